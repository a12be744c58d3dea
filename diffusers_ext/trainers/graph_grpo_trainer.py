"""Graph-GRPO: GRPO on a discrete graph flow model (DeFoG) with exact CTMC step log-probabilities, TRL-shaped."""

import contextlib
import copy
import inspect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from diffusers.utils import logging

from ..data.graphs import dense_to_graphs
from ..schedulers.scheduling_graph_discrete_flow import GraphDiscreteFlowScheduler
from ..training_utils import ResumableBatchSampler, step_generator
from ..utils import check_positive_int, public
from .base_config import with_default_targets
from .base_trainer import DiffusionTrainer
from .diffusion_grpo_trainer import check_reward_values, clipped_policy_loss, reward_functions
from .graph_grpo_config import GRAPH_LORA_TARGETS, GraphGRPOConfig


logger = logging.get_logger(__name__)

GraphRewardFunc = Callable[..., Sequence[float]]

#: normalisation keys of refinement groups are offset by this, so they are never pooled with fresh groups
_REFINE_KEY_OFFSET = 1_000_000


@dataclass
class GraphRollout:
    """One generation round on one process: every state of every trajectory, and what the loss needs.

    `B` graphs (fresh groups first, then refinement groups), `N` node slots, `T` CTMC steps.

    Attributes:
        node_states (`torch.LongTensor` of shape `(B, T + 1, N)`): node classes, `[:, i]` the input of step `i`.
        edge_states (`torch.Tensor` of shape `(B, T + 1, N, N)`): edge classes (stored as `uint8`).
        node_mask (`torch.BoolTensor` of shape `(B, N)`): real nodes.
        log_probs (`torch.Tensor` of shape `(B, T)`): log-probabilities of the sampled steps under the sampling policy.
        train_mask (`torch.BoolTensor` of shape `(B, T)`): the steps the loss trains (a refinement trajectory only
            has the steps after its re-noised start).
        group_ids (`torch.LongTensor` of shape `(B,)`): the group of each graph in this rollout.
        norm_keys (`torch.LongTensor` of shape `(B,)`): the advantage-normalisation key (`per_size`: the node count;
            refinement groups get their own keys).
        columns (`dict[str, list]`): dataset columns, one entry per graph (passed to the reward functions).
        graphs (`list[networkx.Graph]`): the final graphs.
        rewards_per_func / rewards / advantages / group_std: filled by scoring: `(B, num_funcs)`, `(B,)`, `(B,)`
            and `(num_groups,)`.
    """

    node_states: torch.LongTensor
    edge_states: torch.Tensor
    node_mask: torch.BoolTensor
    log_probs: torch.Tensor
    train_mask: torch.BoolTensor
    group_ids: torch.LongTensor
    norm_keys: torch.LongTensor
    columns: dict
    graphs: list
    rewards_per_func: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    group_std: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.node_states.shape[0]

    @staticmethod
    def cat(parts: list["GraphRollout"]) -> "GraphRollout":
        """Concatenate rollouts of the same step (padded to the largest node count); group ids are renumbered."""
        n = max(p.node_mask.shape[1] for p in parts)
        pad = lambda x, dims: torch.nn.functional.pad(x, [0, n - x.shape[-1]] * dims)  # noqa: E731
        offsets, total = [], 0
        for p in parts:
            offsets.append(total)
            total += int(p.group_ids.max()) + 1 if len(p) else 0
        columns = {k: [v for p in parts for v in p.columns[k]] for k in parts[0].columns}
        optional = {}
        for name in ("rewards_per_func", "rewards", "advantages", "group_std"):
            values = [getattr(p, name) for p in parts]
            optional[name] = torch.cat(values) if all(v is not None for v in values) else None
        return GraphRollout(
            node_states=torch.cat([pad(p.node_states, 1) for p in parts]),
            edge_states=torch.cat([pad(p.edge_states, 2) for p in parts]),
            node_mask=torch.cat([pad(p.node_mask, 1) for p in parts]),
            log_probs=torch.cat([p.log_probs for p in parts]),
            train_mask=torch.cat([p.train_mask for p in parts]),
            group_ids=torch.cat([p.group_ids + o for p, o in zip(parts, offsets)]),
            norm_keys=torch.cat([p.norm_keys for p in parts]),
            columns=columns,
            graphs=[g for p in parts for g in p.graphs],
            **optional,
        )


