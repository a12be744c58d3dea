"""ConnectivityPipeline: sample low-rank RNNs from a learned connectivity distribution and simulate their dynamics."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...data.lrrnn import initial_state_grid, simulate_latents
from ...models.connectivity_flow import ConnectivityFlowModel
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np", "latent")


@public
@dataclass
class ConnectivityPipelineOutput(BaseOutput):
    """Output of [`ConnectivityPipeline`].

    Args:
        loadings (`torch.Tensor` or `np.ndarray` of shape `(num_networks, num_neurons, input_dim + rank)`): each
            sampled neuron's input-side loadings `m` (and bias `d`) followed by its output-side loadings `n`; with
            `output_type="latent"`, the flows' samples in their normalised space.
        trajectories (`torch.Tensor` or `np.ndarray` of shape `(num_networks, K, num_dynamics_steps + 1, rank)`,
            *optional*): each network's latent dynamics from the `K` initial states; `None` with
            `output_type="latent"`.
    """

    loadings: torch.Tensor | np.ndarray
    trajectories: torch.Tensor | np.ndarray | None


@public
class ConnectivityPipeline(DiffusionPipeline):
    r"""
    Sample low-rank RNNs from a connectivity distribution learned by flow matching, and simulate their latent dynamics.

    Each neuron is drawn independently: its input-side loadings `(m, d)` from the model's input-side flow, then its
    output-side loadings `n` from the output-side flow conditioned on them (trained on ridge read-outs, so the
    directions the dynamics do not identify carry maximum entropy). Both flows are integrated by the scheduler.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`ConnectivityFlowModel`]): the input-side and output-side velocity networks.
        scheduler ([`FlowMatchEulerDiscreteScheduler`]): integrates each flow from noise (`sigma = 1`) to loadings.
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(self, model: ConnectivityFlowModel, scheduler: FlowMatchEulerDiscreteScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        """Steps of the last call: `num_inference_steps` for each of the two flows."""
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(
        self,
        num_neurons,
        num_networks,
        num_inference_steps,
        generator,
        latents,
        initial_states,
        num_dynamics_steps,
        output_type,
        tensor_inputs,
    ) -> None:
        """Validate a call before any model work."""
        check_positive_int("num_neurons", num_neurons)
        check_positive_int("num_networks", num_networks)
        check_positive_int("num_inference_steps", num_inference_steps)
        check_positive_int("num_dynamics_steps", num_dynamics_steps, minimum=0)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        if isinstance(generator, list) and len(generator) != num_networks:
            raise ValueError(f"`generator` is a list of {len(generator)}, but `num_networks` is {num_networks}.")
        width = self.model.input_dim + self.model.output_dim
        if latents is not None and (
            not isinstance(latents, torch.Tensor)
            or not latents.is_floating_point()
            or tuple(latents.shape) != (num_networks, num_neurons, width)
        ):
            raise ValueError(
                f"`latents` must be a float tensor of shape (num_networks, num_neurons, {width}) = "
                f"{(num_networks, num_neurons, width)}, got {getattr(latents, 'shape', type(latents).__name__)}."
            )
        rank = self.model.config.rank
        if initial_states is not None and (
            not isinstance(initial_states, torch.Tensor) or initial_states.ndim != 2 or initial_states.shape[1] != rank
        ):
            raise ValueError(
                f"`initial_states` must be a tensor of shape (num_states, {rank}), got "
                f"{getattr(initial_states, 'shape', type(initial_states).__name__)}."
            )
        if latents is not None:
            check_finite("latents", latents)
        if initial_states is not None:
            check_finite("initial_states", initial_states)

    def _integrate(self, latents, columns, condition, step_offset, callback, tensor_inputs, progress_bar):
        """Integrate one flow over `latents[..., columns]` (in place of a copy); returns the new `latents`."""
        self.scheduler.set_timesteps(self._num_timesteps // 2, device=latents.device)
        for i, t in enumerate(self.scheduler.timesteps):
            if self.interrupt:
                break
            sample = latents[..., columns]
            velocity = self.model(sample, t, condition=condition).sample
            updated = self.scheduler.step(velocity, t, sample, return_dict=False)[0].to(latents.dtype)
            latents = latents.clone()
            latents[..., columns] = updated
            if callback is not None:
                local_vars = {"latents": latents}
                outputs = callback(self, step_offset + i, t, {k: local_vars[k] for k in tensor_inputs}) or {}
                latents = outputs.pop("latents", latents)
            progress_bar.update()
        return latents

    @torch.no_grad()
    def __call__(
        self,
        num_neurons: int,
        num_networks: int = 1,
        num_inference_steps: int = 100,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        num_dynamics_steps: int = 100,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> ConnectivityPipelineOutput | tuple:
        r"""
        Sample `num_networks` lrRNNs of `num_neurons` neurons each and simulate their latent dynamics.

        Args:
            num_neurons (`int`): neurons per network.
            num_networks (`int`, defaults to 1): networks to sample.
            num_inference_steps (`int`, defaults to 100): Euler steps of each flow (two flows: twice as many model
                evaluations); the setting `benchmarks/connectivity` measured (20 lose fixed points more often).
            generator (`torch.Generator` or a list of `num_networks`, *optional*): draws the noise; with a list,
                network `b` depends on `generator[b]` only.
            latents (`torch.Tensor` of shape `(num_networks, num_neurons, input_dim + rank)`, *optional*): the
                initial noise of both flows (the input-side flow's columns first); drawn if not given.
            initial_states (`torch.Tensor` of shape `(K, rank)`, *optional*): starting points of the simulated
                dynamics; default a 5-per-axis grid of `[-2.4, 2.4]^rank`.
            num_dynamics_steps (`int`, defaults to 100): steps of the simulated dynamics.
            output_type (`str`, defaults to `"pt"`): `"pt"` (tensors), `"np"` (arrays) or `"latent"` (the flows'
                normalised samples, no simulation).
            return_dict (`bool`, defaults to `True`): return a [`ConnectivityPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step of both flows (steps `0 .. 2 * num_inference_steps - 1`); it may return new `latents`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                passed to the callback (default `["latents"]`).

        Returns:
            [`ConnectivityPipelineOutput`] or `(loadings, trajectories)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        self.check_inputs(
            num_neurons,
            num_networks,
            num_inference_steps,
            generator,
            latents,
            initial_states,
            num_dynamics_steps,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        device = self._execution_device
        dtype = self.model.dtype
        input_dim, rank = self.model.input_dim, self.model.output_dim
        shape = (num_networks, num_neurons, input_dim + rank)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        self._num_timesteps = 2 * num_inference_steps
        self._interrupt = False
        inputs, outputs = slice(0, input_dim), slice(input_dim, input_dim + rank)
        with self.progress_bar(total=self._num_timesteps) as progress_bar:
            args = (callback_on_step_end, callback_on_step_end_tensor_inputs, progress_bar)
            latents = self._integrate(latents, inputs, None, 0, *args)
            latents = self._integrate(latents, outputs, latents[..., inputs], num_inference_steps, *args)
        self.maybe_free_model_hooks()

        trajectories = None
        if output_type == "latent":
            loadings = latents
        else:
            config = self.model.config
            loadings = torch.cat(
                [latents[..., inputs] * config.input_scale, latents[..., outputs] * config.output_scale], -1
            )
            if initial_states is None:
                initial_states = initial_state_grid(5, 2.4, rank)
            m = loadings[..., :rank].double()
            bias = loadings[..., rank].double() if config.bias else None
            trajectories = simulate_latents(
                m, loadings[..., input_dim:].double(), initial_states.double(), num_dynamics_steps, config.alpha, bias
            ).to(loadings.dtype)
            if output_type == "np":
                loadings, trajectories = loadings.cpu().float().numpy(), trajectories.cpu().float().numpy()
        if not return_dict:
            return (loadings, trajectories)
        return ConnectivityPipelineOutput(loadings=loadings, trajectories=trajectories)
