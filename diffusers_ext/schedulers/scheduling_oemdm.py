"""OeMDM sampling: unmask each position by its own schedule `alpha^i(t)` (order-expressive masked diffusion).

OeMDM (arXiv 2602.02112) reads masked diffusion, autoregressive and block diffusion as one family: every position
`i` has its own schedule `alpha^i(t)`, the probability that it is clean at time `t` (`alpha(1) = 0`, `alpha(0) = 1`).
Going from time `t` to `s < t`, a still-masked position is unmasked with probability
`(alpha^i(s) - alpha^i(t)) / (1 - alpha^i(t))`, and its token is drawn from the denoiser. The named schedules:

| `schedule` | `alpha^i(t)` | is |
|---|---|---|
| `"mdm"` | `1 - t` | MDLM / LLaDA random-order masked diffusion |
| `"ar"` | 0 before, 1 after position `i`'s window `[1 - (i+1)/G, 1 - i/G]`, linear inside | left-to-right decoding |
| `"block"` | the same windows per block of `order_block_length` positions | block diffusion |
| `"learned"` | `1 - t^(w_i)`, `w_i` from LoMDM's reverse scheduler on the current sequence | LoMDM |

`i` counts the positions the pipeline lets the scheduler fill (its `transfer_mask`), `G` is their number. With
`"learned"` the step takes the exponents `w` `(N, L)` as its `exponents` keyword ([`LoMDMPipeline`] computes them
with its reverse scheduler on the current sequence).
"""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from ..utils import check_positive_int, public
from .compatibility import CompatiblesMixin
from .scheduling_utils import DiffusionLMSchedulerMixin, draw_uniform, draw_uniform_at, timestep_indices
from .token_proposal import gather_positions, scatter_positions


SCHEDULES = ("mdm", "ar", "block", "learned")


@public
@dataclass
class OeMDMSchedulerOutput(BaseOutput):
    """Output of [`OeMDMScheduler.step`] (the fields [`DiffusionLMPipeline`] reads; one beam per prompt).

    Args:
        prev_sample (`torch.LongTensor` of shape `(N, L)`): the sequences after this step's unmasking.
        transfer_index (`torch.BoolTensor` of shape `(N, L)`): the positions unmasked in this step.
        sampled_tokens (`torch.LongTensor` of shape `(N, L)`): the token drawn at every eligible position (still
            masked and in the step's `transfer_mask`); the mask token elsewhere.
        confidence (`torch.Tensor` of shape `(N, L)`): the unmasking probability of every eligible position (0
            elsewhere).
        beam_scores (`torch.DoubleTensor` of shape `(N,)`): running sums of the committed tokens' log-probabilities.
        beam_lengths (`torch.LongTensor` of shape `(N,)`): tokens committed so far.
        beam_groups (`torch.LongTensor` of shape `(N,)`): the prompt of each row (unchanged).
        parent_index (`torch.LongTensor` of shape `(N,)`): `arange(N)` (no beam search).
    """

    prev_sample: torch.LongTensor
    transfer_index: torch.BoolTensor
    sampled_tokens: torch.LongTensor
    confidence: torch.Tensor
    beam_scores: torch.DoubleTensor
    beam_lengths: torch.LongTensor
    beam_groups: torch.LongTensor
    parent_index: torch.LongTensor


