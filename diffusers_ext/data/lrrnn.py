"""Low-rank RNNs (lrRNNs) and the synthetic ground truths of connectivity inference: quadstable, limit cycle, ring.

A rank-`R` lrRNN of `N` neurons has, per neuron `i`, input-side loadings `m_i` (`R` numbers) with an optional bias
`d_i`, and output-side loadings `n_i` (`R` numbers). Its latent state `z` (`R` numbers) follows

    z_{t+1} = (1 - alpha) z_t + (alpha / N) sum_i n_i tanh(m_i . z_t + d_i).

Each ground truth is a distribution over one neuron's loadings `(m, n)` of the maximum-entropy form the method
recovers: `m ~ p(m)`, `n = E[n | m] + N(0, residual_std^2 I)`. The residual is invisible to the mean-field
dynamics (it is independent of `m`), so only `E[n | m]` and `p(m)` shape the attractors:

- `"quadstable"`: `p(m)` a 4-component Gaussian mixture with means `0.87 (+-1, +-1)` and covariance `0.25 I`, whose
  output means are `2.31 (+-1, +-1)`, so `E[n_j | m] = 2.31 tanh(0.87 m_j / 0.25)`: four stable fixed points.
- `"limit_cycle"`: `m ~ N(0, I)`, `E[n | m] = A m` with `A = [[2, -2], [2, 2]]` (growth and rotation): the origin
  is an unstable spiral and the dynamics settle on one stable limit cycle.
- `"ring"`: `m ~ N(0, I)`, `E[n | m] = 2 m`: a ring attractor (a continuum of slow states at one radius).
- `"heavy_tailed_limit_cycle"`: the limit cycle's `A`, with `m` an isotropic Student-t (3 degrees of freedom,
  scaled to unit covariance): heavy-tailed loadings, still rotation-symmetric, so again one limit cycle.

Everything is deterministic given a `torch.Generator` (or a seed).
"""

import math
from dataclasses import dataclass

import torch

from ..utils import check_positive_int, is_int


GROUND_TRUTHS = ("quadstable", "limit_cycle", "ring", "heavy_tailed_limit_cycle")
# The attractor kind each ground truth has (what resampled networks must reproduce).
ATTRACTORS = {
    "quadstable": "fixed_points",
    "limit_cycle": "limit_cycle",
    "ring": "ring",
    "heavy_tailed_limit_cycle": "limit_cycle",
}
DEFAULT_ALPHA = 0.1


def _check_loadings(input_loadings: torch.Tensor, output_loadings: torch.Tensor, bias: torch.Tensor | None):
    if not isinstance(input_loadings, torch.Tensor) or input_loadings.ndim not in (2, 3):
        raise ValueError(
            "`input_loadings` must be a tensor of shape (num_neurons, rank) or (num_networks, num_neurons, rank), "
            f"got {getattr(input_loadings, 'shape', type(input_loadings).__name__)}."
        )
    if not isinstance(output_loadings, torch.Tensor) or output_loadings.shape != input_loadings.shape:
        raise ValueError(
            f"`output_loadings` must have the shape of `input_loadings` {tuple(input_loadings.shape)}, got "
            f"{tuple(getattr(output_loadings, 'shape', ()))}."
        )
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != input_loadings.shape[:-1]):
        raise ValueError(
            f"`bias` must have shape {tuple(input_loadings.shape[:-1])} (one per neuron), got "
            f"{tuple(getattr(bias, 'shape', ()))}."
        )


