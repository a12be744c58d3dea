r"""Offline black-box optimisation tasks with exact oracles (a self-contained stand-in for Design-Bench).

Design-Bench downloads its data and oracle weights at run time (and several are missing upstream), so these tasks
are built in code, with an oracle that is the exact objective:

- [`TFBindLikeTask`]: every 8-mer over `ACGT` (4^8 = 65,536 sequences) scored by a seeded position weight matrix
  plus sparse pairwise epistasis; the exact maximum and minimum are known by enumeration. The offline set is the
  bottom half by score.
- [`EhrlichTask`]: the closed-form Ehrlich functions of Stanton et al. (2024): a sequence is feasible under a banded
  transition matrix (a discrete Markov process, DMP), and its value is the product over `c` spaced motifs of the
  quantised fraction of the motif present. The optimum is exactly 1.0.
- [`ContinuousTask`]: Ackley, Rosenbrock and Styblinski-Tang (negated, so larger is better) in `D` dimensions, the
  offline set the lower half of a uniform sample of the box.

All follow Design-Bench's protocol: train on the offline set, propose a batch (128) of designs, score them with the
oracle and report the 100th and 50th percentile of the normalised score `(y - y_min) / (y_max - y_min)`
([`OfflineTask.score_candidates`]). Discrete tasks expose Design-Bench's logit relaxation ([`to_logits`],
[`from_logits`]): a design is a point in `R^{L (C - 1)}` and the oracle decodes it by arg-max.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np


TASK_NAMES = ("tfbind8", "ehrlich", "ackley", "rosenbrock", "styblinski_tang")


def to_logits(tokens: np.ndarray, num_classes: int, soft_interpolation: float = 0.6) -> np.ndarray:
    r"""Design-Bench's logit relaxation of token sequences.

    Each token becomes a smoothed one-hot `p = soft * onehot + (1 - soft) / C`; its logits relative to class 0,
    `log p[1:] - log p[0]`, are kept (class 0 is the reference), so a position takes `C - 1` numbers.

    Args:
        tokens (`np.ndarray` of shape `(N, L)`, integers in `[0, num_classes)`).
        num_classes (`int`): `C`.
        soft_interpolation (`float`): the weight of the one-hot (Design-Bench's default 0.6).

    Returns:
        `np.ndarray` of shape `(N, L * (C - 1))`, float32.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"`tokens` must have shape (N, L), got {tokens.shape}.")
    if not 0.0 < soft_interpolation < 1.0:
        raise ValueError(f"`soft_interpolation` must be in (0, 1), got {soft_interpolation}.")
    onehot = np.eye(num_classes, dtype=np.float64)[tokens]
    probs = soft_interpolation * onehot + (1.0 - soft_interpolation) / num_classes
    logits = np.log(probs[..., 1:]) - np.log(probs[..., :1])
    return logits.reshape(tokens.shape[0], -1).astype(np.float32)


