"""E2PO: GRPO with structured prompt-embedding perturbations inside each group, so group reward variance survives."""

import math

import torch

from ..utils import public
from .diffusion_grpo_trainer import DiffusionGRPOTrainer, Rollout
from .e2po_config import E2POConfig


class ScaleController:
    r"""
    Per-prompt perturbation scale with hard bounds: `s <- min(s * up, s_max)` when the prompt's group reward std is
    at most `target_std`, else `s <- max(s * down, s_min)`.

    It is a checkpointable object (`state_dict` / `load_state_dict`), registered with the accelerator so that a
    resumed run continues with the same scales.
    """

    def __init__(self, num_prompts: int, init: float, low: float, high: float, up: float, down: float, target: float):
        self.scales = torch.full((num_prompts,), float(init), dtype=torch.float64)
        self.low, self.high, self.up, self.down, self.target = low, high, up, down, target

    def __getitem__(self, row: int) -> float:
        return float(self.scales[row])

    def update(
        self,
        rows: list[int],
        group_std: list[float],
        reward_drop: list[float] | None = None,
        max_reward_drop: float | None = None,
    ) -> None:
        """Apply one update per `(row, std)` pair, in order.

        With `reward_drop` (anchors' mean reward minus perturbed members', per pair) and `max_reward_drop`, a drop
        above the allowance shrinks the scale whatever the std.
        """
        drops = reward_drop if reward_drop is not None else [None] * len(rows)
        for row, std, drop in zip(rows, group_std, drops):
            damaging = max_reward_drop is not None and drop is not None and drop > max_reward_drop
            factor = self.up if std <= self.target and not damaging else self.down
            self.scales[row] = min(max(float(self.scales[row]) * factor, self.low), self.high)

    def state_dict(self) -> dict:
        return {"scales": self.scales.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["scales"].shape != self.scales.shape:
            raise ValueError(
                f"the checkpoint holds {state['scales'].numel()} prompt scales; this dataset has {self.scales.numel()}."
            )
        self.scales = state["scales"].clone()


def orthonormal_directions(
    reference: torch.Tensor, num_directions: int, generator: torch.Generator, per_token: bool = False
) -> torch.Tensor:
    r"""
    `num_directions` orthonormal perturbations shaped like `reference`, zero where `reference` is zero (padding).

    Args:
        reference: `(..., D)` one embedding (`(L, D)` tokens or `(D,)` pooled).
        per_token: if False, each direction's RMS over the non-zero entries of `reference` equals that of
            `reference`; if True, each token (last-dimension row) of each direction has the norm of the same token
            of `reference` (the paper's `s ||e_j|| u_kj / sqrt(D)` with `u_kj` of norm `sqrt(D)`), which keeps the
            directions exactly antithetic and nearly (not exactly) orthogonal.

    Returns:
        `(num_directions, *reference.shape)`; multiply by the relative scale `s` to perturb.
    """
    mask = (reference != 0).flatten().float()
    support = int(mask.sum())
    if support < num_directions:
        raise ValueError(f"an embedding with {support} non-zero entries cannot hold {num_directions} directions.")
    noise = torch.randn((mask.numel(), num_directions), generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(noise * mask.double()[:, None])
    directions = q.T.reshape(num_directions, *reference.shape)
    if per_token:
        token_norm = reference.double().norm(dim=-1, keepdim=True)
        directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-30) * token_norm
    else:
        rms = reference.double().pow(2).sum().div(support).sqrt()
        directions = directions * math.sqrt(support) * rms
    return directions.to(reference.dtype)


@public
class E2POTrainer(DiffusionGRPOTrainer):
    r"""
    E2PO: group-based RL (GRPO) whose groups share structured perturbations of the prompt embedding.

    Group-based RL loses its learning signal when the images of a group become alike and the in-group reward
    variance decays to zero. Here every group has [`E2POConfig`]`.e2po_num_anchors` unperturbed anchors and antithetic
    pairs `e +/- s * u_k` along orthonormal directions `u_k` (drawn per prompt and step, restricted to the non-zero
    entries of the embedding, RMS-matched to it) of the conditional prompt embedding and, optionally, the pooled
    embedding. The negative (CFG) branch is never perturbed. The perturbed embedding of each image is stored with its
    rollout, so its old, new and reference log-probabilities are all computed under the same embedding; advantages
    are normalised over the whole group, anchors included. A per-prompt [`ScaleController`] raises `s` while a
    group's reward std is low and lowers it otherwise, inside hard bounds.

    Takes the arguments of [`DiffusionGRPOTrainer`] with an [`E2POConfig`]. Extra metrics: `e2po/scale` (mean over
    this step's prompts), `e2po/scale_max`, `e2po/frac_scale_at_max`, `e2po/anchor_reward`, `e2po/perturbed_reward`.
    """

    _tag_names = ["diffusers-ext", "grpo", "e2po"]
    config_class = E2POConfig

    def __init__(self, pipeline, reward_funcs, args: E2POConfig | None = None, train_dataset=None, peft_config=None):
        super().__init__(pipeline, reward_funcs, args, train_dataset, peft_config)
        args = self.args
        self.controller = ScaleController(
            len(self.rows),
            args.e2po_init_scale,
            args.e2po_min_scale,
            args.e2po_max_scale,
            args.e2po_scale_up,
            args.e2po_scale_down,
            args.e2po_target_std,
        )
        self.accelerator.register_for_checkpointing(self.controller)
        self.perturbed_keys = [
            key
            for key in self.adapter.perturbable
            if key == "prompt_embeds" or (key == "pooled_prompt_embeds" and args.e2po_perturb_pooled)
        ]

    def member_signs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per group member: the direction index (-1 for anchors) and the sign (0 for anchors)."""
        args = self.args
        R, K = args.e2po_num_anchors, args.e2po_num_directions
        per_sign = (args.num_generations - R) // (2 * K)
        direction = [-1] * R
        sign = [0.0] * R
        for k in range(K):
            direction += [k] * (2 * per_sign)
            sign += [1.0] * per_sign + [-1.0] * per_sign
        return torch.tensor(direction), torch.tensor(sign)

    def perturb_conditioning(self, cond, step, row_ids):
        G, K = self.args.num_generations, self.args.e2po_num_directions
        direction, sign = self.member_signs()
        generator = self._generator(step, salt=2)
        out = {key: value.clone() for key, value in cond.items()}
        scales = []
        for group, row in enumerate(row_ids):
            scale = self.controller[row]
            scales.append(scale)
            for key in self.perturbed_keys:
                block = out[key][group * G : (group + 1) * G]
                directions = orthonormal_directions(
                    block[0].float().cpu(), K, generator, per_token=self.args.e2po_token_scaling
                ).to(block.device)
                for member in range(G):
                    if direction[member] >= 0:
                        delta = sign[member] * scale * directions[direction[member]]
                        block[member] = block[member] + delta.to(block.dtype)
        self._step_scales = scales
        return out

    def after_step(self, rollout: Rollout, step: int) -> None:
        # Every process applies every process's updates, in process order, so the scales stay identical everywhere.
        device = self.accelerator.device
        rows = torch.tensor(rollout.row_ids, device=device, dtype=torch.long)
        std = rollout.group_std.to(device=device, dtype=torch.float32)
        drop = self.reward_drop(rollout).to(device=device, dtype=torch.float32)
        all_rows, all_std, all_drop = (self.accelerator.gather(t) for t in (rows, std, drop))
        self.controller.update(all_rows.tolist(), all_std.tolist(), all_drop.tolist(), self.args.e2po_max_reward_drop)

    def reward_drop(self, rollout: Rollout) -> torch.Tensor:
        """Per group: the anchors' mean reward minus the perturbed members' (0 without anchors)."""
        direction, _ = self.member_signs()
        grouped = rollout.rewards.view(-1, self.args.num_generations)
        anchors = (direction < 0).to(grouped.device)
        if not anchors.any():
            return torch.zeros(grouped.shape[0], device=grouped.device)
        return grouped[:, anchors].mean(dim=1) - grouped[:, ~anchors].mean(dim=1)

    def extra_metrics(self, rollout: Rollout) -> dict[str, float]:
        direction, _ = self.member_signs()
        anchors = (direction < 0).repeat(len(rollout.rewards) // len(direction)).to(rollout.rewards.device)
        scales = torch.tensor(self._step_scales)
        metrics = {
            "e2po/scale": float(scales.mean()),
            "e2po/scale_max": float(scales.max()),
            "e2po/frac_scale_at_max": float((scales >= self.args.e2po_max_scale - 1e-12).float().mean()),
            "e2po/perturbed_reward": float(rollout.rewards[~anchors].mean()),
            "e2po/reward_drop": float(self.reward_drop(rollout).mean()),
        }
        if anchors.any():
            metrics["e2po/anchor_reward"] = float(rollout.rewards[anchors].mean())
        return metrics
