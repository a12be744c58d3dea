"""Judges and exact evaluators for discrete flow matching.

- [`HMMJudge`]: exact log-likelihood of sequences under a known [`RandomHMM`] (generative perplexity with the true
  model as the judge), and the exact denoiser `p(x1 | x_t)` of that HMM on a mixture path, so that a discrete flow
  whose model is this denoiser generates exactly the HMM's distribution (in continuous time).
- [`exact_nll_bounds`]: the perplexity bounds of a denoiser computed without Monte Carlo (all `x_t` enumerated,
  time integrated by Gauss-Legendre quadrature), for short sequences.
- [`BernoulliMixtureJudge`]: an exact-likelihood judge for binary data (binarised digits), fitted by EM on the
  training split only.
"""

import itertools
import math

import numpy as np
import torch

from ..data.random_hmm import RandomHMM
from ..losses.discrete_flow import BOUNDS, bound_integrand
from ..schedulers.scheduling_discrete_flow_matching import DiscreteFlowMatchingScheduler


def generative_perplexity(nll_per_sequence: torch.Tensor, sequence_length: int) -> float:
    """`exp(mean NLL per token)` from per-sequence NLLs in nats."""
    return float(math.exp(float(nll_per_sequence.double().mean()) / sequence_length))


def sample_diversity(samples: torch.LongTensor) -> dict[str, float]:
    """Distinct-sequence fraction and mean per-position token entropy (nats) of a set of samples `(N, L)`."""
    distinct = len({tuple(row) for row in samples.tolist()}) / len(samples)
    V = int(samples.max()) + 1
    counts = torch.nn.functional.one_hot(samples, V).double().mean(0)  # (L, V)
    entropy = -(counts * counts.clamp_min(1e-300).log()).sum(-1).mean()
    return {"distinct_fraction": distinct, "token_entropy": float(entropy)}


