"""Discrete flow matching on mixture (convex-interpolant) paths: the probability path, the model's denoiser and
CTMC Euler sampling.

Tokens `0 .. vocab_size - 1` are data tokens; sources that need them add mask tokens
`vocab_size .. vocab_size + num_mask_tokens - 1` to the model's input vocabulary. Per position, the path between a
source sequence `x0` and a data sequence `x1` is the mixture

    x_t^i = x1^i with probability kappa(t),   x0^i otherwise,        kappa(t) = t ** kappa_exponent,

and a position that has not reached `x1^i` jumps to it at rate `lambda(t) = kappa'(t) / (1 - kappa(t))`. The model
predicts `p(x1^i | x_t)`; sampling replaces `x1` by a draw from that prediction.

Sources: `"mask"` (one mask token), `"multimask"` (each position draws one of `num_mask_tokens` mask tokens
uniformly; Multimask flows, "Minibatch Optimal Transport and Perplexity Bound Estimation in Discrete Flow Matching",
arXiv:2411.00759) and `"uniform"` (each position a uniform data token).
"""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from ..utils import check_positive_int, public
from .compatibility import CompatiblesMixin
from .scheduling_utils import draw_uniform, timestep_indices


SOURCES = ("mask", "multimask", "uniform")


@public
@dataclass
class DiscreteFlowMatchingSchedulerOutput(BaseOutput):
    """
    Output of [`DiscreteFlowMatchingScheduler.step`]. `B` is the batch size, `L` the sequence length.

    Args:
        prev_sample (`torch.LongTensor` of shape `(B, L)`): the sequence at the next time.
        pred_original_sample (`torch.LongTensor` of shape `(B, L)`): the draw of `x1` from the model's prediction.
        jumped (`torch.BoolTensor` of shape `(B, L)`): positions whose token changed in this step.
    """

    prev_sample: torch.LongTensor
    pred_original_sample: torch.LongTensor
    jumped: torch.BoolTensor


def _as_generators(generator, batch_size: int) -> list | None:
    if generator is None or isinstance(generator, torch.Generator):
        return None
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch_size or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(
                f"`generator` must be one torch.Generator or a list of {batch_size} (one per sequence), got "
                f"{len(generator)} entries."
            )
        return list(generator)
    raise TypeError(f"`generator` must be a torch.Generator or a list of them, got {type(generator).__name__}.")


def _rand(shape: tuple[int, ...], generator, device) -> torch.Tensor:
    """Uniform [0, 1) draws of `shape`; with a list of generators, row `b` comes from `generator[b]` alone."""
    generators = _as_generators(generator, shape[0])
    source = generator if generators is None else generators
    return draw_uniform(shape[1:], source, torch.arange(shape[0]), device, one_draw=True)


def _randint(high: int, shape: tuple[int, ...], generator, device) -> torch.LongTensor:
    return (_rand(shape, generator, device) * high).long().clamp_(max=high - 1)


def sample_categorical(log_probs: torch.Tensor, generator=None) -> torch.LongTensor:
    """Draw one index per row of `log_probs` (shape `(B, ..., K)`) by inverse-CDF sampling.

    With a list of generators, row `b` uses only `generator[b]`, so a batch reproduces its single runs.
    """
    probs = log_probs.float().softmax(-1)
    cdf = probs.cumsum(-1)
    u = _rand(tuple(probs.shape[:-1]) + (1,), generator, probs.device) * cdf[..., -1:]
    return torch.searchsorted(cdf.contiguous(), u.contiguous()).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@public
