"""Discrete flow matching over graphs (DeFoG), sampled as a CTMC, with the analytic rate of Graph-GRPO.

A graph with `N` node slots is a node-class tensor `X` of shape `(B, N)` (classes `0 .. S_X - 1`), a symmetric
edge-class tensor `E` of shape `(B, N, N)` (classes `0 .. S_E - 1`, class 0 = no edge, zero diagonal) and a node mask
`(B, N)`. Every node and every upper-triangle edge follows its own path from the marginal noise `p0` (the class
frequencies of the training graphs) to the data,

    p_t(z | x1) = t * [z = x1] + (1 - t) * p0(z),

and moves at time `t` with a rate built from the model's prediction `p̂(x1 | G_t)`:

- `rate="defog"`: DeFoG's rate `R*(z -> k | x1) = ReLU(dp_t(k|x1)/dt - dp_t(z|x1)/dt) / (Z_t * p_t(z|x1))` with
  `x1` drawn from `p̂` (a one-sample Monte-Carlo estimate), plus `eta` times the detailed-balance rate
  `p_t(k | x1)` and `omega` times the target-guidance rate `[k = x1] / (Z_t * p_t(z | x1))`
  (DeFoG, arXiv:2410.04263; `Z_t` counts the states with `p_t(. | x1) > 0`);
- `rate="analytic"` (Graph-GRPO, arXiv:2603.10395, Eq. 28): the expectation of `R*` over `x1 ~ p̂`, in closed form,

      R(z -> k) = [p̂(k) (1 + p0(z) - p0(k)) + (1 - p̂(z) - p̂(k)) ReLU(p0(z) - p0(k))] / [S (1 - t) p0(z)],

  so a step is a categorical transition with an exact, differentiable probability and log-probability.

A step from `t` to `s` moves to `k != z` with probability `R(z -> k) (s - t)` and stays with the rest (clamped at 0;
the row is renormalised when the moves alone exceed 1, which is the distribution the categorical draw uses).
Sampling times are `t_i = f(i / (T + 1))`, `i = 0 .. T`, with the time distortion `f` (`"polydec"`:
`f(t) = 2t - t^2`), so a `T`-step run ends at `f(T / (T + 1)) < 1`, as in DeFoG.
"""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from ..utils import check_positive_int, public
from .scheduling_discrete_flow_matching import _as_generators, _rand, sample_categorical
from .scheduling_utils import timestep_indices


TIME_DISTORTIONS = ("identity", "polydec", "polyinc", "cos", "revcos")
RATES = ("analytic", "defog")


def distort_time(t: torch.Tensor, distortion: str) -> torch.Tensor:
    """DeFoG's time distortions `f` on `[0, 1]`: `"identity"`, `"polydec"` (`2t - t^2`), `"polyinc"` (`t^2`),
    `"cos"` (`(1 - cos(pi t)) / 2`) and `"revcos"` (`2t - (1 - cos(pi t)) / 2`)."""
    if distortion == "identity":
        return t
    if distortion == "polydec":
        return 2 * t - t**2
    if distortion == "polyinc":
        return t**2
    if distortion == "cos":
        return (1 - torch.cos(t * torch.pi)) / 2
    if distortion == "revcos":
        return 2 * t - (1 - torch.cos(t * torch.pi)) / 2
    raise ValueError(f"`time_distortion` must be one of {TIME_DISTORTIONS}, got {distortion!r}.")


