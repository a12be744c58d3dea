"""LoMDMPipeline: a [`DiffusionLMPipeline`] that also carries LoMDM's learned schedules, so the learned generation
order, the OeMDM presets and the SOAR / greedy / threshold decoders all sample from one saved model."""

import torch

from ... import DiffusionLMPipeline, OeMDMScheduler
from ...models.lomdm_schedule_network import LoMDMScheduleNetwork
from ...utils import public


class LearnedOrderAdapter:
    """Wrap a diffusion-LM adapter: append the reverse scheduler's exponents `w` as one more logit channel.

    The output is `(N, L, V + 1)`: the wrapped adapter's logits, then `w` of every position computed on the current
    sequence (the prompt is excluded from the NormSig mean). This is the input [`OeMDMScheduler`] expects with
    `schedule="learned"`.
    """

    def __init__(self, adapter, reverse_schedule: LoMDMScheduleNetwork):
        self.adapter = adapter
        self.reverse_schedule = reverse_schedule

    def __getattr__(self, name):
        # everything else (mask token, defaults) is the wrapped adapter's
        if name == "adapter":
            raise AttributeError(name)
        return getattr(self.adapter, name)

    def __call__(self, model, input_ids, attention_mask, *, prompt_mask=None, **kwargs) -> torch.Tensor:
        logits = self.adapter(model, input_ids, attention_mask, prompt_mask=prompt_mask, **kwargs)
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

    def __call__(self, *args, **kwargs):
        """Generate; see [`DiffusionLMPipeline.__call__`]. With `OeMDMScheduler(schedule="learned")` the reverse
        scheduler's exponents travel to the scheduler beside the logits. For sampling from the model (rather than
        greedy decoding) pass `temperature=1.0`."""
        learned = isinstance(self.scheduler, OeMDMScheduler) and self.scheduler.config.schedule == "learned"
        if not learned:
            return super().__call__(*args, **kwargs)
        if self.reverse_schedule is None:
            raise ValueError("`OeMDMScheduler(schedule='learned')` needs the pipeline's `reverse_schedule`.")
        base = self.adapter
        self.adapter = LearnedOrderAdapter(base, self.reverse_schedule)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.adapter = base