@public
class OeMDMScheduler(CompatiblesMixin, SchedulerMixin, ConfigMixin, DiffusionLMSchedulerMixin):
    """Per-position-schedule ancestral sampler for masked diffusion LMs (MDLM, AR, block diffusion, LoMDM).

    Each step moves from time `t` to the next time `s` on `linspace(1, 0, num_inference_steps + 1)`; the last step
    reaches `s = 0`, where every schedule is 1, so every position is filled. Named presets: [`from_preset`].

    Args:
        schedule (`str`, defaults to `"mdm"`): one of `"mdm"`, `"ar"`, `"block"`, `"learned"` (see the module
            docstring).
        order_block_length (`int`, defaults to 4): positions per block of the `"block"` schedule.
        block_length (`int`, defaults to 1024): the pipeline's semi-autoregressive block length by default (the
            pipeline uses `min(block_length, gen_length)`; the order lives in `schedule`).
    """

    order = 1
    # the diffusion-LM contract (`scheduling_utils.DiffusionLMSchedulerMixin`): the optional keywords implemented
    step_options = ("exponents",)

    @register_to_config
    def __init__(self, schedule: str = "mdm", order_block_length: int = 4, block_length: int = 1024):
        if schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {SCHEDULES}, got {schedule!r}.")
        check_positive_int("order_block_length", order_block_length)
        check_positive_int("block_length", block_length)
        self.set_timesteps(1)

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "OeMDMScheduler":
        """The named OeMDM special cases: `"mdm"` (MDLM), `"ar"`, `"block"` (pass `order_block_length`), and
        `"lomdm"` (the learned order; same as `schedule="learned"`)."""
        schedule = {"lomdm": "learned"}.get(name, name)
        if schedule not in SCHEDULES:
            raise ValueError(f"`name` must be one of {sorted([*SCHEDULES, 'lomdm'])}, got {name!r}.")
        return cls(schedule=schedule, **kwargs)

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None) -> None:
        """Set the times `linspace(1, 0, n + 1)[:-1]` of one block's `n` steps."""
        check_positive_int("num_inference_steps", num_inference_steps)
        self.num_inference_steps = num_inference_steps
        self._times = torch.linspace(1, 0, num_inference_steps + 1, dtype=torch.float64)
        self.timesteps = self._times[:-1].to(device)

    def _next_times(self, timestep) -> tuple[torch.Tensor, torch.Tensor]:
        index = timestep_indices(timestep, self._times[:-1])
        return self._times[index], self._times[index + 1]

    def alpha(self, t: torch.Tensor, rank: torch.Tensor, count: torch.Tensor, exponents=None) -> torch.Tensor:
        """`alpha^i(t)`: the probability that position `i` is clean at time `t`.

        Args:
            t (`torch.Tensor` of shape `(N, 1)`): times.
            rank (`torch.Tensor` of shape `(N, L)`): `i`, the index of each position among the fillable ones.
            count (`torch.Tensor` of shape `(N, 1)`): `G`, the number of fillable positions.
            exponents (`torch.Tensor` of shape `(N, L)`, *optional*): `w` for `"learned"`.
        """
        schedule = self.config.schedule
        if schedule == "mdm":
            return (1 - t).expand_as(rank)
        if schedule == "learned":
            return 1 - t**exponents
        if schedule == "ar":
            unit, units = rank, count
        else:
            size = self.config.order_block_length
            unit = torch.div(rank, size, rounding_mode="floor")
            units = torch.div(count + size - 1, size, rounding_mode="floor")
        units = units.clamp(min=1)
        high = 1 - unit / units
        return ((high - t) * units).clamp(0, 1)

    def step(
        self,
        model_output: torch.Tensor,
        timestep: float | torch.Tensor,
        sample: torch.LongTensor,
        *,
        mask_token_id: int = None,
        transfer_mask: torch.BoolTensor | None = None,
        beam_scores: torch.Tensor | None = None,
        beam_lengths: torch.LongTensor | None = None,
        beam_groups: torch.LongTensor | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        exponents: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> OeMDMSchedulerOutput | tuple:
        """Unmask positions from time `timestep` to the next time and draw their tokens.

        Random draws, in order: the tokens (Gumbel-max at `temperature > 0`), then one uniform per position for the
        unmasking decision; with a list of generators, row `r` draws from `generator[beam_groups[r]]`.

        Args:
            model_output (`torch.Tensor` of shape `(N, L, V)`): logits aligned with `sample`.
            timestep (`float` or `torch.Tensor` of shape `(N,)`): the current time(s), among `timesteps`.
            sample (`torch.LongTensor` of shape `(N, L)`): the current sequences.
            mask_token_id (`int`): the mask token.
            transfer_mask (`torch.BoolTensor` of shape `(N, L)`, *optional*): positions this step may fill (the
                generated region or block); default: every masked position.
            beam_scores, beam_lengths, beam_groups (`torch.Tensor` of shape `(N,)`, *optional*): carried through.
            temperature (`float`, defaults to 1): 0 takes the argmax token; above 0 samples from
                `softmax(logits / temperature)`.
            generator (`torch.Generator` or a list with one per prompt, *optional*): randomness.
            exponents (`torch.Tensor` of shape `(N, L)`, *optional*): LoMDM's positive exponents `w` of every
                position; required by (and only used with) `schedule="learned"`.
            return_dict (`bool`, defaults to `True`): return an [`OeMDMSchedulerOutput`] or a tuple.
        """
        if mask_token_id is None:
            raise ValueError("`mask_token_id` is required.")
        if model_output.ndim != 3 or model_output.shape[:2] != sample.shape:
            raise ValueError(
                f"`model_output` must have shape (N, L, V) with (N, L) = {tuple(sample.shape)}, got "
                f"{tuple(model_output.shape)}."
            )
        if not isinstance(temperature, (int, float)) or temperature < 0 or math.isnan(temperature):
            raise ValueError(f"`temperature` must be a number >= 0, got {temperature!r}.")
        num_rows, length = sample.shape
        device = sample.device
        if transfer_mask is None:
            transfer_mask = torch.ones_like(sample, dtype=torch.bool)
        elif transfer_mask.shape != sample.shape:
            raise ValueError(
                f"`transfer_mask` must have the shape of `sample` {tuple(sample.shape)}, got "
                f"{tuple(transfer_mask.shape)}."
            )
        t, s = self._next_times(timestep)
        logits = model_output
        if self.config.schedule != "learned":
            exponents = None
        elif exponents is None or tuple(exponents.shape) != tuple(sample.shape):
            raise ValueError(
                f"`exponents` of shape {tuple(sample.shape)} are required by schedule='learned' (LoMDM's `w`), got "
                f"{tuple(exponents.shape) if isinstance(exponents, torch.Tensor) else exponents!r}."
            )
        else:
            exponents = exponents.double()
            if bool((exponents <= 0).any()):
                raise ValueError("`exponents` must be positive (LoMDM's `w`).")
        groups = torch.arange(num_rows, device=device) if beam_groups is None else beam_groups
        if beam_scores is None:
            beam_scores = torch.zeros(num_rows, dtype=torch.float64, device=device)
        if beam_lengths is None:
            beam_lengths = torch.zeros(num_rows, dtype=torch.long, device=device)

        # tokens are drawn only where they can be committed: every vocabulary-sized intermediate is (P, V) for the P
        # eligible positions, and the Gumbel noise is drawn as over every position (same numbers) and gathered
        eligible = (sample == mask_token_id) & transfer_mask
        selected, flat = gather_positions(logits, eligible)
        selected = selected.float()
        # the mask token is never a prediction (MDLM's zero-masking parameterisation)
        selected[:, mask_token_id] = float("-inf")
        log_probs = torch.log_softmax(selected, dim=-1)
        del selected
        if temperature > 0:
            uniform = draw_uniform_at(
                eligible, logits.shape[2:], generator, groups, device, torch.float64, one_draw=True
            )
            gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
            del uniform
            picked = torch.argmax(log_probs.double() / temperature + gumbel, dim=-1)
            del gumbel
        else:
            picked = torch.argmax(log_probs, dim=-1)
        picked_log_probs = log_probs.gather(-1, picked.unsqueeze(-1)).squeeze(-1)
        del log_probs
        tokens = scatter_positions(picked, flat, sample.shape, mask_token_id)
        token_log_probs = scatter_positions(picked_log_probs, flat, sample.shape, 0.0)

        t = t.to(device).expand(num_rows).unsqueeze(1)
        s = s.to(device).expand(num_rows).unsqueeze(1)
        rank = (torch.cumsum(transfer_mask.long(), 1) - 1).double()
        count = transfer_mask.sum(1, keepdim=True).double()
        alpha_t = self.alpha(t, rank, count, exponents)
        alpha_s = self.alpha(s, rank, count, exponents)
        still_masked = 1 - alpha_t
        prob = torch.where(still_masked > 0, (alpha_s - alpha_t) / still_masked.clamp_min(1e-300), 1.0)
        prob = torch.where(eligible, prob.clamp(0, 1), 0.0)
        if bool((s == 0).any()):
            prob = torch.where(eligible & (s == 0), 1.0, prob)
        commit = eligible & (
            draw_uniform(sample.shape[1:], generator, groups, device, torch.float64, one_draw=True) < prob
        )

        output = OeMDMSchedulerOutput(
            prev_sample=torch.where(commit, tokens, sample),
            transfer_index=commit,
            sampled_tokens=tokens,
            confidence=prob.float(),
            beam_scores=beam_scores.double() + torch.where(commit, token_log_probs.double(), 0.0).sum(-1),
            beam_lengths=beam_lengths + commit.sum(-1),
            beam_groups=groups,
            parent_index=torch.arange(num_rows, device=device),
        )
        return output if return_dict else output.to_tuple()
