"""LoMDMPipeline: a [`DiffusionLMPipeline`] that also carries LoMDM's learned schedules, so the learned generation
order, the OeMDM presets and the SOAR / greedy / threshold decoders all sample from one saved model."""

import functools

import torch

from ... import DiffusionLMPipeline, OeMDMScheduler
from ...models.lomdm_schedule_network import LoMDMScheduleNetwork
from ...utils import public


class LoMDMAdapter:
    """Wrap a diffusion-LM adapter for a masked diffusion LM trained with MDLM or LoMDM.

    The mask token's logit is set to `-inf` (the denoiser never predicts a mask: MDLM's zero-masking
    parameterisation), so every scheduler, sampling or greedy, commits real tokens. With a reverse scheduler the
    output gets one more channel, `(N, L, V + 1)`: the exponents `w` of every position computed on the current
    sequence (the prompt is excluded from the NormSig mean), the input [`OeMDMScheduler`] expects with
    `schedule="learned"`.
    """

    def __init__(self, adapter, reverse_schedule: LoMDMScheduleNetwork | None = None):
        self.adapter = adapter
        self.reverse_schedule = reverse_schedule

    def __getattr__(self, name):
        # everything else (mask token, defaults) is the wrapped adapter's
        if name == "adapter":
            raise AttributeError(name)
        return getattr(self.adapter, name)

    def __call__(self, model, input_ids, attention_mask, *, prompt_mask=None, mask_token_id=None, **kwargs):
        logits = self.adapter(
            model, input_ids, attention_mask, prompt_mask=prompt_mask, mask_token_id=mask_token_id, **kwargs
        )
        if mask_token_id is not None:
            logits = logits.clone()
            logits[..., mask_token_id] = float("-inf")
        if self.reverse_schedule is None:
            return logits
        schedule_mask = torch.ones_like(input_ids, dtype=torch.bool) if prompt_mask is None else ~prompt_mask
        exponents = self.reverse_schedule(input_ids, schedule_mask).exponents
        return torch.cat([logits, exponents.unsqueeze(-1).to(logits.dtype)], dim=-1)


@public
class LoMDMPipeline(DiffusionLMPipeline):
    """Generate with a masked diffusion LM trained by LoMDM (or MDLM) and any diffusion-LM scheduler.

    Everything [`DiffusionLMPipeline`] does, plus two optional components: LoMDM's reverse scheduler (used when the
    scheduler is an [`OeMDMScheduler`] with `schedule="learned"`: each step unmasks positions by the learned
    per-position schedule) and its forward scheduler (training only; kept so a saved folder holds the whole model).
    Swap `pipe.scheduler` for an [`OeMDMScheduler`] preset (`"mdm"`, `"ar"`, `"block"`) or a [`SOARScheduler`]
    (greedy, Fast-dLLM threshold, SOAR) to compare decoders on the same denoiser.

    Args:
        model: the denoiser (a `transformers` model returning `.logits`, bidirectional).
        scheduler ([`OeMDMScheduler`] or [`SOARScheduler`]): the decoding rule.
        tokenizer (*optional*): the model's tokenizer.
        reverse_schedule ([`LoMDMScheduleNetwork`], *optional*): LoMDM's reverse scheduler `psi` (reads `z_t`).
        forward_schedule ([`LoMDMScheduleNetwork`], *optional*): LoMDM's forward scheduler `phi` (reads clean `x`).
        adapter (*optional*): the model's calling convention (see [`DiffusionLMPipeline`]); not saved.
    """

    _optional_components = ["tokenizer", "reverse_schedule", "forward_schedule"]

    def __init__(
        self,
        model,
        scheduler,
        tokenizer=None,
        reverse_schedule: LoMDMScheduleNetwork | None = None,
        forward_schedule: LoMDMScheduleNetwork | None = None,
        adapter=None,
    ):
        super().__init__(model=model, scheduler=scheduler, tokenizer=tokenizer, adapter=adapter)
        self.register_modules(reverse_schedule=reverse_schedule, forward_schedule=forward_schedule)

    # the signature (and so every argument check that reads it) is DiffusionLMPipeline's; the docstring is this one
    @functools.wraps(DiffusionLMPipeline.__call__, assigned=("__module__", "__name__", "__qualname__"))
    def __call__(self, *args, **kwargs):
        """Generate; see [`DiffusionLMPipeline.__call__`]. The mask token is never committed (its logit is `-inf`
        for every scheduler); with `OeMDMScheduler(schedule="learned")` the reverse scheduler's exponents travel to
        the scheduler beside the logits. For sampling from the model (rather than
        greedy decoding) pass `temperature=1.0`."""
        learned = isinstance(self.scheduler, OeMDMScheduler) and self.scheduler.config.schedule == "learned"
        if learned and self.reverse_schedule is None:
            raise ValueError("`OeMDMScheduler(schedule='learned')` needs the pipeline's `reverse_schedule`.")
        base = self.adapter
        self.adapter = LoMDMAdapter(base, self.reverse_schedule if learned else None)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.adapter = base
