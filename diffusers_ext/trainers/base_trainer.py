r"""
[`DiffusionTrainer`]: what every trainer of the pack shares (accelerator, optimizer, metrics, loop, checkpoints).

Why not `transformers.Trainer`? TRL's `GRPOTrainer` subclasses it, and for language models that is right: the model
is a `PreTrainedModel`, a step is "a batch from a DataLoader through `compute_loss`", and `Trainer` brings the data
collator, evaluation loop, schedulers, Hub push and DeepSpeed/FSDP wiring around that. Our trainers fit that mould
badly:

- The trained object is a diffusers denoiser (`UNet2DModel`, `SD3Transformer2DModel`, ...) inside a pipeline, with
  frozen copies (the pretrained reference), a VAE and text encoders that must stay out of the optimizer and off the
  `Trainer`'s `model` slot, and LoRA adapters added through diffusers' own peft integration.
- A step is not a DataLoader batch: GRPO samples images with the model itself (a stochastic ODE/SDE rollout),
  scores them and then takes several optimizer steps over every stored denoising transition; unlearning draws from
  sample pools of the model being trained and updates a dual variable after each primal step. `Trainer` would be
  driven through `get_train_dataloader`/`training_step`/`compute_loss` overrides that bypass most of what it does,
  and its epoch/sampler logic would fight our step-indexed, exactly resumable random draws.
- Checkpoints must hold state `Trainer` does not know (the dual variable and the on-policy sample pool, E²PO's
  per-prompt scale controller) and be written atomically so a crash never loses the last good one; results are
  diffusers artefacts (a pipeline folder or a `load_lora_weights` file with a model card), not a `PreTrainedModel`.

So the trainers are built directly on `accelerate.Accelerator` (which `Trainer` itself uses underneath), the way
diffusers' own training scripts are, while keeping TRL's user-facing shape: a config dataclass whose fields carry
`TrainingArguments`' names ([`DiffusionTrainerConfig`]), a trainer constructed from `(model, ..., args, datasets)`,
`train()`, `training_step()`, `save_model()`, `history` and metrics sent to the accelerate trackers.

A subclass implements `training_step()` (one step at `self.global_step`: sample, compute targets/rewards, backward,
optimizer step; returns the step's metrics averaged over processes), and for `save_model` the hooks `_save_weights`,
`_card_title`, `_card_description` (and optionally `_card_metrics`). Trainer state beyond the accelerator's (weights,
optimizer, RNG) is checkpointed either by naming a `state_file` and implementing `state_dict`/`load_state_dict`, or
with `accelerator.register_for_checkpointing`.
"""

import abc
import math
import os
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch
from diffusers.utils import logging

from ..training_utils import (
    build_accelerator,
    command_line,
    maybe_resume,
    push_to_hub,
    save_checkpoint,
    write_model_card,
)
from ..utils import public
from .base_config import DiffusionTrainerConfig


logger = logging.get_logger(__name__)