class HMMJudge:
    """Exact likelihoods and exact mixture-path denoisers of a known [`RandomHMM`]."""

    def __init__(self, hmm: RandomHMM):
        self.hmm = hmm
        self.initial = torch.as_tensor(hmm.initial, dtype=torch.float64)
        self.transition = torch.as_tensor(hmm.transition, dtype=torch.float64)
        self.emission = torch.as_tensor(hmm.emission, dtype=torch.float64)

    def _check(self, sequences: torch.LongTensor, max_id: int, name: str) -> torch.LongTensor:
        if not isinstance(sequences, torch.Tensor) or sequences.ndim != 2 or sequences.shape[1] != self.hmm.length:
            raise ValueError(f"`{name}` must be a tensor of shape (N, {self.hmm.length}), got {sequences!r}.")
        if sequences.min() < 0 or sequences.max() >= max_id:
            raise ValueError(f"`{name}` ids must lie in [0, {max_id}).")
        return sequences.cpu().long()

    def _forward_backward(self, likelihood: torch.Tensor):
        """Scaled forward-backward for per-position observation likelihoods over hidden states `(N, L, H)`.

        Returns the predictive messages `P(z_i | o_<i)` `(N, L, H)`, the backward messages (scaled) `(N, L, H)` and
        `log P(o)` `(N,)`."""
        N, L, H = likelihood.shape
        predictive = torch.empty(N, L, H, dtype=torch.float64)
        backward = torch.empty(N, L, H, dtype=torch.float64)
        log_norm = torch.zeros(N, dtype=torch.float64)
        prior = self.initial.expand(N, H)
        for i in range(L):
            predictive[:, i] = prior
            joint = prior * likelihood[:, i]
            norm = joint.sum(-1, keepdim=True)
            log_norm += norm.squeeze(-1).log()
            prior = (joint / norm) @ self.transition
        message = torch.ones(N, H, dtype=torch.float64)
        for i in range(L - 1, -1, -1):
            backward[:, i] = message
            message = (likelihood[:, i] * message) @ self.transition.T
            message = message / message.sum(-1, keepdim=True)
        return predictive, backward, log_norm

    def log_prob(self, sequences: torch.LongTensor) -> torch.Tensor:
        """Exact `log P(x)` in nats of sequences `(N, L)` of data tokens; returns `(N,)` float64."""
        x = self._check(sequences, self.hmm.vocab_size, "sequences")
        likelihood = self.emission.T[x]  # (N, L, H)
        return self._forward_backward(likelihood)[2]

    def cavity_logits(
        self, sample: torch.LongTensor, timestep: float | torch.Tensor, scheduler: DiscreteFlowMatchingScheduler
    ) -> torch.Tensor:
        """
        `log P(x1^i = y | x_t^j, j != i)` of shape `(N, L, V)` on the scheduler's path (independent coupling).

        Passed through `scheduler.denoiser_log_probs`, which adds the evidence of `x_t^i` itself, this is the exact
        posterior `p(x1 | x_t)`: used as a model's logits, the discrete flow generates this HMM exactly.
        """
        V = self.hmm.vocab_size
        if scheduler.config.vocab_size != V:
            raise ValueError(f"the scheduler's vocab_size {scheduler.config.vocab_size} is not the HMM's {V}.")
        x = self._check(sample, scheduler.num_embeddings, "sample")
        N, L = x.shape
        t = torch.as_tensor(timestep, dtype=torch.float64).expand(N).cpu()
        kappa = scheduler.kappa(t).view(N, 1, 1)
        one_hot = torch.nn.functional.one_hot(x.clamp(max=V - 1), V).double()
        if scheduler.is_masked:
            masked = (x >= V).unsqueeze(-1)
            token_likelihood = torch.where(masked, torch.ones_like(one_hot), one_hot)
        else:
            token_likelihood = kappa * one_hot + (1 - kappa) / V
        likelihood = token_likelihood @ self.emission.T  # (N, L, H)
        predictive, backward, _ = self._forward_backward(likelihood)
        cavity = (predictive * backward) @ self.emission  # (N, L, V)
        return cavity.clamp_min(1e-300).log()

    def denoiser(self, scheduler: DiscreteFlowMatchingScheduler):
        """A stand-in model `(input_ids, timestep) -> .logits` returning [`cavity_logits`]."""
        judge = self

        class _Output:
            def __init__(self, logits):
                self.logits = logits

        def model(input_ids, timestep):
            return _Output(judge.cavity_logits(input_ids, timestep, scheduler).to(input_ids.device))

        return model


def _position_support(scheduler: DiscreteFlowMatchingScheduler, x1: torch.LongTensor, kappa: float):
    """Values `x_t^i` can take given `x1^i` (shape `(L,)`), and their probabilities at `kappa`: `(L, K)` each."""
    V, M = scheduler.config.vocab_size, scheduler.num_mask_tokens
    L = x1.shape[0]
    if scheduler.config.source == "uniform":
        values = torch.arange(V).expand(L, V)
        probs = torch.full((L, V), (1 - kappa) / V, dtype=torch.float64)
        probs[torch.arange(L), x1] += kappa
        return values, probs
    values = torch.cat([x1[:, None], V + torch.arange(M).expand(L, M)], dim=1)
    probs = torch.cat(
        [torch.full((L, 1), kappa, dtype=torch.float64), torch.full((L, M), (1 - kappa) / M, dtype=torch.float64)],
        dim=1,
    )
    return values, probs