class DiscreteFlowMatchingScheduler(CompatiblesMixin, SchedulerMixin, ConfigMixin):
    r"""
    CTMC Euler sampling for discrete flow matching on mixture paths, with masked, Multimask and uniform sources.

    The scheduler also holds the path itself for training and likelihood bounds: [`~sample_source`] draws `x0`,
    [`~add_noise`] draws `x_t` between `x0` and `x1`, [`~jump_rate`] is `lambda(t)`, and [`~denoiser_log_probs`]
    turns the model's logits into `log p(x1 | x_t)` (positions a masked path has already revealed are kept; on the
    uniform path the token at a position is evidence about `x1` there, folded in exactly).

    Parameters:
        vocab_size (`int`, defaults to 2): number of data tokens `V`.
        source (`str`, defaults to `"mask"`): `"mask"`, `"multimask"` or `"uniform"`.
        num_mask_tokens (`int`, *optional*): mask tokens `M` after the data tokens: 1 for `"mask"` (the default), at
            least 2 for `"multimask"` (required), 0 for `"uniform"` (the default).
        kappa_exponent (`float`, defaults to 1.0): the scheduler `kappa(t) = t ** kappa_exponent` (1: linear).

    Times run from 0 (source) to 1 (data); `timesteps` holds the start time of every step.
    """

    order = 1

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 2,
        source: str = "mask",
        num_mask_tokens: int | None = None,
        kappa_exponent: float = 1.0,
    ):
        check_positive_int("vocab_size", vocab_size, minimum=2)
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}, got {source!r}.")
        expected = {"mask": (1, 1), "uniform": (0, 0), "multimask": (2, None)}[source]
        resolved = num_mask_tokens if num_mask_tokens is not None else {"mask": 1, "uniform": 0}.get(source)
        if resolved is None:
            raise ValueError("`num_mask_tokens` is required (>= 2) for source 'multimask'.")
        if (
            not isinstance(resolved, int)
            or resolved < expected[0]
            or (expected[1] is not None and resolved > expected[1])
        ):
            bound = f"exactly {expected[0]}" if expected[1] is not None else f">= {expected[0]}"
            raise ValueError(f"`num_mask_tokens` must be {bound} for source {source!r}, got {num_mask_tokens!r}.")
        if not kappa_exponent > 0:
            raise ValueError(f"`kappa_exponent` must be > 0, got {kappa_exponent!r}.")
        self.num_mask_tokens = resolved
        self.num_inference_steps = None
        self.time_grid = torch.linspace(0.0, 1.0, 2)
        self.timesteps = self.time_grid[:-1]
        self._step_index = None

    # the path --------------------------------------------------------------------------------------------------

    @property
    def num_embeddings(self) -> int:
        """Size of the model's input vocabulary: data tokens plus mask tokens."""
        return self.config.vocab_size + self.num_mask_tokens

    @property
    def is_masked(self) -> bool:
        return self.config.source in ("mask", "multimask")

    def kappa(self, t: torch.Tensor) -> torch.Tensor:
        """`kappa(t) = t ** kappa_exponent`, the probability that a position has reached `x1` at time `t`."""
        return t.clamp(0.0, 1.0) ** self.config.kappa_exponent

    def jump_rate(self, t: torch.Tensor) -> torch.Tensor:
        """`lambda(t) = kappa'(t) / (1 - kappa(t))`: the rate at which a position not at `x1` jumps to it."""
        a = self.config.kappa_exponent
        t = t.clamp(0.0, 1.0)
        return a * t ** (a - 1) / (1 - t**a)

    def sample_source(self, shape: tuple[int, int], generator=None, device=None) -> torch.LongTensor:
        """Draw source sequences `x0` of `shape` `(B, L)` (mask tokens, or uniform data tokens)."""
        V, M = self.config.vocab_size, self.num_mask_tokens
        if self.config.source == "mask":
            return torch.full(shape, V, dtype=torch.long, device=device)
        if self.config.source == "multimask":
            return V + _randint(M, shape, generator, device)
        return _randint(V, shape, generator, device)

    def add_noise(
        self, original_samples: torch.LongTensor, noise: torch.LongTensor, timesteps: torch.Tensor, generator=None
    ) -> torch.LongTensor:
        """Draw `x_t`: each position is `original_samples` (`x1`, shape `(B, L)`) with probability `kappa(t)`,
        else `noise` (`x0`, shape `(B, L)`); `timesteps` has shape `(B,)`."""
        if original_samples.shape != noise.shape:
            raise ValueError(
                f"`noise` must have the shape of `original_samples` {tuple(original_samples.shape)}, got "
                f"{tuple(noise.shape)}."
            )
        keep = _rand(tuple(original_samples.shape), generator, original_samples.device)
        keep = keep < self.kappa(timesteps.to(original_samples.device).float()).view(-1, 1)
        return torch.where(keep, original_samples, noise)

    def denoiser_log_probs(self, logits: torch.Tensor, sample: torch.LongTensor, timestep) -> torch.Tensor:
        r"""
        `log p(x1^i = y | x_t)` of shape `(B, L, V)` from the model's `logits` (shape `(B, L, V)`).

        Masked sources: a revealed position (a data token) is kept with probability 1. Uniform source: the token at
        a position is a noisy observation of `x1` there, `P(x_t^i = z | x1^i = y) = kappa * [y = z] + (1 - kappa) / V`,
        and the logits are read as the prediction without it, so the likelihood is added; this also keeps the
        probability of leaving a correct token of order `1 - kappa(t)`, which keeps the likelihood bounds finite.
        """
        V = self.config.vocab_size
        if logits.shape[-1] != V or logits.shape[:-1] != sample.shape:
            raise ValueError(
                f"`model_output` must have shape {(*sample.shape, V)} (sample shape + vocab_size), got "
                f"{tuple(logits.shape)}."
            )
        t = torch.as_tensor(timestep, device=logits.device)
        # float64 times (exact evaluations close to t = 1) keep the whole computation in float64
        dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
        logits, t = logits.to(dtype), t.to(dtype)
        if self.is_masked:
            log_probs = logits.log_softmax(-1)
            revealed = sample < V
            delta = torch.full_like(log_probs, float("-inf")).scatter_(-1, sample.clamp(max=V - 1).unsqueeze(-1), 0.0)
            return torch.where(revealed.unsqueeze(-1), delta, log_probs)
        kappa = self.kappa(t).reshape(-1, *([1] * (logits.ndim - 1))) if t.ndim else self.kappa(t)
        base = torch.log1p(-kappa) - math.log(V)
        same = torch.logaddexp(torch.log(kappa), base)
        evidence = torch.where(
            torch.nn.functional.one_hot(sample, V).bool(), same.expand_as(logits), base.expand_as(logits)
        )
        return (logits + evidence).log_softmax(-1)

    # sampling -------------------------------------------------------------------------------------------------

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None):
        """Split [0, 1] into `num_inference_steps` equal steps; `timesteps` are their start times."""
        check_positive_int("num_inference_steps", num_inference_steps)
        self.num_inference_steps = num_inference_steps
        self.time_grid = torch.linspace(0.0, 1.0, num_inference_steps + 1, dtype=torch.float32, device=device)
        self.timesteps = self.time_grid[:-1].clone()
        self._step_index = None

    @property
    def step_index(self) -> int | None:
        return self._step_index

    def index_for_timestep(self, timestep) -> int:
        return int(timestep_indices(float(timestep), self.timesteps, atol=1e-6)[0])

    def step(
        self,
        model_output: torch.Tensor,
        timestep: float | torch.Tensor,
        sample: torch.LongTensor,
        generator: torch.Generator | list[torch.Generator] | None = None,
        return_dict: bool = True,
    ) -> DiscreteFlowMatchingSchedulerOutput | tuple:
        """
        One Euler step of the CTMC from time `t` to the next grid time `s`.

        Every position draws `x1^i ~ p(x1^i | x_t)` and moves to it with probability
        `(kappa(s) - kappa(t)) / (1 - kappa(t))`, the exact probability that a position not yet at `x1^i` reaches it
        in `[t, s]` on the mixture path (1 at the last step). Positions move independently given `x_t`, which is the
        approximation that more steps remove.

        Args:
            model_output (`torch.Tensor` of shape `(B, L, V)`): the model's logits.
            timestep (`float` or `torch.Tensor`): the current time, one of `timesteps`.
            sample (`torch.LongTensor` of shape `(B, L)`): `x_t`.
            generator (`torch.Generator` or a list of `B`, *optional*): randomness (per sequence with a list).
            return_dict (`bool`, defaults to `True`): return a [`DiscreteFlowMatchingSchedulerOutput`] or a tuple.
        """
        if self.num_inference_steps is None:
            raise ValueError("call `set_timesteps` before `step`.")
        if sample.dtype != torch.long or sample.ndim != 2:
            raise ValueError(
                f"`sample` must be a (batch, length) LongTensor of token ids, got {sample.dtype} "
                f"of shape {tuple(sample.shape)}."
            )
        index = self.index_for_timestep(timestep) if self._step_index is None else self._step_index
        t, s = self.time_grid[index], self.time_grid[index + 1]
        log_probs = self.denoiser_log_probs(model_output, sample, t)
        x1 = sample_categorical(log_probs, generator)
        kt, ks = self.kappa(t), self.kappa(s)
        move_prob = torch.ones(()) if float(ks) >= 1.0 else (ks - kt) / (1 - kt)
        move = _rand(tuple(sample.shape), generator, sample.device) < move_prob.to(sample.device)
        prev_sample = torch.where(move, x1, sample)
        jumped = prev_sample != sample
        self._step_index = index + 1 if index + 1 < self.num_inference_steps else None
        if not return_dict:
            return (prev_sample, x1, jumped)
        return DiscreteFlowMatchingSchedulerOutput(prev_sample=prev_sample, pred_original_sample=x1, jumped=jumped)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
