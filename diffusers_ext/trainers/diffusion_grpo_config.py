"""Configuration of [`DiffusionGRPOTrainer`]: TRL's `GRPOConfig` names where they apply, plus the sampler's."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, public
from .base_config import BaseGRPOConfig


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
class DiffusionGRPOConfig(BaseGRPOConfig):
    r"""
    Configuration of [`DiffusionGRPOTrainer`], GRPO for flow-matching text-to-image pipelines (Flow-GRPO).

    Names follow TRL's `GRPOConfig` where the concept is the same, with its meanings (`num_generations`, `beta`,
    `epsilon`, `scale_rewards`, `reward_weights`, `num_iterations`, `generation_batch_size`, `steps_per_generation`):
    those GRPO options are [`BaseGRPOConfig`]'s, shared with [`GraphGRPOConfig`]; the shared options (`output_dir`,
    `max_steps`, `per_device_train_batch_size`, `gradient_accumulation_steps`, `learning_rate`, `weight_decay`,
    `logging_steps`, `save_steps`, `report_to`, ...) are [`DiffusionTrainerConfig`]'s, named as in
    `transformers.TrainingArguments`; the sampler's options are Flow-GRPO's. LoRA comes from the trainer's
    `peft_config`, as in TRL.

    One training step generates one generation batch of `generation_batch_size` images, in groups of
    `num_generations` images of one prompt, as [`BaseGRPOConfig`] describes; every `gradient_accumulation_steps`
    micro-batches (their losses at every trained timestep) make one optimizer step. The trainer resolves the
    generation batch at construction (`trainer.generation_batch_size`, `trainer.steps_per_generation`), when the
    number of processes is known.

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

    # GRPO: BaseGRPOConfig's fields, with this trainer's defaults where they differ, and its own
    epsilon: float = field(
        default=1e-4,
        metadata={"help": "Lower clip range of the ratio; tiny because log-probs are averaged over dimensions."},
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
        for name in ("num_inference_steps", "max_sequence_length", "ema_update_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        check_positive_int("vae_decode_batch_size", self.vae_decode_batch_size, optional=True)
        if self.timestep_selection not in TIMESTEP_SELECTIONS:
            raise ValueError(
                f"`timestep_selection` must be one of {TIMESTEP_SELECTIONS}, got {self.timestep_selection!r}."
            )
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"`timestep_fraction` must lie in (0, 1], got {self.timestep_fraction}.")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"`ema_decay` must lie in [0, 1), got {self.ema_decay}.")
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