@torch.no_grad()
def exact_nll_bounds(
    model,
    scheduler: DiscreteFlowMatchingScheduler,
    x1: torch.LongTensor,
    num_nodes: int = 64,
    kinds: tuple[str, ...] = BOUNDS,
    max_states: int = 20000,
) -> dict[str, torch.Tensor]:
    """
    The perplexity bounds of `model` on each sequence of `x1` (shape `(N, L)`), in nats, without Monte Carlo.

    Every `x_t` reachable from `x1` is enumerated with its exact probability, and the time integral is done by
    Gauss-Legendre quadrature after the substitution `t = 1 - (1 - s)^3`, which smooths the integrand's logarithmic
    behaviour at `t = 1`. Only for short sequences: the number of states per sequence (`(M + 1)^L` for masked
    sources, `V^L` for the uniform source) must not exceed `max_states`.

    Returns:
        `{kind: (N,) float64}`.
    """
    N, L = x1.shape
    nodes, weights = np.polynomial.legendre.leggauss(num_nodes)
    s = torch.as_tensor((nodes + 1) / 2, dtype=torch.float64)
    w = torch.as_tensor(weights / 2, dtype=torch.float64)
    times = 1 - (1 - s) ** 3
    dt_ds = 3 * (1 - s) ** 2
    results = {kind: torch.zeros(N, dtype=torch.float64) for kind in kinds}
    K = scheduler.config.vocab_size if scheduler.config.source == "uniform" else scheduler.num_mask_tokens + 1
    if K**L > max_states:
        raise ValueError(f"{K**L} states per sequence exceed `max_states` ({max_states}); use shorter sequences.")
    choice = torch.tensor(list(itertools.product(range(K), repeat=L)), dtype=torch.long)  # (S, L)
    positions = torch.arange(L).expand_as(choice)
    S = len(choice)
    tt = times.repeat_interleave(S)  # every node's states in one model call: (num_nodes * S,)
    for n in range(N):
        supports = [_position_support(scheduler, x1[n], float(scheduler.kappa(t))) for t in times]
        values = supports[0][0]  # the values do not depend on time, their probabilities do
        probs = torch.stack([p for _, p in supports])  # (num_nodes, L, K)
        states = values[positions, choice].repeat(num_nodes, 1)
        state_probs = probs[:, positions, choice].prod(-1).reshape(-1)
        target = x1[n].expand(len(states), L)
        log_probs = scheduler.denoiser_log_probs(model(states, tt).logits, states, tt)
        node_weight = (w * dt_ds).repeat_interleave(S)
        for kind in kinds:
            integrand = bound_integrand(log_probs, states, target, tt, scheduler, kind)
            integrand = torch.where(state_probs > 0, integrand, torch.zeros_like(integrand))
            results[kind][n] = (node_weight * state_probs * integrand).sum()
    return results


class BernoulliMixtureJudge:
    """
    A mixture of product-Bernoulli distributions over binary vectors, fitted by EM: an exact-likelihood judge for
    binary data that the discrete flows never see (fit it on the training split; report its held-out NLL).
    """

    def __init__(self, log_weights: np.ndarray, probs: np.ndarray):
        self.log_weights = log_weights  # (K,)
        self.probs = probs  # (K, D)

    @classmethod
    def fit(cls, data: torch.LongTensor, num_components: int = 32, num_iters: int = 100, seed: int = 0):
        """EM from `num_components` random data points (smoothed); `data` is `(N, D)` in {0, 1}."""
        x = data.double().numpy()
        rng = np.random.default_rng(seed)
        probs = 0.25 + 0.5 * x[rng.choice(len(x), num_components, replace=False)]
        log_weights = np.full(num_components, -np.log(num_components))
        for _ in range(num_iters):
            judge = cls(log_weights, probs)
            resp = judge._joint(x)
            resp = np.exp(resp - resp.max(1, keepdims=True))
            resp /= resp.sum(1, keepdims=True)
            counts = resp.sum(0) + 1e-9
            probs = np.clip((resp.T @ x + 1.0) / (counts[:, None] + 2.0), 1e-4, 1 - 1e-4)  # Beta(1, 1) prior
            log_weights = np.log(counts / counts.sum())
        return cls(log_weights, probs)

    def _joint(self, x: np.ndarray) -> np.ndarray:
        return self.log_weights + x @ np.log(self.probs).T + (1 - x) @ np.log1p(-self.probs).T

    def log_prob(self, sequences: torch.LongTensor) -> torch.Tensor:
        """Exact `log p(x)` in nats, `(N,)` float64."""
        joint = self._joint(sequences.double().cpu().numpy())
        peak = joint.max(1, keepdims=True)
        return torch.from_numpy((peak + np.log(np.exp(joint - peak).sum(1, keepdims=True))).squeeze(1))
