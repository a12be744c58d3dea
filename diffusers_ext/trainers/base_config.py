"""[`DiffusionTrainerConfig`]: the options every trainer of the pack shares, with `TrainingArguments`' names."""

from dataclasses import dataclass, field, fields

from ..utils import check_output_dir, check_positive_int, public


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

    LoRA is not a config option: as in TRL, a trainer takes `peft_config` (a `peft.LoraConfig`; None trains all
    weights). The training scripts build it from [`LoraArguments`].
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
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the saved result to the Hub (`save_model`)."})
    hub_model_id: str | None = field(
        default=None, metadata={"help": "Hub repository of `push_to_hub` (default: the output folder's name)."}
    )
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the logged-in one)."})

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
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Recompute the trained model's activations in the backward pass instead of storing them (less "
            "memory, about a third more compute); the model must support it, as diffusers' and transformers' do."
        },
    )

    def __post_init__(self):
        if self.output_dir is not None:  # None: a script's "required" sentinel, checked by the script
            check_output_dir("output_dir", self.output_dir)
        for name in (
            "max_steps",
            "logging_steps",
            "save_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
        ):
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

    def to_dict(self) -> dict:
        """The fields as a plain dict (for trackers and model cards)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@public
@dataclass
class LoraArguments:
    r"""
    The LoRA options of the training scripts, one set for every trainer: `to_peft_config()` turns them into the
    `peft.LoraConfig` a trainer takes as `peft_config` (None without `use_lora`), as TRL's `ModelConfig` /
    `get_peft_config` do for its scripts. Each script sets its own defaults on the parser.
    """

    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha (default: the rank)."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names that get LoRA layers; None: the trainer's default targets."}
    )
    lora_init: str = field(default="gaussian", metadata={"help": "peft `init_lora_weights` ('gaussian' or 'true')."})

    def __post_init__(self):
        check_positive_int("lora_rank", self.lora_rank)
        if self.lora_init not in ("gaussian", "true"):
            raise ValueError(f"`lora_init` must be 'gaussian' or 'true', got {self.lora_init!r}.")

    def to_peft_config(self):
        """The `peft.LoraConfig` of these options, or None without `use_lora` (train all weights)."""
        if not self.use_lora:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_rank,
            lora_alpha=self.lora_alpha or self.lora_rank,
            init_lora_weights=True if self.lora_init == "true" else self.lora_init,
            target_modules=self.lora_target_modules,
        )


def with_default_targets(peft_config, targets: list[str]):
    """A copy of `peft_config` whose `target_modules` are `targets` when it names none (the trainer's defaults)."""
    import copy

    if peft_config is None or peft_config.target_modules is not None:
        return peft_config
    peft_config = copy.deepcopy(peft_config)
    peft_config.target_modules = set(targets)
    return peft_config