def from_logits(x: np.ndarray, seq_len: int, num_classes: int) -> np.ndarray:
    r"""Decode relaxed designs (shape `(N, L * (C - 1))`) to tokens `(N, L)`: arg-max over `[0, logits]`."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != seq_len * (num_classes - 1):
        raise ValueError(
            f"`x` must have shape (N, {seq_len * (num_classes - 1)}) (seq_len * (num_classes - 1)), got {x.shape}."
        )
    logits = x.reshape(x.shape[0], seq_len, num_classes - 1)
    full = np.concatenate([np.zeros(logits.shape[:2] + (1,)), logits], axis=-1)
    return full.argmax(-1)


@dataclass
class OfflineTask(ABC):
    r"""
    An offline optimisation task: the offline data, the design bounds, the exact oracle and the normalisation.

    Attributes:
        name (`str`): the task's name.
        offline_x (`np.ndarray` of shape `(N, D)`, float32): the offline designs (relaxed logits for discrete tasks).
        offline_y (`np.ndarray` of shape `(N,)`, float32): their exact scores.
        bounds (`np.ndarray` of shape `(2, D)`): the per-dimension min and max of `offline_x` (the search box).
        y_min, y_max (`float`): the normalisation range (exact for enumerable tasks; see each task).
        discrete (`bool`): whether designs are relaxed token sequences.
        seq_len, num_classes (`int` or None): `L` and `C` of a discrete task.
    """

    name: str
    offline_x: np.ndarray
    offline_y: np.ndarray
    y_min: float
    y_max: float
    discrete: bool = False
    seq_len: int | None = None
    num_classes: int | None = None
    bounds: np.ndarray = field(init=False)

    def __post_init__(self):
        self.bounds = np.stack([self.offline_x.min(0), self.offline_x.max(0)]).astype(np.float32)

    @property
    def dim(self) -> int:
        return int(self.offline_x.shape[1])

    @abstractmethod
    def oracle(self, x: np.ndarray) -> np.ndarray:
        """Exact scores `(N,)` of designs `x` of shape `(N, D)` (relaxed designs are decoded by arg-max); every
        task defines its own."""

    def _check_x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"`x` must have shape (N, {self.dim}) for task {self.name!r}, got {x.shape}.")
        return x

    def normalise(self, y: np.ndarray) -> np.ndarray:
        """`(y - y_min) / (y_max - y_min)`."""
        return (np.asarray(y, dtype=np.float64) - self.y_min) / (self.y_max - self.y_min)

    def score_candidates(self, x: np.ndarray) -> dict:
        """The Design-Bench numbers of a proposed batch: normalised 100th and 50th percentile, and the raw max."""
        y = self.oracle(x)
        normalised = self.normalise(y)
        return {
            "p100": float(np.max(normalised)),
            "p50": float(np.percentile(normalised, 50)),
            "max": float(np.max(y)),
        }

    def offline_best(self) -> float:
        """The normalised best score of the offline data (the "best of offline data" baseline)."""
        return float(self.normalise(self.offline_y.max()))


def _subsample(rng: np.random.Generator, n: int, size: int | None) -> np.ndarray:
    if size is None or size >= n:
        return np.arange(n)
    return np.sort(rng.choice(n, size=size, replace=False))


class TFBindLikeTask(OfflineTask):
    r"""
    A TF-Bind-8-like task: all 4^8 8-mers, scored by a seeded PWM plus sparse pairwise epistasis.

    `score(s) = sum_l W[l, s_l] + sum_{(a, b) in P} E_ab[s_a, s_b]` with `W ~ N(0, 1)`, `num_pairs` random position
    pairs and `E_ab ~ N(0, epistasis)`. Every sequence is scored, so `y_min`/`y_max` are the exact extremes. The offline
    set is the bottom `offline_fraction` by score (Design-Bench's TF-Bind-8 keeps the lower half), optionally a random
    subset of `offline_size` of it (for CPU runs).

    Args:
        seed (`int`): seed of the PWM and epistasis (another seed is another task).
        offline_fraction (`float`): the fraction of all sequences, by score from the bottom, that is offline.
        offline_size (`int`, *optional*): keep a random subset of this many offline points.
        num_pairs (`int`), epistasis (`float`): the pairwise terms.
        subset_seed (`int`): seed of the subset draw.
    """

    seq_len = 8
    num_classes = 4

    def __init__(
        self,
        seed: int = 0,
        offline_fraction: float = 0.5,
        offline_size: int | None = None,
        num_pairs: int = 6,
        epistasis: float = 1.0,
        subset_seed: int = 0,
    ):
        if not 0.0 < offline_fraction <= 1.0:
            raise ValueError(f"`offline_fraction` must be in (0, 1], got {offline_fraction}.")
        rng = np.random.default_rng(seed)
        length, classes = self.seq_len, self.num_classes
        self.pwm = rng.normal(size=(length, classes))
        pairs = []
        while len(pairs) < num_pairs:
            a, b = sorted(rng.choice(length, size=2, replace=False).tolist())
            if (a, b) not in pairs:
                pairs.append((a, b))
        self.pairs = pairs
        self.pair_tables = rng.normal(scale=epistasis, size=(num_pairs, classes, classes))
        grids = np.stack(np.meshgrid(*[np.arange(classes)] * length, indexing="ij"), -1).reshape(-1, length)
        self.all_tokens = grids
        self.all_y = self._score_tokens(grids)
        order = np.argsort(self.all_y, kind="stable")
        offline = order[: int(round(offline_fraction * len(order)))]
        offline = offline[_subsample(np.random.default_rng(subset_seed), len(offline), offline_size)]
        super().__init__(
            name=f"tfbind8_like(seed={seed})",
            offline_x=to_logits(grids[offline], classes),
            offline_y=self.all_y[offline].astype(np.float32),
            y_min=float(self.all_y.min()),
            y_max=float(self.all_y.max()),
            discrete=True,
            seq_len=length,
            num_classes=classes,
        )
        self.offline_tokens = grids[offline]

    def _score_tokens(self, tokens: np.ndarray) -> np.ndarray:
        positions = np.arange(self.seq_len)
        y = self.pwm[positions, tokens].sum(-1)
        for table, (a, b) in zip(self.pair_tables, self.pairs):
            y = y + table[tokens[:, a], tokens[:, b]]
        return y

    def oracle(self, x: np.ndarray) -> np.ndarray:
        x = self._check_x(x)
        return self._score_tokens(from_logits(x, self.seq_len, self.num_classes))


class EhrlichFunction:
    r"""
    A closed-form Ehrlich function (Stanton et al. 2024) over sequences of length `L` on `v` states.

    - Feasibility: a banded transition matrix forbids, from each state `i`, the `band` states `i + 1 .. i + band`
      (mod `v`) except transitions the motifs need; a sequence is feasible iff each of its transitions is allowed.
    - Value: `f(s) = prod_i q(h_i(s))` over `c` motifs `a_i` (length `k`, distinct states) with spacings `s_i`
      (offsets `0 = s_i1 < ... < s_ik`, span at most `L // c`): `h_i(s) = max_l (1/k) #{j : s[l + s_ij] = a_ij}`,
      quantised to `q` levels (`floor(h q) / q`); an infeasible sequence scores 0. The optimum is 1.0, reached by
      [`optimal_sequence`].

    Args:
        seq_len (`int`): `L`. num_states (`int`): `v`. num_motifs (`int`): `c`. motif_length (`int`): `k`.
        quantization (`int`): `q` (must divide `k`'s levels; `q = k` is exact). seed (`int`). band (`int`).
    """

    def __init__(
        self,
        seq_len: int = 32,
        num_states: int = 20,
        num_motifs: int = 4,
        motif_length: int = 4,
        quantization: int = 4,
        seed: int = 0,
        band: int | None = None,
    ):
        if num_motifs * motif_length > num_states:
            raise ValueError(
                f"`num_motifs * motif_length` ({num_motifs * motif_length}) must be <= `num_states` ({num_states})."
            )
        if seq_len // num_motifs < motif_length:
            raise ValueError(f"`seq_len // num_motifs` must be >= `motif_length`, got {seq_len}, {num_motifs}.")
        self.seq_len, self.num_states, self.num_motifs = seq_len, num_states, num_motifs
        self.motif_length, self.quantization = motif_length, quantization
        rng = np.random.default_rng(seed)
        band = max(1, num_states // 4) if band is None else band
        feasible = np.ones((num_states, num_states), dtype=bool)
        for i in range(num_states):
            for d in range(1, band + 1):
                feasible[i, (i + d) % num_states] = False
        states = rng.permutation(num_states)[: num_motifs * motif_length]
        self.motifs = states.reshape(num_motifs, motif_length)
        for m, motif in enumerate(self.motifs):
            for a, b in zip(motif[:-1], motif[1:]):
                feasible[a, b] = True
            if m + 1 < num_motifs:
                feasible[motif[-1], self.motifs[m + 1][0]] = True
        np.fill_diagonal(feasible, True)
        self.feasible = feasible
        span = seq_len // num_motifs
        self.spacings = np.stack(
            [
                np.concatenate([[0], np.sort(rng.choice(np.arange(1, span), motif_length - 1, replace=False))])
                for _ in range(num_motifs)
            ]
        )
        weights = rng.random((num_states, num_states)) * feasible
        self.transition = weights / weights.sum(1, keepdims=True)

    def is_feasible(self, tokens: np.ndarray) -> np.ndarray:
        """`(N,)` bool: every transition of each sequence is allowed."""
        return self.feasible[tokens[:, :-1], tokens[:, 1:]].all(1)

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        """`f(tokens)` for `tokens` of shape `(N, L)`: `(N,)` values in `[0, 1]`."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[1] != self.seq_len:
            raise ValueError(f"`tokens` must have shape (N, {self.seq_len}), got {tokens.shape}.")
        value = np.ones(tokens.shape[0])
        for motif, spacing in zip(self.motifs, self.spacings):
            starts = self.seq_len - spacing[-1]
            hits = np.zeros((tokens.shape[0], starts))
            for element, offset in zip(motif, spacing):
                hits += tokens[:, offset : offset + starts] == element
            presence = hits.max(1) / self.motif_length
            value *= np.floor(presence * self.quantization + 1e-9) / self.quantization
        return np.where(self.is_feasible(tokens), value, 0.0)

    def optimal_sequence(self) -> np.ndarray:
        """A feasible sequence `(L,)` with value 1.0: each motif in its own segment, gaps filled by repeats."""
        seq = []
        span = self.seq_len // self.num_motifs
        for motif, spacing in zip(self.motifs, self.spacings):
            segment = np.empty(span, dtype=int)
            for j, (element, offset) in enumerate(zip(motif, spacing)):
                end = spacing[j + 1] if j + 1 < len(spacing) else span
                segment[offset:end] = element
            seq.append(segment)
        seq = np.concatenate(seq)
        return np.concatenate([seq, np.full(self.seq_len - len(seq), seq[-1])])

    def sample_dmp(self, num: int, rng: np.random.Generator) -> np.ndarray:
        """`num` sequences `(num, L)` drawn from the DMP (uniform first state, then the transition matrix)."""
        tokens = np.empty((num, self.seq_len), dtype=int)
        tokens[:, 0] = rng.integers(0, self.num_states, num)
        cumulative = self.transition.cumsum(1)
        for position in range(1, self.seq_len):
            u = rng.random(num)[:, None]
            tokens[:, position] = (u > cumulative[tokens[:, position - 1]]).sum(1).clip(max=self.num_states - 1)
        return tokens


class EhrlichTask(OfflineTask):
    r"""
    An Ehrlich function as an offline task: `num_samples` DMP samples, the offline set those at or below the
    `offline_quantile` of their values (optionally a random `offline_size` of them). `y_min = 0`, `y_max = 1`
    (the exact optimum). Designs are relaxed one-hot logits (`seq_len * (num_states - 1)` numbers).
    """

    def __init__(
        self,
        seq_len: int = 32,
        num_states: int = 20,
        num_motifs: int = 4,
        motif_length: int = 4,
        quantization: int = 4,
        seed: int = 0,
        num_samples: int = 20000,
        offline_quantile: float = 0.5,
        offline_size: int | None = None,
    ):
        self.function = EhrlichFunction(seq_len, num_states, num_motifs, motif_length, quantization, seed)
        rng = np.random.default_rng(seed + 1)
        tokens = self.function.sample_dmp(num_samples, rng)
        y = self.function(tokens)
        keep = np.flatnonzero(y <= np.quantile(y, offline_quantile))
        keep = keep[_subsample(rng, len(keep), offline_size)]
        super().__init__(
            name=f"ehrlich(L={seq_len},v={num_states},c={num_motifs},k={motif_length},q={quantization},seed={seed})",
            offline_x=to_logits(tokens[keep], num_states),
            offline_y=y[keep].astype(np.float32),
            y_min=0.0,
            y_max=1.0,
            discrete=True,
            seq_len=seq_len,
            num_classes=num_states,
        )

    def oracle(self, x: np.ndarray) -> np.ndarray:
        x = self._check_x(x)
        return self.function(from_logits(x, self.seq_len, self.num_classes))


def ackley(x: np.ndarray) -> np.ndarray:
    """Negated Ackley (maximum 0 at the origin), `x` of shape `(N, D)`."""
    d = x.shape[1]
    a = -20.0 * np.exp(-0.2 * np.sqrt((x**2).sum(1) / d))
    b = -np.exp(np.cos(2 * np.pi * x).sum(1) / d)
    return -(a + b + 20.0 + np.e)


def rosenbrock(x: np.ndarray) -> np.ndarray:
    """Negated Rosenbrock (maximum 0 at all ones)."""
    return -(100.0 * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (1.0 - x[:, :-1]) ** 2).sum(1)


def styblinski_tang(x: np.ndarray) -> np.ndarray:
    """Negated Styblinski-Tang (maximum `39.16617 D` at `x_i = -2.903534`)."""
    return -0.5 * (x**4 - 16.0 * x**2 + 5.0 * x).sum(1)


CONTINUOUS_FUNCTIONS = {
    # name: (function, lower, upper, optimiser (one coordinate))
    "ackley": (ackley, -32.768, 32.768, 0.0),
    "rosenbrock": (rosenbrock, -5.0, 10.0, 1.0),
    "styblinski_tang": (styblinski_tang, -5.0, 5.0, -2.903534),
}


class ContinuousTask(OfflineTask):
    r"""
    A continuous test function (negated, larger is better) in `dim` dimensions on its standard box.

    The offline set is the lower `offline_fraction` (by value) of `num_samples` uniform points of the box.
    `y_max` is the known optimum; `y_min` the minimum over a seeded `reference_size` uniform sample (10^6 by
    default), as the normalisation of the Design-Bench protocol needs a finite range.
    """

    def __init__(
        self,
        function: str = "ackley",
        dim: int = 20,
        seed: int = 0,
        num_samples: int = 4000,
        offline_fraction: float = 0.5,
        reference_size: int = 1_000_000,
    ):
        if function not in CONTINUOUS_FUNCTIONS:
            raise ValueError(f"`function` must be one of {tuple(CONTINUOUS_FUNCTIONS)}, got {function!r}.")
        self.function, low, high, optimiser = CONTINUOUS_FUNCTIONS[function]
        self.low, self.high = low, high
        rng = np.random.default_rng(seed)
        x = rng.uniform(low, high, size=(num_samples, dim))
        y = self.function(x)
        keep = np.argsort(y, kind="stable")[: int(round(offline_fraction * num_samples))]
        reference = np.random.default_rng(12345)
        y_min = np.inf
        for start in range(0, reference_size, 100_000):
            chunk = reference.uniform(low, high, size=(min(100_000, reference_size - start), dim))
            y_min = min(y_min, float(self.function(chunk).min()))
        y_max = float(self.function(np.full((1, dim), optimiser))[0])
        super().__init__(
            name=f"{function}-{dim}",
            offline_x=x[keep].astype(np.float32),
            offline_y=y[keep].astype(np.float32),
            y_min=min(y_min, float(y.min())),
            y_max=y_max,
        )

    def oracle(self, x: np.ndarray) -> np.ndarray:
        return self.function(self._check_x(x))


def make_task(name: str, seed: int = 0, **kwargs) -> OfflineTask:
    """Build a task by name (`TASK_NAMES`): `"tfbind8"`, `"ehrlich"`, or a continuous function's name."""
    if name == "tfbind8":
        return TFBindLikeTask(seed=seed, **kwargs)
    if name == "ehrlich":
        return EhrlichTask(seed=seed, **kwargs)
    if name in CONTINUOUS_FUNCTIONS:
        return ContinuousTask(function=name, seed=seed, **kwargs)
    raise ValueError(f"`name` must be one of {TASK_NAMES}, got {name!r}.")