def analytic_rate(probs: torch.Tensor, state: torch.LongTensor, t: torch.Tensor, p0: torch.Tensor) -> torch.Tensor:
    r"""Graph-GRPO's analytic rate (Eq. 28): `E_{x1 ~ probs}[R*(state -> k | x1)]` for every class `k`.

    Args:
        probs (`torch.Tensor` of shape `(..., S)`): the model's prediction `p̂(x1)` per variable.
        state (`torch.LongTensor` of shape `(...)`): the current class `z` per variable.
        t (`torch.Tensor` broadcastable to `state`): the time, `0 <= t < 1`.
        p0 (`torch.Tensor` of shape `(S,)`): the noise marginals, all positive.

    Returns:
        `torch.Tensor` of shape `(..., S)`: the rates to every `k`, 0 at `k = z`; differentiable in `probs`.
    """
    S = probs.shape[-1]
    p0 = p0.to(probs)
    p0_z = p0[state].unsqueeze(-1)
    p_z = probs.gather(-1, state.unsqueeze(-1))
    t = torch.as_tensor(t, dtype=probs.dtype, device=probs.device).unsqueeze(-1)
    numerator = probs * (1 + p0_z - p0) + (1 - p_z - probs) * torch.relu(p0_z - p0)
    rate = numerator / (S * (1 - t) * p0_z)
    return rate * (1 - torch.nn.functional.one_hot(state, S).to(rate))


def defog_rate(
    x1: torch.LongTensor,
    state: torch.LongTensor,
    t: torch.Tensor,
    p0: torch.Tensor,
    eta: float = 0.0,
    omega: float = 0.0,
) -> torch.Tensor:
    r"""DeFoG's rate given a clean class `x1`: `R* + eta * R^DB + omega * R^TG` (the `"general"` detailed-balance
    design), with DeFoG's stabilisation (non-finite or > 1e5 rates, and rates into or out of states with
    `p_t(. | x1) = 0`, set to 0).

    Args:
        x1 (`torch.LongTensor` of shape `(...)`): the clean class per variable.
        state (`torch.LongTensor` of shape `(...)`): the current class `z` per variable.
        t (`torch.Tensor` broadcastable to `state`): the time, `0 <= t < 1`.
        p0 (`torch.Tensor` of shape `(S,)`): the noise marginals.
        eta (`float`): weight of the detailed-balance rate `p_t(k | x1)`.
        omega (`float`): weight of the target-guidance rate `[k = x1 != z] / (Z_t p_t(z | x1))`.

    Returns:
        `torch.Tensor` of shape `(..., S)`: the rates to every `k`, 0 at `k = z`.
    """
    S = p0.shape[0]
    p0 = p0.to(state.device)
    t = torch.as_tensor(t, dtype=p0.dtype, device=state.device).unsqueeze(-1)
    x1_onehot = torch.nn.functional.one_hot(x1, S).to(p0)
    p_t = t * x1_onehot + (1 - t) * p0  # p_t(k | x1), (..., S)
    dp_t = x1_onehot - p0  # d/dt p_t(k | x1)
    p_t_z = p_t.gather(-1, state.unsqueeze(-1))
    dp_t_z = dp_t.gather(-1, state.unsqueeze(-1))
    Z_t = torch.count_nonzero(p_t, dim=-1).unsqueeze(-1).to(p0)
    rate = torch.relu(dp_t - dp_t_z) / (Z_t * p_t_z)
    if eta:
        rate = rate + eta * p_t
    if omega:
        rate = rate + omega * x1_onehot * (x1 != state).unsqueeze(-1) / (Z_t * p_t_z)
    rate = torch.nan_to_num(rate, nan=0.0, posinf=0.0, neginf=0.0)
    rate = torch.where(rate > 1e5, torch.zeros_like(rate), rate)
    rate = torch.where((p_t_z == 0) | (p_t == 0), torch.zeros_like(rate), rate)
    return rate * (1 - torch.nn.functional.one_hot(state, S).to(rate))


