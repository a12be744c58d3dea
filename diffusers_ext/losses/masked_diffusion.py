"""The masked diffusion LM objective (MDLM's continuous-time NELBO with the linear schedule, LLaDA's loss).

With the linear schedule `alpha_t = 1 - t`, a clean token is masked at time `t` with probability `t`, and MDLM's
continuous-time NELBO weight `-alpha'_t / (1 - alpha_t)` is `1 / t`: the loss is the cross-entropy on the masked
tokens, each weighted by one over its masking probability. Times are drawn on `[eps, 1]` so the weight stays bounded.

These functions are the one implementation used by `training/train_masked_lm.py`, `training/train_lomdm.py` (whose
LoMDM objective reduces to this one at `(c1, c2) = (1, 0)`) and `benchmarks/lomdm/lomdm.py`.
"""

import torch
import torch.nn.functional as F


def sample_mask_probability(
    batch_size: int, mask_eps: float, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """Masking probabilities `(1 - eps) * t + eps` with `t ~ U(0, 1)`, one per sequence: shape `(batch_size,)`."""
    if not 0.0 <= mask_eps < 1.0:
        raise ValueError(f"`mask_eps` must lie in [0, 1), got {mask_eps!r}.")
    t = torch.rand(batch_size, generator=generator, device=device)
    return (1 - mask_eps) * t + mask_eps


def sample_mask(
    shape: tuple[int, ...], mask_prob: torch.Tensor, generator: torch.Generator | None = None
) -> torch.BoolTensor:
    """Independent Bernoulli masks of `shape` `(B, L)`; `mask_prob` is `(B,)` (one per sequence) or `(B, L)`."""
    if mask_prob.ndim == 1:
        mask_prob = mask_prob.unsqueeze(1)
    # float64 probabilities (tiny times in evaluation) get float64 uniforms; float32 draws are the default stream
    dtype = torch.float64 if mask_prob.dtype == torch.float64 else torch.float32
    return torch.rand(shape, generator=generator, device=mask_prob.device, dtype=dtype) < mask_prob


def masked_diffusion_loss(
    logits: torch.Tensor, targets: torch.LongTensor, masked: torch.BoolTensor, mask_prob: torch.Tensor
) -> torch.Tensor:
    """MDLM's NELBO estimate (LLaDA's loss) per token: `sum(CE * masked / mask_prob) / targets.numel()`.

    Args:
        logits (`torch.Tensor` of shape `(B, L, V)`): denoiser logits aligned with `targets`.
        targets (`torch.LongTensor` of shape `(B, L)`): the clean tokens.
        masked (`torch.BoolTensor` of shape `(B, L)`): which tokens were masked in the model input.
        mask_prob (`torch.Tensor` of shape `(B,)`): the masking probability (time `t`) of each sequence.
    """
    losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return (losses * masked / mask_prob.unsqueeze(1)).sum() / targets.numel()
