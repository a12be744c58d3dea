"""[`DiffusionTrainerConfig`]: the options every trainer of the pack shares, with `TrainingArguments`' names."""

from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple

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


class GenerationBatch(NamedTuple):
    """A GRPO step's generation batch for a number of processes ([`BaseGRPOConfig.resolve_generation_batch`])."""

    generation_batch_size: int
    """Samples generated per step over all processes."""
    steps_per_generation: int
    """Micro-batches of `per_device_train_batch_size` samples per process in it."""
    per_process: int
    """Samples each process generates: `per_device_train_batch_size * steps_per_generation`."""


@public
@dataclass
class BaseGRPOConfig(DiffusionTrainerConfig):
    r"""
    The GRPO options shared by [`DiffusionGRPOConfig`] (images) and [`GraphGRPOConfig`] (graphs), with the names and
    meanings of TRL's `GRPOConfig`; a subclass re-declares a field only to change its default or its help.

    One training step generates one generation batch: `generation_batch_size` samples over all processes (default
    `per_device_train_batch_size * num_processes * steps_per_generation`, as in TRL), in groups of `num_generations`
    (each group on one process, so the samples per process, `per_device_train_batch_size * steps_per_generation`,
    must be a multiple of `num_generations`). It scores them and makes `num_iterations` passes over them; a pass goes
    through the `steps_per_generation` micro-batches of `per_device_train_batch_size` samples per process, and every
    `gradient_accumulation_steps` micro-batches make one optimizer step. `steps_per_generation` defaults to
    `gradient_accumulation_steps` (one optimizer step per pass, TRL's default) and must be a multiple of it. The
    trainer resolves the two at construction ([`~BaseGRPOConfig.resolve_generation_batch`]), when the number of
    processes is known.
    """

    #: the values `scale_rewards` may take (a subclass may add its own)
    scale_rewards_choices: ClassVar[tuple[str, ...]] = ("group", "batch", "none")

    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples generated per step over all processes. None: per_device_train_batch_size * "
            "num_processes * steps_per_generation. Mutually exclusive with steps_per_generation."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches of per_device_train_batch_size samples per process in one generation batch (every "
            "gradient_accumulation_steps of them make one optimizer step). None: gradient_accumulation_steps. "
            "Mutually exclusive with generation_batch_size."
        },
    )
    num_iterations: int = field(
        default=1, metadata={"help": "Passes over each generation batch (TRL's mu); >1 makes the ratio move."}
    )
    num_generations: int = field(
        default=8,
        metadata={
            "help": "Samples per group (the group size G: images of one prompt, graphs of one node count), >= 2."
        },
    )
    beta: float = field(
        default=0.0,
        metadata={"help": "Weight of the KL to the reference model (the model with its LoRA adapter disabled)."},
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range of the ratio."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clip range of the ratio; None: the same as `epsilon`."}
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "Divide advantages by the std of the 'group' (TRL's default, kept here), of the whole 'batch' on "
            "all processes (Flow-GRPO's global std: groups with little spread get small advantages), or 'none'."
        },
    )
    adv_clip_max: float = field(
        default=5.0, metadata={"help": "Advantages are clipped to [-adv_clip_max, +adv_clip_max]."}
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per reward function; None: all 1."}
    )
    reward_std_tolerance: float = field(
        default=1e-6, metadata={"help": "A group whose reward std is at most this counts in frac_reward_zero_std."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(
            "num_generations",
            self.num_generations,
            minimum=2,
            expected=">= 2: group-relative advantages need at least two samples per group",
        )
        check_positive_int("num_iterations", self.num_iterations, expected=">= 1")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                "`generation_batch_size` and `steps_per_generation` cannot both be set (as in TRL's GRPOConfig), got "
                f"{self.generation_batch_size} and {self.steps_per_generation}."
            )
        for name in ("generation_batch_size", "steps_per_generation"):
            check_positive_int(name, getattr(self, name), optional=True)
        if self.generation_batch_size is not None and self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"`generation_batch_size` ({self.generation_batch_size}) must be a multiple of `num_generations` "
                f"({self.num_generations})."
            )
        if self.generation_batch_size is None:
            self.check_steps_per_generation(self.steps_per_generation or self.gradient_accumulation_steps)
        if self.scale_rewards not in self.scale_rewards_choices:
            raise ValueError(
                f"`scale_rewards` must be one of {self.scale_rewards_choices}, got {self.scale_rewards!r}."
            )
        if not self.epsilon > 0 or (self.epsilon_high is not None and not self.epsilon_high > 0):
            raise ValueError(f"`epsilon` and `epsilon_high` must be > 0, got {self.epsilon}, {self.epsilon_high}.")
        for name in ("beta", "adv_clip_max", "reward_std_tolerance"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)!r}.")
        if self.reward_weights is not None:
            self.reward_weights = [float(w) for w in self.reward_weights]

    def check_steps_per_generation(self, steps_per_generation: int) -> None:
        """Raise unless `steps_per_generation` micro-batches per process hold whole groups and whole optimizer steps."""
        samples = self.per_device_train_batch_size * steps_per_generation
        if samples % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size * steps_per_generation = {self.per_device_train_batch_size} * "
                f"{steps_per_generation} = {samples} samples per process per step must be a multiple of "
                f"`num_generations` ({self.num_generations}): each group is generated on one process."
            )
        if steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(
                f"`steps_per_generation` ({steps_per_generation}) must be a multiple of `gradient_accumulation_steps` "
                f"({self.gradient_accumulation_steps}): a generation batch makes whole optimizer steps."
            )

    def resolve_generation_batch(self, num_processes: int) -> GenerationBatch:
        """The [`GenerationBatch`] (`generation_batch_size`, `steps_per_generation`, `per_process`) for
        `num_processes` processes, as TRL's `GRPOConfig` resolves them (the config itself is left as given)."""
        global_batch = self.per_device_train_batch_size * num_processes
        if self.generation_batch_size is None:
            steps = self.steps_per_generation or self.gradient_accumulation_steps
        elif self.generation_batch_size % global_batch:
            raise ValueError(
                f"`generation_batch_size` ({self.generation_batch_size}) must be divisible by the global batch size "
                f"per_device_train_batch_size * num_processes = {self.per_device_train_batch_size} * {num_processes} "
                f"= {global_batch}."
            )
        else:
            steps = self.generation_batch_size // global_batch
            self.check_steps_per_generation(steps)
        return GenerationBatch(global_batch * steps, steps, self.per_device_train_batch_size * steps)


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