def rate_to_step_probs(rate: torch.Tensor, state: torch.LongTensor, dt: torch.Tensor) -> torch.Tensor:
    """One Euler step of a CTMC: `P(z -> k) = rate_k * dt` for `k != z`, `P(z -> z) = max(1 - sum, 0)`, each row
    renormalised (a no-op unless the moves alone exceed 1). Differentiable (no in-place writes).

    Args:
        rate (`torch.Tensor` of shape `(..., S)`): rates to every class (the entry at `z` is ignored).
        state (`torch.LongTensor` of shape `(...)`): the current class `z`.
        dt (`torch.Tensor` broadcastable to `state`): the step length `s - t`.

    Returns:
        `torch.Tensor` of shape `(..., S)`: the transition distribution of every variable.
    """
    stay = torch.nn.functional.one_hot(state, rate.shape[-1]).to(rate)
    dt = torch.as_tensor(dt, dtype=rate.dtype, device=rate.device).unsqueeze(-1)
    moves = rate * dt * (1 - stay)
    probs = moves + (1 - moves.sum(-1, keepdim=True)).clamp(min=0.0) * stay
    return probs / probs.sum(-1, keepdim=True)


def _edge_pair_mask(node_mask: torch.BoolTensor) -> torch.BoolTensor:
    """`(B, N, N)`: pairs `i < j` of two real nodes (the free edge variables)."""
    n = node_mask.shape[1]
    upper = torch.ones(n, n, dtype=torch.bool, device=node_mask.device).triu(1)
    return node_mask.unsqueeze(1) & node_mask.unsqueeze(2) & upper


def _symmetrize_upper(edges: torch.LongTensor, node_mask: torch.BoolTensor) -> torch.LongTensor:
    """Keep the free upper-triangle entries of `edges` `(B, N, N)`, mirror them, and zero everything else."""
    upper = torch.where(_edge_pair_mask(node_mask), edges, torch.zeros_like(edges))
    return upper + upper.transpose(1, 2)


@public
@dataclass
class GraphDiscreteFlowSchedulerOutput(BaseOutput):
    """
    Output of [`GraphDiscreteFlowScheduler.step`]. `B` graphs of `N` node slots, `S_X` node and `S_E` edge classes.

    Args:
        prev_node_classes (`torch.LongTensor` of shape `(B, N)`): node classes at the next time.
        prev_edge_classes (`torch.LongTensor` of shape `(B, N, N)`): symmetric edge classes at the next time.
        log_prob (`torch.Tensor` of shape `(B,)`): log-probability of the transition (real nodes plus the free
            upper-triangle edges).
        node_probs (`torch.Tensor` of shape `(B, N, S_X)`): the node transition distributions.
        edge_probs (`torch.Tensor` of shape `(B, N, N, S_E)`): the edge transition distributions.
    """

    prev_node_classes: torch.LongTensor
    prev_edge_classes: torch.LongTensor
    log_prob: torch.Tensor
    node_probs: torch.Tensor
    edge_probs: torch.Tensor


