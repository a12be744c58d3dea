"""Configuration of [`DiffusionGRPOTrainer`]: TRL's `GRPOConfig` names where they apply, plus the sampler's."""

from dataclasses import dataclass, field

from ..utils import public
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

    Names follow TRL's `GRPOConfig` where the concept is the same (`num_generations`, `beta`, `epsilon`,
    `scale_rewards`, `reward_weights`, `num_iterations`); the shared options (`output_dir`, `max_steps`,
    `per_device_train_batch_size`, `gradient_accumulation_steps`, `learning_rate`, `weight_decay`, `logging_steps`,
    `save_steps`, `report_to`, ...) are [`DiffusionTrainerConfig`]'s, named as in `transformers.TrainingArguments`;
    the sampler's options are Flow-GRPO's. One training step generates
    `per_device_train_batch_size * gradient_accumulation_steps` images per process (groups of `num_generations`
    images of one prompt), scores them, and takes `num_iterations` optimizer steps on them, each accumulating the
    loss of every micro-batch of `per_device_train_batch_size` images at every trained timestep.

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
        metadata={
            "help": "Micro-batches per generation round; their losses (at every trained timestep) make one step."
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
    init_same_noise: bool = field(
        default=False,
        metadata={
            "help": "Start every member of a group from the same initial noise (DanceGRPO's --init_same_noise), so the "
            "spread comes from the SDE noise alone. Off by default, as in Flow-GRPO: independent noises spread more."
        },
    )

    # LoRA
    use_lora: bool = field(default=True, metadata={"help": "Train a LoRA adapter (else the whole transformer)."})
    lora_rank: int = field(default=32, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=64, metadata={"help": "LoRA alpha."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(SD3_LORA_TARGETS), metadata={"help": "Module names that get LoRA layers."}
    )
    lora_init: str = field(default="gaussian", metadata={"help": "peft `init_lora_weights` ('gaussian' or 'true')."})

    def __post_init__(self):
        super().__post_init__()
        if self.num_generations < 2:
            raise ValueError(
                f"`num_generations` must be >= 2: group-relative advantages need at least two images per prompt, "
                f"got {self.num_generations}."
            )
        for name in ("num_iterations", "num_inference_steps", "max_sequence_length", "lora_rank", "ema_update_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size * gradient_accumulation_steps = {self.generation_batch_size} images per "
                f"step must be a multiple of `num_generations` ({self.num_generations})."
            )
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

    @property
    def generation_batch_size(self) -> int:
        """Images generated per process per step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps
