"""SOAR (Search Or AcceleRate): confidence-switched position beam search for masked diffusion language models.

One scheduler covers the standard decoders of masked diffusion LMs and SOAR itself, by configuration:

| decoder | `max_beam_size` | `confidence_threshold` | `transfer_schedule` |
|---|---|---|---|
| LLaDA low-confidence remasking (fixed per-step quota) | 1 | `None` | `"uniform"` |
| Dream `maskgit_plus` / `topk_margin` / `entropy` | 1 | `None` | `"linear"` |
| Fast-dLLM confidence-threshold parallel decoding | 1 | tau | `"uniform"` |
| position beam search (PBS) | `> 1` | `None` | `"uniform"` |
| SOAR | `> 1` | tau | `"uniform"` |

`SOARScheduler.from_preset(name)` gives each reference decoder's exact configuration by name: `"llada"`,
`"fast-dllm"`, `"dream"`, `"soar-llada"`, `"soar-dream"`, `"pbs"` (see `PRESETS`).

Paper: "Search or Accelerate: Confidence-Switched Position Beam Search for Diffusion Language Models"
(arXiv:2602.10953).
"""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from ..utils import check_positive_int, exact_dtype, is_int, public
from .compatibility import CompatiblesMixin
from .scheduling_utils import DiffusionLMSchedulerMixin, timestep_indices
from .token_proposal import propose_tokens


CONFIDENCE_MEASURES = ("prob", "margin", "neg_entropy", "random")
SCORE_RULES = ("sum", "mean", "logprob")
TRANSFER_SCHEDULES = ("uniform", "linear", "origin", "block")
COLLAPSE_RULES = ("any_accelerated", "best_multi_token")
CONFIDENCE_PRECISIONS = ("float32", "float64", "model")
# how a pipeline's `num_inference_steps` bounds the decoding (see `DiffusionLMPipeline.__call__`'s `step_budget`)
STEP_BUDGETS = ("per_block", "global", "unbounded")
BEAM_SCORES = ("path", "pll")
PROPOSAL_POSITIONS = ("eligible", "all")

# The largest value each confidence measure can take: a threshold above it can never be reached.
_MEASURE_MAX = {"prob": 1.0, "margin": 1.0, "neg_entropy": 0.0, "random": 1.0}
# the lowest value of the bounded measures (the negative entropy's, -log(vocabulary size), depends on the model)
_MEASURE_MIN = {"prob": 0.0, "margin": 0.0}


@public
@dataclass
class SOARSchedulerOutput(BaseOutput):
    """Output of [`SOARScheduler.step`].

    `N` is the number of rows (beams of all prompts) given to `step`, `N'` the number of rows it keeps, `L` the
    sequence length.

    Args:
        prev_sample (`torch.LongTensor` of shape `(N', L)`): the kept sequences after this step's commits.
        transfer_index (`torch.BoolTensor` of shape `(N', L)`): the positions each kept row committed in this step.
        sampled_tokens (`torch.LongTensor` of shape `(N', L)`): the token proposed at each position the step could
            commit in the kept row's parent (argmax, or a Gumbel-max sample when `temperature > 0`); the mask token
            elsewhere (at every position with `proposal_positions="all"`).
        sampled_probs (`torch.Tensor` of shape `(N', L)`): the model probability of each proposed token (0 where
            none was proposed).
        confidence (`torch.Tensor` of shape `(N', L)`): the configured confidence measure at each position the step
            could commit (the dtype's lowest finite value elsewhere; at every position with `proposal_positions="all"`).
        beam_scores (`torch.DoubleTensor` of shape `(N',)`): running score sums (see `score` in the config); float32
            on MPS, which has no float64.
        beam_lengths (`torch.LongTensor` of shape `(N',)`): tokens committed so far by each kept row.
        beam_groups (`torch.LongTensor` of shape `(N',)`): the prompt (group) each kept row belongs to; rows of a
            group are contiguous and groups stay in their input order.
        parent_index (`torch.LongTensor` of shape `(N',)`): the input row each kept row was expanded from.
        accelerated (`torch.BoolTensor` of shape `(N',)`): whether the kept row took the accelerate branch.
    """

    prev_sample: torch.LongTensor
    transfer_index: torch.BoolTensor
    sampled_tokens: torch.LongTensor
    sampled_probs: torch.Tensor
    confidence: torch.Tensor
    beam_scores: torch.DoubleTensor
    beam_lengths: torch.LongTensor
    beam_groups: torch.LongTensor
    parent_index: torch.LongTensor
    accelerated: torch.BoolTensor