@public
class GraphDiscreteFlowScheduler(SchedulerMixin, ConfigMixin):
    r"""
    CTMC sampling of discrete graph flow matching (DeFoG) with marginal noise, the linear path, DeFoG's rate or
    Graph-GRPO's analytic rate, and DeFoG's time distortions.

    The scheduler holds the path for training ([`~sample_noise`], [`~add_noise`], [`~sample_training_times`]), the
    rates ([`~rate_matrix`]), a differentiable [`~transition_probs`] with per-step [`~step_log_prob`] for policy
    gradients, and [`~step`] for sampling.

    Parameters:
        num_node_classes (`int`, defaults to 1): node classes `S_X` (1 for unlabelled graphs).
        num_edge_classes (`int`, defaults to 2): edge classes `S_E`, class 0 meaning "no edge".
        node_marginals (`list[float]`, *optional*): the noise `p0` over node classes (positive, summing to 1);
            uniform if not given. [`~marginals_from_dense`] computes it from training graphs.
        edge_marginals (`list[float]`, *optional*): the noise `p0` over edge classes (positive, summing to 1);
            uniform if not given.
        time_distortion (`str`, defaults to `"polydec"`): the sampling-time distortion `f`, one of
            `TIME_DISTORTIONS`.
        train_time_distortion (`str`, defaults to `"identity"`): the distortion of the uniform training times.
        rate (`str`, defaults to `"analytic"`): `"analytic"` (Graph-GRPO Eq. 28) or `"defog"` (Monte-Carlo `R*`).
        eta (`float`, defaults to 0.0): DeFoG's detailed-balance weight (only with `rate="defog"`).
        omega (`float`, defaults to 0.0): DeFoG's target-guidance weight (only with `rate="defog"`).
        node_count_probs (`list[float]`, *optional*): probabilities of the node counts `0, 1, 2, ...` (the training
            distribution), used by [`GraphFlowPipeline`] when no `num_nodes` is given.
    """

    order = 1

    @register_to_config
    def __init__(
        self,
        num_node_classes: int = 1,
        num_edge_classes: int = 2,
        node_marginals: list[float] | None = None,
        edge_marginals: list[float] | None = None,
        time_distortion: str = "polydec",
        train_time_distortion: str = "identity",
        rate: str = "analytic",
        eta: float = 0.0,
        omega: float = 0.0,
        node_count_probs: list[float] | None = None,
    ):
        for name, value in (("num_node_classes", num_node_classes), ("num_edge_classes", num_edge_classes)):
            check_positive_int(name, value)
        if num_edge_classes < 2:
            raise ValueError(f"`num_edge_classes` must be >= 2 (class 0 is 'no edge'), got {num_edge_classes!r}.")
        for name, value in (("time_distortion", time_distortion), ("train_time_distortion", train_time_distortion)):
            if value not in TIME_DISTORTIONS:
                raise ValueError(f"`{name}` must be one of {TIME_DISTORTIONS}, got {value!r}.")
        if rate not in RATES:
            raise ValueError(f"`rate` must be one of {RATES}, got {rate!r}.")
        for name, value in (("eta", eta), ("omega", omega)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"`{name}` must be a number >= 0, got {value!r}.")
        if rate == "analytic" and (eta or omega):
            raise ValueError(
                f"`eta` and `omega` are DeFoG's extra rates and need `rate='defog'`; the analytic rate has none "
                f"(got eta={eta!r}, omega={omega!r})."
            )
        self._node_p0 = self._check_marginals("node_marginals", node_marginals, num_node_classes)
        self._edge_p0 = self._check_marginals("edge_marginals", edge_marginals, num_edge_classes)
        self._node_count_probs = None
        if node_count_probs is not None:
            self._node_count_probs = self._check_distribution("node_count_probs", node_count_probs, None)
            if float(self._node_count_probs[1:].sum()) <= 0:
                raise ValueError("`node_count_probs` puts no mass on a node count >= 1.")
        self.num_inference_steps = None
        self.time_grid = distort_time(torch.tensor([0.0, 0.5]), time_distortion)
        self.timesteps = self.time_grid[:-1]
        self._step_index = None

    # the noise and the path ---------------------------------------------------------------------------------

    @staticmethod
    def _check_distribution(name: str, values, size: int | None) -> torch.Tensor:
        try:
            p = torch.as_tensor(values, dtype=torch.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"`{name}` must be a list of probabilities, got {values!r}.") from error
        if p.ndim != 1 or (size is not None and p.shape[0] != size) or p.shape[0] == 0:
            expected = f"{size} entries" if size is not None else "a non-empty list"
            raise ValueError(f"`{name}` must be {expected}, got {values!r}.")
        if not bool(torch.isfinite(p).all()) or bool((p < 0).any()) or abs(float(p.sum()) - 1.0) > 1e-4:
            raise ValueError(f"`{name}` must be non-negative and sum to 1, got {values!r}.")
        return (p / p.sum()).float()

    def _check_marginals(self, name: str, values, size: int) -> torch.Tensor:
        if values is None:
            return torch.full((size,), 1.0 / size)
        p = self._check_distribution(name, values, size)
        if bool((p <= 0).any()):
            raise ValueError(f"`{name}` must be positive (the rates divide by p0), got {values!r}.")
        return p

    @property
    def node_marginals(self) -> torch.Tensor:
        """The node noise `p0`, shape `(S_X,)`."""
        return self._node_p0

    @property
    def edge_marginals(self) -> torch.Tensor:
        """The edge noise `p0`, shape `(S_E,)`."""
        return self._edge_p0

    @property
    def node_count_probs(self) -> torch.Tensor | None:
        """The node-count distribution (index = node count), or `None`."""
        return self._node_count_probs

    def update_marginals(self, node_marginals=None, edge_marginals=None) -> None:
        """Replace the noise `p0` (and with it the rates), e.g. Graph-GRPO's dynamic prior; the config follows."""
        updates = {}
        if node_marginals is not None:
            values = torch.as_tensor(node_marginals, dtype=torch.float64).tolist()
            self._node_p0 = self._check_marginals("node_marginals", values, self.config.num_node_classes)
            updates["node_marginals"] = self._node_p0.tolist()
        if edge_marginals is not None:
            values = torch.as_tensor(edge_marginals, dtype=torch.float64).tolist()
            self._edge_p0 = self._check_marginals("edge_marginals", values, self.config.num_edge_classes)
            updates["edge_marginals"] = self._edge_p0.tolist()
        if updates:
            self.register_to_config(**updates)

    @staticmethod
    def marginals_from_dense(
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        node_mask: torch.BoolTensor,
        num_node_classes: int,
        num_edge_classes: int,
    ) -> tuple[list[float], list[float]]:
        """Class frequencies of real nodes and of the free edge pairs `i < j` of a dense batch `(B, N)`,
        `(B, N, N)`, `(B, N)`: the marginal noise DeFoG uses."""
        nodes = torch.bincount(node_classes[node_mask].flatten(), minlength=num_node_classes).double()
        edges = torch.bincount(edge_classes[_edge_pair_mask(node_mask)].flatten(), minlength=num_edge_classes)
        edges = edges.double()
        return (nodes / nodes.sum()).tolist(), (edges / edges.sum()).tolist()

    def _check_graph(self, node_classes, edge_classes, node_mask) -> torch.BoolTensor:
        if not isinstance(node_classes, torch.Tensor) or node_classes.dtype != torch.long or node_classes.ndim != 2:
            raise ValueError(
                f"`node_classes` must be a (batch, num_nodes) LongTensor, got {getattr(node_classes, 'dtype', None)} "
                f"of shape {tuple(getattr(node_classes, 'shape', ()))}."
            )
        B, N = node_classes.shape
        if not isinstance(edge_classes, torch.Tensor) or edge_classes.dtype != torch.long:
            raise ValueError(f"`edge_classes` must be a LongTensor, got {type(edge_classes).__name__}.")
        if tuple(edge_classes.shape) != (B, N, N):
            raise ValueError(f"`edge_classes` must have shape {(B, N, N)}, got {tuple(edge_classes.shape)}.")
        if node_mask is None:
            node_mask = torch.ones(B, N, dtype=torch.bool, device=node_classes.device)
        if not isinstance(node_mask, torch.Tensor) or tuple(node_mask.shape) != (B, N):
            raise ValueError(f"`node_mask` must be a bool tensor of shape {(B, N)}, got {node_mask!r}.")
        for name, value, size in (
            ("node_classes", node_classes, self.config.num_node_classes),
            ("edge_classes", edge_classes, self.config.num_edge_classes),
        ):
            if value.numel() and (int(value.min()) < 0 or int(value.max()) >= size):
                raise ValueError(
                    f"`{name}` must lie in [0, {size}), got values in [{int(value.min())}, {int(value.max())}]."
                )
        return node_mask.bool()

    def sample_noise(
        self, node_mask: torch.BoolTensor, generator: torch.Generator | list[torch.Generator] | None = None
    ) -> tuple[torch.LongTensor, torch.LongTensor]:
        """Draw noise graphs from `p0` for a node mask `(B, N)`: node classes `(B, N)` and symmetric edge classes
        `(B, N, N)` (padding and the diagonal are 0). With a list of generators, graph `b` uses `generator[b]`."""
        if not isinstance(node_mask, torch.Tensor) or node_mask.ndim != 2:
            raise ValueError(f"`node_mask` must be a (batch, num_nodes) bool tensor, got {node_mask!r}.")
        node_mask = node_mask.bool()
        B, N = node_mask.shape
        _as_generators(generator, B)
        device = node_mask.device
        nodes = sample_categorical(self._node_p0.log().to(device).expand(B, N, -1), generator)
        edges = sample_categorical(self._edge_p0.log().to(device).expand(B, N, N, -1), generator)
        return torch.where(node_mask, nodes, torch.zeros_like(nodes)), _symmetrize_upper(edges, node_mask)

    def sample_training_times(self, batch_size: int, generator=None, device=None) -> torch.Tensor:
        """Training times `(batch_size,)`: uniform on `[0, 1)`, then `train_time_distortion`."""
        t = _rand((batch_size, 1), generator, device).squeeze(-1)
        return distort_time(t, self.config.train_time_distortion)

    def add_noise(
        self,
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        timesteps: torch.Tensor,
        node_mask: torch.BoolTensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.LongTensor, torch.LongTensor]:
        """Draw `G_t ~ p_t(. | G_1)`: every real node and free edge keeps its clean class with probability `t`,
        otherwise draws from `p0`. Inputs `(B, N)`, `(B, N, N)` (symmetric), times `(B,)`; returns the noisy pair."""
        node_mask = self._check_graph(node_classes, edge_classes, node_mask)
        B = node_classes.shape[0]
        t = torch.as_tensor(timesteps, dtype=torch.float32, device=node_classes.device).reshape(-1)
        if t.shape[0] != B or bool((t < 0).any()) or bool((t > 1).any()):
            raise ValueError(f"`timesteps` must be {B} times in [0, 1], got {timesteps!r}.")
        noise_X, noise_E = self.sample_noise(node_mask, generator)
        keep_X = _rand(tuple(node_classes.shape), generator, node_classes.device) < t.view(-1, 1)
        keep_E = _rand(tuple(edge_classes.shape), generator, node_classes.device) < t.view(-1, 1, 1)
        X = torch.where(keep_X & node_mask, node_classes, noise_X)
        E = _symmetrize_upper(torch.where(keep_E, edge_classes, noise_E), node_mask)
        return X, E

    # rates and transitions ------------------------------------------------------------------------------------

    def rate_matrix(
        self,
        node_probs: torch.Tensor,
        edge_probs: torch.Tensor,
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        timestep: torch.Tensor | float,
        node_mask: torch.BoolTensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rates `(B, N, S_X)` and `(B, N, N, S_E)` out of the current graph, from the model's probabilities
        `p̂` (same shapes), at `timestep` (a number or `(B,)`). `"defog"` draws `x1 ~ p̂` (with `generator`);
        `"analytic"` is its expectation and draws nothing. Padding rows are 0."""
        node_mask = self._check_graph(node_classes, edge_classes, node_mask)
        B = node_classes.shape[0]
        t = torch.as_tensor(timestep, dtype=node_probs.dtype, device=node_probs.device)
        t = t.expand(B) if t.ndim == 0 else t.reshape(B)
        if bool((t < 0).any()) or bool((t >= 1).any()):
            raise ValueError(f"`timestep` must lie in [0, 1), got {timestep!r}.")
        if self.config.rate == "analytic":
            rate_X = analytic_rate(node_probs, node_classes, t.view(B, 1), self._node_p0)
            rate_E = analytic_rate(edge_probs, edge_classes, t.view(B, 1, 1), self._edge_p0)
        else:
            x1_X = sample_categorical(node_probs.clamp_min(0).log(), generator)
            x1_E = sample_categorical(edge_probs.clamp_min(0).log(), generator)
            eta, omega = self.config.eta, self.config.omega
            rate_X = defog_rate(x1_X, node_classes, t.view(B, 1), self._node_p0.to(node_probs), eta, omega)
            rate_E = defog_rate(x1_E, edge_classes, t.view(B, 1, 1), self._edge_p0.to(edge_probs), eta, omega)
        edge_mask = node_mask.unsqueeze(1) & node_mask.unsqueeze(2)
        return rate_X * node_mask.unsqueeze(-1), rate_E * edge_mask.unsqueeze(-1)

    def transition_probs(
        self,
        node_logits: torch.Tensor,
        edge_logits: torch.Tensor,
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        timestep: torch.Tensor | float,
        next_timestep: torch.Tensor | float,
        node_mask: torch.BoolTensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step distributions from `timestep` to `next_timestep` (numbers or `(B,)`) of every node
        `(B, N, S_X)` and edge `(B, N, N, S_E)`, from the model's logits (same shapes). With `rate="analytic"` it
        is deterministic and differentiable in the logits (the policy of Graph-GRPO). Padding rows put all mass on
        class 0."""
        node_mask = self._check_graph(node_classes, edge_classes, node_mask)
        B, N = node_classes.shape
        S_X, S_E = self.config.num_node_classes, self.config.num_edge_classes
        if tuple(node_logits.shape) != (B, N, S_X):
            raise ValueError(f"`node_logits` must have shape {(B, N, S_X)}, got {tuple(node_logits.shape)}.")
        if tuple(edge_logits.shape) != (B, N, N, S_E):
            raise ValueError(f"`edge_logits` must have shape {(B, N, N, S_E)}, got {tuple(edge_logits.shape)}.")
        dtype = node_logits.dtype if node_logits.dtype == torch.float64 else torch.float32
        node_probs, edge_probs = node_logits.to(dtype).softmax(-1), edge_logits.to(dtype).softmax(-1)
        t = torch.as_tensor(timestep, dtype=dtype, device=node_logits.device)
        s = torch.as_tensor(next_timestep, dtype=dtype, device=node_logits.device)
        t, s = (x.expand(B) if x.ndim == 0 else x.reshape(B) for x in (t, s))
        if bool((s < t).any()) or bool((s > 1).any()):
            raise ValueError(f"`next_timestep` must lie in [timestep, 1], got {next_timestep!r}.")
        rate_X, rate_E = self.rate_matrix(node_probs, edge_probs, node_classes, edge_classes, t, node_mask, generator)
        dt = s - t
        probs_X = rate_to_step_probs(rate_X, node_classes, dt.view(B, 1))
        probs_E = rate_to_step_probs(rate_E, edge_classes, dt.view(B, 1, 1))
        edge_mask = node_mask.unsqueeze(1) & node_mask.unsqueeze(2)
        pad_X = torch.nn.functional.one_hot(torch.zeros_like(node_classes), S_X).to(probs_X)
        pad_E = torch.nn.functional.one_hot(torch.zeros_like(edge_classes), S_E).to(probs_E)
        probs_X = torch.where(node_mask.unsqueeze(-1), probs_X, pad_X)
        probs_E = torch.where(edge_mask.unsqueeze(-1), probs_E, pad_E)
        return probs_X, probs_E

    @staticmethod
    def step_log_prob(
        node_probs: torch.Tensor,
        edge_probs: torch.Tensor,
        next_node_classes: torch.LongTensor,
        next_edge_classes: torch.LongTensor,
        node_mask: torch.BoolTensor | None = None,
    ) -> torch.Tensor:
        """`log P(G_s | G_t)` of shape `(B,)`: the sum of `log node_probs` at `next_node_classes` over real nodes
        plus `log edge_probs` at `next_edge_classes` over the free pairs `i < j` (each edge once). For symmetric
        edge distributions this equals the reference's `0.5 * sum_{i != j}`."""
        B, N = next_node_classes.shape
        if node_mask is None:
            node_mask = torch.ones(B, N, dtype=torch.bool, device=next_node_classes.device)
        tiny = torch.finfo(node_probs.dtype).tiny
        log_X = node_probs.clamp_min(tiny).log().gather(-1, next_node_classes.unsqueeze(-1)).squeeze(-1)
        log_E = edge_probs.clamp_min(tiny).log().gather(-1, next_edge_classes.unsqueeze(-1)).squeeze(-1)
        pairs = _edge_pair_mask(node_mask.bool())
        return (log_X * node_mask).sum(-1) + (log_E * pairs).sum((-2, -1))

    def sample_transition(
        self,
        node_probs: torch.Tensor,
        edge_probs: torch.Tensor,
        node_mask: torch.BoolTensor,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.LongTensor, torch.LongTensor]:
        """Draw the next graph from the step distributions `(B, N, S_X)`, `(B, N, N, S_E)`: every node, and every
        free pair `i < j` (mirrored), draws its class; padding is 0."""
        nodes = sample_categorical(node_probs.detach().clamp_min(0).log(), generator)
        edges = sample_categorical(edge_probs.detach().clamp_min(0).log(), generator)
        return torch.where(node_mask, nodes, torch.zeros_like(nodes)), _symmetrize_upper(edges, node_mask)

    # sampling -------------------------------------------------------------------------------------------------

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None):
        """DeFoG's grid: `t_i = f(i / (T + 1))` for `i = 0 .. T`; `timesteps` are the `T` start times."""
        check_positive_int("num_inference_steps", num_inference_steps)
        self.num_inference_steps = num_inference_steps
        grid = torch.arange(num_inference_steps + 1, dtype=torch.float64) / (num_inference_steps + 1)
        self.time_grid = distort_time(grid, self.config.time_distortion).float().to(device)
        self.timesteps = self.time_grid[:-1].clone()
        self._step_index = None

    @property
    def step_index(self) -> int | None:
        return self._step_index

    def index_for_timestep(self, timestep) -> int:
        return int(timestep_indices(float(timestep), self.timesteps, atol=1e-6)[0])

    def step(
        self,
        node_logits: torch.Tensor,
        edge_logits: torch.Tensor,
        timestep: float | torch.Tensor,
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        node_mask: torch.BoolTensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        return_dict: bool = True,
    ) -> GraphDiscreteFlowSchedulerOutput | tuple:
        """
        One CTMC step from `timestep` (one of `timesteps`) to the next grid time.

        Args:
            node_logits (`torch.Tensor` of shape `(B, N, S_X)`): the model's node logits of `x1`.
            edge_logits (`torch.Tensor` of shape `(B, N, N, S_E)`): the model's edge logits of `x1`.
            timestep (`float` or `torch.Tensor`): the current time, one of `timesteps`.
            node_classes (`torch.LongTensor` of shape `(B, N)`): the current node classes.
            edge_classes (`torch.LongTensor` of shape `(B, N, N)`): the current symmetric edge classes.
            node_mask (`torch.BoolTensor` of shape `(B, N)`, *optional*): real nodes (all if not given).
            generator (`torch.Generator` or a list of `B`, *optional*): randomness; with a list, graph `b` uses only
                `generator[b]`.
            return_dict (`bool`, defaults to `True`): return a [`GraphDiscreteFlowSchedulerOutput`] or a tuple.
        """
        if self.num_inference_steps is None:
            raise ValueError("call `set_timesteps` before `step`.")
        node_mask = self._check_graph(node_classes, edge_classes, node_mask)
        index = self.index_for_timestep(timestep)
        t, s = self.time_grid[index], self.time_grid[index + 1]
        probs_X, probs_E = self.transition_probs(
            node_logits, edge_logits, node_classes, edge_classes, t, s, node_mask, generator
        )
        X, E = self.sample_transition(probs_X, probs_E, node_mask, generator)
        log_prob = self.step_log_prob(probs_X, probs_E, X, E, node_mask)
        self._step_index = index + 1 if index + 1 < self.num_inference_steps else None
        if not return_dict:
            return (X, E, log_prob, probs_X, probs_E)
        return GraphDiscreteFlowSchedulerOutput(
            prev_node_classes=X, prev_edge_classes=E, log_prob=log_prob, node_probs=probs_X, edge_probs=probs_E
        )

    def __len__(self) -> int:
        return self.num_inference_steps or 0
