"""The flow-matching loss of a velocity model on point clouds (diffusers' `FlowMatchEulerDiscreteScheduler`
convention: `x_sigma = (1 - sigma) x + sigma noise`, velocity target `noise - x`, timestep
`sigma * num_train_timesteps`): [`ManifoldFlowTransformerModel`]'s, and that of any vector model with the same call
(the brain-network flow's, which also takes `covariates=`)."""

import torch


def manifold_flow_loss(
    model, x: torch.Tensor, generator: torch.Generator | None = None, **model_kwargs
) -> torch.Tensor:
    """Conditional flow matching (straight paths from a standard normal) on one batch of points.

    The full `D`-dim loss `|v(x_sigma, sigma) - (noise - x)|^2` (summed over coordinates, averaged over the batch),
    with `sigma ~ U(0, 1)` and `noise ~ N(0, I)`. For a two-head model with a fixed subspace the orthogonal head has
    no parameters, so only the tangent term `|g(B^T x_sigma) - B^T (noise - x)|^2` moves the weights: exactly latent
    flow matching on `B^T x`; with `learn_subspace=True` the orthogonal term trains `B` too.

    Args:
        model: a velocity model `model(sample, timestep).sample` with `config.num_train_timesteps` (possibly wrapped
            by accelerate), e.g. [`ManifoldFlowTransformerModel`].
        x (`torch.Tensor` of shape `(B, D)`): data points.
        generator (`torch.Generator`, *optional*): draws the noise and the noise levels (on `x`'s device).
        model_kwargs: passed to the model with every call (e.g. `covariates=` of shape `(B, c)` for a
            [`BrainNetworkFlowModel`]).

    Returns:
        `torch.Tensor`: the scalar loss.
    """
    config = getattr(model, "module", model).config
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point():
        raise ValueError(f"`x` must be a float tensor of shape (batch, dim), got {getattr(x, 'shape', x)}.")
    kwargs = {"generator": generator, "device": x.device, "dtype": x.dtype}
    sigma = torch.rand(len(x), 1, **kwargs)
    noise = torch.randn(x.shape, **kwargs)
    noisy = (1 - sigma) * x + sigma * noise
    prediction = model(noisy, sigma.squeeze(-1) * config.num_train_timesteps, **model_kwargs).sample
    return (prediction.float() - (noise - x).float()).square().sum(-1).mean()
