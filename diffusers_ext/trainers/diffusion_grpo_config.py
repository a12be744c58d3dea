"""Configuration of [`DiffusionGRPOTrainer`]: TRL's `GRPOConfig` names where they apply, plus the sampler's."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, public
from .base_config import DiffusionTrainerConfig


SCALE_REWARDS = ("group", "batch", "none")
TIMESTEP_SELECTIONS = ("first", "random")
SD3_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


@public
@dataclass
class DiffusionGRPOConfig(DiffusionTrainerConfig):
    r"""
    Configuration of [`DiffusionGRPOTrainer`], GRPO for flow-matching text-to-image pipelines (Flow-GRPO).

    Names follow TRL's `GRPOConfig` where the concept is the same, with its meanings (`num_generations`, `beta`,
    `epsilon`, `scale_rewards`, `reward_weights`, `num_iterations`, `generation_batch_size`, `steps_per_generation`);
    the shared options (`output_dir`, `max_steps`, `per_device_train_batch_size`, `gradient_accumulation_steps`,
    `learning_rate`, `weight_decay`, `logging_steps`, `save_steps`, `report_to`, ...) are [`DiffusionTrainerConfig`]'s,
    named as in `transformers.TrainingArguments`; the sampler's options are Flow-GRPO's. LoRA comes from the
    trainer's `peft_config`, as in TRL.

    One training step generates one generation batch: `generation_batch_size` images over all processes (default
    `per_device_train_batch_size * num_processes * steps_per_generation`, as in TRL), in groups of
    `num_generations` images of one prompt (each group on one process, so the images per process,
    `per_device_train_batch_size * steps_per_generation`, must be a multiple of `num_generations`). It scores them
    and makes `num_iterations` passes over them; a pass goes through the `steps_per_generation` micro-batches of
    `per_device_train_batch_size` images per process, and every `gradient_accumulation_steps` micro-batches (their
    losses at every trained timestep) make one optimizer step. `steps_per_generation` defaults to
    `gradient_accumulation_steps` (one optimizer step per pass, TRL's default) and must be a multiple of it. The
    trainer resolves the two at construction (`trainer.generation_batch_size`, `trainer.steps_per_generation`),
    when the number of processes is known.

    Every field has a `help` entry, so `trl.TrlParser((DiffusionGRPOConfig,))` builds a command line (and YAML)
    parser from it.
    """

    # The shared fields of DiffusionTrainerConfig, with this trainer's defaults and meanings
    output_dir: str = field(
        default="diffusion-grpo", metadata={"help": "Where LoRA weights, checkpoints and logs go."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of prompt order, initial noise and SDE noise."})
    max_steps: int = field(default=100, metadata={"help": "Training steps (one generation round each)."})
    learning_rate: float = field(default=3e-4, metadata={"help": "AdamW learning rate (constant)."})
    weight_decay: float = field(default=1e-4, metadata={"help": "AdamW weight decay."})
    per_device_train_batch_size: int = field(
        default=8, metadata={"help": "Images per process in one loss micro-batch."}
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "Micro-batches whose losses (at every trained timestep) make one optimizer step."},
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Images generated per step over all processes. None: per_device_train_batch_size * num_processes "
            "* steps_per_generation. Mutually exclusive with steps_per_generation."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches of per_device_train_batch_size images per process in one generation batch. None: "
            "gradient_accumulation_steps. Mutually exclusive with generation_batch_size."
        },
    )

    # GRPO
    num_iterations: int = field(
        default=1, metadata={"help": "Optimizer steps on each generated batch (TRL's mu); >1 makes the ratio move."}
    )
    num_generations: int = field(default=8, metadata={"help": "Images per prompt (the group size G), >= 2."})
    beta: float = field(
        default=0.0,
        metadata={"help": "Weight of the KL to the reference model (the same model with the LoRA adapter disabled)."},
    )
    epsilon: float = field(
        default=1e-4,
        metadata={"help": "Lower clip range of the ratio; tiny because log-probs are averaged over dimensions."},
    )
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
    drop_zero_advantage: bool = field(
        default=False,
        metadata={
            "help": "Leave the images of groups without reward spread (std <= reward_std_tolerance, so advantage 0) "
            "out of the loss: they carry no policy gradient, so this skips their forward/backward and averages the "
            "loss over informative images only (their KL term is dropped too). Off by default, as in Flow-GRPO."
        },
    )
    use_ema: bool = field(
        default=False,
        metadata={
            "help": "Keep an EMA of the trained weights (diffusers' EMAModel); `save_model` and `ema_weights()` use it "
            "(Flow-GRPO: on, 0.9 every 8 optimizer steps). Off by default: the saved weights are the policy."
        },
    )
    ema_decay: float = field(default=0.9, metadata={"help": "EMA decay (constant), used with `use_ema`."})
    ema_update_steps: int = field(
        default=8, metadata={"help": "Update the EMA every N optimizer steps (Flow-GRPO: 8), used with `use_ema`."}
    )

    # Sampling
    num_inference_steps: int = field(default=10, metadata={"help": "Denoising steps of each rollout."})
    guidance_scale: float = field(
        default=4.5,
        metadata={
            "help": "Guidance during rollouts and their rescoring: classifier-free (SD3; the unconditional branch is "
            "detached; <= 1 turns it off) or distilled (Flux). 4.5 as Flow-GRPO on SD3.5."
        },
    )
    negative_prompt: str = field(default="", metadata={"help": "Negative prompt of classifier-free guidance."})
    height: int | None = field(default=None, metadata={"help": "Image height; None: the pipeline's default."})
    width: int | None = field(default=None, metadata={"help": "Image width; None: the pipeline's default."})
    max_sequence_length: int = field(default=256, metadata={"help": "T5 prompt length."})
    noise_level: float = field(default=0.7, metadata={"help": "SDE noise level `a` of FlowMatchSDEScheduler."})
    sde_type: str = field(default="sde", metadata={"help": "'sde' (Flow-GRPO) or 'cps' (coefficient-preserving)."})
    sde_window: list[int] | None = field(
        default=None, metadata={"help": "Step indices [start, end) sampled stochastically and trained; None: all."}
    )
    timestep_fraction: float = field(
        default=0.99, metadata={"help": "Share of the stochastic steps trained per rollout (at least one)."}
    )
    timestep_selection: str = field(
        default="first",
        metadata={
            "help": "'first' (Flow-GRPO: the earliest steps, in order) or 'random' (DanceGRPO: a random subset)."
        },
    )
    vae_decode_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Images decoded per VAE call at the end of each rollout; None: the whole generation batch in one "
            "call. The decoder's peak memory grows with batch x resolution, so set it (e.g. 4) at SD3/Flux sizes."
        },
    )
    init_same_noise: bool = field(
        default=False,
        metadata={
            "help": "Start every member of a group from the same initial noise (DanceGRPO's --init_same_noise), so the "
            "spread comes from the SDE noise alone. Off by default, as in Flow-GRPO: independent noises spread more."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.num_generations < 2:
            raise ValueError(
                f"`num_generations` must be >= 2: group-relative advantages need at least two images per prompt, "
                f"got {self.num_generations}."
            )
        for name in ("num_iterations", "num_inference_steps", "max_sequence_length", "ema_update_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                "`generation_batch_size` and `steps_per_generation` cannot both be set (as in TRL's GRPOConfig), got "
                f"{self.generation_batch_size} and {self.steps_per_generation}."
            )
        for name in ("generation_batch_size", "steps_per_generation", "vae_decode_batch_size"):
            value = getattr(self, name)
            check_positive_int(name, value, optional=True)
        if self.generation_batch_size is not None and self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"`generation_batch_size` ({self.generation_batch_size}) must be a multiple of `num_generations` "
                f"({self.num_generations})."
            )
        if self.generation_batch_size is None:
            self.check_steps_per_generation(self.steps_per_generation or self.gradient_accumulation_steps)
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"`scale_rewards` must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}.")
        if self.timestep_selection not in TIMESTEP_SELECTIONS:
            raise ValueError(
                f"`timestep_selection` must be one of {TIMESTEP_SELECTIONS}, got {self.timestep_selection!r}."
            )
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"`timestep_fraction` must lie in (0, 1], got {self.timestep_fraction}.")
        if not self.epsilon > 0 or (self.epsilon_high is not None and not self.epsilon_high > 0):
            raise ValueError(f"`epsilon` and `epsilon_high` must be > 0, got {self.epsilon}, {self.epsilon_high}.")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"`ema_decay` must lie in [0, 1), got {self.ema_decay}.")
        if self.beta < 0:
            raise ValueError(f"`beta` must be >= 0, got {self.beta}.")
        if not self.noise_level > 0:
            raise ValueError(f"`noise_level` must be > 0 for a stochastic policy, got {self.noise_level}.")
        if self.sde_window is not None:
            if len(self.sde_window) != 2 or not 0 <= self.sde_window[0] < self.sde_window[1]:
                raise ValueError(f"`sde_window` must be [start, end) with 0 <= start < end, got {self.sde_window}.")
            if self.sde_window[0] >= self.num_inference_steps:
                raise ValueError(
                    f"`sde_window` {self.sde_window} starts after the last of {self.num_inference_steps} steps."
                )
            self.sde_window = [int(i) for i in self.sde_window]
        if self.reward_weights is not None:
            self.reward_weights = [float(w) for w in self.reward_weights]

    def check_steps_per_generation(self, steps_per_generation: int) -> None:
        """Raise unless `steps_per_generation` micro-batches per process hold whole groups and whole optimizer steps."""
        images = self.per_device_train_batch_size * steps_per_generation
        if images % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size * steps_per_generation = {self.per_device_train_batch_size} * "
                f"{steps_per_generation} = {images} images per process per step must be a multiple of "
                f"`num_generations` ({self.num_generations}): each group is generated on one process."
            )
        if steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(
                f"`steps_per_generation` ({steps_per_generation}) must be a multiple of `gradient_accumulation_steps` "
                f"({self.gradient_accumulation_steps}): a generation batch makes whole optimizer steps."
            )

    def resolve_generation_batch(self, num_processes: int) -> tuple[int, int]:
        """`(generation_batch_size, steps_per_generation)` for `num_processes` processes, as TRL's `GRPOConfig`
        resolves them (the config itself is left as given)."""
        global_batch = self.per_device_train_batch_size * num_processes
        if self.generation_batch_size is None:
            steps = self.steps_per_generation or self.gradient_accumulation_steps
            return global_batch * steps, steps
        if self.generation_batch_size % global_batch:
            raise ValueError(
                f"`generation_batch_size` ({self.generation_batch_size}) must be divisible by the global batch size "
                f"per_device_train_batch_size * num_processes = {self.per_device_train_batch_size} * {num_processes} "
                f"= {global_batch}."
            )
        steps = self.generation_batch_size // global_batch
        self.check_steps_per_generation(steps)
        return self.generation_batch_size, steps