# The reference decoders, by name: each entry reproduces its reference implementation's decoding rule with no
# further option (pass the reference call's own arguments, `gen_length`, `block_length`, `num_inference_steps`
# (its `steps`), `temperature`, to the pipeline). `block_length=None` is one block over the whole generation, the
# references' default (`block_length == gen_length`).
PRESETS = {
    # ML-GSAI/LLaDA `generate(remasking="low_confidence")`: a fixed per-step quota that fills every block within its
    # share of `steps`; the softmax in the logits' dtype.
    "llada": {
        "confidence_threshold": None,
        "max_beam_size": 1,
        "transfer_schedule": "uniform",
        "confidence_measure": "prob",
        "confidence_precision": "model",
        "step_budget": "per_block",
        "block_length": None,
    },
    # NVlabs/Fast-dLLM `generate(threshold=0.9)`: commit the most confident position and every other one above the
    # threshold, block by block until the block is full (`steps` is not a cap: the forward count is adaptive); the
    # softmax in float64.
    "fast-dllm": {
        "confidence_threshold": 0.9,
        "max_beam_size": 1,
        "max_parallel_tokens": None,
        "transfer_schedule": "uniform",
        "confidence_measure": "prob",
        "confidence_precision": "float64",
        "step_budget": "unbounded",
        "block_length": None,
    },
    # Dream `diffusion_generate(alg="maskgit_plus")`: Dream's linear quota over `steps`, no blocks, the softmax in the
    # logits' dtype (`alg="topk_margin"` / `"entropy"`: override `confidence_measure` with "margin" / "neg_entropy").
    "dream": {
        "confidence_threshold": None,
        "max_beam_size": 1,
        "transfer_schedule": "linear",
        "confidence_measure": "prob",
        "confidence_precision": "model",
        "step_budget": "per_block",
        "temper_logits": True,
        "block_length": None,
    },
    # duterscmy/SOAR `generate_soar` (LLaDA): tau 0.95, beam 2, 1 to 5 tokens per accelerate step, sum-of-probabilities
    # score, the beam collapses whenever a beam accelerated, and `steps` forwards in all (a global budget).
    "soar-llada": {
        "confidence_threshold": 0.95,
        "max_beam_size": 2,
        "min_parallel_tokens": 1,
        "max_parallel_tokens": 5,
        "score": "sum",
        "confidence_measure": "prob",
        "collapse_rule": "any_accelerated",
        "confidence_precision": "model",
        "step_budget": "global",
        "block_length": None,
    },
    # duterscmy/SOAR `_sample_soar` (Dream): tau 0.9, beam 2, 1 to 5 tokens, running-mean score, the beam collapses only
    # when the best child committed two tokens or more, no blocks, and it runs until no mask is left (`steps` unused).
    "soar-dream": {
        "confidence_threshold": 0.9,
        "max_beam_size": 2,
        "min_parallel_tokens": 1,
        "max_parallel_tokens": 5,
        "score": "mean",
        "confidence_measure": "prob",
        "collapse_rule": "best_multi_token",
        "confidence_precision": "model",
        "step_budget": "unbounded",
        "temper_logits": True,
        "block_length": None,
    },
    # duterscmy/SOAR `generate_pbs` (LLaDA): position beam search, beam 2, one token per child, sum-of-probabilities
    # score, `steps` forwards in all.
    "pbs": {
        "confidence_threshold": None,
        "max_beam_size": 2,
        "score": "sum",
        "confidence_measure": "prob",
        "confidence_precision": "model",
        "step_budget": "global",
        "block_length": None,
    },
}


