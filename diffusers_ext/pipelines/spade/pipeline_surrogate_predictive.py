"""[`SurrogatePredictivePipeline`]: Monte-Carlo predictive samples, mean and spread of a SPADE surrogate."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DDIMScheduler, DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs, check_generator
from .sampling import ddim_step, inference_timesteps


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np", "latent")


@public
@dataclass
class SurrogatePredictiveOutput(BaseOutput):
    """Output of [`SurrogatePredictivePipeline`].

    Args:
        samples (`torch.Tensor` or `np.ndarray` of shape `(num_samples, N)`): Monte-Carlo scores of each design (data
            units; normalised units with `output_type="latent"`).
        mean (`torch.Tensor` or `np.ndarray` of shape `(N,)`): their mean.
        std (`torch.Tensor` or `np.ndarray` of shape `(N,)`): their population standard deviation.
    """

    samples: torch.Tensor | np.ndarray
    mean: torch.Tensor | np.ndarray
    std: torch.Tensor | np.ndarray


def as_designs(x, x_dim: int, device, dtype) -> torch.Tensor:
    """Check designs `x` (`(N, x_dim)` tensor or array) and return them as a tensor."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`x` must be a torch.Tensor or np.ndarray of shape (N, {x_dim}), got {type(x).__name__}.")
    if x.ndim != 2 or x.shape[1] != x_dim or x.shape[0] < 1:
        raise ValueError(f"`x` must have shape (N, {x_dim}) with N >= 1, got {tuple(x.shape)}.")
    if not x.is_floating_point():
        raise TypeError(f"`x` must be a floating-point tensor, got {x.dtype}.")
    check_finite("x", x)
    return x.to(device=device, dtype=dtype)


@public
class SurrogatePredictivePipeline(DiffusionPipeline):
    r"""
    The predictive distribution `p(y | x)` of a SPADE surrogate: `num_samples` deterministic DDIM samples per design,
    their mean and (population) standard deviation, in the data's units.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`ScalarDiffusionSurrogate`]): the noise predictor (it stores the data's z-scoring).
        scheduler ([`DDIMScheduler`]): its `alphas_cumprod` and timesteps; SPADE's is
            `DDIMScheduler(num_train_timesteps=100, beta_schedule="linear", beta_start=1e-4, beta_end=2e-2,
            timestep_spacing="linspace", clip_sample=False)`.
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(self, model: ScalarDiffusionSurrogate, scheduler: DDIMScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(self, x, num_samples, num_inference_steps, latents, output_type, tensor_inputs, generator):
        """Validate a call before any model work; returns the designs as a tensor."""
        check_positive_int("num_samples", num_samples)
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        x = as_designs(x, self.model.config.x_dim, self._execution_device, self.model.dtype)
        check_generator(generator, x.shape[0], batch="`x` (one generator per design)")
        shape = (num_samples, x.shape[0])
        if latents is not None and (
            not isinstance(latents, torch.Tensor) or not latents.is_floating_point() or tuple(latents.shape) != shape
        ):
            raise ValueError(
                f"`latents` must be a float tensor of shape (num_samples, N) = {shape}, got "
                f"{getattr(latents, 'shape', type(latents).__name__)}."
            )
        if latents is not None:
            check_finite("latents", latents)
        return x

    @torch.no_grad()
    def __call__(
        self,
        x: torch.Tensor | np.ndarray,
        num_samples: int = 256,
        num_inference_steps: int = 50,
        timesteps: list[int] | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> SurrogatePredictiveOutput | tuple:
        r"""
        Sample the surrogate's predictive distribution for a batch of designs.

        Args:
            x (`torch.Tensor` or `np.ndarray` of shape `(N, x_dim)`): designs, in the data's units.
            num_samples (`int`, defaults to 256): Monte-Carlo samples per design (SPADE's acquisition default).
            num_inference_steps (`int`, defaults to 50): DDIM steps (ignored with `timesteps`).
            timesteps (`list[int]`, *optional*): explicit decreasing timesteps (e.g. the reference's truncated
                `linspace(T - 1, 0, n)`).
            generator (`torch.Generator` or a list of `N`, *optional*): draws `latents`, as one `(num_samples, N)`
                normal tensor; with a list, design `j`'s samples come from `generator[j]` alone (one `(num_samples,)`
                draw), so they equal those of a call with design `j` alone and that generator.
            latents (`torch.Tensor` of shape `(num_samples, N)`, *optional*): the initial noise.
            output_type (`str`, defaults to `"pt"`): `"pt"`, `"np"`, or `"latent"` (normalised units, tensors).
            return_dict (`bool`, defaults to True): return a [`SurrogatePredictiveOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                each DDIM step; it may return new `latents` (shape `(num_samples, N)`, normalised units).
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): default `["latents"]`.

        Returns:
            [`SurrogatePredictiveOutput`] or `(samples, mean, std)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        x = self.check_inputs(
            x, num_samples, num_inference_steps, latents, output_type, callback_on_step_end_tensor_inputs, generator
        )
        steps = inference_timesteps(self.scheduler, num_inference_steps, timesteps)
        device, dtype = self._execution_device, self.model.dtype
        if latents is None and isinstance(generator, list) and len(generator) > 1:  # column j from generator[j]
            latents = randn_tensor(
                (x.shape[0], num_samples), generator=generator, device=device, dtype=dtype
            ).T.contiguous()
        elif latents is None:
            latents = randn_tensor((num_samples, x.shape[0]), generator=generator, device=device, dtype=dtype)
        latents = latents.to(device=device, dtype=dtype)
        self._num_timesteps = len(steps)
        self._interrupt = False

        model = self.model
        features = model.encode_x(model.normalize_x(x)).repeat(num_samples, 1)
        samples = latents
        with self.progress_bar(total=len(steps)) as progress_bar:
            for i, t in enumerate(steps.tolist()):
                if self.interrupt:
                    break
                samples = ddim_step(model, self.scheduler.alphas_cumprod, steps, i, features, samples)
                if callback_on_step_end is not None:
                    local_vars = {"latents": samples}
                    callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                    outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    samples = outputs.pop("latents", samples)
                progress_bar.update()
        self.maybe_free_model_hooks()
        if output_type != "latent":
            samples = self.model.denormalize_y(samples)
        mean, std = samples.mean(0), samples.std(0, unbiased=False)
        if output_type == "np":
            samples, mean, std = (v.cpu().float().numpy() for v in (samples, mean, std))
        if not return_dict:
            return (samples, mean, std)
        return SurrogatePredictiveOutput(samples=samples, mean=mean, std=std)
