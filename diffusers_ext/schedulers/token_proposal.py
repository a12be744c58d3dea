"""How the SOAR scheduler proposes tokens and measures confidence at every masked position (shared by all its
decoders), and the per-row uniform noise it draws."""

import torch

from .scheduling_utils import draw_uniform


# keeps log(p) finite for the entropy confidence
_ENTROPY_EPS = 1e-10


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
):
    """Proposed tokens, their probabilities and the confidence (`confidence_measure`: `"prob"`, `"margin"`,
    `"neg_entropy"` or `"random"`) at every position, each of shape `(N, L)`, from logits `(N, L, V)`.

    Order of operations (LLaDA's and Dream's): suppressed tokens' logits are set to -inf; top-p then top-k
    filtering (Dream's `top_p_logits` / `top_k_logits`); the token is the argmax, or at `temperature > 0` a
    Gumbel-max sample in float64 (LLaDA's `add_gumbel_noise`); the mask token is never proposed. Probabilities
    and confidences come from the softmax of the (filtered) logits, in float32 or, with
    `confidence_precision="model"`, in the logits' own dtype like the references; tokens in
    `confidence_suppress_token_ids` are removed from that softmax after the tokens are chosen (LLaDA's
    `confidence_eos_eot_inf`).
    """
    if suppress_token_ids:
        logits = logits.clone()
        logits[..., list(suppress_token_ids)] = float("-inf")
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)
        outside = torch.softmax(sorted_logits, dim=-1).cumsum(-1) > top_p
        outside[..., 1:] = outside[..., :-1].clone()  # keep the token that crosses top_p
        outside[..., 0] = False
        remove = torch.zeros_like(outside).scatter_(-1, sorted_index, outside)
        logits = logits.masked_fill(remove, torch.finfo(logits.dtype).min)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    choice = logits.clone()
    choice[..., mask_token_id] = float("-inf")
    if temperature > 0:
        noise = draw_uniform(logits.shape[1:], generator, groups, logits.device, torch.float64, offset)
        tokens = torch.argmax(choice.to(torch.float64).exp() / (-torch.log(noise)) ** temperature, dim=-1)
    else:
        tokens = torch.argmax(choice, dim=-1)
    if confidence_suppress_token_ids:
        logits = logits.clone()
        logits[..., list(confidence_suppress_token_ids)] = float("-inf")
    precise = confidence_precision == "float32"
    probs = torch.softmax(logits.float() if precise else logits, dim=-1)
    token_probs = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    measure = confidence_measure
    if measure == "prob":
        confidence = token_probs
    elif measure == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = top2[..., 0] - top2[..., 1]
    elif measure == "neg_entropy":
        confidence = (probs * torch.log(probs + _ENTROPY_EPS)).sum(-1)
    else:  # LLaDA's remasking="random": positions ranked by uniform noise, drawn after the token noise
        confidence = draw_uniform(logits.shape[1:2], generator, groups, logits.device, torch.float32, offset)
    return tokens, token_probs, confidence