@public
class SOARScheduler(CompatiblesMixin, SchedulerMixin, ConfigMixin, DiffusionLMSchedulerMixin):
    """Confidence-switched position beam search ("Search Or AcceleRate") for masked diffusion language models.

    At every step, for every row (a beam of a prompt) the scheduler proposes a token at each masked position, scores
    each position with a confidence measure, and either

    - **accelerates**: when at least `max(quota, min_parallel_tokens)` eligible positions exceed
      `confidence_threshold` (strictly, as in the references), it commits the most confident of them (at most `max_parallel_tokens`, at least the
      quota) in one child; or
    - **searches**: otherwise it expands the row into up to `max_beam_size` children. Child `c` commits the
      `quota - 1` most confident positions plus the position ranked `quota - 1 + c` (so with a quota of one, child
      `c` commits the `c`-th most confident position).

    The children of all beams of a prompt are ranked by score (ties keep the earlier row and child), identical
    sequences are dropped, and the best `max_beam_size` are kept; when the beam collapses (`collapse_rule`), only
    the best child is kept. With `max_beam_size=1` this is plain low-confidence remasking with a
    per-step quota, and with a threshold it is Fast-dLLM's rule: commit the top position and every other one above
    the threshold.

    The quota is the number of tokens a step must commit, from `transfer_schedule`:

    - `"uniform"` (LLaDA): with `m` eligible masked positions and `r` steps left in the block, `ceil(m / r)`. For a
      row that committed exactly its quota at every step this equals LLaDA's precomputed split (`n // steps` per
      step and one more in the first `n % steps` steps).
    - `"linear"` (Dream): `int(m * (1 - s / t))` for the step from time `t` to `s` on `linspace(1, final_eps,
      steps + 1)`, and all remaining masks at the last step.

    Position ties (equal confidence) are broken towards the lower position. The scheduler is stateless across
    `step` calls: beams, scores and groups travel in the arguments and the output.

    Args:
        block_length (`int`, *optional*, defaults to 32): the semi-autoregressive block length a pipeline uses by
            default; `None` is one block over the whole generation (Dream).
        confidence_threshold (`float`, *optional*): the accelerate threshold, in the units of
            `confidence_measure`: a probability in `[0, 1]` for `"prob"`, a top-2 probability margin in `[0, 1]`
            for `"margin"`, a negative entropy `sum(p log p) <= 0` for `"neg_entropy"`. `None` disables the
            accelerate branch. A threshold the measure can never reach is a `ValueError`.
        max_beam_size (`int`, defaults to 1): beams kept per prompt; 1 disables search.
        min_parallel_tokens (`int`, defaults to 1): the fewest confident positions that trigger acceleration.
        max_parallel_tokens (`int`, *optional*): the most tokens one accelerate step commits (`None`: no limit).
        score (`str`, defaults to `"sum"`): how beams are ranked: `"sum"` of committed confidences, their `"mean"`,
            or `"logprob"`, the sum of the log-probabilities of the committed tokens.
        confidence_measure (`str`, defaults to `"prob"`): `"prob"` (probability of the proposed token; LLaDA's
            low-confidence remasking and Dream's `maskgit_plus`), `"margin"` (top-1 minus top-2 probability; Dream's
            `topk_margin`) or `"neg_entropy"` (Dream's `entropy`).
        transfer_schedule (`str`, defaults to `"uniform"`): the per-step quota rule: `"uniform"` (LLaDA),
            `"linear"` (Dream), `"block"` (LLaDA2 / diffusers' `BlockRefinementScheduler`: the block length split
            evenly over the steps) or `"origin"` (Dream's `alg="origin"`: each masked position is revealed with
            probability `1 - s / t`, confidences unused; beam 1, no threshold).
        final_eps (`float`, defaults to 1e-3): the last time of the `"linear"` and `"origin"` schedules.
        collapse_rule (`str`, defaults to `"any_accelerated"`): when a prompt's beam collapses to its best child:
            `"any_accelerated"` (LLaDA's SOAR code: any beam accelerated) or `"best_multi_token"` (Dream's: the best
            child committed two tokens or more).
        confidence_precision (`str`, defaults to `"float32"`): the dtype of the softmax that gives the
            probabilities and confidences (and of the threshold comparison): `"float32"`, `"float64"` (Fast-dLLM's;
            float32 on MPS, which has no float64) or `"model"`, the logits' own dtype (LLaDA's, Dream's and SOAR's
            code; on a bf16 model the rounding creates ties and 0.95 becomes 0.9492). Each preset uses its
            reference's.
        selection_temperature (`float`, defaults to 0): Dream's `alg_temp`: above 0, the quota's positions are
            drawn from `softmax(confidence / selection_temperature)` instead of taken by rank (beam 1, no
            threshold).
        beam_score (`str`, defaults to `"path"`): how the returned beam is chosen when a prompt finishes: `"path"`
            (the scheduler's running score) or `"pll"` (the pipeline rescores the complete beams by
            pseudo-log-likelihood, one extra batched forward).
        step_budget (`str`, defaults to `"per_block"`): how [`DiffusionLMPipeline`] spends `num_inference_steps`
            when its call does not say: `"per_block"` (an equal share per block, each block filled in time; LLaDA's
            `generate`), `"global"` (every step commits one token, more when it accelerates, and decoding stops
            after `num_inference_steps` forwards, possibly leaving masks; SOAR's and PBS's LLaDA loops) or
            `"unbounded"` (every step commits one token or more until no mask is left; `num_inference_steps` is not
            used; Fast-dLLM's threshold loop and SOAR's Dream loop).
        temper_logits (`bool`, defaults to `False`): where the sampling temperature enters. `False` (LLaDA's
            rule): only in the Gumbel-max draw; the top-p / top-k filters and the confidences use the model's
            distribution. `True` (Dream's `sample_tokens`): the logits are divided by the temperature first, so the
            filters, the draw and the confidences all use the tempered distribution. Equal at temperature 1 and 0.

    Presets: [`~SOARScheduler.from_preset`] returns the configuration of a reference decoder by name (`"llada"`,
    `"fast-dllm"`, `"dream"`, `"soar-llada"`, `"soar-dream"`, `"pbs"`).
    """

    order = 1
    # the diffusion-LM contract (`scheduling_utils.DiffusionLMSchedulerMixin`): the optional keywords implemented
    step_options = (
        "top_p",
        "top_k",
        "suppress_token_ids",
        "confidence_suppress_token_ids",
        "num_transfer_tokens",
        "sample_offset",
        "proposal_positions",
        "logits_positions",
    )
    set_timesteps_options = ("block_length",)

    @register_to_config
    def __init__(
        self,
        block_length: int | None = 32,
        confidence_threshold: float | None = None,
        max_beam_size: int = 1,
        min_parallel_tokens: int = 1,
        max_parallel_tokens: int | None = None,
        score: str = "sum",
        confidence_measure: str = "prob",
        transfer_schedule: str = "uniform",
        final_eps: float = 1e-3,
        collapse_rule: str = "any_accelerated",
        confidence_precision: str = "float32",
        selection_temperature: float = 0.0,
        beam_score: str = "path",
        step_budget: str = "per_block",
        temper_logits: bool = False,
    ):
        check_positive_int("block_length", block_length, optional=True)
        for name, value, allowed in (
            ("collapse_rule", collapse_rule, COLLAPSE_RULES),
            ("confidence_precision", confidence_precision, CONFIDENCE_PRECISIONS),
            ("beam_score", beam_score, BEAM_SCORES),
            ("step_budget", step_budget, STEP_BUDGETS),
        ):
            if value not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, got {value!r}.")
        if not isinstance(temper_logits, bool):
            raise ValueError(f"`temper_logits` must be a bool, got {temper_logits!r}.")
        if not isinstance(selection_temperature, (int, float)) or not selection_temperature >= 0:
            raise ValueError(f"`selection_temperature` must be a number >= 0, got {selection_temperature!r}.")
        if (transfer_schedule == "origin" or selection_temperature > 0) and (
            max_beam_size != 1 or confidence_threshold is not None
        ):
            raise ValueError(
                f"`transfer_schedule='origin'` and `selection_temperature` > 0 (Dream's random transfer rules) need "
                f"`max_beam_size=1` and no `confidence_threshold`; got {max_beam_size} and {confidence_threshold}."
            )
        if confidence_measure == "random" and confidence_threshold is not None:
            raise ValueError(
                "`confidence_measure='random'` (LLaDA's random remasking) ranks positions by uniform noise; a "
                f"`confidence_threshold` ({confidence_threshold}) has no meaning with it: pass None."
            )
        if confidence_measure not in CONFIDENCE_MEASURES:
            raise ValueError(f"`confidence_measure` must be one of {CONFIDENCE_MEASURES}, got {confidence_measure!r}.")
        if score not in SCORE_RULES:
            raise ValueError(f"`score` must be one of {SCORE_RULES}, got {score!r}.")
        if transfer_schedule not in TRANSFER_SCHEDULES:
            raise ValueError(f"`transfer_schedule` must be one of {TRANSFER_SCHEDULES}, got {transfer_schedule!r}.")
        if confidence_threshold is not None:
            if not isinstance(confidence_threshold, (int, float)) or math.isnan(confidence_threshold):
                raise ValueError(f"`confidence_threshold` must be a number or None, got {confidence_threshold!r}.")
            lowest = _MEASURE_MIN.get(confidence_measure)
            if lowest is not None and confidence_threshold < lowest:
                raise ValueError(
                    f"`confidence_threshold`={confidence_threshold} is below every value of "
                    f"`confidence_measure`={confidence_measure!r} (at least {lowest}): every masked position would "
                    "count as confident. Give a threshold in [0, 1), or None to disable the accelerate branch."
                )
            highest = _MEASURE_MAX[confidence_measure]
            if confidence_threshold >= highest:
                raise ValueError(
                    f"`confidence_threshold`={confidence_threshold} can never be reached by "
                    f"`confidence_measure`={confidence_measure!r}, whose values are at most {highest} "
                    + (
                        "(it is the negative entropy sum(p log p); try e.g. -0.3)."
                        if confidence_measure == "neg_entropy"
                        else "(a probability)."
                    )
                )
        check_positive_int("max_beam_size", max_beam_size)
        check_positive_int("min_parallel_tokens", min_parallel_tokens)
        if max_parallel_tokens is not None and (
            not isinstance(max_parallel_tokens, int) or max_parallel_tokens < min_parallel_tokens
        ):
            raise ValueError(
                f"`max_parallel_tokens` must be None or an integer >= `min_parallel_tokens`={min_parallel_tokens}, "
                f"got {max_parallel_tokens!r}."
            )
        if not 0.0 < final_eps < 1.0:
            raise ValueError(f"`final_eps` must lie in (0, 1), got {final_eps!r}.")
        self.set_timesteps(1)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "SOARScheduler":
        """A scheduler configured as one of the reference decoders (`PRESETS`), which reproduces that reference at
        temperature 0 with no further option: pass the reference call's own arguments (`gen_length`,
        `block_length`, `steps` as `num_inference_steps`) to the pipeline.

        - `"llada"`: LLaDA's `generate` (low-confidence remasking; `confidence_measure="random"` for
          `remasking="random"`).
        - `"fast-dllm"`: Fast-dLLM's threshold decoding (tau 0.9; override `confidence_threshold`).
        - `"dream"`: Dream's `diffusion_generate` with `alg="maskgit_plus"` (`confidence_measure="margin"` /
          `"neg_entropy"` for `"topk_margin"` / `"entropy"`, `transfer_schedule="origin"` for `"origin"`).
        - `"soar-llada"`: SOAR's LLaDA loop `generate_soar` (tau 0.95, beam 2, 1 to 5 tokens per accelerate step,
          sum of probabilities, global step budget).
        - `"soar-dream"`: SOAR's Dream loop `_sample_soar` (tau 0.9, mean score, the beam collapses only when the
          best child committed two tokens or more, runs until no mask is left).
        - `"pbs"`: position beam search, SOAR's `generate_pbs` (beam 2, global step budget).

        Keyword arguments override single settings (e.g. `block_length=32`).

        Raises:
            `ValueError`: `name` is not one of the presets (the message lists them).
        """
        if name not in PRESETS:
            raise ValueError(f"`name` must be one of the presets {list(PRESETS)}, got {name!r}.")
        return cls(**{**PRESETS[name], **overrides})

    # timesteps and quotas

    def set_timesteps(
        self, num_inference_steps: int, device: str | torch.device | None = None, block_length: int | None = None
    ) -> None:
        """Set the steps of one block: `timesteps` are the times `linspace(1, final_eps, n + 1)[:-1]`.

        Args:
            num_inference_steps (`int`): denoising steps per block.
            device (`str` or `torch.device`, *optional*): where `timesteps` live.
            block_length (`int`, *optional*): the block length the `"block"` transfer schedule splits (defaults to
                the config's).
        """
        if block_length is not None:
            check_positive_int("block_length", block_length)
        self._schedule_block_length = block_length if block_length is not None else self.config.block_length
        check_positive_int("num_inference_steps", num_inference_steps)
        self.num_inference_steps = num_inference_steps
        self._times = torch.linspace(1, self.config.final_eps, num_inference_steps + 1)
        self.timesteps = self._times[:-1].to(device)

    def _step_indices(self, timestep) -> torch.LongTensor:
        """Index in `timesteps` of a timestep, or of each element of a 1-D tensor of timesteps."""
        return timestep_indices(timestep, self._times[:-1])

    def num_transfer_tokens(self, num_masked: torch.LongTensor, timestep) -> torch.LongTensor:
        """The per-row quota for rows with `num_masked` eligible masked positions.

        Args:
            num_masked (`torch.LongTensor` of shape `(N,)`): eligible masked positions per row.
            timestep (`float` or `torch.Tensor`): one element of `timesteps`, or one per row (shape `(N,)`).
        """
        index = self._step_indices(timestep).to(num_masked.device)
        n = self.num_inference_steps
        last = index == n - 1
        if self.config.transfer_schedule == "block":
            # LLaDA2 / diffusers' BlockRefinementScheduler: the block length split evenly over the steps, whatever
            # is still masked; a block is finished by its own masks running out
            if self._schedule_block_length is None:
                raise ValueError("the 'block' transfer schedule needs a block length: pass it to `set_timesteps`.")
            size = self._schedule_block_length
            return torch.div(size, n, rounding_mode="floor") + (index < size % n).long()
        if self.config.transfer_schedule == "uniform":
            remaining = n - index
            quota = torch.div(num_masked + remaining - 1, remaining, rounding_mode="floor")
        else:
            times = self._times.to(num_masked.device)
            t, s = times[index], times[(index + 1).clamp(max=n)]
            quota = (num_masked.to(torch.float32) * (1 - s / t)).to(torch.long)
        return torch.where(last, num_masked, quota)

    # step

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
        temperature: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        suppress_token_ids: tuple[int, ...] = (),
        confidence_suppress_token_ids: tuple[int, ...] = (),
        num_transfer_tokens: int | torch.LongTensor | None = None,
        sample_offset: int = 0,
        proposal_positions: str | None = None,
        logits_positions: torch.LongTensor | None = None,
        return_dict: bool = True,
    ) -> SOARSchedulerOutput | tuple:
        """Commit tokens in every row and select the beams to keep.

        Args:
            model_output (`torch.Tensor` of shape `(N, L, V)`): logits aligned with `sample` (`model_output[:, i]`
                predicts `sample[:, i]`; shift-by-one models are realigned by the pipeline's adapter); `(N, K, V)`
                with `logits_positions`.
            timestep (`float` or `torch.Tensor`): an element of `timesteps`, or one per row (shape `(N,)`; rows of
                a batch can be at different steps of their blocks).
            sample (`torch.LongTensor` of shape `(N, L)`): current sequences, with `mask_token_id` where undecided.
            mask_token_id (`int`): the mask token.
            transfer_mask (`torch.BoolTensor` of shape `(N, L)`, *optional*): positions that may be committed in
                this step (the current block); masked positions outside it are left alone. Defaults to all.
            beam_scores (`torch.Tensor` of shape `(N,)`, *optional*): running score sums (zeros by default).
            beam_lengths (`torch.LongTensor` of shape `(N,)`, *optional*): tokens committed so far (zeros).
            beam_groups (`torch.LongTensor` of shape `(N,)`, *optional*): the prompt of each row, rows of a prompt
                contiguous (by default every row is its own prompt).
            temperature (`float`, defaults to 0): 0 proposes the argmax; above 0, a Gumbel-max sample.
            generator (`torch.Generator` or a list of them, *optional*): the noise source (sampling at
                `temperature > 0`, random remasking, `"origin"` transfers, `selection_temperature`); a list holds one
                generator per group (indexed by `beam_groups`), and each row then draws only for positions from
                `sample_offset` on, so a prompt's draws do not depend on the other prompts of the batch.
            top_p (`float`, *optional*): nucleus filtering of the logits before proposing (Dream's `top_p`).
            top_k (`int`, *optional*): top-k filtering of the logits before proposing (Dream's `top_k`).
            suppress_token_ids (`tuple[int]`): tokens never proposed, their logits set to -inf before anything
                else (LLaDA's `logits_eos_inf` passes the EOS token).
            confidence_suppress_token_ids (`tuple[int]`): tokens removed from the softmax that gives the
                confidences, after the tokens are chosen (LLaDA's `confidence_eos_eot_inf`, which in the reference
                code removes the EoT token only).
            num_transfer_tokens (`int` or `torch.LongTensor` of shape `(N,)`, *optional*): the quota of every row
                (an int) or of each row, overriding the schedule (`timestep` is then unused); the reference SOAR
                loop's global step budget uses 1.
            sample_offset (`int`, defaults to 0): the first position of the generated region (see `generator`).
            proposal_positions (`str`, *optional*, defaults to `"eligible"`): where tokens are proposed and
                confidences measured: `"eligible"`, only the masked positions of `transfer_mask`, the ones the step
                can commit (the full-vocabulary softmax, filtering and sampling run on those alone); `"all"`, every
                position (for callers that read `sampled_tokens` / `confidence` elsewhere; the commits are the
                same either way, and so are the random draws).
            logits_positions (`torch.LongTensor` of shape `(K,)`, *optional*): the increasing sequence positions
                `model_output` holds (`model_output[:, j]` predicts `sample[:, logits_positions[j]]`), when the
                model ran its output head only there; they must include every position the step can commit
                (`proposal_positions="eligible"`). The result is the same as with the full logits.
            return_dict (`bool`, defaults to `True`): return a [`SOARSchedulerOutput`] or a plain tuple.
        """
        if mask_token_id is None:
            raise ValueError("`mask_token_id` must be given to `SOARScheduler.step`.")
        if logits_positions is not None:
            if proposal_positions == "all":
                raise ValueError(
                    "`logits_positions` (logits at some positions only) cannot serve `proposal_positions='all'`."
                )
            if (
                not isinstance(logits_positions, torch.Tensor)
                or logits_positions.ndim != 1
                or logits_positions.dtype != torch.long
            ):
                raise ValueError(
                    f"`logits_positions` must be a 1-D torch.long tensor of positions, got "
                    f"{getattr(logits_positions, 'dtype', type(logits_positions).__name__)} "
                    f"{tuple(getattr(logits_positions, 'shape', ()))}."
                )
        expected = tuple(sample.shape) if logits_positions is None else (sample.shape[0], logits_positions.numel())
        if model_output.ndim != 3 or sample.ndim != 2 or tuple(model_output.shape[:2]) != expected:
            raise ValueError(
                f"`model_output` must have shape (N, {'L' if logits_positions is None else 'K'}, V) = "
                f"{expected} + (V,) for `sample` (N, L); got {tuple(model_output.shape)} and {tuple(sample.shape)}."
            )
        if temperature < 0:
            raise ValueError(f"`temperature` must be >= 0, got {temperature!r}.")
        proposal_positions = "eligible" if proposal_positions is None else proposal_positions
        if proposal_positions not in PROPOSAL_POSITIONS:
            raise ValueError(f"`proposal_positions` must be one of {PROPOSAL_POSITIONS}, got {proposal_positions!r}.")
        num_rows, length = sample.shape
        device = sample.device
        config = self.config
        score_dtype = exact_dtype(device)  # float64 (float32 on MPS)

        if beam_scores is None:
            beam_scores = torch.zeros(num_rows, dtype=exact_dtype(device), device=device)
        if beam_lengths is None:
            beam_lengths = torch.zeros(num_rows, dtype=torch.long, device=device)
        if beam_groups is None:
            beam_groups = torch.arange(num_rows, device=device)
        for name, value in (
            ("beam_scores", beam_scores),
            ("beam_lengths", beam_lengths),
            ("beam_groups", beam_groups),
        ):
            if value.shape != (num_rows,):
                raise ValueError(
                    f"`{name}` must have shape ({num_rows},), one entry per row; got {tuple(value.shape)}."
                )
        if bool((beam_groups[1:] < beam_groups[:-1]).any()):
            raise ValueError("`beam_groups` must keep the rows of a group contiguous and groups in order.")
        eligible = sample == mask_token_id
        if transfer_mask is not None:
            if transfer_mask.shape != sample.shape:
                raise ValueError(
                    f"`transfer_mask` must have the shape of `sample` {tuple(sample.shape)}, got "
                    f"{tuple(transfer_mask.shape)}."
                )
            eligible = eligible & transfer_mask
        if logits_positions is not None:
            covered = torch.zeros(length, dtype=torch.bool, device=device)
            inside = (logits_positions >= 0) & (logits_positions < length)
            if not bool(inside.all()) or bool((logits_positions[1:] <= logits_positions[:-1]).any()):
                raise ValueError(
                    f"`logits_positions` must be increasing positions in [0, {length}), got {logits_positions.tolist()}."
                )
            covered[logits_positions] = True
            if bool((eligible & ~covered).any()):
                raise ValueError(
                    "`logits_positions` must include every position the step can commit (the masked positions of "
                    "`transfer_mask`)."
                )

        tokens, token_probs, confidence = propose_tokens(
            self.config.confidence_measure,
            self.config.confidence_precision,
            model_output,
            temperature,
            generator,
            beam_groups,
            mask_token_id,
            top_p=top_p,
            top_k=top_k,
            suppress_token_ids=tuple(suppress_token_ids),
            confidence_suppress_token_ids=tuple(confidence_suppress_token_ids),
            offset=sample_offset,
            positions=eligible if proposal_positions == "eligible" else None,
            temper_logits=config.temper_logits,
            logits_positions=logits_positions,
        )
        num_masked = eligible.sum(-1)
        if config.transfer_schedule == "origin":
            return self._origin_step(
                timestep,
                sample,
                eligible,
                tokens,
                token_probs,
                confidence,
                beam_scores,
                beam_lengths,
                beam_groups,
                generator,
                sample_offset,
                return_dict,
            )
        if is_int(num_transfer_tokens):
            num_transfer_tokens = torch.full((num_rows,), num_transfer_tokens, dtype=torch.long, device=device)
        if num_transfer_tokens is not None:
            if not isinstance(num_transfer_tokens, torch.Tensor) or num_transfer_tokens.shape != (num_rows,):
                raise ValueError(
                    f"`num_transfer_tokens` must be an int or a tensor of shape ({num_rows},), got "
                    f"{tuple(getattr(num_transfer_tokens, 'shape', ())) or num_transfer_tokens!r}."
                )
            quota = num_transfer_tokens.to(device=device, dtype=torch.long).clamp(min=0)
            quota = torch.minimum(quota, num_masked)
        else:
            quota = self.num_transfer_tokens(num_masked, timestep).clamp(max=num_masked)

        # rank[r, p]: place of position p in row r when sorted by confidence (descending, lower position first).
        ranked_conf = confidence.masked_fill(~eligible, float("-inf"))
        order = torch.sort(ranked_conf, dim=-1, descending=True, stable=True).indices
        if config.selection_temperature > 0:
            order = self._sampled_order(ranked_conf, order, quota, beam_groups, generator)
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(length, device=device).expand(num_rows, -1))

        if config.confidence_threshold is not None:
            # strict, as in the references; in "model" precision the comparison runs in the logits' dtype
            num_confident = (eligible & (confidence > config.confidence_threshold)).sum(-1)
            accelerate = (num_confident >= quota.clamp(min=config.min_parallel_tokens)) & (num_confident > 0)
            cap = quota.clamp(min=config.max_parallel_tokens) if config.max_parallel_tokens is not None else num_masked
            num_accelerated = torch.minimum(num_confident, cap)
        else:
            accelerate = torch.zeros(num_rows, dtype=torch.bool, device=device)
            num_accelerated = torch.zeros_like(quota)

        # children: (row, c) for c < num_children[row]; row-major order
        width = config.max_beam_size
        search_children = (num_masked - quota + 1).clamp(min=1, max=width)
        num_children = torch.where(accelerate | (quota == 0), torch.ones_like(quota), search_children)
        child = torch.arange(width, device=device)
        valid = child.unsqueeze(0) < num_children.unsqueeze(1)  # (N, W)
        rows, children = valid.nonzero(as_tuple=True)
        child_rank = rank[rows]
        search_commit = (child_rank < (quota[rows] - 1).unsqueeze(1)) | (
            child_rank == (quota[rows] - 1 + children).unsqueeze(1)
        )
        accel_commit = child_rank < num_accelerated[rows].unsqueeze(1)
        commit = torch.where(accelerate[rows].unsqueeze(1), accel_commit, search_commit)
        commit = commit & eligible[rows] & (quota[rows] > 0).unsqueeze(1)
        new_samples = torch.where(commit, tokens[rows], sample[rows])

        if config.score == "logprob":
            gains = torch.log(token_probs[rows].to(score_dtype).clamp_min(torch.finfo(score_dtype).tiny))
        else:
            gains = confidence[rows].to(score_dtype)
        new_scores = beam_scores[rows].to(score_dtype) + torch.where(commit, gains, 0.0).sum(-1)
        new_lengths = beam_lengths[rows] + commit.sum(-1)
        groups = beam_groups[rows]

        if width > 1:
            keep = self._select_beams(new_samples, new_scores, new_lengths, groups, accelerate[rows], commit.sum(-1))
            rows, new_samples, new_scores, new_lengths, groups, commit = (
                rows[keep],
                new_samples[keep],
                new_scores[keep],
                new_lengths[keep],
                groups[keep],
                commit[keep],
            )
        output = SOARSchedulerOutput(
            prev_sample=new_samples,
            transfer_index=commit,
            sampled_tokens=tokens[rows],
            sampled_probs=token_probs[rows],
            confidence=confidence[rows],
            beam_scores=new_scores,
            beam_lengths=new_lengths,
            beam_groups=groups,
            parent_index=rows,
            accelerated=accelerate[rows],
        )
        return output if return_dict else output.to_tuple()

    def _ranking_key(self, scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.config.score == "mean":
            return scores / lengths.clamp(min=1)
        return scores

    def _select_beams(self, samples, scores, lengths, groups, accelerated, committed) -> torch.LongTensor:
        """Indices of the candidates kept: per group, best first, duplicates dropped, `max_beam_size` at most.

        The group collapses to its best candidate when any of its beams accelerated (`collapse_rule=
        "any_accelerated"`, LLaDA's code) or when the best candidate committed two tokens or more
        (`"best_multi_token"`, Dream's code).
        """
        key = self._ranking_key(scores, lengths)
        kept = []
        for group in torch.unique_consecutive(groups).tolist():
            members = (groups == group).nonzero(as_tuple=True)[0]
            ranked = members[torch.sort(key[members], descending=True, stable=True).indices]
            if self.config.collapse_rule == "any_accelerated":
                collapse = bool(accelerated[members].any())
            else:
                collapse = int(committed[ranked[0]]) >= 2
            limit = 1 if collapse else self.config.max_beam_size
            chosen: list[int] = []
            for index in ranked.tolist():
                if any(torch.equal(samples[index], samples[other]) for other in chosen):
                    continue
                chosen.append(index)
                if len(chosen) == limit:
                    break
            kept.extend(chosen)
        return torch.tensor(kept, dtype=torch.long, device=samples.device)

    def _sampled_order(self, ranked_conf, order, quota, groups, generator) -> torch.LongTensor:
        """Dream's `alg_temp`: the first `quota` positions of each row are drawn without replacement from
        `softmax(confidence / selection_temperature)` (one `torch.multinomial` call per row); the rest follow in
        confidence order."""
        order = order.clone()
        for row in range(ranked_conf.shape[0]):
            k = int(quota[row])
            if k == 0:
                continue
            g = generator[int(groups[row])] if isinstance(generator, (list, tuple)) else generator
            weights = torch.softmax(ranked_conf[row] / self.config.selection_temperature, dim=-1)
            chosen = torch.multinomial(weights, k, generator=g)
            rest = order[row][~torch.isin(order[row], chosen)]
            order[row] = torch.cat([chosen, rest])
        return order

    def _origin_step(
        self,
        timestep,
        sample,
        eligible,
        tokens,
        token_probs,
        confidence,
        scores,
        lengths,
        groups,
        generator,
        offset,
        return_dict,
    ):
        """Dream's `alg="origin"`: every eligible position is revealed with probability `1 - s / t` (all at the
        last step), independently of the confidences. One uniform draw per eligible position, row by row (for one
        prompt, the draw Dream makes over its masked positions)."""
        index = self._step_indices(timestep).to(sample.device)
        n = self.num_inference_steps
        times = self._times.to(sample.device)
        t, s = times[index], times[(index + 1).clamp(max=n)]
        p_transfer = torch.where(index == n - 1, torch.ones_like(t), 1 - s / t)
        p_transfer = p_transfer.expand(sample.shape[0]) if p_transfer.numel() == 1 else p_transfer
        draws = torch.ones(sample.shape, device=sample.device)
        for row, g in enumerate(groups.tolist()):
            source = generator[g] if isinstance(generator, (list, tuple)) else generator
            draws[row, eligible[row]] = torch.rand(int(eligible[row].sum()), generator=source, device=sample.device)
        commit = eligible & (draws < p_transfer.unsqueeze(1))
        new_samples = torch.where(commit, tokens, sample)
        score_dtype = exact_dtype(sample.device)
        gains = (
            confidence.to(score_dtype)
            if self.config.score != "logprob"
            else torch.log(token_probs.to(score_dtype).clamp_min(torch.finfo(score_dtype).tiny))
        )
        rows = torch.arange(sample.shape[0], device=sample.device)
        output = SOARSchedulerOutput(
            prev_sample=new_samples,
            transfer_index=commit,
            sampled_tokens=tokens,
            sampled_probs=token_probs,
            confidence=confidence,
            beam_scores=scores.to(score_dtype) + torch.where(commit, gains, 0.0).sum(-1),
            beam_lengths=lengths + commit.sum(-1),
            beam_groups=groups,
            parent_index=rows,
            accelerated=torch.zeros_like(commit[:, 0]),
        )
        return output if return_dict else output.to_tuple()
