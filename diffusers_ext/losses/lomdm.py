"""LoMDM's objective: the masked diffusion NELBO with learned per-position schedules (arXiv 2602.02112).

The forward scheduler `phi` reads the clean sequence `x` and gives each position an exponent `w_i`; position `i` is
masked at time `t` with probability `1 - alpha^i_t = t^(w_i)`, so in reverse time it is unmasked at rate
`A_i = w_i / t`. The reverse scheduler `psi` reads the noisy `z_t` and predicts its own rate `Ahat_i = what_i / t`,
which is what sampling uses. The continuous-time NELBO (a path KL between the two unmasking processes) is, per
masked position,

    -A_i log p_theta(x^i | z_t) + A_i (log A_i - log Ahat_i) - (A_i - Ahat_i),

integrated over `t ~ U(0, 1)` and `z_t ~ q_phi(. | x, t)`. The last two terms (the schedule mismatch) vanish when the
reverse scheduler matches the forward one. The masks depend on `phi` through a discrete sample, so its gradient
uses REINFORCE with the leave-one-out baseline (RLOO) over `num_mask_samples` masks of the same `(x, t)`.

With `(c1, c2) = (1, 0)` both exponents are 1, the mismatch terms are 0, the REINFORCE term has no parameter to
act on, and the loss is MDLM's (`masked_diffusion.masked_diffusion_loss`) on the same masks.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..utils import check_positive_int
from .masked_diffusion import sample_mask, sample_mask_probability


@dataclass
class LoMDMLossOutput:
    """What [`lomdm_loss`] returns.

    Args:
        loss (`torch.Tensor`, scalar): the surrogate to back-propagate (NELBO per scheduled token + RLOO term).
        nelbo (`torch.Tensor`, scalar, detached): the NELBO estimate in nats per scheduled token.
        per_sequence (`torch.Tensor` of shape `(K, B)`, detached): the NELBO integrand of each sequence and mask
            sample (nats, summed over positions).
        t (`torch.Tensor` of shape `(B,)`): the times.
        masked (`torch.BoolTensor` of shape `(K, B, L)`): the mask samples.
        forward_exponents (`torch.Tensor` of shape `(B, L)`): `w` of the forward scheduler.
        reverse_exponents (`torch.Tensor` of shape `(K, B, L)`): `what` of the reverse scheduler.
    """

    loss: torch.Tensor
    nelbo: torch.Tensor
    per_sequence: torch.Tensor
    t: torch.Tensor
    masked: torch.BoolTensor
    forward_exponents: torch.Tensor
    reverse_exponents: torch.Tensor


def lomdm_integrand(
    token_log_probs: torch.Tensor,
    masked: torch.BoolTensor,
    t: torch.Tensor,
    forward_exponents: torch.Tensor,
    reverse_exponents: torch.Tensor,
) -> torch.Tensor:
    """The NELBO integrand per sequence: the per-position terms summed over masked positions.

    Args:
        token_log_probs (`torch.Tensor` of shape `(..., B, L)`): `log p_theta(x^i | z_t)` of the clean tokens.
        masked (`torch.BoolTensor` of shape `(..., B, L)`): masked positions of `z_t`.
        t (`torch.Tensor` of shape `(B,)`): times.
        forward_exponents (`torch.Tensor` of shape `(B, L)`): `w` (rate `A = w / t`).
        reverse_exponents (`torch.Tensor` of shape `(..., B, L)`): `what` (rate `Ahat = what / t`).

    Returns:
        `torch.Tensor` of shape `(..., B)`.
    """
    rate = forward_exponents / t.unsqueeze(-1)
    reverse_rate = reverse_exponents / t.unsqueeze(-1)
    terms = -rate * token_log_probs
    if not torch.equal(forward_exponents.expand_as(reverse_exponents), reverse_exponents):
        log_ratio = torch.log(forward_exponents) - torch.log(reverse_exponents)
        terms = terms + rate * log_ratio - (rate - reverse_rate)
    return (terms * masked).sum(-1)


def lomdm_loss(
    denoiser: Callable[[torch.LongTensor], torch.Tensor],
    forward_schedule: torch.nn.Module,
    reverse_schedule: torch.nn.Module,
    input_ids: torch.LongTensor,
    schedule_mask: torch.BoolTensor,
    mask_token_id: int,
    generator: torch.Generator | None = None,
    mask_eps: float = 1e-3,
    num_mask_samples: int = 2,
    t: torch.Tensor | None = None,
) -> LoMDMLossOutput:
    """LoMDM's training loss (and NELBO estimate) on a batch of clean sequences.

    Random draws, in order: the times (`sample_mask_probability`, skipped when `t` is given), then one mask per
    sample (`sample_mask`), all from `generator`.

    Args:
        denoiser (`Callable`): maps noisy ids `(N, L)` to logits `(N, L, V)` aligned with them.
        forward_schedule ([`LoMDMScheduleNetwork`]): the forward scheduler `phi` (reads `input_ids`).
        reverse_schedule ([`LoMDMScheduleNetwork`]): the reverse scheduler `psi` (reads the noisy ids).
        input_ids (`torch.LongTensor` of shape `(B, L)`): clean sequences (prompt tokens included).
        schedule_mask (`torch.BoolTensor` of shape `(B, L)`): positions that are ever masked (the generated
            region); the loss is normalised by their number.
        mask_token_id (`int`): the mask token.
        generator (`torch.Generator`, *optional*): source of times and masks.
        mask_eps (`float`, defaults to 1e-3): times are `(1 - eps) * U + eps`.
        num_mask_samples (`int`, defaults to 2): masks per `(x, t)`; at least 2 for the RLOO baseline (1 drops the
            REINFORCE term).
        t (`torch.Tensor` of shape `(B,)`, *optional*): fixed times in `(0, 1]` (evaluation); pass float64 for times
            below float32's range.
    """
    if input_ids.ndim != 2:
        raise ValueError(f"`input_ids` must have shape (batch, length), got {tuple(input_ids.shape)}.")
    if schedule_mask.shape != input_ids.shape or schedule_mask.dtype != torch.bool:
        raise ValueError(
            f"`schedule_mask` must be a bool tensor of shape {tuple(input_ids.shape)}, got "
            f"{schedule_mask.dtype} {tuple(schedule_mask.shape)}."
        )
    check_positive_int("num_mask_samples", num_mask_samples)
    batch, length = input_ids.shape
    device = input_ids.device
    if t is None:
        t = sample_mask_probability(batch, mask_eps, generator, device=device)
    elif t.shape != (batch,) or bool(((t <= 0) | (t > 1)).any()):
        raise ValueError(f"`t` must have shape ({batch},) with values in (0, 1], got {tuple(t.shape)}.")
    t = t.to(device)

    forward_exponents = forward_schedule(input_ids, schedule_mask).exponents
    log_t = torch.log(t).unsqueeze(1)
    # t ** 1 is exactly t, so (c1, c2) = (1, 0) draws MDLM's masks bit for bit
    mask_prob = torch.where(schedule_mask, t.unsqueeze(1) ** forward_exponents, 0.0)
    masked = torch.stack(
        [sample_mask((batch, length), mask_prob.detach(), generator) for _ in range(num_mask_samples)]
    )

    noisy = torch.where(masked, mask_token_id, input_ids.unsqueeze(0)).reshape(-1, length)
    logits = denoiser(noisy)
    token_log_probs = -F.cross_entropy(
        logits.float().transpose(1, 2), input_ids.repeat(num_mask_samples, 1), reduction="none"
    ).reshape(num_mask_samples, batch, length)
    reverse_exponents = reverse_schedule(noisy, schedule_mask.repeat(num_mask_samples, 1)).exponents.reshape(
        num_mask_samples, batch, length
    )
    per_sequence = lomdm_integrand(token_log_probs, masked, t, forward_exponents, reverse_exponents)

    surrogate = per_sequence.mean(0)
    if num_mask_samples > 1 and forward_exponents.requires_grad:
        log_q = torch.where(
            masked,
            forward_exponents * log_t,
            torch.log1p(-mask_prob.clamp(max=1 - 1e-6)),
        )
        log_q = (log_q * schedule_mask).sum(-1)  # (K, B)
        values = per_sequence.detach()
        baseline = (values.sum(0, keepdim=True) - values) / (num_mask_samples - 1)
        surrogate = surrogate + ((values - baseline) * log_q).mean(0)
    num_tokens = schedule_mask.sum()
    return LoMDMLossOutput(
        loss=surrogate.sum() / num_tokens,
        nelbo=per_sequence.detach().mean(0).sum() / num_tokens,
        per_sequence=per_sequence.detach(),
        t=t,
        masked=masked,
        forward_exponents=forward_exponents,
        reverse_exponents=reverse_exponents,
    )
