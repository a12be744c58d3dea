"""The diffusers base classes (and transformers' `PreTrainedModel`), re-exported under ``diffusers_ext``.

diffusers resolves a component saved as ``["diffusers_ext", "Class"]`` by looking these base classes up on the
``diffusers_ext`` module to decide how to load it (``from_pretrained``) and save it (``save_pretrained``);
`PreTrainedModel` is the base of the package's native transformers models (`LLaDAModelLM`, `DreamModel`).
"""

from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
from transformers import PreTrainedModel


__all__ = ["ConfigMixin", "DiffusionPipeline", "ModelMixin", "PreTrainedModel", "SchedulerMixin"]
