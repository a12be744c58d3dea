"""LoMDMPipeline: a [`DiffusionLMPipeline`] that also carries LoMDM's learned schedules, so the learned generation
order, the OeMDM presets and the SOAR / greedy / threshold decoders all sample from one saved model."""

import functools

import torch

from ...models.lomdm_schedule_network import LoMDMScheduleNetwork
from ...schedulers.scheduling_oemdm import OeMDMScheduler
from ...utils import public
from ..diffusion_lm.pipeline_diffusion_lm import DiffusionLMPipeline


class LoMDMAdapter:
    """Wrap a diffusion-LM adapter for a masked diffusion LM trained with MDLM or LoMDM: the mask token's logit is
    set to `-inf` (the denoiser never predicts a mask: MDLM's zero-masking parameterisation), so every scheduler,
    sampling or greedy, commits real tokens."""

    def __init__(self, adapter):
        self.adapter = adapter

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
        return logits


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

    @property
    def uses_learned_schedule(self) -> bool:
        """Whether the scheduler unmasks by LoMDM's learned schedule (`OeMDMScheduler(schedule="learned")`)."""
        return isinstance(self.scheduler, OeMDMScheduler) and self.scheduler.config.schedule == "learned"

    def step_inputs(self, sequences: torch.LongTensor, prompt_mask: torch.BoolTensor) -> dict:
        """With the learned schedule, `exponents` `(N, L)`: the reverse scheduler's `w` of every position computed on
        the current sequences (the prompt is excluded from the NormSig mean); nothing otherwise."""
        if not self.uses_learned_schedule:
            return {}
        return {"exponents": self.reverse_schedule(sequences, ~prompt_mask).exponents}

    # the signature (and so every argument check that reads it) is DiffusionLMPipeline's; the docstring is this one
    @functools.wraps(DiffusionLMPipeline.__call__, assigned=("__module__", "__name__", "__qualname__"))
    def __call__(self, *args, **kwargs):
        """Generate; see [`DiffusionLMPipeline.__call__`]. The mask token is never committed (its logit is `-inf`
        for every scheduler); with `OeMDMScheduler(schedule="learned")` the reverse scheduler's exponents are passed
        to the scheduler's step (`exponents`, see [`~LoMDMPipeline.step_inputs`]). For sampling from the model
        (rather than greedy decoding) pass `temperature=1.0`."""
        if self.uses_learned_schedule and self.reverse_schedule is None:
            raise ValueError("`OeMDMScheduler(schedule='learned')` needs the pipeline's `reverse_schedule`.")
        base = self.adapter
        self.adapter = LoMDMAdapter(base)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.adapter = base
