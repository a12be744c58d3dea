"""BrainNetworkFlowPipeline: conditional generation of connectivity matrices that are valid by construction, by flow
matching in the Euclidean coordinates of a matrix codec (DiffeoCFM's recipe), sampled with a diffusers
flow-matching scheduler."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.brain_network_flow import BrainNetworkFlowModel
from ...models.matrix_codecs import CorrelationMatrixCodec, SPDMatrixCodec
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs, check_generator, prepare_initial_noise


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np", "latent")


@public
@dataclass
class BrainNetworkFlowPipelineOutput(BaseOutput):
    """Output of [`BrainNetworkFlowPipeline`].

    Args:
        matrices (`torch.Tensor` or `np.ndarray` of shape `(batch, n, n)`, float64): the generated matrices, valid
            for the codec (correlation matrices for [`CorrelationMatrixCodec`], SPD for [`SPDMatrixCodec`]); the
            standardised vectors `(batch, num_features)` with `output_type="latent"`.
    """

    matrices: torch.Tensor | np.ndarray


@public
class BrainNetworkFlowPipeline(DiffusionPipeline):
    r"""
    Connectivity matrices conditioned on covariates: the ODE `dx / dsigma = v(x, sigma, c)` of a
    [`BrainNetworkFlowModel`] integrated from `x_1 ~ N(0, I)` to `sigma = 0` by the scheduler in the codec's
    standardised vector space, then decoded by the codec. Every decoded matrix is valid (positive definite, and with
    a unit diagonal for the correlation codec) whatever the vector, so validity never depends on the model.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`BrainNetworkFlowModel`]): the conditional velocity model.
        codec ([`CorrelationMatrixCodec`] or [`SPDMatrixCodec`]): matrices <-> vectors, with the standardiser fitted
            on the training matrices.
        scheduler ([`FlowMatchEulerDiscreteScheduler`]): integrates the flow (any diffusers flow-matching
            scheduler).
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(
        self,
        model: BrainNetworkFlowModel,
        codec: CorrelationMatrixCodec | SPDMatrixCodec,
        scheduler: FlowMatchEulerDiscreteScheduler,
    ):
        super().__init__()
        if model.config.num_features != codec.num_features:
            raise ValueError(
                f"`model` predicts {model.config.num_features} features but `codec` makes {codec.num_features}."
            )
        self.register_modules(model=model, codec=codec, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(
        self, covariates, batch_size, num_inference_steps, generator, latents, output_type, tensor_inputs
    ) -> torch.Tensor | None:
        """Validate a call before any model work; returns `(covariates, batch_size)`: the covariates as a float32
        tensor `(batch, num_covariates)` (None for an unconditional model) and the batch they make."""
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        expected = self.model.config.num_covariates
        if expected:
            if covariates is None:
                raise ValueError(f"`covariates` is required: the model is conditioned on {expected} covariates.")
            covariates = torch.as_tensor(np.asarray(covariates, dtype=np.float32))
            if covariates.ndim == 1:
                covariates = covariates[None]
            if covariates.ndim != 2 or covariates.shape[1] != expected:
                raise ValueError(f"`covariates` must have shape (batch, {expected}), got {tuple(covariates.shape)}.")
            check_finite("covariates", covariates)
            if batch_size is not None and batch_size != len(covariates):
                raise ValueError(
                    f"`batch_size` is {batch_size} but `covariates` holds {len(covariates)} rows; give one or the "
                    "other (each row of `covariates` is one matrix)."
                )
            batch_size = len(covariates)
        else:
            if covariates is not None:
                raise ValueError("`covariates` was given, but the model takes none (`num_covariates` is 0).")
            batch_size = 1 if batch_size is None else batch_size
            check_positive_int("batch_size", batch_size)
        check_generator(generator, batch_size, "`covariates`" if expected else "`batch_size`")
        shape = (batch_size, self.codec.num_features)
        if latents is not None:
            if not isinstance(latents, torch.Tensor) or tuple(latents.shape) != shape:
                got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
                raise ValueError(f"`latents` must be a tensor of shape (batch, num_features) = {shape}, got {got}.")
            check_finite("latents", latents)
        return covariates, batch_size

    @torch.no_grad()
    def __call__(
        self,
        covariates: torch.Tensor | np.ndarray | list | None = None,
        batch_size: int | None = None,
        num_inference_steps: int = 50,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> BrainNetworkFlowPipelineOutput | tuple:
        r"""
        Generate one matrix per row of `covariates` (or `batch_size` matrices from an unconditional model).

        Args:
            covariates (`torch.Tensor`, `np.ndarray` or list of shape `(batch, num_covariates)`): each subject's
                covariates, in the units the model was trained on (e.g. `(age, sex)`).
            batch_size (`int`, *optional*): matrices to generate, for an unconditional model (defaults to 1).
            num_inference_steps (`int`, defaults to 50): scheduler steps (model evaluations for Euler).
            generator (`torch.Generator` or a list of one per matrix, *optional*): draws the noise; with a list,
                matrix `b` depends on `generator[b]` only.
            latents (`torch.Tensor` of shape `(batch, num_features)`, *optional*): the initial noise.
            output_type (`str`, defaults to `"pt"`): `"pt"` (float64 matrices), `"np"` (an array) or `"latent"`
                (the final standardised vectors, not decoded).
            return_dict (`bool`, defaults to `True`): a [`BrainNetworkFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return new `latents`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                (default `["latents"]`).

        Returns:
            [`BrainNetworkFlowPipelineOutput`] or `(matrices,)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        covariates, batch_size = self.check_inputs(
            covariates,
            batch_size,
            num_inference_steps,
            generator,
            latents,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        device = self._execution_device
        dtype = self.model.dtype
        shape = (batch_size, self.codec.num_features)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        if covariates is not None:
            covariates = covariates.to(device=device, dtype=dtype)
        latents, timesteps = prepare_initial_noise(self.scheduler, num_inference_steps, latents, device)
        self._num_timesteps = len(timesteps)
        self._interrupt = False
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    break
                velocity = self.model(latents, t, covariates).sample
                latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0].to(dtype)
                if callback_on_step_end is not None:
                    local_vars = {"latents": latents}
                    callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                    outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    latents = outputs.pop("latents", latents)
                progress_bar.update()
        self.maybe_free_model_hooks()
        if output_type == "latent":
            matrices = latents
        else:
            matrices = self.codec.decode(latents)
            if output_type == "np":
                matrices = matrices.cpu().numpy()
        if not return_dict:
            return (matrices,)
        return BrainNetworkFlowPipelineOutput(matrices=matrices)
