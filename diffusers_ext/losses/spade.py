r"""SPADE's training losses and its search-time support transform (the formulas of `HarryYoung2018/spade`).

All work in the surrogate's normalised units (z-scored `y`): the denoising (epsilon-MSE) loss, the calibration loss
(MSE of the Monte-Carlo mean plus a pairwise ranking loss) and the kNN support-proximity loss.
"""

import torch
import torch.nn.functional as F


def denoising_loss(
    model, alphas_cumprod: torch.Tensor, x: torch.Tensor, y: torch.Tensor, timesteps: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    r"""
    The DDPM epsilon-MSE of `model` on `(x, y)`: `y_t = sqrt(abar_t) y + sqrt(1 - abar_t) noise`,
    `mean((model(y_t, t, x) - noise)^2)`.

    Args:
        model ([`ScalarDiffusionSurrogate`]): the noise predictor.
        alphas_cumprod (`torch.Tensor` of shape `(T,)`): the training scheduler's `alphas_cumprod`.
        x (`torch.Tensor` of shape `(batch, D)`), y (`torch.Tensor` of shape `(batch, 1)`): normalised data.
        timesteps (`torch.Tensor` of shape `(batch,)`, long): integer timesteps in `[0, T)`.
        noise (`torch.Tensor` of shape `(batch, 1)`).
    """
    abar = alphas_cumprod.to(device=y.device, dtype=y.dtype)[timesteps].reshape(-1, 1)
    noisy = abar.sqrt() * y + (1.0 - abar).sqrt() * noise
    return F.mse_loss(model(noisy, timesteps, x).sample, noise)


def ranking_pairs(y: torch.Tensor, num_pairs: int, generator: torch.Generator | None = None):
    """`num_pairs` random index pairs `(i, j)` (with replacement), kept where `y_i > y_j`: two `(M,)` long tensors."""
    y = y.reshape(-1)
    first = torch.randint(0, y.numel(), (num_pairs,), generator=generator, device=y.device)
    second = torch.randint(0, y.numel(), (num_pairs,), generator=generator, device=y.device)
    keep = y[first] > y[second]
    return first[keep], second[keep]


def calibration_loss(
    mean: torch.Tensor,
    y: torch.Tensor,
    num_pairs: int = 32,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""
    `MSE(mean, y) + mean_{(i, j): y_i > y_j} softplus(-temperature (mean_i - mean_j))` over `num_pairs` random pairs
    (drawn with `torch.randint` from `generator`: first indices, then second ones; pairs with `y_i <= y_j` are dropped,
    and the ranking term is 0 when none is left or `num_pairs` is 0).

    Args:
        mean (`torch.Tensor` of shape `(batch,)` or `(batch, 1)`): the Monte-Carlo predictive means.
        y (`torch.Tensor`, the same shape): the normalised targets.
    """
    mean, y = mean.reshape(-1), y.reshape(-1)
    if mean.shape != y.shape:
        raise ValueError(f"`mean` and `y` must have the same number of entries, got {mean.numel()} and {y.numel()}.")
    loss = F.mse_loss(mean, y)
    if num_pairs > 0 and y.numel() > 1:
        first, second = ranking_pairs(y, num_pairs, generator)
        if first.numel():
            loss = loss + F.softplus(-temperature * (mean[first] - mean[second])).mean()
    return loss


def support_loss(
    mean: torch.Tensor,
    std: torch.Tensor,
    neighbour_mean: torch.Tensor,
    radius: torch.Tensor,
    tau_a: float = 0.02,
    sigma_a0: float = 0.02,
    sigma_a1: float = 0.005,
) -> torch.Tensor:
    r"""
    The support-proximity loss `mean[relu(mean - ybar_k - tau_a log r_k) + relu(sigma_a0 + sigma_a1 log r_k - std)]`:
    the predictive mean may exceed the kNN mean of the neighbours' scores only by `tau_a log r_k`, and the spread must
    be at least `sigma_a0 + sigma_a1 log r_k` (`r_k`: the distance to the k-th neighbour, plus 1e-8).

    All arguments are `(batch,)` (or `(batch, 1)`) tensors.
    """
    log_radius = torch.log(radius.reshape(-1) + 1e-8)
    excess = F.relu(mean.reshape(-1) - neighbour_mean.reshape(-1) - tau_a * log_radius)
    floor = F.relu(sigma_a0 + sigma_a1 * log_radius - std.reshape(-1))
    return (excess + floor).mean()


def support_transform(
    samples: torch.Tensor,
    log_radius: torch.Tensor,
    tau_a: float = 0.02,
    sigma_a0: float = 0.02,
    sigma_a1: float = 0.005,
) -> torch.Tensor:
    r"""
    SPADE's search-time support transform of Monte-Carlo samples `(S, N)`: shift each design's mean by
    `-tau_a log r_k` and raise its spread to at least `sigma_a0 + sigma_a1 log r_k`, by rescaling the samples about
    their mean. `log_radius` is `(N,)`.
    """
    mean = samples.mean(0)
    std = samples.std(0, unbiased=False)
    log_radius = log_radius.reshape(-1).to(samples)
    target = torch.maximum(std, sigma_a0 + sigma_a1 * log_radius)
    return (samples - mean) * (target / (std + 1e-8)) + (mean - tau_a * log_radius)
