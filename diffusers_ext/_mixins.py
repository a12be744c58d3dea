"""The diffusers base classes, re-exported under ``diffusers_ext``.

diffusers resolves a component saved as ``["diffusers_ext", "Class"]`` by looking these mixins up on the
``diffusers_ext`` module to decide how to load it (``from_pretrained``) and save it (``save_pretrained``).
"""

from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin


__all__ = ["ConfigMixin", "DiffusionPipeline", "ModelMixin", "SchedulerMixin"]
