"""Configuration of [`GraphGRPOTrainer`]: TRL's `GRPOConfig` names where they apply, plus Graph-GRPO's options."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, is_int, public
from .base_config import BaseGRPOConfig


GRAPH_SCALE_REWARDS = ("per_size", *BaseGRPOConfig.scale_rewards_choices)
KL_TYPES = ("mse_logratio",)
GRAPH_LORA_TARGETS = ["qkv", "node_out", "edge_mul", "edge_add", "edge_out"]


@public
@dataclass
class GraphGRPOConfig(BaseGRPOConfig):
    r"""
    Configuration of [`GraphGRPOTrainer`], Graph-GRPO (arXiv 2603.10395): GRPO on a discrete graph flow model whose
    CTMC steps have exact, differentiable log-probabilities (the analytic rate of [`GraphDiscreteFlowScheduler`]).

    The GRPO options are [`BaseGRPOConfig`]'s, shared with [`DiffusionGRPOConfig`], with the names and meanings of
    TRL's `GRPOConfig`: `num_generations`, `beta`, `epsilon`, `epsilon_high`, `scale_rewards`, `adv_clip_max`,
    `reward_weights`, `reward_std_tolerance`, `num_iterations`, `generation_batch_size`, `steps_per_generation`; the
    shared options (`output_dir`, `max_steps`, `per_device_train_batch_size`, `gradient_accumulation_steps`,
    `learning_rate`, ...) are [`DiffusionTrainerConfig`]'s. The defaults are the reference's tree configuration where
    it has one (epsilon 0.2 / 0.28, beta 0.005, lr 1e-5, weight decay 1e-4, grad clip 5, advantages clipped at 5).

    One training step generates `generation_batch_size` graphs over all processes (default
    `per_device_train_batch_size * num_processes * steps_per_generation`, `steps_per_generation` defaulting to
    `gradient_accumulation_steps`, as in TRL) in groups of `num_generations`: each group has one node count and, with
    `shared_start`, one initial noise graph, so its members differ only through the CTMC draws. With
    `refine_top_k > 0`, the step's `refine_top_k` best graphs (per process) are each re-noised to time
    `1 - refine_noise_fraction` and regenerated `num_generations` times: extra groups, sharing the re-noised graph as
    their start, trained on the steps they took (not counted in `generation_batch_size`). Each pass over the step's
    graphs goes through micro-batches of `per_device_train_batch_size` graphs, and every
    `gradient_accumulation_steps` micro-batches (their losses at every trained step) make one optimizer step, so a
    pass over the generation batch makes `steps_per_generation / gradient_accumulation_steps` optimizer steps (as in
    [`DiffusionGRPOTrainer`]); `num_iterations` passes are made.

    Every field has a `help` entry, so `transformers.HfArgumentParser((GraphGRPOConfig,))` builds a command line
    parser from it.
    """

    output_dir: str = field(default="graph-grpo", metadata={"help": "Where weights, checkpoints and logs go."})
    seed: int = field(default=0, metadata={"help": "Seed of node counts, start graphs and CTMC draws."})
    max_steps: int = field(default=50, metadata={"help": "Training steps (one generation round each)."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate (constant; reference 1e-5)."})
    weight_decay: float = field(default=1e-4, metadata={"help": "AdamW weight decay (reference 1e-4)."})
    max_grad_norm: float = field(default=5.0, metadata={"help": "Gradient clipping norm (reference 5.0)."})
    per_device_train_batch_size: int = field(
        default=8, metadata={"help": "Graphs per process in one loss micro-batch."}
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches whose losses (at every trained step) make one optimizer step."}
    )

    # GRPO: BaseGRPOConfig's fields, with this trainer's defaults where they differ, and its own
    scale_rewards_choices = GRAPH_SCALE_REWARDS
    beta: float = field(
        default=0.005,
        metadata={
            "help": "Weight of the KL proxy mean((log pi - log pi_ref)^2) to the reference policy (a frozen copy of "
            "the model, or the model with its LoRA adapter disabled); 0: no reference model."
        },
    )
    kl_type: str = field(
        default="mse_logratio",
        metadata={"help": "The KL estimate: 'mse_logratio' (the reference's squared step log-ratio)."},
    )
    epsilon_high: float | None = field(
        default=0.28, metadata={"help": "Upper clip range of the ratio (asymmetric clip); None: `epsilon`."}
    )
    log_ratio_clip: float = field(
        default=5.0, metadata={"help": "The step log-ratio is clamped to [-c, c] before exp (the reference's 5)."}
    )
    scale_rewards: str = field(
        default="per_size",
        metadata={
            "help": "Advantage normalisation: 'per_size' (the reference: mean and std over all graphs of the same "
            "node count in the step, on every process), 'group' (per group, TRL), 'batch' (mean per group, std of "
            "the batch) or 'none' (mean per group only)."
        },
    )
    reward_std_tolerance: float = field(
        default=1e-4,
        metadata={
            "help": "A normalisation set (size, group or batch) whose reward std is below this gets advantage 0 "
            "(the reference's rule); groups at or below it count in frac_reward_zero_std."
        },
    )

    # Sampling
    num_inference_steps: int = field(default=50, metadata={"help": "CTMC steps of each rollout."})
    train_max_steps: int | None = field(
        default=None, metadata={"help": "Train only the last N steps of each rollout; None: every step."}
    )
    num_nodes: list[int] | None = field(
        default=None,
        metadata={
            "help": "Node counts of the groups, cycled; None: the `num_nodes` column of `train_dataset`, else drawn "
            "from the scheduler's `node_count_probs`."
        },
    )
    shared_start: bool = field(
        default=True,
        metadata={"help": "Start every member of a group from one noise graph (the reference's force_same_start)."},
    )
    dynamic_prior_alpha: float = field(
        default=0.0,
        metadata={
            "help": "After each step, p0 <- (1 - alpha) p0 + alpha * (node and edge marginals of the top "
            "`dynamic_prior_top_fraction` graphs by reward): the reference's dynamic prior (0.05 there). 0: off."
        },
    )
    dynamic_prior_top_fraction: float = field(
        default=0.1, metadata={"help": "Share of the step's graphs (best rewards) whose marginals move the prior."}
    )

    # Refinement
    refine_top_k: int = field(
        default=0,
        metadata={"help": "Re-noise this many of each step's best graphs (per process) and regenerate; 0: off."},
    )
    refine_noise_fraction: float = field(
        default=0.25,
        metadata={"help": "Refinement re-noises to time 1 - fraction (the reference's 0.25 early, 0.2 late)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_positive_int("num_inference_steps", self.num_inference_steps)
        check_positive_int("train_max_steps", self.train_max_steps, optional=True)
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"`kl_type` must be one of {KL_TYPES}, got {self.kl_type!r}.")
        if not self.log_ratio_clip > 0:
            raise ValueError(f"`log_ratio_clip` must be > 0, got {self.log_ratio_clip!r}.")
        if self.num_nodes is not None:
            if (
                not isinstance(self.num_nodes, (list, tuple))
                or not self.num_nodes
                or not all(is_int(n) and n >= 1 for n in self.num_nodes)
            ):
                raise ValueError(
                    f"`num_nodes` must be None or a non-empty list of positive ints, got {self.num_nodes!r}."
                )
            self.num_nodes = [int(n) for n in self.num_nodes]
        if not 0 <= self.dynamic_prior_alpha <= 1:
            raise ValueError(f"`dynamic_prior_alpha` must lie in [0, 1], got {self.dynamic_prior_alpha!r}.")
        if not 0 < self.dynamic_prior_top_fraction <= 1:
            raise ValueError(
                f"`dynamic_prior_top_fraction` must lie in (0, 1], got {self.dynamic_prior_top_fraction!r}."
            )
        check_positive_int("refine_top_k", self.refine_top_k, minimum=0)
        if not 0 < self.refine_noise_fraction < 1:
            raise ValueError(f"`refine_noise_fraction` must lie in (0, 1), got {self.refine_noise_fraction!r}.")
