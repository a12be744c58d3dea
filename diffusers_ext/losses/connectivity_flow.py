"""The flow matching loss of [`ConnectivityFlowModel`]'s two heads (diffusers' `FlowMatchEulerDiscreteScheduler`
convention: `x_sigma = (1 - sigma) x + sigma noise`, velocity target `noise - x`, timestep `sigma * 1000`)."""

import torch

from ..models.connectivity_flow import ConnectivityFlowModel


def connectivity_flow_loss(
    model: ConnectivityFlowModel,
    input_loadings: torch.Tensor,
    output_loadings: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Conditional flow matching (straight paths from a standard normal) on one batch of neurons' loadings.

    Without `output_loadings`, the loss of the input-side flow on `input_loadings`; with them, the loss of the
    output-side flow on `output_loadings` conditioned on `input_loadings`. Loadings are given unnormalised; the
    model's `input_scale` / `output_scale` are applied here.

    Args:
        model ([`ConnectivityFlowModel`]): the velocity networks (possibly wrapped by accelerate).
        input_loadings (`torch.Tensor` of shape `(B, input_dim)`): `(m, d)` per neuron.
        output_loadings (`torch.Tensor` of shape `(B, rank)`, *optional*): `n` per neuron.
        generator (`torch.Generator`, *optional*): draws the noise and the noise levels (on the loadings' device).

    Returns:
        `torch.Tensor`: the scalar mean squared velocity error.
    """
    config = getattr(model, "module", model).config
    if input_loadings.ndim != 2:
        raise ValueError(f"`input_loadings` must have shape (batch, dim), got {tuple(input_loadings.shape)}.")
    condition = input_loadings / config.input_scale
    if output_loadings is None:
        target_sample, condition = condition, None
    else:
        if output_loadings.ndim != 2 or output_loadings.shape[0] != input_loadings.shape[0]:
            raise ValueError(
                f"`output_loadings` must have shape ({input_loadings.shape[0]}, rank), got "
                f"{tuple(output_loadings.shape)}."
            )
        target_sample = output_loadings / config.output_scale
    batch = target_sample.shape[0]
    kwargs = {"generator": generator, "device": target_sample.device, "dtype": target_sample.dtype}
    sigma = torch.rand(batch, 1, **kwargs)
    noise = torch.randn(target_sample.shape, **kwargs)
    noisy = (1 - sigma) * target_sample + sigma * noise
    prediction = model(noisy, sigma.squeeze(-1) * config.num_train_timesteps, condition=condition).sample
    return torch.nn.functional.mse_loss(prediction.float(), (noise - target_sample).float())
