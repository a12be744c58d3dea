"""Configuration of [`E2POTrainer`]: [`DiffusionGRPOConfig`] plus the embedding perturbations and their scale."""

from dataclasses import dataclass, field

from ..utils import public
from .diffusion_grpo_config import DiffusionGRPOConfig


@public
@dataclass
class E2POConfig(DiffusionGRPOConfig):
    r"""
    Configuration of [`E2POTrainer`]: GRPO whose groups carry structured perturbations of the prompt embedding.

    Each group of `num_generations` images has `e2po_num_anchors` unperturbed anchor members and, for each of
    `e2po_num_directions` orthonormal directions `u_k`, the same number of members at `+s u_k` and at `-s u_k`
    (antithetic pairs, so the group's mean embedding is the clean one). `s` is relative: the perturbation's RMS is
    `s` times the norm of each token it perturbs (`e2po_token_scaling`, the paper's per-token rule), or times the
    RMS of the whole embedding. A per-prompt controller grows `s` (times `e2po_scale_up`) while the prompt's group
    reward std is at most `e2po_target_std` and shrinks it (times `e2po_scale_down`) otherwise, or whenever the
    perturbed members' mean reward falls more than `e2po_max_reward_drop` below the anchors'; always inside the hard
    bounds `[e2po_min_scale, e2po_max_scale]`.
    """

    e2po_num_anchors: int = field(default=2, metadata={"help": "Unperturbed (reference anchor) members per group."})
    e2po_num_directions: int = field(
        default=3, metadata={"help": "Orthonormal perturbation directions per group, each used as a +/- pair."}
    )
    e2po_init_scale: float = field(default=0.1, metadata={"help": "Initial relative perturbation scale s."})
    e2po_min_scale: float = field(default=0.02, metadata={"help": "Hard lower bound of s."})
    e2po_max_scale: float = field(
        default=0.3, metadata={"help": "Hard upper bound of s (an uncapped scale destabilises training)."}
    )
    e2po_target_std: float = field(
        default=0.05, metadata={"help": "Group reward std at or below which a prompt's scale grows."}
    )
    e2po_scale_up: float = field(default=1.25, metadata={"help": "Factor applied to s when the group std is low."})
    e2po_scale_down: float = field(
        default=0.95, metadata={"help": "Factor applied to s when the group std is not low."}
    )
    e2po_token_scaling: bool = field(
        default=True,
        metadata={
            "help": "Scale each token's perturbation to s times that token's norm (the paper's per-token rule, so "
            "small-norm tokens are not swamped); False: one RMS over the whole embedding."
        },
    )
    e2po_max_reward_drop: float | None = field(
        default=None,
        metadata={
            "help": "Shrink a prompt's scale whenever its perturbed members' mean reward is more than this below its "
            "anchors' (perturbations must not damage the prompt); None: no such check (needs e2po_num_anchors >= 1). "
            "Off by default because it is in the reward's units."
        },
    )
    e2po_perturb_pooled: bool = field(
        default=True, metadata={"help": "Also perturb the pooled prompt embedding (same scale, own directions)."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.e2po_num_anchors < 0 or self.e2po_num_directions < 1:
            raise ValueError(
                f"`e2po_num_anchors` must be >= 0 and `e2po_num_directions` >= 1, got {self.e2po_num_anchors}, "
                f"{self.e2po_num_directions}."
            )
        perturbed = self.num_generations - self.e2po_num_anchors
        if perturbed < 2 * self.e2po_num_directions or perturbed % (2 * self.e2po_num_directions):
            raise ValueError(
                f"num_generations - e2po_num_anchors = {perturbed} perturbed members must be a positive multiple of "
                f"2 * e2po_num_directions = {2 * self.e2po_num_directions} (one +/- pair per direction)."
            )
        if not 0 < self.e2po_min_scale <= self.e2po_init_scale <= self.e2po_max_scale:
            raise ValueError(
                "the scale bounds must satisfy 0 < e2po_min_scale <= e2po_init_scale <= e2po_max_scale, got "
                f"{self.e2po_min_scale}, {self.e2po_init_scale}, {self.e2po_max_scale}."
            )
        if not self.e2po_scale_up >= 1 or not 0 < self.e2po_scale_down <= 1:
            raise ValueError(
                f"need e2po_scale_up >= 1 and 0 < e2po_scale_down <= 1, got {self.e2po_scale_up}, "
                f"{self.e2po_scale_down}."
            )
        if self.e2po_max_reward_drop is not None and (self.e2po_max_reward_drop < 0 or self.e2po_num_anchors < 1):
            raise ValueError(
                f"`e2po_max_reward_drop` must be None or >= 0 with e2po_num_anchors >= 1, got "
                f"{self.e2po_max_reward_drop} with {self.e2po_num_anchors} anchors."
            )
        if self.e2po_target_std < 0:
            raise ValueError(f"`e2po_target_std` must be >= 0, got {self.e2po_target_std}.")
