"""LoMDM's schedule networks: per-position masking schedules `alpha^i(t) = 1 - t^(w_i)` predicted from a sequence.

The same class serves as LoMDM's forward scheduler (it reads the clean sequence `x`; used only in training) and its
reverse scheduler (it reads the noisy sequence `z_t`; used at sampling). Each is one transformer block and an MLP that
give a score `g_i` per position, turned into the exponent `w_i = c1 + c2 * NormSig(g)_i` with
`NormSig(g)_i = sigmoid(g_i) - mean_j sigmoid(g_j)` (the mean over the scheduled positions of the sequence). A
position with a larger exponent is clean earlier in the forward process, so it is unmasked earlier when sampling.
`(c1, c2) = (1, 0)` gives every position MDLM's linear schedule `alpha(t) = 1 - t`.
"""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, public


@public
@dataclass
class LoMDMScheduleOutput(BaseOutput):
    """Output of [`LoMDMScheduleNetwork`].

    Args:
        scores (`torch.Tensor` of shape `(B, L)`): the raw per-position scores `g`.
        exponents (`torch.Tensor` of shape `(B, L)`): `w = c1 + c2 * NormSig(g)` at scheduled positions, `c1`
            elsewhere.
    """

    scores: torch.Tensor
    exponents: torch.Tensor


@public
class LoMDMScheduleNetwork(ModelMixin, ConfigMixin):
    """A per-position schedule predictor: token + position embeddings, one transformer block, an MLP head.

    Args:
        vocab_size (`int`): token vocabulary (mask token included).
        max_length (`int`): the longest sequence (learned position embeddings).
        hidden_size (`int`, defaults to 64): width.
        num_heads (`int`, defaults to 4): attention heads of the block.
        c1 (`float`, defaults to 0.7): the exponent's offset; the mean exponent of a sequence.
        c2 (`float`, defaults to 0.65): the exponent's scale; `c2 < c1` keeps every exponent positive.
    """

    @register_to_config
    def __init__(
        self,
        vocab_size: int,
        max_length: int,
        hidden_size: int = 64,
        num_heads: int = 4,
        c1: float = 0.7,
        c2: float = 0.65,
    ):
        super().__init__()
        check_positive_int("vocab_size", vocab_size, minimum=2)
        check_positive_int("max_length", max_length)
        if hidden_size % num_heads:
            raise ValueError(f"`hidden_size` {hidden_size} must be divisible by `num_heads` {num_heads}.")
        if not (c1 > 0 and 0 <= c2 < c1):
            raise ValueError(f"need c1 > 0 and 0 <= c2 < c1 so every exponent is positive; got c1={c1}, c2={c2}.")
        self.token_embedding = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding = nn.Embedding(max_length, hidden_size)
        self.block = nn.TransformerEncoderLayer(
            hidden_size, num_heads, dim_feedforward=4 * hidden_size, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = nn.Sequential(
            nn.LayerNorm(hidden_size), nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.Linear(hidden_size, 1)
        )

    def forward(
        self, input_ids: torch.LongTensor, schedule_mask: torch.BoolTensor | None = None, return_dict: bool = True
    ) -> LoMDMScheduleOutput | tuple:
        """Scores and exponents of each position.

        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): the clean sequence (forward scheduler) or the noisy one
                (reverse scheduler).
            schedule_mask (`torch.BoolTensor` of shape `(B, L)`, *optional*): positions that have a schedule (the
                generated region); the NormSig mean runs over them. Default: all positions.
            return_dict (`bool`, defaults to `True`): return a [`LoMDMScheduleOutput`] or a tuple.
        """
        if input_ids.ndim != 2:
            raise ValueError(f"`input_ids` must have shape (batch, length), got {tuple(input_ids.shape)}.")
        length = input_ids.shape[1]
        if length > self.config.max_length:
            raise ValueError(f"`input_ids` length {length} exceeds `max_length` {self.config.max_length}.")
        if schedule_mask is None:
            schedule_mask = torch.ones_like(input_ids, dtype=torch.bool)
        elif schedule_mask.shape != input_ids.shape:
            raise ValueError(
                f"`schedule_mask` shape {tuple(schedule_mask.shape)} must match `input_ids` {tuple(input_ids.shape)}."
            )
        positions = torch.arange(length, device=input_ids.device)
        hidden = self.token_embedding(input_ids) + self.position_embedding(positions)
        scores = self.head(self.block(hidden)).squeeze(-1).float()
        exponents = self.exponents_from_scores(scores, schedule_mask)
        return LoMDMScheduleOutput(scores=scores, exponents=exponents) if return_dict else (scores, exponents)

    def exponents_from_scores(self, scores: torch.Tensor, schedule_mask: torch.BoolTensor) -> torch.Tensor:
        """`c1 + c2 * NormSig(scores)` on `schedule_mask`, `c1` elsewhere; exactly `c1` when `c2 == 0`."""
        c1, c2 = float(self.config.c1), float(self.config.c2)
        if c2 == 0:
            return torch.full_like(scores, c1)
        weights = schedule_mask.to(scores.dtype)
        sig = torch.sigmoid(scores)
        mean = (sig * weights).sum(-1, keepdim=True) / weights.sum(-1, keepdim=True).clamp(min=1)
        return torch.where(schedule_mask, c1 + c2 * (sig - mean), torch.full_like(scores, c1))
