"""ManifoldFlowPipeline: sample points of R^D from a flow-matching velocity model, e.g. the two-head
[`ManifoldFlowTransformerModel`], by integrating its ODE from noise with a diffusers flow-matching scheduler."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.manifold_flow import ManifoldFlowTransformerModel
from ...utils import check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs, prepare_initial_noise


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np", "latent")


@public
@dataclass
class ManifoldFlowPipelineOutput(BaseOutput):
    """Output of [`ManifoldFlowPipeline`].

    Args:
        samples (`torch.Tensor` or `np.ndarray` of shape `(batch_size, ambient_dim)`): the generated points (a float32
            array with `output_type="np"`; the model's dtype otherwise).
    """

    samples: torch.Tensor | np.ndarray


@public
class ManifoldFlowPipeline(DiffusionPipeline):
    r"""
    Unconditional generation of points in `R^D` by flow matching: the ODE `dx / dsigma = v(x, sigma)` integrated from
    `x_1 ~ N(0, I)` to `sigma = 0` by the scheduler.

    With a [`ManifoldFlowTransformerModel`] the velocity is the two-head decomposition
    `B g(B^T x, sigma) + (I - B B^T) x / sigma`: the orthogonal part of each sample shrinks by `sigma' / sigma` at
    every Euler step and is exactly 0 after the last one, so samples lie on the model's subspace (plus the modelled
    off-subspace noise when `orthogonal_noise_std > 0`). `model.project(samples)` gives their subspace coordinates.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`ManifoldFlowTransformerModel`]): the velocity model; any module in diffusers' flow-matching
            convention (`model(sample, timestep).sample` the velocity `noise - x`) whose `config.ambient_dim` is the
            sample size runs too (the pack's benchmark samples its baselines and the exact oracle this way).
        scheduler ([`FlowMatchEulerDiscreteScheduler`]): integrates the flow (any diffusers flow-matching
            scheduler).
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(self, model: ManifoldFlowTransformerModel, scheduler: FlowMatchEulerDiscreteScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def ambient_dim(self) -> int:
        """The sample size `D` (the model's `config.ambient_dim`)."""
        return int(self.model.config.ambient_dim)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(self, batch_size, num_inference_steps, generator, latents, output_type, tensor_inputs) -> None:
        """Validate a call before any model work."""
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(f"`generator` is a list of {len(generator)}, but `batch_size` is {batch_size}.")
        shape = (batch_size, self.ambient_dim)
        if latents is not None and (
            not isinstance(latents, torch.Tensor) or not latents.is_floating_point() or tuple(latents.shape) != shape
        ):
            got = (
                f"{tuple(latents.shape)} {latents.dtype}"
                if isinstance(latents, torch.Tensor)
                else type(latents).__name__
            )
            raise ValueError(
                f"`latents` must be a float tensor of shape (batch_size, ambient_dim) = {shape}, got {got}."
            )

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 50,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> ManifoldFlowPipelineOutput | tuple:
        r"""
        Generate `batch_size` points.

        Args:
            batch_size (`int`, defaults to 1): points to generate.
            num_inference_steps (`int`, defaults to 50): scheduler steps (model evaluations for Euler).
            generator (`torch.Generator` or a list of `batch_size`, *optional*): draws the noise; with a list, point
                `b` depends on `generator[b]` only.
            latents (`torch.Tensor` of shape `(batch_size, ambient_dim)`, *optional*): the initial noise; drawn if
                not given.
            output_type (`str`, defaults to `"pt"`): `"pt"` (a tensor), `"np"` (a float32 array) or `"latent"` (the
                final latents as they are, a tensor: for points nothing is decoded, so the same as `"pt"`).
            return_dict (`bool`, defaults to `True`): return a [`ManifoldFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return new `latents`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                passed to the callback (default `["latents"]`).

        Returns:
            [`ManifoldFlowPipelineOutput`] or `(samples,)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        self.check_inputs(
            batch_size, num_inference_steps, generator, latents, output_type, callback_on_step_end_tensor_inputs
        )
        device = self._execution_device
        dtype = self.model.dtype
        if latents is None:
            latents = randn_tensor((batch_size, self.ambient_dim), generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        latents, timesteps = prepare_initial_noise(self.scheduler, num_inference_steps, latents, device)
        self._num_timesteps = len(timesteps)
        self._interrupt = False
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    break
                velocity = self.model(latents, t).sample
                latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0].to(dtype)
                if callback_on_step_end is not None:
                    local_vars = {"latents": latents}
                    callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                    outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    latents = outputs.pop("latents", latents)
                progress_bar.update()
        self.maybe_free_model_hooks()
        samples = latents.cpu().float().numpy() if output_type == "np" else latents
        if not return_dict:
            return (samples,)
        return ManifoldFlowPipelineOutput(samples=samples)