@public
class DiffusionTrainer(abc.ABC):
    r"""
    Base class of the pack's trainers: it owns the `Accelerator`, the AdamW optimizer, the per-step metrics, the
    training loop, checkpoint/resume and `save_model`. See the module docstring for why it is not a
    `transformers.Trainer`.

    Attributes:
        args ([`DiffusionTrainerConfig`] subclass): the configuration.
        accelerator (`accelerate.Accelerator`): built from `args` (`output_dir`, `logging_dir`, `mixed_precision`,
            `report_to`, the accumulation steps) unless the subclass was given one.
        optimizer: the prepared AdamW optimizer (`create_optimizer`).
        global_step (`int`): finished training steps; a checkpoint `checkpoint-<global_step>` resumes exactly.
        history (`list[dict]`): every step's metrics, with its `step`.
        stop_reason (`str` or None): set by a subclass to end training early (a checkpoint is saved there).
    """

    config_class = DiffusionTrainerConfig
    state_file: str | None = None
    _tag_names = ["diffusers-ext"]
    _progress_keys = ("loss", "reward")

    def __init__(self, args: DiffusionTrainerConfig | None):
        args = args if args is not None else self.config_class()
        if not isinstance(args, self.config_class):
            raise TypeError(f"`args` must be a {self.config_class.__name__}, got {type(args).__name__}.")
        self.args = args
        self.accelerator = None
        self.optimizer = None
        self.global_step = 0
        self.history: list[dict[str, float]] = []
        self.stop_reason: str | None = None
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._resumed = False

    # ------------------------------------------------------------------------------------------------------------
    # Set-up helpers for subclasses
    # ------------------------------------------------------------------------------------------------------------

    def create_accelerator(self, accelerator=None, gradient_accumulation_steps: int | None = None):
        """Build the `Accelerator` from `args`, or check a given one accumulates as this trainer needs."""
        args = self.args
        steps = (
            args.gradient_accumulation_steps if gradient_accumulation_steps is None else gradient_accumulation_steps
        )
        if accelerator is None:
            accelerator = build_accelerator(
                args.output_dir, args.logging_dir, args.mixed_precision, args.report_to, steps
            )
        elif accelerator.gradient_accumulation_steps != steps:
            raise ValueError(
                f"the given `accelerator` accumulates {accelerator.gradient_accumulation_steps} micro-steps; this "
                f"trainer needs {steps} (build it with `Accelerator(gradient_accumulation_steps={steps})`, or pass "
                "none)."
            )
        self.accelerator = accelerator
        if self.state_file is not None:
            accelerator.register_save_state_pre_hook(self._save_state_hook)
            accelerator.register_load_state_pre_hook(self._load_state_hook)
        return accelerator

    def create_optimizer(self, parameters) -> torch.optim.Optimizer:
        """AdamW over `parameters` with the config's learning rate, betas, epsilon and weight decay (not prepared)."""
        args = self.args
        return torch.optim.AdamW(
            parameters,
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            weight_decay=args.weight_decay,
            eps=args.adam_epsilon,
        )

    def prepare_trained_model(self, model: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
        """Prepare `model` and an AdamW optimizer over its trainable parameters (`self.optimizer`).

        Returns `(prepared_model, trainable_parameters)`, the parameters read from the *prepared* model: FSDP (and
        DeepSpeed ZeRO-3) replace a module's parameters when wrapping it, so lists taken before `prepare` (for an EMA,
        gradient clipping) would point at tensors the optimizer no longer updates. With `gradient_checkpointing` set,
        checkpointing is switched on first (a `ValueError` if the model does not support it).
        """
        if self.args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        parameters = [p for p in model.parameters() if p.requires_grad]
        prepared, self.optimizer = self.accelerator.prepare(model, self.create_optimizer(parameters))
        return prepared, [p for p in prepared.parameters() if p.requires_grad]

    @property
    def shards_parameters(self) -> bool:
        """Whether prepared models hold only a shard of their parameters on each process (FSDP, DeepSpeed ZeRO-3).

        Then the unwrapped model on the main process does not hold the full weights, and saving must gather them
        first ([`~DiffusionTrainer.gathered_state_dict`])."""
        from ..training_utils import shards_parameters

        return shards_parameters(self.accelerator)

    def gathered_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full state dict of the prepared `model`, gathered from every process's shards when parameters are
        sharded (`shards_parameters`; a collective, so call it on every process); `None` otherwise, where the
        unwrapped model already holds the full weights on every process."""
        return self.accelerator.get_state_dict(model) if self.shards_parameters else None

    def clip_gradients(self, parameters, model: torch.nn.Module | None = None) -> float:
        """Clip the gradients to `max_grad_norm` (none when <= 0); return their norm before clipping.

        Args:
            parameters: the trained parameters (a LoRA subset, say).
            model (`torch.nn.Module`, *optional*): the prepared model holding them. Under FSDP the norm must be taken
                by the model itself over its shards (accelerate does that only when `parameters` are all of the
                model's; for a subset it would fall back to a local norm of this process's shard): with `model`, all
                its parameters are passed, which is the same norm, frozen parameters having no gradient.

        Under DeepSpeed, clipping is DeepSpeed's (its `gradient_clipping` setting) and accelerate returns no norm
        before the engine's first step: the result is then NaN, not an error.
        """
        from accelerate.utils import DistributedType

        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else math.inf
        if model is not None and self.accelerator.distributed_type == DistributedType.FSDP:
            parameters = list(model.parameters())
        norm = self.accelerator.clip_grad_norm_(parameters, max_norm)
        return math.nan if norm is None else float(norm)

    def log_metric(self, name: str, value: float) -> None:
        """Record one value of a metric for the current step (averaged with the step's other values)."""
        self._metrics[name].append(float(value))

    def reduce_metrics(self, values: dict[str, float | torch.Tensor]) -> dict[str, float]:
        """Average each metric over the processes that measured it; returns plain floats.

        Processes may log different metrics in a step (one whose images were all dropped computes no loss): the
        names are gathered first, so every process takes part in the same reduction, and a metric is the mean over
        the processes that have it (NaN if none has a value). The order is this process's, then the others' names.
        """
        accelerator = self.accelerator
        names = list(values)
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            for other in gather_object([names]):
                names += [name for name in other if name not in names]
        if not names:
            return {}
        sums = torch.zeros(len(names), dtype=torch.float64)
        counts = torch.zeros(len(names), dtype=torch.float64)
        for i, name in enumerate(names):
            if name in values:
                sums[i] = float(torch.as_tensor(values[name], dtype=torch.float64).reshape(()))
                counts[i] = 1.0
        totals = accelerator.reduce(torch.stack([sums, counts]).to(accelerator.device), reduction="sum").cpu()
        means = torch.where(totals[1] > 0, totals[0] / totals[1].clamp_min(1), torch.full_like(totals[0], math.nan))
        return dict(zip(names, means.tolist()))

    # ------------------------------------------------------------------------------------------------------------
    # The loop
    # ------------------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def training_step(self) -> dict[str, float]:
        """One training step at `self.global_step`; returns its metrics, averaged over processes."""

    def on_train_begin(self) -> None:
        """Hook called by `train` before the first step of each call (after resuming)."""
        return None  # an optional hook: nothing to do by default

    def resume(self) -> int:
        """Load the checkpoint `args.resume_from_checkpoint` names (if any, once); return the step it resumed at."""
        args = self.args
        if args.resume_from_checkpoint is None or self._resumed:
            return self.global_step
        self._resumed = True
        step = maybe_resume(self.accelerator, args.output_dir, args.resume_from_checkpoint, logger)
        if step and self.global_step not in (0, step):
            raise ValueError(f"the checkpoint of step {step} holds trainer state of step {self.global_step}.")
        if step:
            self.global_step = step
        return step

    def train(self, max_steps: int | None = None) -> list[dict[str, float]]:
        """Run (or resume, per `args.resume_from_checkpoint`) until `max_steps` (default `args.max_steps`) or until
        `stop_reason` is set; return `history`. Calling it again with a larger `max_steps` continues."""
        args, accelerator = self.args, self.accelerator
        max_steps = args.max_steps if max_steps is None else max_steps
        self.resume()
        if accelerator.is_main_process and not accelerator.trackers:
            accelerator.init_trackers(type(self).__name__, config={k: str(v) for k, v in args.to_dict().items()})
        self.on_train_begin()
        progress = None
        if not args.disable_tqdm and accelerator.is_local_main_process:
            from tqdm.auto import tqdm

            progress = tqdm(total=max_steps, initial=self.global_step, desc=type(self).__name__)
        while self.global_step < max_steps and self.stop_reason is None:
            self._metrics.clear()
            logs = self.training_step()
            self.finish_step(logs, max_steps)
            if progress is not None:
                progress.update(1)
                progress.set_postfix({k: f"{v:.4g}" for k, v in logs.items() if k in self._progress_keys})
            finished = self.global_step == max_steps or self.stop_reason is not None
            if args.save_strategy == "steps" and (self.global_step % args.save_steps == 0 or finished):
                self.save_checkpoint()
        if progress is not None:
            progress.close()
        accelerator.wait_for_everyone()
        return self.history

    def finish_step(self, logs: dict[str, float], max_steps: int) -> None:
        """Count the step, keep its metrics in `history` and send them to the trackers every `logging_steps`."""
        self.global_step += 1
        self.history.append({**logs, "step": self.global_step})
        if self.global_step % self.args.logging_steps == 0 or self.global_step == max_steps:
            self.accelerator.log(logs, step=self.global_step)

    def save_checkpoint(self) -> str:
        """Save `output_dir/checkpoint-<global_step>` atomically (the last good one survives a crash).

        Call on every process."""
        path = save_checkpoint(self.accelerator, self.args.output_dir, self.global_step, self.args.save_total_limit)
        logger.info(f"Saved {path}")
        return path

    # ------------------------------------------------------------------------------------------------------------
    # Trainer state in checkpoints
    # ------------------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Trainer state beyond the accelerator's, as tensors (saved to `state_file` in every checkpoint)."""
        return {"global_step": torch.tensor(self.global_step)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.global_step = int(state["global_step"])

    def _save_state_hook(self, models, weights, output_dir):
        from safetensors.torch import save_file

        if self.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
            save_file(self.state_dict(), os.path.join(output_dir, self.state_file))

    def _load_state_hook(self, models, input_dir):
        from safetensors.torch import load_file

        path = os.path.join(input_dir, self.state_file)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {input_dir!r} has no {self.state_file}; it was not saved by this trainer.")
        self.load_state_dict(load_file(path))

    # ------------------------------------------------------------------------------------------------------------
    # Saving the result
    # ------------------------------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, base_model: str | None = None, metrics: dict | None = None):
        """Save the trained weights (`_save_weights`) and a model card into `output_dir` (default `args.output_dir`).

        `metrics` (e.g. measured quality) are added to the card's table; with `args.push_to_hub` the folder is then
        uploaded to `args.hub_model_id`. Call on every process; only the main one writes. Returns `output_dir`.
        """
        output_dir = output_dir or self.args.output_dir
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
        # every process: gathering sharded weights is a collective; only the main process writes
        self._save_weights(output_dir)
        if self.accelerator.is_main_process:
            write_model_card(
                output_dir,
                title=self._card_title(base_model),
                description=self._card_description(),
                command=command_line(),
                metrics={**self._card_metrics(), **(metrics or {})},
                tags=self._card_tags(),
                base_model=base_model,
            )
            if self.args.push_to_hub:
                push_to_hub(output_dir, self.args.hub_model_id, self.args.hub_token, logger)
        self.accelerator.wait_for_everyone()
        return output_dir

    @abc.abstractmethod
    def _save_weights(self, output_dir: str) -> None:
        """Write the trained weights (a pipeline folder, or LoRA files) into `output_dir`.

        Called on every process: gather sharded weights there (`gathered_state_dict`), then write on the main
        process only."""

    def _card_title(self, base_model: str | None) -> str:
        return type(self).__name__.replace("Trainer", "") + (f" of {base_model}" if base_model else "")

    def _card_description(self) -> str:
        return f"Trained by `{type(self).__name__}` (diffusers-ext) for {self.global_step} steps."

    def _card_metrics(self) -> dict:
        return {}

    def _card_tags(self) -> list[str]:
        return list(self._tag_names)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Switch on `model`'s own gradient checkpointing: diffusers' `enable_gradient_checkpointing` or transformers'
    `gradient_checkpointing_enable` (a peft-wrapped model forwards either to its base model).

    Raises a `ValueError` naming the model's class when it supports neither, rather than training without it (the
    user asked for the memory it saves)."""
    for method in ("enable_gradient_checkpointing", "gradient_checkpointing_enable"):
        if callable(getattr(model, method, None)) and getattr(model, "_supports_gradient_checkpointing", True):
            getattr(model, method)()
            return
    raise ValueError(
        f"`gradient_checkpointing=True`, but {type(model).__name__} supports no gradient checkpointing (it has "
        "neither diffusers' `enable_gradient_checkpointing` nor transformers' `gradient_checkpointing_enable`)."
    )


def dataset_arrays(train_dataset, columns: dict[str, str], name: str = "train_dataset") -> dict[str, np.ndarray]:
    """The numeric `columns` of a trainer's `train_dataset`, stacked in row order as float32 arrays.

    `train_dataset` is a `datasets.Dataset` or a list of rows (dicts), as TRL's trainers take it; every row must have
    every column, and a column's entries one shape. `columns` maps each column name to what it holds (`"an array of
    shape (V, T)"`), for the errors, which name the argument, the row and what was expected; they are raised before
    any training work.
    """
    expected = ", ".join(f"{column!r} ({what})" for column, what in columns.items())
    if train_dataset is None:
        raise ValueError(f"`{name}` is required: a datasets.Dataset or a list of dicts with columns {expected}.")
    if hasattr(train_dataset, "column_names") and hasattr(train_dataset, "with_format"):  # a datasets.Dataset
        missing = [column for column in columns if column not in train_dataset.column_names]
        if missing:
            raise ValueError(
                f"`{name}` has columns {train_dataset.column_names}; expected {expected} (missing {missing})."
            )
        table = train_dataset.with_format("numpy")[:] if len(train_dataset) else {}
        values = {column: table.get(column, []) for column in columns}
    elif isinstance(train_dataset, (list, tuple)):
        for index, row in enumerate(train_dataset):
            if not isinstance(row, Mapping) or any(column not in row for column in columns):
                got = f"columns {sorted(row)}" if isinstance(row, Mapping) else type(row).__name__
                raise ValueError(f"`{name}` row {index} must be a dict with columns {expected}, got {got}.")
        values = {column: [row[column] for row in train_dataset] for column in columns}
    else:
        raise TypeError(
            f"`{name}` must be a datasets.Dataset or a list of dicts with columns {expected}, got "
            f"{type(train_dataset).__name__}."
        )
    if not len(train_dataset):
        raise ValueError(f"`{name}` is empty: give at least one row with columns {expected}.")
    arrays = {}
    for column, entries in values.items():
        if isinstance(entries, np.ndarray) and entries.dtype.kind in "fiu":
            arrays[column] = entries.astype(np.float32, copy=False)
            continue
        rows = []
        for index, entry in enumerate(entries):
            try:
                row = np.asarray(entry, dtype=np.float32)
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"`{name}` row {index} has a non-numeric {column!r}: {entry!r:.80}; expected {columns[column]}."
                ) from error
            rows.append(row)
        for index, row in enumerate(rows):
            if row.shape != rows[0].shape:
                raise ValueError(
                    f"`{name}` row {index} has {column!r} of shape {row.shape}, row 0 of shape {rows[0].shape}; "
                    f"expected {columns[column]} for every row."
                )
        arrays[column] = np.stack(rows)
    return arrays
