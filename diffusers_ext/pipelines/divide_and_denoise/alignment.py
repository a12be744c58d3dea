"""The alignment step of Divide-and-Denoise (closed form, no backpropagation); the clean-sample prediction it reads
is `pipeline_utils.prediction_to_x0`.

The sample at a step is `x_t = signal * x_0 + noise * e` (`signal = sqrt(alpha_bar)`, `noise = sqrt(1 - alpha_bar)`
for DDPM-family schedulers; `signal = 1 - sigma`, `noise = sigma` for flow matching).
"""

import torch


def alignment_step(
    latents: torch.Tensor,
    scaled: torch.Tensor,
    x0: torch.Tensor,
    allocation: torch.Tensor,
    noise: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One closed-form alignment step on the latents `(B, C, H, W)`, given their scaled model input `scaled`, every
    agent's clean-sample prediction `x0` `(B, K, C, H, W)`, the allocation `(B, K, H, W)` and the step's `noise`
    scale (a 0-d tensor); returns the moved latents.

    Energy `L = sum_k (1 - <X_k, s_k> / sum s_k)^2` with `s_k = |x0_k - b_k|^2` the squared saliency of agent `k`
    (layout-guidance form). Its gradient goes through `x0_k`, which moves with `x_t` (by `1 / signal` for noise
    predictions, by 1 for flow velocities) with the network output held fixed (no backpropagation through the
    models), which is what keeps alignment cheap. The step is normalised, so that positive factor drops out.

    The arithmetic runs in float32 whatever the inputs' dtype (in float16 the saliency sums over an SD-sized canvas
    overflow, the normalised gradient underflows and `clamp_min(1e-12)` is 0, so the step is 0/0); the returned
    latents have the dtype of `latents`.
    """
    dtype = latents.dtype
    latents, scaled, x0 = latents.float(), scaled.float(), x0.float()
    allocation, noise = allocation.float(), torch.as_tensor(noise, device=latents.device).float()
    background = x0.flatten(3).median(dim=3).values[..., None, None]  # (B, K, C, 1, 1)
    deviation = x0 - background
    saliency = deviation.pow(2).sum(dim=2)  # (B, K, H, W)
    total = saliency.flatten(2).sum(dim=2).clamp_min(1e-12)[..., None, None]
    inside = (allocation * saliency).flatten(2).sum(dim=2)[..., None, None] / total
    # dL/ds = -2 (1 - r) (X - r) / sum s ; ds/dx0 = 2 (x0 - b)
    grad_s = -2 * (1 - inside) * (allocation - inside) / total
    grad = (grad_s.unsqueeze(2) * 2 * deviation).sum(dim=1)
    # step size: `scale` times the sample's own noise level, in units of the normalised gradient
    norm = grad.flatten(1).abs().amax(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
    step = scale * noise * grad / norm
    # the scheduler may scale its model input (Euler: x / sqrt(sigma^2 + 1)); move the latents accordingly
    ratio = (scaled.flatten(1).norm(dim=1) / latents.flatten(1).norm(dim=1).clamp_min(1e-12)).view(-1, 1, 1, 1)
    return (latents - step / ratio).to(dtype)