def lrrnn_step(
    states: torch.Tensor,
    input_loadings: torch.Tensor,
    output_loadings: torch.Tensor,
    alpha: float = DEFAULT_ALPHA,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One step of the lrRNN's latent dynamics.

    Args:
        states (`torch.Tensor` of shape `(..., K, R)`): `K` latent states per network (leading dims match the
            networks' batch dims of the loadings, or are absent for one network).
        input_loadings (`torch.Tensor` of shape `(..., N, R)`): `m`.
        output_loadings (`torch.Tensor` of shape `(..., N, R)`): `n`.
        alpha (`float`, defaults to 0.1): the leak `dt / tau`.
        bias (`torch.Tensor` of shape `(..., N)`, *optional*): `d`.

    Returns:
        `torch.Tensor` of the shape of `states`: `z_{t+1}`.
    """
    currents = states @ input_loadings.transpose(-1, -2)
    if bias is not None:
        currents = currents + bias.unsqueeze(-2)
    recurrent = torch.tanh(currents) @ output_loadings / input_loadings.shape[-2]
    return (1 - alpha) * states + alpha * recurrent


def simulate_latents(
    input_loadings: torch.Tensor,
    output_loadings: torch.Tensor,
    initial_states: torch.Tensor,
    num_steps: int,
    alpha: float = DEFAULT_ALPHA,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the latent dynamics of one or a batch of lrRNNs from the same initial states (no noise, no input).

    Args:
        input_loadings (`torch.Tensor` of shape `(N, R)` or `(B, N, R)`): `m` of one network or of `B` networks.
        output_loadings (`torch.Tensor` of the same shape): `n`.
        initial_states (`torch.Tensor` of shape `(K, R)`): the `K` starting points (shared by every network).
        num_steps (`int`): steps to run (`>= 0`).
        alpha (`float`, defaults to 0.1): the leak.
        bias (`torch.Tensor` of shape `(N,)` or `(B, N)`, *optional*): `d`.

    Returns:
        `torch.Tensor` of shape `(K, num_steps + 1, R)` (one network) or `(B, K, num_steps + 1, R)`: the
        trajectories, initial states included.
    """
    _check_loadings(input_loadings, output_loadings, bias)
    rank = input_loadings.shape[-1]
    if not isinstance(initial_states, torch.Tensor) or initial_states.ndim != 2 or initial_states.shape[1] != rank:
        raise ValueError(
            f"`initial_states` must be a tensor of shape (num_states, {rank}), got "
            f"{tuple(getattr(initial_states, 'shape', ()))}."
        )
    check_positive_int("num_steps", num_steps, minimum=0)
    if not 0 < float(alpha) <= 1:
        raise ValueError(f"`alpha` must lie in (0, 1], got {alpha!r}.")
    states = initial_states.to(input_loadings)
    if input_loadings.ndim == 3:
        states = states.expand(input_loadings.shape[0], *states.shape)
    trajectory = [states]
    for _ in range(num_steps):
        states = lrrnn_step(states, input_loadings, output_loadings, alpha, bias)
        trajectory.append(states)
    return torch.stack(trajectory, dim=-2)


def initial_state_grid(grid_size: int = 20, extent: float = 2.4, rank: int = 2) -> torch.Tensor:
    """A `grid_size ** rank` grid of initial states in `[-extent, extent]^rank`, shape `(grid_size ** rank, rank)`."""
    check_positive_int("grid_size", grid_size)
    check_positive_int("rank", rank)
    axis = torch.linspace(-extent, extent, grid_size, dtype=torch.float64)
    return torch.stack(torch.meshgrid(*([axis] * rank), indexing="ij"), dim=-1).reshape(-1, rank)


@dataclass(frozen=True)
class LowRankRNN:
    """One lrRNN: its loadings and leak.

    Attributes:
        input_loadings (`torch.Tensor` of shape `(N, R)`): `m`.
        output_loadings (`torch.Tensor` of shape `(N, R)`): `n`.
        alpha (`float`): the leak.
        bias (`torch.Tensor` of shape `(N,)`, *optional*): `d`.
    """

    input_loadings: torch.Tensor
    output_loadings: torch.Tensor
    alpha: float = DEFAULT_ALPHA
    bias: torch.Tensor | None = None

    def __post_init__(self):
        _check_loadings(self.input_loadings, self.output_loadings, self.bias)
        if self.input_loadings.ndim != 2:
            raise ValueError(f"`input_loadings` of one network must be 2-D, got {tuple(self.input_loadings.shape)}.")

    @property
    def num_neurons(self) -> int:
        return self.input_loadings.shape[0]

    @property
    def rank(self) -> int:
        return self.input_loadings.shape[1]

    def step(self, states: torch.Tensor) -> torch.Tensor:
        """`z_{t+1}` of states `(K, R)`."""
        return lrrnn_step(
            states.to(self.input_loadings), self.input_loadings, self.output_loadings, self.alpha, self.bias
        )

    def velocity(self, states: torch.Tensor) -> torch.Tensor:
        """The continuous-time flow `-z + (1/N) sum_i n_i tanh(m_i . z + d_i)` at states `(K, R)` (= step / alpha)."""
        states = states.to(self.input_loadings)
        return (self.step(states) - states) / self.alpha

    def simulate(self, initial_states: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Trajectories `(K, num_steps + 1, R)` from `initial_states` `(K, R)`."""
        return simulate_latents(
            self.input_loadings, self.output_loadings, initial_states, num_steps, self.alpha, self.bias
        )

    def transitions(self, initial_states: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`(states, next_states)`, each `(K * num_steps, R)`: every one-step transition of the trajectories."""
        trajectories = self.simulate(initial_states, num_steps)
        rank = trajectories.shape[-1]
        return trajectories[:, :-1].reshape(-1, rank), trajectories[:, 1:].reshape(-1, rank)


def _generator(generator: torch.Generator | int | None) -> torch.Generator:
    if isinstance(generator, torch.Generator):
        return generator
    if generator is None or is_int(generator):
        return torch.Generator("cpu").manual_seed(0 if generator is None else int(generator))
    raise TypeError(f"`generator` must be a torch.Generator or an int seed, got {type(generator).__name__}.")


@dataclass(frozen=True)
class LowRankRNNGroundTruth:
    """A known distribution of one neuron's loadings, `m ~ p(m)`, `n = E[n | m] + N(0, residual_std^2 I)` (rank 2).

    Build one with [`make_ground_truth`]. `sample_loadings` draws neurons, `conditional_mean` is the analytic
    `E[n | m]`, and `network` draws a whole lrRNN.

    Attributes:
        name (`str`): one of `GROUND_TRUTHS`.
        residual_std (`float`): the std of `n - E[n | m]` (the maximum-entropy part).
        alpha (`float`): the leak of its networks.
    """

    name: str
    residual_std: float = 1.0
    alpha: float = DEFAULT_ALPHA

    rank = 2

    def __post_init__(self):
        if self.name not in GROUND_TRUTHS:
            raise ValueError(f"`name` must be one of {GROUND_TRUTHS}, got {self.name!r}.")
        if not self.residual_std >= 0:
            raise ValueError(f"`residual_std` must be >= 0, got {self.residual_std!r}.")

    @property
    def attractor(self) -> str:
        """`"fixed_points"`, `"limit_cycle"` or `"ring"`."""
        return ATTRACTORS[self.name]

    def sample_input_loadings(self, num_neurons: int, generator: torch.Generator) -> torch.Tensor:
        """`m`: `(num_neurons, 2)` float64 draws of `p(m)`."""
        check_positive_int("num_neurons", num_neurons)
        noise = torch.randn(num_neurons, 2, generator=generator, dtype=torch.float64)
        if self.name == "quadstable":
            signs = torch.randint(0, 2, (num_neurons, 2), generator=generator).to(torch.float64) * 2 - 1
            return 0.87 * signs + 0.5 * noise
        if self.name == "heavy_tailed_limit_cycle":
            dof = 3  # chi-square with 3 degrees of freedom: a sum of 3 squared normals
            chi2 = torch.randn(num_neurons, dof, generator=generator, dtype=torch.float64).square().sum(-1, True)
            return noise * torch.sqrt((dof - 2) / chi2)
        return noise

    def conditional_mean(self, input_loadings: torch.Tensor) -> torch.Tensor:
        """The analytic `E[n | m]` of input-side loadings `(N, 2)`, shape `(N, 2)`."""
        m = input_loadings.to(torch.float64)
        if self.name == "quadstable":
            return 2.31 * torch.tanh(0.87 * m / 0.25)
        if self.name == "ring":
            return 2.0 * m
        rotation = torch.tensor([[2.0, -2.0], [2.0, 2.0]], dtype=torch.float64)
        return m @ rotation.T

    def sample_loadings(
        self, num_neurons: int, generator: torch.Generator | int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(m, n)`, each `(num_neurons, 2)` float64: `num_neurons` independent neurons of the ground truth."""
        generator = _generator(generator)
        m = self.sample_input_loadings(num_neurons, generator)
        residual = torch.randn(num_neurons, 2, generator=generator, dtype=torch.float64)
        return m, self.conditional_mean(m) + self.residual_std * residual

    def network(self, num_neurons: int = 1000, generator: torch.Generator | int | None = None) -> LowRankRNN:
        """A [`LowRankRNN`] of `num_neurons` neurons drawn from the ground truth."""
        m, n = self.sample_loadings(num_neurons, generator)
        return LowRankRNN(m, n, self.alpha)


def make_ground_truth(name: str, residual_std: float = 1.0, alpha: float = DEFAULT_ALPHA) -> LowRankRNNGroundTruth:
    """The ground truth `name` (one of `GROUND_TRUTHS`; see the module docstring)."""
    if name not in GROUND_TRUTHS:
        raise ValueError(f"`name` must be one of {GROUND_TRUTHS}, got {name!r}.")
    return LowRankRNNGroundTruth(name=name, residual_std=residual_std, alpha=alpha)


def ring_initial_states(radius: float, num_angles: int = 24) -> torch.Tensor:
    """`num_angles` states evenly spaced on a circle of `radius`, shape `(num_angles, 2)` float64."""
    check_positive_int("num_angles", num_angles)
    angles = torch.arange(num_angles, dtype=torch.float64) * (2 * math.pi / num_angles)
    return radius * torch.stack([angles.cos(), angles.sin()], dim=-1)
