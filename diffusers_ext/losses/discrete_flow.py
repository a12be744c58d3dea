r"""Training losses and perplexity upper bounds for discrete flow matching on mixture paths.

For a data sequence `x1`, let `Q` be the path that starts at a source draw `x0` (independent of `x1`) and moves
each position `i` not yet at `x1^i` to it at rate `lambda(t)`; let `P` be the model's CTMC, whose position `i` leaves
`x_t^i` for `y` at rate `lambda(t) p(x1^i = y | x_t)`. Both start from the source distribution and `Q` ends at `x1`,
so `-log p_model(x1) <= KL(Q || P)` (the model's marginal at `t = 1` is `p_model`). The path-space KL of two CTMCs
that change one position at a time is `E_Q int_0^1 sum_i sum_{y != x^i} [r_P - r_Q + r_Q log(r_Q / r_P)] dt`, which
gives, with `p = p(. | x_t)`,

    KL bound       int_0^1 lambda(t) E_{x_t} [ sum_{i: x_t^i != x1^i} (-log p(x1^i) - p(x_t^i))
                                               + sum_{i: x_t^i == x1^i} (1 - p(x_t^i)) ] dt

(`p(x_t^i) = 0` at a mask token). Since `-p <= 0` and `1 - p <= -log p`, the integrand is at most
`lambda(t) sum_i -log p(x1^i | x_t)`:

    entropy bound  int_0^1 lambda(t) E_{x_t} [ sum_i -log p(x1^i | x_t) ] dt,

the rate-weighted cross-entropy of discrete flow matching. Both are upper bounds on `-log p_model(x1)` in nats; on
masked sources (one or many mask tokens) they coincide. Perplexity bounds are `exp(bound / L)`.
"""

import time

import torch

from ..schedulers.scheduling_discrete_flow_matching import DiscreteFlowMatchingScheduler
from ..utils import check_positive_int
from .discrete_flow_couplings import couple


BOUNDS = ("kl", "entropy")
LOSSES = ("cross_entropy", "kl", "entropy")


