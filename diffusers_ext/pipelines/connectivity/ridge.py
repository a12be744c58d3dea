"""The ridge (maximum-entropy) read-out of a low-rank RNN's output-side loadings from its latent dynamics."""

from dataclasses import dataclass

import torch

from ...utils import check_positive_int, is_number, public


@public
@dataclass
class RidgeReadout:
    """Result of [`ridge_readout`].

    Args:
        mean (`torch.Tensor` of shape `(N, R)`): the ridge solution (posterior mean) of the output-side loadings.
        samples (`torch.Tensor` of shape `(S, N, R)`, *optional*): draws of the Gaussian posterior.
        residual_rms (`float`): the RMS one-step prediction error of `mean` on the transitions.
    """

    mean: torch.Tensor
    samples: torch.Tensor | None
    residual_rms: float


@public
def ridge_readout(
    input_loadings: torch.Tensor,
    states: torch.Tensor,
    next_states: torch.Tensor,
    alpha: float = 0.1,
    lam: float = 1.0,
    noise_std: float = 0.01,
    num_samples: int = 0,
    generator: torch.Generator | None = None,
) -> RidgeReadout:
    """Output-side loadings `n` of an lrRNN whose input side `(m, d)` is given, from observed transitions.

    The transitions satisfy `next - (1 - alpha) z = (alpha / N) tanh(z m^T + d) n + noise`. With the prior
    `n_i ~ N(0, I / lam)` (the ridge penalty) and Gaussian noise of std `noise_std`, the posterior of `n` is Gaussian:
    precision `P = alpha^2 / (N^2 noise_std^2) X^T X + lam I` and mean `P^-1 alpha / (N noise_std^2) X^T Y`, the ridge
    solution. Directions of `n` the dynamics do not constrain keep the prior's covariance `I / lam`: the
    maximum-entropy completion. Computed in float64.

    Args:
        input_loadings (`torch.Tensor` of shape `(N, R)` or `(N, R + 1)`): `m`, or `(m, d)` with a bias column last.
        states (`torch.Tensor` of shape `(T, R)`): `z_t` of `T` transitions.
        next_states (`torch.Tensor` of shape `(T, R)`): `z_{t+1}`.
        alpha (`float`, defaults to 0.1): the leak.
        lam (`float`, defaults to 1.0): the prior precision (ridge strength) of each loading.
        noise_std (`float`, defaults to 0.01): the std of the one-step observation noise.
        num_samples (`int`, defaults to 0): posterior draws to return.
        generator (`torch.Generator`, *optional*): draws the posterior samples.
    """
    if not isinstance(states, torch.Tensor) or states.ndim != 2:
        raise ValueError(f"`states` must be a (T, rank) tensor, got {getattr(states, 'shape', states)}.")
    rank = states.shape[1]
    if not isinstance(next_states, torch.Tensor) or next_states.shape != states.shape:
        raise ValueError(
            f"`next_states` must have the shape of `states` {tuple(states.shape)}, got "
            f"{tuple(getattr(next_states, 'shape', ()))}."
        )
    if (
        not isinstance(input_loadings, torch.Tensor)
        or input_loadings.ndim != 2
        or input_loadings.shape[1] not in (rank, rank + 1)
    ):
        raise ValueError(
            f"`input_loadings` must have shape (num_neurons, {rank}) or (num_neurons, {rank + 1}) (a bias column), "
            f"got {tuple(getattr(input_loadings, 'shape', ()))}."
        )
    for name, value in (("alpha", alpha), ("lam", lam), ("noise_std", noise_std)):
        if not is_number(value) or value <= 0:
            raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
    check_positive_int("num_samples", num_samples, minimum=0)
    if num_samples:
        check_positive_int("num_samples", num_samples)
    loadings = input_loadings.to(torch.float64)
    z, z_next = states.to(loadings), next_states.to(loadings)
    num_neurons = loadings.shape[0]
    currents = z @ loadings[:, :rank].T
    if loadings.shape[1] == rank + 1:
        currents = currents + loadings[:, rank]
    features = torch.tanh(currents)  # (T, N)
    targets = z_next - (1 - alpha) * z  # (T, R)
    gain = alpha / (num_neurons * noise_std)
    precision = gain**2 * features.T @ features + lam * torch.eye(num_neurons, dtype=torch.float64)
    cholesky = torch.linalg.cholesky(precision)
    mean = torch.cholesky_solve(gain / noise_std * features.T @ targets, cholesky)
    residual = targets - alpha / num_neurons * features @ mean
    samples = None
    if num_samples:
        noise = torch.randn(num_samples, num_neurons, rank, generator=generator, dtype=torch.float64)
        # P = L L^T, so L^-T xi has covariance P^-1
        samples = mean + torch.linalg.solve_triangular(cholesky.T, noise, upper=True)
    return RidgeReadout(mean=mean, samples=samples, residual_rms=float(residual.square().mean().sqrt()))


@public
def ridge_readout_targets(
    pipeline,
    states: torch.Tensor,
    next_states: torch.Tensor,
    num_networks: int,
    num_neurons: int,
    lam: float = 1.0,
    noise_std: float = 0.01,
    num_inference_steps: int = 10,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output-side flow's training pairs: networks sampled from the input-side flow, each read out by ridge.

    `num_networks` networks of `num_neurons` neurons get their input side from `pipeline`'s input-side flow; each
    network's output side is one draw of its [`ridge_readout`] posterior on the observed transitions (the
    maximum-entropy completion). The pipeline's model's `alpha` is the leak.

    Returns:
        `(input_loadings, output_loadings)`: float32 `(num_networks * num_neurons, input_dim)` and `(..., rank)`.
    """
    check_positive_int("num_networks", num_networks)
    check_positive_int("num_neurons", num_neurons)
    config = pipeline.model.config
    latents = pipeline(
        num_neurons=num_neurons,
        num_networks=num_networks,
        num_inference_steps=num_inference_steps,
        generator=generator,
        output_type="latent",
    ).loadings
    inputs = latents[..., : pipeline.model.input_dim].double().cpu() * config.input_scale
    outputs = []
    for network in inputs:
        readout = ridge_readout(
            network, states, next_states, config.alpha, lam, noise_std, num_samples=1, generator=generator
        )
        outputs.append(readout.samples[0])
    return inputs.reshape(-1, inputs.shape[-1]).float(), torch.stack(outputs).reshape(-1, config.rank).float()
