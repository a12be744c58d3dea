"""Configuration of [`ConstrainedUnlearningTrainer`]: primal-dual unlearning and its baselines."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, is_number, public
from .base_config import DiffusionTrainerConfig


CONSTRAINTS = ("reverse_kl", "forward_kl", "likelihood")
BASELINES = ("esd", "siss", "neggrad_plus", "retain_only")
# Default upper bound of the dual variable per constraint. Reverse KL needs lambda < 1 (the target's strength is
# lambda / (1 - lambda)); forward KL divides by (1 - lambda); the likelihood constraint's lambda is unbounded.
DEFAULT_LAMBDA_MAX = {"reverse_kl": 0.9, "forward_kl": 0.9, "likelihood": 10.0}


@public
@dataclass
class ConstrainedUnlearningConfig(DiffusionTrainerConfig):
    r"""
    Configuration of [`ConstrainedUnlearningTrainer`].

    Unlearning keeps the model as close as possible to the pretrained one subject to a separation constraint from
    the distribution to forget, and a dual variable `lambda` finds the smallest intervention that meets the
    constraint. `constraint` chooses the formulation; `baseline` (when set) replaces the primal-dual method by a
    fixed-strength baseline trained by the same machinery. See `docs/unlearning.md` for the derivations.

    What to forget is either a concept (`forget_classes` of a class-conditional `UNet2DModel`, or `forget_prompts` of
    a text-to-image model: SD 1.x / 2.x, SDXL, SD3 or Flux) or a set of training examples (`forget_dataset` passed to the trainer: data
    unlearning, with `retain_dataset` the remaining training data).

    The shared options (output folder, optimiser, logging, checkpoints, accelerator) are those of
    [`DiffusionTrainerConfig`], named as in `transformers.TrainingArguments`. One training step draws
    `gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` forget (and as many retain) samples
    per process, takes one AdamW step on their accumulated loss and one dual step on lambda from their mean
    constraint estimate. LoRA comes from the trainer's `peft_config`, as in TRL.

    `constraint_level="auto"` and `dual_learning_rate="auto"` are resolved by the trainer when training starts (the
    config keeps what was given; the values in use are `trainer.constraint_level` and `trainer.dual_learning_rate`,
    logged at the start of training and written into the model card).
    """

    # What to optimise
    constraint: str = field(
        default="reverse_kl",
        metadata={
            "help": "Separation constraint from the forget distribution p_u: 'reverse_kl' (KL(q||p_u) >= level), "
            "'forward_kl' (KL(p_u||q) >= level, measured as the denoising loss on forget samples) or "
            "'likelihood' (E_q[log p_u - log p_ref] <= level)."
        },
    )
    baseline: str | None = field(
        default=None,
        metadata={
            "help": "Train a baseline instead of the primal-dual method: 'esd' (negative-guidance target, concept "
            "unlearning), 'siss' (data or concept unlearning), 'neggrad_plus' (data unlearning), 'retain_only' "
            "(fine-tune on the retain set). "
            "None runs the primal-dual method for `constraint`."
        },
    )
    # `float | str | None`: TrlParser / HfArgumentParser then read the option as a string ("auto" or a number).
    constraint_level: float | str | None = field(
        default=50.0,
        metadata={
            "help": "The level b of the constraint, in the units of its estimate: nats of path KL for reverse_kl, "
            "nats of ELBO difference for likelihood, mean squared noise-prediction error for forward_kl. 'auto' "
            "(concept unlearning): `constraint_level_factor` times what the constraint reads on the retained "
            "classes/prompts under the pretrained model (`trainer.calibrate_level()`), resolved at train start."
        },
    )
    constraint_level_factor: float = field(
        default=1.0, metadata={"help": "Multiplies the calibrated level of constraint_level='auto'."}
    )

    # Dual variable
    dual_learning_rate: float | str | None = field(
        default=0.01,
        metadata={
            "help": "Step size of the projected dual ascent on lambda (per training step), or 'auto': "
            "dual_learning_rate_scale / max(|b|, 1e-3), in the units of the constraint, resolved at train start."
        },
    )
    dual_learning_rate_scale: float | None = field(
        default=None,
        metadata={
            "help": "Numerator of dual_learning_rate='auto'. Default 0.02 for concept unlearning, 0.3 for data "
            "unlearning."
        },
    )
    lambda_init: float = field(default=0.0, metadata={"help": "Initial value of the dual variable lambda."})
    lambda_min: float = field(default=0.0, metadata={"help": "Lower bound of lambda (>= 0)."})
    lambda_max: float | None = field(
        default=None,
        metadata={
            "help": "Upper bound of lambda. Default 0.9 for reverse_kl and forward_kl (both need lambda < 1), 10 for "
            "likelihood."
        },
    )
    stop_patience: int = field(
        default=50,
        metadata={
            "help": "Stop, reporting the best constraint value reached, after this many consecutive steps with "
            "lambda at its upper bound and the smoothed constraint still violated (the level is unreachable)."
        },
    )
    constraint_ema: float = field(
        default=0.9, metadata={"help": "Decay of the moving average of the constraint estimate (logging, stopping)."}
    )

    # What to forget and what to keep
    forget_classes: list[int] | None = field(
        default=None, metadata={"help": "Class labels to forget (class-conditional UNet2DModel)."}
    )
    retain_classes: list[int] | None = field(
        default=None,
        metadata={"help": "Class labels to keep unchanged. Default: every other class except the null class."},
    )
    reference_class: int | None = field(
        default=None,
        metadata={
            "help": "The class p_ref of the forgotten classes' replacement. Default: the null class of the pipeline "
            "(the unconditional model)."
        },
    )
    forget_prompts: list[str] | None = field(
        default=None, metadata={"help": "Prompts of the concept to forget (text-to-image models)."}
    )
    retain_prompts: list[str] | None = field(
        default=None, metadata={"help": "Anchor prompts to keep unchanged (text-to-image models)."}
    )
    reference_prompt: str = field(
        default="", metadata={"help": "The prompt of p_ref (default the empty prompt, i.e. unconditional)."}
    )
    # Model families with text encoders and their own sizes (SDXL, SD3, Flux)
    resolution: int | None = field(
        default=None,
        metadata={
            "help": "Side in pixels of the images whose latents are drawn and noised (the VAE divides it). Default the "
            "model's own: its sample size (SD 1.x/2.x, SDXL, SD3), or the pipeline's default size (Flux). SDXL's "
            "time ids are (resolution, resolution, 0, 0, resolution, resolution)."
        },
    )
    max_sequence_length: int | None = field(
        default=None,
        metadata={
            "help": "T5 tokens of each prompt (SD3, Flux; their pipeline's `encode_prompt` option). Default the "
            "pipeline's own (256 for SD3, 512 for Flux)."
        },
    )
    guidance_scale: float = field(
        default=3.5,
        metadata={
            "help": "The guidance input of a guidance-distilled Flux transformer (Flux.1-dev; `guidance_embeds`), "
            "given to the trained and the frozen model at every call, as FluxPipeline's `guidance_scale`. Unused "
            "by other models."
        },
    )
    retain_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the retain term: distillation to the pretrained model on the retained conditions "
            "(concept unlearning) or the denoising loss on the retain set (data unlearning)."
        },
    )

    # Baselines
    esd_negative_guidance: float = field(
        default=2.0,
        metadata={
            "help": "ESD's negative guidance eta: target eps_ref - eta (eps_u - eps_ref), the paper's form. ESD's "
            "diffusers script and the constrained-unlearning reference write eps_u - eta (eps_u - eps_ref): their "
            "eta is this one plus 1."
        },
    )
    neggrad_weight: float = field(
        default=1.0,
        metadata={
            "help": "NegGrad+: weight alpha of the gradient ascent on the forget set; SISS: the weight of its "
            "subtracted (forget) term (1 is SISS as published)."
        },
    )
    siss_mixture_weight: float = field(
        default=0.5,
        metadata={"help": "SISS: probability of noising the forget example in the defensive importance mixture."},
    )
    siss_retain_weight: float = field(
        default=0.0,
        metadata={
            "help": "SISS: weight of an added retain term (the denoising loss on retain samples, as NegGrad+ and "
            "forward_kl draw it); 0 is SISS as published, whose own keep term is its only retention."
        },
    )

    # Optimisation (the shared fields of DiffusionTrainerConfig, with this trainer's defaults)
    output_dir: str = field(
        default="constrained-unlearning", metadata={"help": "Where checkpoints, logs and `save_model` go."}
    )
    max_steps: int = field(default=200, metadata={"help": "Number of primal-dual steps."})
    per_device_train_batch_size: int = field(
        default=32, metadata={"help": "Per-process micro-batch of forget samples (and as many retain samples)."}
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the primal step."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    seed: int = field(default=0, metadata={"help": "Seed of batches, noise and sample pools."})

    # Samples of the model itself
    pool_size: int = field(
        default=64,
        metadata={
            "help": "Per-process number of samples drawn from the current model for each sample pool (the forget "
            "condition's on-policy samples, and the pretrained retain and reference samples)."
        },
    )
    pool_sampling_steps: int = field(
        default=10,
        metadata={
            "help": "Steps of the deterministic sampler (DDIM eta 0, or Euler on the flow ODE) that draws the sample pools."
        },
    )
    pool_refresh_steps: int = field(
        default=10, metadata={"help": "Redraw the on-policy forget pool from the current model every N steps."}
    )

    def __post_init__(self):
        super().__post_init__()
        self.constraint_level = _number_or_auto(self.constraint_level, "constraint_level")
        self.dual_learning_rate = _number_or_auto(self.dual_learning_rate, "dual_learning_rate")
        if not self.constraint_level_factor > 0:
            raise ValueError(f"`constraint_level_factor` must be > 0, got {self.constraint_level_factor}.")
        if self.dual_learning_rate_scale is not None and not self.dual_learning_rate_scale > 0:
            raise ValueError(f"`dual_learning_rate_scale` must be None or > 0, got {self.dual_learning_rate_scale}.")
        if self.constraint not in CONSTRAINTS:
            raise ValueError(f"`constraint` must be one of {CONSTRAINTS}, got {self.constraint!r}.")
        if self.baseline is not None and self.baseline not in BASELINES:
            raise ValueError(f"`baseline` must be None or one of {BASELINES}, got {self.baseline!r}.")
        if self.lambda_max is None:
            self.lambda_max = DEFAULT_LAMBDA_MAX[self.constraint]
        if self.lambda_min < 0:
            raise ValueError(f"`lambda_min` must be >= 0, got {self.lambda_min}.")
        if self.lambda_max < self.lambda_min:
            raise ValueError(f"`lambda_max` {self.lambda_max} is below `lambda_min` {self.lambda_min}.")
        if self.constraint in ("reverse_kl", "forward_kl") and self.lambda_max >= 1.0:
            what = (
                "the reverse-KL target eps_ref + lambda / (1 - lambda) (eps_ref - eps_u) is undefined (the "
                "Lagrangian is unbounded below)"
                if self.constraint == "reverse_kl"
                else "the forward-KL objective divides by 1 - lambda and the subtracted mixture has no mass left"
            )
            raise ValueError(
                f"`lambda_max` must be < 1 for constraint={self.constraint!r}, got {self.lambda_max}: for lambda >= 1 "
                f"{what}."
            )
        if not self.lambda_min <= self.lambda_init <= self.lambda_max:
            raise ValueError(
                f"`lambda_init` {self.lambda_init} must lie in [lambda_min, lambda_max] = "
                f"[{self.lambda_min}, {self.lambda_max}]."
            )
        if self.forget_classes is not None and self.forget_prompts is not None:
            raise ValueError("Give `forget_classes` (class-conditional UNet) or `forget_prompts`, not both.")
        for name in ("forget_classes", "forget_prompts"):
            value = getattr(self, name)
            if value is not None and len(value) == 0:
                raise ValueError(f"`{name}` is empty: nothing to forget. Give at least one entry, or leave it None.")
        if self.forget_prompts is not None and any(not str(p).strip() for p in self.forget_prompts):
            raise ValueError(f"`forget_prompts` holds an empty prompt: {self.forget_prompts!r}.")
        if self.retain_classes is not None and self.forget_classes is not None:
            overlap = sorted(set(self.retain_classes) & set(self.forget_classes))
            if overlap:
                raise ValueError(f"classes {overlap} are in both `forget_classes` and `retain_classes`.")
        for name in ("pool_size", "pool_sampling_steps", "pool_refresh_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        if self.stop_patience < 1:
            raise ValueError(f"`stop_patience` must be >= 1, got {self.stop_patience}.")
        if self.dual_learning_rate != "auto" and self.dual_learning_rate < 0:
            raise ValueError(f"`dual_learning_rate` must be >= 0 or 'auto', got {self.dual_learning_rate}.")
        for name in ("retain_weight", "neggrad_weight", "siss_retain_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if not 0.0 <= self.constraint_ema < 1.0:
            raise ValueError(f"`constraint_ema` must lie in [0, 1), got {self.constraint_ema}.")
        if not 0.0 < self.siss_mixture_weight < 1.0:
            raise ValueError(f"`siss_mixture_weight` must lie in (0, 1), got {self.siss_mixture_weight}.")
        for name in ("resolution", "max_sequence_length"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.esd_negative_guidance < 0:
            raise ValueError(f"`esd_negative_guidance` must be >= 0, got {self.esd_negative_guidance}.")

    @property
    def method(self) -> str:
        """The name of what is trained: the baseline, or the constraint of the primal-dual method."""
        return self.baseline or self.constraint


def _number_or_auto(value, name: str) -> float | str:
    """`value` as a float, or "auto"; a string from a command line or YAML file is converted."""
    if value == "auto":
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    elif is_number(value):
        return float(value)
    raise ValueError(f"`{name}` must be a number or 'auto', got {value!r}.")