def graph_grpo_advantages(
    rewards: torch.Tensor,
    keys: torch.Tensor,
    group_ids: torch.Tensor,
    scale_rewards: str = "per_size",
    std_tolerance: float = 1e-4,
    clip: float = 5.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    Graph-GRPO's advantages of one step's rewards.

    - `"per_size"` (the reference's per-graph-configuration tracker): `(r - mean_k) / (std_k + 1e-4)` over all graphs
      with the same key `k` (the node count), `std_k` the population std (ddof 0, as numpy's);
    - `"group"`: `(r - mean_g) / (std_g + 1e-4)` per group `g` (TRL's, unbiased std);
    - `"batch"`: `(r - mean_g) / (std + 1e-4)` with the std of all rewards (unbiased);
    - `"none"`: `r - mean_g`.

    A set (key, group or batch) whose std is below `std_tolerance` gets advantage 0 (the reference's rule); then
    advantages are clipped to `[-clip, clip]`.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`): the rewards.
        keys (`torch.Tensor` of shape `(B,)`): the normalisation key of each graph (used by `"per_size"`).
        group_ids (`torch.Tensor` of shape `(B,)`): the group of each graph.

    Returns:
        `(advantages, group_std)` of shapes `(B,)` and `(num_groups,)` (the unbiased reward std of each group, in
        order of group id).
    """
    rewards = rewards.double()
    advantages = torch.zeros_like(rewards)
    groups = torch.unique(group_ids, sorted=True)
    group_std = torch.stack(
        [rewards[group_ids == g].std() if int((group_ids == g).sum()) > 1 else rewards.new_zeros(()) for g in groups]
    )
    if scale_rewards == "per_size":
        for key in torch.unique(keys):
            members = keys == key
            values = rewards[members]
            std = values.std(unbiased=False)
            if float(std) >= std_tolerance:
                advantages[members] = (values - values.mean()) / (std + 1e-4)
    else:
        batch_std = rewards.std() if len(rewards) > 1 else rewards.new_zeros(())
        for g, std in zip(groups, group_std):
            members = group_ids == g
            values = rewards[members]
            divisor = {"group": std, "batch": batch_std, "none": None}[scale_rewards]
            spread = std if divisor is None else divisor
            if float(spread) < std_tolerance:
                continue
            centred = values - values.mean()
            advantages[members] = centred if divisor is None else centred / (divisor + 1e-4)
    return advantages.clamp(-clip, clip).float(), group_std.float()


def mse_log_ratio_kl(log_prob: torch.Tensor, reference_log_prob: torch.Tensor) -> torch.Tensor:
    """The reference's KL proxy per transition: `(log pi_theta - log pi_ref)^2`, shape of the inputs."""
    return (log_prob - reference_log_prob) ** 2


def _as_rows(train_dataset) -> list[dict] | None:
    if train_dataset is None:
        return None
    rows = [dict(row) for row in train_dataset]
    if not rows:
        raise ValueError("`train_dataset` is empty: give at least one row (a dict with 'num_nodes').")
    keys = set(rows[0])
    for index, row in enumerate(rows):
        if set(row) != keys:
            raise ValueError(f"`train_dataset` row {index} has columns {sorted(row)}, row 0 has {sorted(keys)}.")
        count = row.get("num_nodes")
        check_positive_int(f"train_dataset[{index}]['num_nodes']", count)
    return rows


@public
class GraphGRPOTrainer(DiffusionTrainer):
    r"""
    Graph-GRPO (arXiv 2603.10395): online RL with verifiable rewards for a discrete graph flow model
    ([`GraphFlowPipeline`] = [`GraphTransformerModel`] + [`GraphDiscreteFlowScheduler`] with `rate="analytic"`).

    Each step generates groups of `num_generations` graphs (one node count per group and, with `shared_start`, one
    noise graph), keeping every CTMC state and the exact log-probability of every step, computed from the
    scheduler's differentiable [`~GraphDiscreteFlowScheduler.transition_probs`]. Rewards become advantages
    ([`graph_grpo_advantages`]; per node count by default), and the loss at every trained step is the clipped ratio
    loss `max(-A rho, -A clip(rho, 1 - epsilon, 1 + epsilon_high))`, `rho = exp(clamp(log pi - log pi_old, +-c))`,
    plus `beta` times `(log pi - log pi_ref)^2`. Optionally the step's best graphs are re-noised and regenerated
    (refinement groups, trained on the steps they took) and the noise prior drifts towards the marginals of
    high-reward graphs (the dynamic prior).

    It is built on [`DiffusionTrainer`] (accelerator, loop, logging, checkpoints, model card) like
    [`DiffusionGRPOTrainer`], whose GRPO option names and loss it shares; it is not a subclass of that trainer,
    whose sampling, conditioning and saving are those of SD3/Flux text-to-image pipelines.

    Args:
        pipeline ([`GraphFlowPipeline`]): the pretrained model and its scheduler (`rate="analytic"`, the policy with
            exact log-probabilities). The trainer trains `pipeline.model` in place.
        reward_funcs: a callable or a list of callables `f(graphs, **columns) -> list[float]`, `graphs` a list of
            `networkx.Graph` (see `diffusers_ext.rewards.graphs`); dataset columns arrive by name, one entry per
            graph, with `num_nodes`; a function with a `trainer_state` parameter gets `{"global_step": ...}`.
        args ([`GraphGRPOConfig`], *optional*): the configuration.
        train_dataset (*optional*): rows (dicts, or a `datasets.Dataset`) with a positive int `"num_nodes"` and any
            other columns for the rewards; one row per group, drawn by a resumable sampler. Without it, node counts
            come from `args.num_nodes` (cycled) or the scheduler's `node_count_probs`.
        peft_config (`peft.LoraConfig`, *optional*): train a LoRA adapter of the model (default targets
            `GRAPH_LORA_TARGETS`); the reference policy is then the model with the adapter disabled. None trains all
            weights, with a frozen copy as the reference (when `beta > 0`).
        accelerator (`accelerate.Accelerator`, *optional*): an accelerator to use (gradient accumulation 1: the
            trainer accumulates itself, over micro-batches and trained steps).

    Attributes:
        generation_batch_size (`int`): graphs generated per step over all processes (TRL's meaning; refinement groups
            aside).
        steps_per_generation (`int`): micro-batches of `per_device_train_batch_size` graphs per process in it; a pass
            over them makes `steps_per_generation / gradient_accumulation_steps` optimizer steps.
        graphs_per_process (`int`): `per_device_train_batch_size * steps_per_generation`.

    Metrics (kept in `history`, logged every `logging_steps`): `reward`, `reward_std`, `frac_reward_zero_std`,
    `rewards/{name}/mean|std`, `loss`, `policy_loss`, `kl`, `log_ratio_abs`, `clip_ratio/low_mean|high_mean|
    region_mean`, `grad_norm`, `refine/reward` and `refine/parent_reward` (with refinement), `prior/edge_p1` (the
    edge prior's first non-empty class), and `time/step|sampling|reward|optimization`.
    """

    _tag_names = ["diffusers-ext", "grpo", "graph-grpo", "graph-generation"]
    config_class = GraphGRPOConfig
    state_file = "graph_grpo_state.safetensors"
    _progress_keys = ("loss", "reward")

    def __init__(
        self,
        pipeline,
        reward_funcs: GraphRewardFunc | list[GraphRewardFunc],
        args: GraphGRPOConfig | None = None,
        train_dataset=None,
        peft_config=None,
        accelerator=None,
    ):
        super().__init__(args)
        args = self.args
        model = getattr(pipeline, "model", None)
        scheduler = getattr(pipeline, "scheduler", None)
        if model is None or not isinstance(scheduler, GraphDiscreteFlowScheduler):
            raise TypeError(
                "`pipeline` must be a GraphFlowPipeline (a `model` and a GraphDiscreteFlowScheduler), got "
                f"{type(pipeline).__name__}."
            )
        if scheduler.config.rate != "analytic":
            raise ValueError(
                f"the scheduler's `rate` is {scheduler.config.rate!r}; Graph-GRPO needs rate='analytic' (the "
                "Monte-Carlo 'defog' rate has no exact step log-probability). Build the scheduler with "
                "`GraphDiscreteFlowScheduler.from_config(scheduler.config, rate='analytic', eta=0.0, omega=0.0)`."
            )
        self.pipeline, self.scheduler = pipeline, scheduler
        self.reward_funcs, self.reward_names, self.reward_weights = reward_functions(reward_funcs, args.reward_weights)
        self.rows = _as_rows(train_dataset)
        if args.num_nodes is None and self.rows is None and scheduler.node_count_probs is None:
            raise ValueError(
                "no node counts to train on: set `args.num_nodes`, give a `train_dataset` with 'num_nodes', or use "
                "a scheduler with `node_count_probs`."
            )
        for name, value in (
            ("num_node_classes", scheduler.config.num_node_classes),
            ("num_edge_classes", scheduler.config.num_edge_classes),
        ):
            model_value = getattr(getattr(model, "config", None), name, value)
            if model_value != value:
                raise ValueError(f"the model's `{name}` is {model_value} but the scheduler's is {value}.")
        T = args.num_inference_steps
        if args.train_max_steps is not None and args.train_max_steps > T:
            raise ValueError(f"`train_max_steps` ({args.train_max_steps}) exceeds `num_inference_steps` ({T}).")
        self.train_steps = list(range(T - (args.train_max_steps or T), T))
        self.peft_config = with_default_targets(peft_config, GRAPH_LORA_TARGETS)

        self.create_accelerator(accelerator, gradient_accumulation_steps=1)
        self.generation_batch_size, self.steps_per_generation, self.graphs_per_process = args.resolve_generation_batch(
            self.accelerator.num_processes
        )
        device = self.accelerator.device
        pipeline.to(device)
        pipeline.set_progress_bar_config(disable=True)
        model.requires_grad_(False)
        self.reference = None
        if self.peft_config is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(args.seed)
                model.add_adapter(self.peft_config)
        else:
            model.requires_grad_(True)
            if args.beta > 0:
                self.reference = copy.deepcopy(model).requires_grad_(False).eval()
        self.model, self.trainable_parameters = self.prepare_trained_model(model)
        self._timers: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------------------------------

    @property
    def unwrapped_model(self):
        return self.accelerator.unwrap_model(self.model)

    def _generator(self, step: int, salt: int = 0) -> torch.Generator:
        return step_generator(self.args.seed + salt * 7919, step, self.accelerator.process_index)

    def _timed(self, name: str):
        trainer = self

        class _Timer:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                trainer._timers[name] = trainer._timers.get(name, 0.0) + time.perf_counter() - self.start

        return _Timer()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            **super().state_dict(),
            "node_marginals": self.scheduler.node_marginals.clone(),
            "edge_marginals": self.scheduler.edge_marginals.clone(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.scheduler.update_marginals(state["node_marginals"], state["edge_marginals"])

    # ------------------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------------------

    def group_rows(self, step: int) -> list[dict]:
        """This process's groups at `step`: one row (`num_nodes` and the dataset's columns) per group; depends only
        on `(seed, step, process)`, so a resumed run draws the same."""
        args, accelerator = self.args, self.accelerator
        per_process = self.graphs_per_process // args.num_generations
        if self.rows is not None:
            sampler = ResumableBatchSampler(
                len(self.rows), per_process, accelerator.num_processes, accelerator.process_index, args.seed, step
            )
            return [dict(self.rows[i]) for i in next(iter(sampler))]
        if args.num_nodes is not None:
            start = (step * accelerator.num_processes + accelerator.process_index) * per_process
            return [{"num_nodes": args.num_nodes[(start + g) % len(args.num_nodes)]} for g in range(per_process)]
        probs = self.scheduler.node_count_probs.double()
        draws = torch.multinomial(probs, per_process, replacement=True, generator=self._generator(step, salt=3))
        return [{"num_nodes": int(n)} for n in draws.clamp_min(1).tolist()]

    def _policy_probs(self, model, X, E, node_mask, i: int):
        """The step-`i` transition distributions of graphs `X`, `E` under `model` (differentiable)."""
        grid = self.scheduler.time_grid
        t, s = grid[i], grid[i + 1]
        with self.accelerator.autocast():
            out = model(X, E, t.expand(X.shape[0]), node_mask)
        return self.scheduler.transition_probs(out.node_logits.float(), out.edge_logits.float(), X, E, t, s, node_mask)

    @torch.no_grad()
    def rollout(self, X, E, node_mask, start_index: int, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the CTMC from grid step `start_index` to the end with the current policy.

        Returns `(node_states (B, T + 1, N), edge_states (B, T + 1, N, N) uint8, log_probs (B, T))`; the states before
        `start_index` repeat the start graph and their log-probs are 0."""
        T = self.args.num_inference_steps
        model = self.unwrapped_model
        model.eval()
        node_states, edge_states = [X] * (start_index + 1), [E.to(torch.uint8)] * (start_index + 1)
        log_probs = torch.zeros(X.shape[0], T, device=X.device)
        for i in range(start_index, T):
            with self._timed("model_forward"):
                probs_X, probs_E = self._policy_probs(model, X, E, node_mask, i)
            X, E = self.scheduler.sample_transition(probs_X, probs_E, node_mask, generator)
            log_probs[:, i] = self.scheduler.step_log_prob(probs_X, probs_E, X, E, node_mask)
            node_states.append(X)
            edge_states.append(E.to(torch.uint8))
        return torch.stack(node_states, 1), torch.stack(edge_states, 1), log_probs

    def _rollout_record(self, X, E, node_mask, start_index, group_size, rows, key_offset, generator) -> GraphRollout:
        nodes, edges, log_probs = self.rollout(X, E, node_mask, start_index, generator)
        B, T = log_probs.shape
        train_mask = torch.zeros(B, T, dtype=torch.bool, device=X.device)
        trained = [i for i in self.train_steps if i >= start_index]
        train_mask[:, trained] = True
        counts = node_mask.sum(1)
        return GraphRollout(
            node_states=nodes,
            edge_states=edges,
            node_mask=node_mask,
            log_probs=log_probs,
            train_mask=train_mask,
            group_ids=torch.arange(B, device=X.device) // group_size,
            norm_keys=counts + key_offset,
            columns={k: [row[k] for row in rows for _ in range(group_size)] for k in rows[0]},
            graphs=dense_to_graphs(nodes[:, -1], edges[:, -1].long(), node_mask),
        )

    def generate(self, step: int) -> GraphRollout:
        """This process's fresh groups at `step`: each shares one node count and (with `shared_start`) one noise
        graph."""
        args, device = self.args, self.accelerator.device
        rows = self.group_rows(step)
        G = args.num_generations
        counts = torch.tensor([row["num_nodes"] for row in rows], device=device).repeat_interleave(G)
        node_mask = torch.arange(int(counts.max()), device=device).unsqueeze(0) < counts.unsqueeze(1)
        generator = self._generator(step)
        self.scheduler.set_timesteps(args.num_inference_steps, device=device)
        if args.shared_start:
            X, E = self.scheduler.sample_noise(node_mask[::G], generator)
            X, E = X.repeat_interleave(G, 0), E.repeat_interleave(G, 0)
        else:
            X, E = self.scheduler.sample_noise(node_mask, generator)
        return self._rollout_record(X, E, node_mask, 0, G, rows, 0, generator)

    def refine(self, rollout: GraphRollout, step: int) -> GraphRollout | None:
        """Refinement groups: each of the `refine_top_k` best graphs of `rollout` is re-noised to grid time
        `>= 1 - refine_noise_fraction` (`add_noise`) and regenerated `num_generations` times from that one graph."""
        args = self.args
        k = min(args.refine_top_k, len(rollout))
        if k == 0:
            return None
        G = args.num_generations
        best = torch.argsort(rollout.rewards, descending=True, stable=True)[:k]
        grid = self.scheduler.time_grid
        start = int(torch.searchsorted(grid[:-1].contiguous(), torch.tensor(1 - args.refine_noise_fraction).to(grid)))
        start = min(start, args.num_inference_steps - 1)
        generator = self._generator(step, salt=5)
        X1, E1 = rollout.node_states[best, -1], rollout.edge_states[best, -1].long()
        mask = rollout.node_mask[best]
        t = grid[start].expand(k)
        X, E = self.scheduler.add_noise(X1, E1, t, mask, generator)
        X, E, mask = X.repeat_interleave(G, 0), E.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
        rows = [{key: rollout.columns[key][int(b)] for key in rollout.columns} for b in best]
        refined = self._rollout_record(X, E, mask, start, G, rows, _REFINE_KEY_OFFSET, generator)
        refined.parent_rewards = rollout.rewards[best]
        return refined

    # ------------------------------------------------------------------------------------------------------------
    # Scoring
    # ------------------------------------------------------------------------------------------------------------

    def score(self, graphs: list, columns: dict[str, list]) -> torch.Tensor:
        """Call every reward function on `graphs`; `(B, num_funcs)` rewards, or a `ValueError` on a wrong length or
        a non-finite value."""
        scores = []
        for func, name in zip(self.reward_funcs, self.reward_names):
            kwargs = dict(columns)
            if "trainer_state" in inspect.signature(func).parameters:
                kwargs["trainer_state"] = {"global_step": self.global_step}
            with self._timed("reward"):
                values = func(graphs=graphs, **kwargs)
            scores.append(check_reward_values(name, values, len(graphs), "graphs"))
        return torch.stack(scores, dim=1).to(self.accelerator.device)

    def score_rollout(self, rollout: GraphRollout, prefix: str = "") -> GraphRollout:
        """Fill the rewards and advantages of `rollout`; record the reward metrics (names prefixed by `prefix`)."""
        args = self.args
        per_func = self.score(rollout.graphs, rollout.columns)
        rewards = (per_func * self.reward_weights.to(per_func.device)).sum(1)
        # per-size statistics pool every process's graphs of a size (the keys are node counts)
        if args.scale_rewards == "per_size" and self.accelerator.num_processes > 1:
            all_rewards = self.accelerator.gather(rewards)
            all_keys = self.accelerator.gather(rollout.norm_keys)
            rank, B = self.accelerator.process_index, len(rewards)
            all_groups = torch.arange(len(all_rewards), device=rewards.device) // args.num_generations
            advantages, _ = graph_grpo_advantages(
                all_rewards, all_keys, all_groups, "per_size", args.reward_std_tolerance, args.adv_clip_max
            )
            advantages = advantages[rank * B : (rank + 1) * B]
            _, group_std = graph_grpo_advantages(rewards, rollout.norm_keys, rollout.group_ids, "group")
        else:
            advantages, group_std = graph_grpo_advantages(
                rewards,
                rollout.norm_keys,
                rollout.group_ids,
                args.scale_rewards,
                args.reward_std_tolerance,
                args.adv_clip_max,
            )
        rollout.rewards_per_func, rollout.rewards = per_func, rewards
        rollout.advantages, rollout.group_std = advantages.to(rewards.device), group_std.to(rewards.device)
        gathered = self.accelerator.gather(rewards)
        gathered_std = self.accelerator.gather(rollout.group_std)
        self.log_metric(f"{prefix}reward", gathered.mean().item())
        if not prefix:
            self.log_metric("reward_std", gathered_std.mean().item())
            self.log_metric("frac_reward_zero_std", (gathered_std <= args.reward_std_tolerance).float().mean().item())
            all_per_func = self.accelerator.gather(per_func)
            for j, name in enumerate(self.reward_names):
                self.log_metric(f"rewards/{name}/mean", all_per_func[:, j].mean().item())
                self.log_metric(
                    f"rewards/{name}/std", all_per_func[:, j].std().item() if len(all_per_func) > 1 else 0.0
                )
        return rollout

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------

    def step_log_prob(self, model, rollout: GraphRollout, index: torch.Tensor, i: int) -> torch.Tensor:
        """`(len(index),)` log-probabilities of the stored step `i` of graphs `index` under `model`."""
        X = rollout.node_states[index, i]
        E = rollout.edge_states[index, i].long()
        mask = rollout.node_mask[index]
        probs_X, probs_E = self._policy_probs(model, X, E, mask, i)
        return self.scheduler.step_log_prob(
            probs_X, probs_E, rollout.node_states[index, i + 1], rollout.edge_states[index, i + 1].long(), mask
        )

    def compute_loss(self, rollout: GraphRollout, index: torch.Tensor, i: int) -> tuple[torch.Tensor, dict]:
        """The summed (not averaged) per-graph loss of graphs `index` at step `i`: clipped ratio loss plus `beta`
        times the KL proxy; and the step's metrics."""
        args = self.args
        with self._timed("model_forward"):
            log_prob = self.step_log_prob(self.model, rollout, index, i)
        log_ratio = (log_prob - rollout.log_probs[index, i]).clamp(-args.log_ratio_clip, args.log_ratio_clip)
        ratio = torch.exp(log_ratio)
        advantages = rollout.advantages[index]
        low = 1 - args.epsilon
        high = 1 + (args.epsilon_high if args.epsilon_high is not None else args.epsilon)
        policy_loss = clipped_policy_loss(ratio, advantages, low, high)  # the mean over the graphs
        loss = policy_loss * len(index)
        metrics = {
            "policy_loss": policy_loss.item(),
            "log_ratio_abs": log_ratio.abs().mean().item(),
            "clip_ratio/low_mean": ((ratio < low) & (advantages < 0)).float().mean().item(),
            "clip_ratio/high_mean": ((ratio > high) & (advantages > 0)).float().mean().item(),
            "clip_ratio/region_mean": ((ratio < low) | (ratio > high)).float().mean().item(),
        }
        if args.beta > 0:
            with torch.no_grad():
                if self.reference is not None:
                    reference_log_prob = self.step_log_prob(self.reference, rollout, index, i)
                else:
                    model = self.unwrapped_model
                    model.disable_adapters()
                    try:
                        reference_log_prob = self.step_log_prob(model, rollout, index, i)
                    finally:
                        model.enable_adapters()
            kl = mse_log_ratio_kl(log_prob, reference_log_prob)
            loss = loss + args.beta * kl.sum()
            metrics["kl"] = kl.mean().item()
        return loss, metrics

    def optimize(self, rollout: GraphRollout) -> None:
        """`num_iterations` passes over `rollout`; every `gradient_accumulation_steps` micro-batches (their losses at
        every trained step, averaged over the trained transitions) make one optimizer step."""
        args, accelerator = self.args, self.accelerator
        self.model.train()
        micro = args.per_device_train_batch_size
        B = len(rollout)
        batches = [torch.arange(s, min(s + micro, B), device=rollout.node_mask.device) for s in range(0, B, micro)]
        chunks = [
            batches[c : c + args.gradient_accumulation_steps]
            for c in range(0, len(batches), args.gradient_accumulation_steps)
        ]
        for _ in range(args.num_iterations):
            for chunk in chunks:
                units = [
                    (index[rollout.train_mask[index, i]], i)
                    for index in chunk
                    for i in range(rollout.log_probs.shape[1])
                    if bool(rollout.train_mask[index, i].any())
                ]
                total = sum(len(index) for index, _ in units)
                if total == 0:
                    continue
                for u, (index, i) in enumerate(units):
                    sync = u == len(units) - 1
                    context = accelerator.no_sync(self.model) if not sync else contextlib.nullcontext()
                    with context:
                        loss, metrics = self.compute_loss(rollout, index, i)
                        with self._timed("model_backward"):
                            accelerator.backward(loss / total)
                    self.log_metric("loss", loss.item() / len(index))
                    for key, value in metrics.items():
                        self.log_metric(key, value)
                self.log_metric("grad_norm", self.clip_gradients(self.trainable_parameters, self.model))
                self.optimizer.step()
                self.optimizer.zero_grad()

    # ------------------------------------------------------------------------------------------------------------
    # The step
    # ------------------------------------------------------------------------------------------------------------

    def update_prior(self, rollout: GraphRollout) -> None:
        """The dynamic prior: `p0 <- (1 - alpha) p0 + alpha * marginals of the top graphs` (every process's)."""
        args = self.args
        count = max(1, int(round(args.dynamic_prior_top_fraction * len(rollout))))
        top = torch.argsort(rollout.rewards, descending=True, stable=True)[:count]
        S_X, S_E = self.scheduler.config.num_node_classes, self.scheduler.config.num_edge_classes
        node_p, edge_p = GraphDiscreteFlowScheduler.marginals_from_dense(
            rollout.node_states[top, -1], rollout.edge_states[top, -1].long(), rollout.node_mask[top], S_X, S_E
        )
        device = self.accelerator.device
        node_p = self.accelerator.reduce(torch.tensor(node_p, device=device), reduction="mean").cpu().double()
        edge_p = self.accelerator.reduce(torch.tensor(edge_p, device=device), reduction="mean").cpu().double()
        alpha = args.dynamic_prior_alpha
        new_node = (1 - alpha) * self.scheduler.node_marginals.double() + alpha * node_p
        new_edge = (1 - alpha) * self.scheduler.edge_marginals.double() + alpha * edge_p
        self.scheduler.update_marginals((new_node / new_node.sum()).tolist(), (new_edge / new_edge.sum()).tolist())

    def training_step(self) -> dict[str, float]:
        """One generation round: sample, (refine,) score, optimise. Returns the step's metrics (process mean)."""
        step = self.global_step
        self._timers = {}
        start = time.perf_counter()
        with self._timed("sampling"):
            rollout = self.generate(step)
        rollout = self.score_rollout(rollout)
        if self.args.refine_top_k > 0:
            with self._timed("sampling"):
                refined = self.refine(rollout, step)
            refined = self.score_rollout(refined, prefix="refine/")
            self.log_metric("refine/parent_reward", refined.parent_rewards.mean().item())
            rollout = GraphRollout.cat([rollout, refined])
        with self._timed("optimization"):
            self.optimize(rollout)
        if self.args.dynamic_prior_alpha > 0:
            self.update_prior(rollout)
        self.log_metric("prior/edge_p1", float(self.scheduler.edge_marginals[1]))
        logs = {key: sum(values) / len(values) for key, values in self._metrics.items() if values}
        logs["time/step"] = time.perf_counter() - start
        for name in ("sampling", "reward", "optimization"):
            logs[f"time/{name}"] = self._timers.get(name, 0.0)
        return self.reduce_metrics(logs)

    # ------------------------------------------------------------------------------------------------------------
    # Saving
    # ------------------------------------------------------------------------------------------------------------

    def _save_weights(self, output_dir: str) -> None:
        """The full model: a `GraphFlowPipeline` folder (model + the current scheduler, with its prior). With LoRA:
        the adapter (`pytorch_lora_weights.safetensors`, `pipe.model.load_lora_adapter(folder)`) beside the
        scheduler."""
        state = self.gathered_state_dict(self.model)
        if not self.accelerator.is_main_process:
            return
        model = self.unwrapped_model
        if self.peft_config is not None:
            model.save_lora_adapter(output_dir, weight_name="pytorch_lora_weights.safetensors")
            self.scheduler.save_pretrained(os.path.join(output_dir, "scheduler"))
            return
        if state is not None:
            from ..training_utils import save_model_state_dict

            save_model_state_dict(model, state, os.path.join(output_dir, "model"))
            self.scheduler.save_pretrained(os.path.join(output_dir, "scheduler"))
            return
        type(self.pipeline)(model=model, scheduler=self.scheduler).save_pretrained(output_dir)

    def _card_title(self, base_model: str | None) -> str:
        return "Graph-GRPO" + (f" of {base_model}" if base_model else "")

    def _card_metrics(self) -> dict:
        first = self.history[0] if self.history else {}
        last = self.history[-1] if self.history else {}
        metrics = {"reward (first step)": first["reward"]} if "reward" in first else {}
        for key in ("reward", "reward_std", "frac_reward_zero_std", "kl"):
            if key in last:
                metrics[f"{key} (last step)"] = last[key]
        return metrics

    def _card_description(self) -> str:
        args = self.args
        rewards = ", ".join(f"`{n}` (weight {w:g})" for n, w in zip(self.reward_names, self.reward_weights.tolist()))
        what = f"A LoRA (rank {self.peft_config.r})" if self.peft_config is not None else "The full model"
        return (
            f"{what}, trained by `GraphGRPOTrainer` (diffusers-ext) for {self.global_step} steps of "
            f"{self.generation_batch_size} graphs in groups of {args.num_generations} "
            f"({'shared' if args.shared_start else 'independent'} start graphs), {args.num_inference_steps} CTMC "
            f"steps, beta {args.beta}, epsilon {args.epsilon}/{args.epsilon_high}, learning rate "
            f"{args.learning_rate}, advantages `{args.scale_rewards}`. Rewards: {rewards}. Load it with "
            "`GraphFlowPipeline.from_pretrained(folder)`."
        )
