"""diffusers-ext: recent diffusion methods as first-class diffusers classes.

Every public name is imported lazily (diffusers' ``_LazyModule`` pattern): ``import diffusers_ext`` imports neither
torch nor diffusers, and each class loads on first use.
"""

from typing import TYPE_CHECKING


__version__ = "0.1.0"

# submodule -> public names it defines. Every class listed here pins its ``__module__`` to "diffusers_ext"
# (see ``diffusers_ext.utils.public``) so saved ``model_index.json`` files name ``["diffusers_ext", "Class"]``.
_import_structure = {
    "_mixins": ["ConfigMixin", "DiffusionPipeline", "ModelMixin", "SchedulerMixin"],
    "loading": ["load_pipeline"],
    "models.conv_image_classifier": ["ConvImageClassifier", "ImageClassifierOutput"],
    "pipelines.class_conditional.pipeline_class_conditional_ddpm": ["ClassConditionalDDPMPipeline"],
    "schedulers.scheduling_flow_match_sde": ["FlowMatchSDEScheduler", "FlowMatchSDESchedulerOutput"],
    "trainers.constrained_unlearning_config": ["ConstrainedUnlearningConfig"],
    "trainers.constrained_unlearning_trainer": ["ConstrainedUnlearningTrainer"],
}

if TYPE_CHECKING:
    from ._mixins import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
    from .loading import load_pipeline
    from .models.conv_image_classifier import ConvImageClassifier, ImageClassifierOutput
    from .pipelines.class_conditional.pipeline_class_conditional_ddpm import ClassConditionalDDPMPipeline
    from .schedulers.scheduling_flow_match_sde import FlowMatchSDEScheduler, FlowMatchSDESchedulerOutput
    from .trainers.constrained_unlearning_config import ConstrainedUnlearningConfig
    from .trainers.constrained_unlearning_trainer import ConstrainedUnlearningTrainer
else:
    import sys

    from ._lazy_module import LazyModule

    sys.modules[__name__] = LazyModule(
        __name__,
        globals()["__file__"],
        _import_structure,
        module_spec=__spec__,
        extra_objects={"__version__": __version__},
    )
