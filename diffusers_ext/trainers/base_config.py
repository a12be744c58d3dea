"""[`DiffusionTrainerConfig`]: the options every trainer of the pack shares, with `TrainingArguments`' names."""

import warnings
from dataclasses import dataclass, field, fields

from ..utils import public


SAVE_STRATEGIES = ("no", "steps")
MIXED_PRECISIONS = (None, "no", "fp16", "bf16")


@public
@dataclass
class DiffusionTrainerConfig:
    r"""
    The options shared by every trainer of the pack ([`DiffusionGRPOConfig`], [`E2POConfig`],
    [`ConstrainedUnlearningConfig`]): output folder, seed, optimiser, accumulation, logging, checkpoints and the
    `Accelerator`.

    Names and meanings follow `transformers.TrainingArguments` (and TRL's configs, which extend it), so a user who
    knows `TrainingArguments(output_dir=..., per_device_train_batch_size=..., max_steps=..., save_steps=...)` knows
    these. What a "training step" is depends on the trainer (one generation round for GRPO, one primal-dual update
    for unlearning); each subclass's docstring says it. Every field has a `help` entry, so `trl.TrlParser` or
    `transformers.HfArgumentParser` builds a command line (and YAML) parser from a subclass.

    Subclasses may list renamed fields in `_deprecated_aliases` (`{old name: new name}`): an old name passed as a
    keyword still works for now, with a `FutureWarning` naming the new one.
    """

    # Output, logging and checkpoints
    output_dir: str = field(default="trainer_output", metadata={"help": "Where checkpoints, logs and results go."})
    seed: int = field(default=0, metadata={"help": "Seed of every random draw (batches, noise, samples)."})
    max_steps: int = field(default=100, metadata={"help": "Number of training steps."})
    logging_steps: int = field(default=1, metadata={"help": "Log metrics through the trackers every N steps."})
    logging_dir: str = field(default="logs", metadata={"help": "Tracker folder, relative to output_dir."})
    report_to: str = field(
        default="none", metadata={"help": "accelerate tracker: 'tensorboard', 'wandb', 'all' or 'none'."}
    )
    save_strategy: str = field(
        default="steps",
        metadata={"help": "'steps': save a resumable checkpoint every `save_steps` and at the end; 'no': never."},
    )
    save_steps: int = field(default=50, metadata={"help": "Save a resumable checkpoint every N steps."})
    save_total_limit: int | None = field(default=None, metadata={"help": "Keep at most N checkpoints (the newest)."})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'latest', a checkpoint folder name in output_dir, or a path."}
    )
    mixed_precision: str | None = field(
        default=None, metadata={"help": "'no', 'fp16' or 'bf16'; None takes accelerate's configuration."}
    )
    disable_tqdm: bool = field(default=False, metadata={"help": "Hide the progress bar."})

    # Optimisation
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (constant)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (<= 0: no clipping)."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Examples per process in a micro-batch."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches whose gradients make one optimizer step."}
    )

    _deprecated_aliases = {}

    def __post_init__(self):
        for name in ("max_steps", "logging_steps", "save_steps", "per_device_train_batch_size",
                     "gradient_accumulation_steps"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(f"`save_total_limit` must be None or >= 1, got {self.save_total_limit}.")
        if self.save_strategy not in SAVE_STRATEGIES:
            raise ValueError(f"`save_strategy` must be one of {SAVE_STRATEGIES}, got {self.save_strategy!r}.")
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(f"`mixed_precision` must be one of {MIXED_PRECISIONS}, got {self.mixed_precision!r}.")
        for name in ("learning_rate", "weight_decay", "adam_epsilon"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")

    def _apply_deprecated_aliases(self):
        """Move values given under an old field name to the new one (call first in a subclass's `__post_init__`)."""
        defaults = {f.name: f.default for f in fields(self)}
        for old, new in self._deprecated_aliases.items():
            value = getattr(self, old)
            if value is None:
                continue
            if getattr(self, new) != defaults[new] and getattr(self, new) != value:
                raise ValueError(
                    f"`{old}` is the deprecated name of `{new}`; got both ({old}={value!r}, "
                    f"{new}={getattr(self, new)!r})."
                )
            warnings.warn(
                f"`{type(self).__name__}({old}=...)` is deprecated and will be removed in a future release; use "
                f"`{new}` (the name `transformers.TrainingArguments` uses).",
                FutureWarning,
                stacklevel=4,
            )
            setattr(self, new, value)
            setattr(self, old, None)

    def to_dict(self) -> dict:
        """The fields as a plain dict (for trackers and model cards), without deprecated aliases."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self._deprecated_aliases}