def bound_integrand(
    log_probs: torch.Tensor,
    sample: torch.LongTensor,
    x1: torch.LongTensor,
    timesteps: torch.Tensor,
    scheduler: DiscreteFlowMatchingScheduler,
    kind: str = "kl",
) -> torch.Tensor:
    """
    The integrand of a perplexity bound at `(t, x_t)`, in nats per sequence.

    Args:
        log_probs (`torch.Tensor` of shape `(B, L, V)`): `log p(x1 | x_t)` from `scheduler.denoiser_log_probs`.
        sample (`torch.LongTensor` of shape `(B, L)`): `x_t`.
        x1 (`torch.LongTensor` of shape `(B, L)`): the data sequences.
        timesteps (`torch.Tensor` of shape `(B,)`): times in [0, 1).
        scheduler ([`DiscreteFlowMatchingScheduler`]): the path.
        kind (`str`, defaults to `"kl"`): `"kl"` or `"entropy"`.

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    if kind not in BOUNDS:
        raise ValueError(f"`kind` must be one of {BOUNDS}, got {kind!r}.")
    V = scheduler.config.vocab_size
    rate = scheduler.jump_rate(timesteps if timesteps.is_floating_point() else timesteps.float())
    nll_x1 = -log_probs.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
    if kind == "entropy":
        return rate * nll_x1.sum(-1)
    is_data = sample < V
    log_stay = log_probs.gather(-1, sample.clamp(max=V - 1).unsqueeze(-1)).squeeze(-1)
    stay = torch.where(is_data, log_stay.exp(), torch.zeros_like(log_stay))
    leave = torch.where(is_data, -torch.expm1(log_stay), torch.ones_like(log_stay))
    per_position = torch.where(sample == x1, leave, nll_x1 - stay)
    return rate * per_position.sum(-1)


def model_log_probs(
    model, scheduler: DiscreteFlowMatchingScheduler, sample: torch.LongTensor, timesteps: torch.Tensor
):
    """`log p(x1 | x_t)` of shape `(B, L, V)` from a model called as `model(input_ids, timestep).logits`."""
    logits = model(sample, timesteps).logits
    return scheduler.denoiser_log_probs(logits, sample, timesteps)


def discrete_flow_loss(
    model,
    scheduler: DiscreteFlowMatchingScheduler,
    x1: torch.LongTensor,
    loss_type: str = "cross_entropy",
    coupling: str = "independent",
    generator: torch.Generator | None = None,
    embedding_weight: torch.Tensor | None = None,
    timings: dict[str, float] | None = None,
) -> torch.Tensor:
    """
    One minibatch of discrete flow matching: draw sources, couple them with `x1`, draw `t` and `x_t`, and score the
    model's prediction of `x1`.

    Args:
        model: called as `model(input_ids, timestep).logits`; `"embedding_ot"` uses `model.token_embedding.weight`.
        scheduler ([`DiscreteFlowMatchingScheduler`]): the path.
        x1 (`torch.LongTensor` of shape `(B, L)`): data sequences.
        loss_type (`str`, defaults to `"cross_entropy"`): `"cross_entropy"` (mean token cross-entropy, the usual
            DFM loss), `"kl"` or `"entropy"` (the bound of that name per token, a Monte Carlo estimate in nats).
        coupling (`str`, defaults to `"independent"`): see [`couple`].
        generator (`torch.Generator`, *optional*): randomness of sources, times and paths.
        embedding_weight (`torch.Tensor` of shape `(num_embeddings, D)`, *optional*): token embeddings for
            `"embedding_ot"`; defaults to `model.token_embedding.weight` (pass it when `model` is wrapped, e.g. DDP).
        timings (`dict`, *optional*): if given, `timings["coupling_seconds"]` is increased by the time spent
            building and solving the assignment.

    Returns:
        The scalar loss.
    """
    if loss_type not in LOSSES:
        raise ValueError(f"`loss_type` must be one of {LOSSES}, got {loss_type!r}.")
    device = x1.device
    x0 = scheduler.sample_source(tuple(x1.shape), generator, device)
    if embedding_weight is None and coupling == "embedding_ot":
        embedding_weight = model.token_embedding.weight
    start = time.perf_counter()
    x0 = couple(x0, x1, coupling, embedding_weight)
    if timings is not None:
        timings["coupling_seconds"] = timings.get("coupling_seconds", 0.0) + time.perf_counter() - start
    t = torch.rand(x1.shape[0], generator=generator, device=generator.device if generator is not None else device).to(
        device
    )
    x_t = scheduler.add_noise(x1, x0, t, generator=generator)
    log_probs = model_log_probs(model, scheduler, x_t, t)
    if loss_type == "cross_entropy":
        return -log_probs.gather(-1, x1.unsqueeze(-1)).mean()
    return bound_integrand(log_probs, x_t, x1, t, scheduler, loss_type).mean() / x1.shape[1]


@torch.no_grad()
def estimate_nll_bounds(
    model,
    scheduler: DiscreteFlowMatchingScheduler,
    x1: torch.LongTensor,
    num_samples: int = 32,
    generator: torch.Generator | None = None,
    kinds: tuple[str, ...] = BOUNDS,
) -> dict[str, dict[str, torch.Tensor]]:
    """
    Monte Carlo estimates of the perplexity bounds of every sequence in `x1` (shape `(B, L)`), in nats.

    Each sequence gets `num_samples` times stratified over [0, 1) (`t_k = (k + u_k) / num_samples`) and one `x_t`
    per time from the independent path; the estimate is unbiased for the bound.

    Returns:
        `{kind: {"mean": (B,), "stderr": (B,)}}`.
    """
    check_positive_int("num_samples", num_samples, minimum=2)
    B, L = x1.shape
    device = x1.device
    values = {kind: [] for kind in kinds}
    for k in range(num_samples):
        u = torch.rand(B, generator=generator, device=generator.device if generator is not None else device).to(device)
        t = (k + u) / num_samples
        x0 = scheduler.sample_source((B, L), generator, device)
        x_t = scheduler.add_noise(x1, x0, t, generator=generator)
        log_probs = model_log_probs(model, scheduler, x_t, t)
        for kind in kinds:
            values[kind].append(bound_integrand(log_probs, x_t, x1, t, scheduler, kind).double())
    out = {}
    for kind in kinds:
        stacked = torch.stack(values[kind], dim=1)  # (B, K)
        out[kind] = {"mean": stacked.mean(1), "stderr": stacked.std(1) / num_samples**0.5}
    return out
