"""How the SOAR scheduler proposes tokens and measures confidence at the masked positions it may commit (shared by
all its decoders), and the per-row uniform noise it draws."""

import torch

from ..utils import exact_dtype
from .scheduling_utils import draw_uniform, draw_uniform_at


# keeps log(p) finite for the entropy confidence
_ENTROPY_EPS = 1e-10


def gather_positions(
    logits: torch.Tensor, positions: torch.BoolTensor, logits_positions: torch.LongTensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits `(P, V)` at `positions` `(N, L)` (a copy of those positions only) and their flat indices `(P,)`
    into `N * L`, in the row-major order of `positions.nonzero()`.

    With `logits_positions` `(K,)` (increasing sequence positions), `logits` `(N, K, V)` hold only those positions
    (`logits[:, j]` is position `logits_positions[j]`), which must include every selected one."""
    if logits_positions is None:
        if tuple(positions.shape) != tuple(logits.shape[:2]):
            raise ValueError(
                f"`positions` must have shape {tuple(logits.shape[:2])} (the logits' rows and positions), got "
                f"{tuple(positions.shape)}."
            )
        return logits[positions], positions.reshape(-1).nonzero(as_tuple=True)[0]
    expected = (positions.shape[0], logits_positions.numel())
    if positions.ndim != 2 or tuple(logits.shape[:2]) != expected:
        raise ValueError(
            f"`logits` must have shape {expected} (rows x `logits_positions`), got {tuple(logits.shape[:2])}."
        )
    # increasing columns: the row-major order of the kept columns is the row-major order of the full positions
    return logits[positions[:, logits_positions]], positions.reshape(-1).nonzero(as_tuple=True)[0]


def scatter_positions(values: torch.Tensor, flat: torch.Tensor, shape, fill) -> torch.Tensor:
    """`values` `(P,)` placed back at the flat indices `flat` of a tensor of `shape` `(N, L)` filled with `fill`."""
    out = torch.full((shape[0] * shape[1],), fill, dtype=values.dtype, device=values.device)
    out[flat] = values
    return out.reshape(shape)


def propose_tokens(
    confidence_measure: str,
    confidence_precision: str,
    logits: torch.Tensor,
    temperature: float,
    generator,
    groups: torch.Tensor,
    mask_token_id: int,
    top_p: float | None = None,
    top_k: int | None = None,
    suppress_token_ids=(),
    confidence_suppress_token_ids=(),
    offset: int = 0,
    positions: torch.BoolTensor | None = None,
    temper_logits: bool = False,
    logits_positions: torch.LongTensor | None = None,
):
    """Proposed tokens, their probabilities and the confidence (`confidence_measure`: `"prob"`, `"margin"`,
    `"neg_entropy"` or `"random"`), each of shape `(N, L)`, from logits `(N, L, V)`, computed at `positions`
    `(N, L)` only (by default every position). Elsewhere the token is `mask_token_id`, the probability 0 and the
    confidence the lowest finite value of its dtype (below every real confidence, and finite). Only the `P` selected positions are copied out of the logits: every vocabulary-sized
    intermediate is `(P, V)`, not `(N, L, V)`, and the logits themselves are never written.

    Order of operations (LLaDA's and Dream's): suppressed tokens' logits are set to -inf; top-p then top-k
    filtering (Dream's `top_p_logits` / `top_k_logits`); the token is the argmax, or at `temperature > 0` a
    Gumbel-max sample in float64 (LLaDA's `add_gumbel_noise`; its noise is drawn over every position from `offset`
    on, as before, so the generators advance the same way whatever `positions` is); the mask token is never
    proposed. Probabilities and confidences come from the softmax of the (filtered) logits, in float32, in float64
    (`confidence_precision="float64"`, Fast-dLLM's) or, with `"model"`, in the logits' own dtype (LLaDA's, Dream's); tokens in
    `confidence_suppress_token_ids` are removed from that softmax after the tokens are chosen (LLaDA's
    `confidence_eos_eot_inf`). With `temper_logits` (Dream's `sample_tokens`), at `temperature > 0` the logits are
    divided by the temperature right after the suppression, so the filters, the Gumbel-max draw (then at
    temperature 1: the same law as Dream's categorical draw) and the confidences all see the tempered
    distribution. Each position is computed exactly as over the whole tensor (every operation is per
    position), so the tokens and confidences at `positions` do not depend on which other positions are selected.

    With `logits_positions` `(K,)` (increasing), `logits` are `(N, K, V)`, the logits at those sequence positions
    only (a model that ran its output head there alone); `positions` `(N, L)` is then required and must lie within
    them. The results are the same as from the full logits.
    """
    if logits_positions is None:
        shape = logits.shape[:2]
        if positions is None:
            positions = torch.ones(shape, dtype=torch.bool, device=logits.device)
    else:
        if positions is None:
            raise ValueError("`positions` must be given with `logits_positions` (the logits cover only those).")
        shape = positions.shape
    selected, flat = gather_positions(
        logits, positions, logits_positions
    )  # (P, V), a copy: the caller's logits are never written
    if suppress_token_ids:
        selected[:, list(suppress_token_ids)] = float("-inf")
    if temper_logits and temperature > 0:
        # Dream's rule: the filters, the draw and the confidences all see the tempered distribution
        selected.div_(temperature)
        temperature = 1.0
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_index = torch.sort(selected, dim=-1, descending=True)
        outside = torch.softmax(sorted_logits, dim=-1).cumsum(-1) > top_p
        outside[..., 1:] = outside[..., :-1].clone()  # keep the token that crosses top_p
        outside[..., 0] = False
        remove = torch.zeros_like(outside).scatter_(-1, sorted_index, outside)
        selected.masked_fill_(remove, torch.finfo(selected.dtype).min)
        del sorted_logits, sorted_index, outside, remove
    if top_k is not None:
        kth = torch.topk(selected, min(top_k, selected.shape[-1]), dim=-1).values[..., -1:]
        selected.masked_fill_(selected < kth, torch.finfo(selected.dtype).min)
    if temperature > 0:
        noise = draw_uniform_at(positions, logits.shape[2:], generator, groups, logits.device, torch.float64, offset)
        weights = selected.to(torch.float64)
        weights[:, mask_token_id] = float("-inf")
        # LLaDA's `exp(logits) / (-log(noise)) ** temperature`, in place on the gathered (P, V) copies
        weights.exp_().div_(noise.log_().neg_().pow_(temperature))
        del noise
        tokens = torch.argmax(weights, dim=-1)
        del weights
    else:
        # the mask token is excluded in place and restored (no copy of the logits)
        kept = selected[:, mask_token_id].clone()
        selected[:, mask_token_id] = float("-inf")
        tokens = torch.argmax(selected, dim=-1)
        selected[:, mask_token_id] = kept
    if confidence_suppress_token_ids:
        selected[:, list(confidence_suppress_token_ids)] = float("-inf")
    if confidence_precision == "float32":
        selected = selected.float()
    elif confidence_precision == "float64":
        selected = selected.to(exact_dtype(selected.device))
    probs = torch.softmax(selected, dim=-1)
    del selected
    token_probs = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    measure = confidence_measure
    if measure == "prob":
        confidence = token_probs
    elif measure == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = top2[..., 0] - top2[..., 1]
    elif measure == "neg_entropy":
        confidence = (probs * torch.log(probs + _ENTROPY_EPS)).sum(-1)
    del probs
    tokens = scatter_positions(tokens, flat, shape, mask_token_id)
    token_probs = scatter_positions(token_probs, flat, shape, 0.0)
    if (
        measure == "random"
    ):  # LLaDA's remasking="random": positions ranked by uniform noise, drawn after the token noise
        confidence = draw_uniform(shape[1:], generator, groups, logits.device, torch.float32, offset)
        confidence = confidence.masked_fill(~positions, torch.finfo(confidence.dtype).min)
    else:
        confidence = scatter_positions(confidence, flat, shape, torch.finfo(confidence.dtype).min)
    return tokens, token_probs, confidence
