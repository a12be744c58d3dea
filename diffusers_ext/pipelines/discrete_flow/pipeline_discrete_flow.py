"""Sampling sequences from a discrete flow matching model by CTMC Euler steps."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging

from ...schedulers.scheduling_discrete_flow_matching import DiscreteFlowMatchingScheduler
from ...utils import check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("seq", "np")


@public
@dataclass
class DiscreteFlowPipelineOutput(BaseOutput):
    """
    Output of [`DiscreteFlowPipeline`].

    Args:
        sequences (`torch.LongTensor` of shape `(batch_size, sequence_length)`, or a numpy array with
            `output_type="np"`): the generated token ids.
        nfe (`int`): number of function (model) evaluations the sampler used.
        num_jumps (`torch.LongTensor` of shape `(batch_size,)`): token changes along each sequence's path.
    """

    sequences: torch.LongTensor | np.ndarray
    nfe: int
    num_jumps: torch.LongTensor


@public
class DiscreteFlowPipeline(DiffusionPipeline):
    r"""
    Pipeline for unconditional sequence generation with a discrete flow matching model.

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`DiscreteFlowTransformerModel`]): predicts the logits of `x1` from `(x_t, t)`; any module with
            `forward(input_ids, timestep)` returning `.logits` of shape `(B, L, V)` and a `config.sequence_length`.
        scheduler ([`DiscreteFlowMatchingScheduler`]): the path (source, kappa) the model was trained on.
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["sequences", "logits"]

    def __init__(self, model, scheduler: DiscreteFlowMatchingScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def sequence_length(self) -> int:
        return int(self.model.config.sequence_length)

    def check_inputs(self, batch_size, num_inference_steps, generator, latents, output_type, tensor_inputs) -> int:
        """Validate the call before any model work; return the batch size."""
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        if latents is not None:
            if not isinstance(latents, torch.Tensor) or latents.dtype != torch.long or latents.ndim != 2:
                raise ValueError(
                    f"`latents` must be a (batch, length) LongTensor of source token ids, got {latents!r}."
                )
            if latents.shape[1] != self.sequence_length:
                raise ValueError(
                    f"`latents` must have length {self.sequence_length} (the model's sequence_length), got "
                    f"{latents.shape[1]}."
                )
            if latents.min() < 0 or latents.max() >= self.scheduler.num_embeddings:
                raise ValueError(
                    f"`latents` ids must lie in [0, {self.scheduler.num_embeddings}) (data and mask tokens)."
                )
            batch_size = latents.shape[0]
        check_positive_int("batch_size", batch_size)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(f"`generator` is a list of {len(generator)}, but `batch_size` is {batch_size}.")
        vocab = getattr(self.model.config, "vocab_size", None)
        if vocab is not None and vocab != self.scheduler.config.vocab_size:
            raise ValueError(
                f"the model predicts {vocab} tokens but the scheduler's `vocab_size` is "
                f"{self.scheduler.config.vocab_size}."
            )
        return batch_size

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 64,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.LongTensor | None = None,
        output_type: str = "seq",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> DiscreteFlowPipelineOutput | tuple:
        r"""
        Generate sequences.

        Args:
            batch_size (`int`, defaults to 1): number of sequences (ignored when `latents` is given).
            num_inference_steps (`int`, defaults to 64): Euler steps; each is one model evaluation (NFE).
            generator (`torch.Generator` or a list of `batch_size`, *optional*): randomness; with a list, sequence
                `b` depends on `generator[b]` only.
            latents (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): source sequences
                `x0`; drawn from the scheduler's source if not given.
            output_type (`str`, defaults to `"seq"`): `"seq"` (a LongTensor) or `"np"` (an int64 array).
            return_dict (`bool`, defaults to `True`): return a [`DiscreteFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return replacements for `sequences`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                passed to the callback (default `["sequences"]`).

        Returns:
            [`DiscreteFlowPipelineOutput`] or `(sequences, nfe, num_jumps)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["sequences"]
        batch_size = self.check_inputs(
            batch_size, num_inference_steps, generator, latents, output_type, callback_on_step_end_tensor_inputs
        )
        device = self._execution_device
        if latents is None:
            sequences = self.scheduler.sample_source((batch_size, self.sequence_length), generator, device)
        else:
            sequences = latents.to(device)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        num_jumps = torch.zeros(batch_size, dtype=torch.long, device=device)
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                logits = self.model(sequences, t.expand(batch_size)).logits
                out = self.scheduler.step(logits, t, sequences, generator=generator)
                num_jumps += out.jumped.sum(-1)
                sequences = out.prev_sample
                if callback_on_step_end is not None:
                    local_vars = {"sequences": sequences, "logits": logits}
                    callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                    callback_outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    sequences = callback_outputs.pop("sequences", sequences)
                progress_bar.update()

        self.maybe_free_model_hooks()
        if output_type == "np":
            sequences = sequences.cpu().numpy()
        if not return_dict:
            return (sequences, num_inference_steps, num_jumps)
        return DiscreteFlowPipelineOutput(sequences=sequences, nfe=num_inference_steps, num_jumps=num_jumps)
