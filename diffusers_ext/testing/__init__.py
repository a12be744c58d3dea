"""Test kit for diffusers_ext: tiny seeded components, a dummy-pipeline registry and pytest conformance suites.

Every name below is importable as ``from diffusers_ext.testing import ...``. The kit is not part of the lazy top-level
API, does not import pytest at import time, and nothing in the library, its zoo builders or its training scripts
imports it (``tests/test_architecture.py`` checks that).

1. **Tiny components built from configs** (no hub access, seeded, a forward takes milliseconds):
   [`get_tiny_sd_components`], [`get_tiny_sdxl_components`], [`get_tiny_sd3_components`],
   [`get_tiny_flux_components`], [`get_tiny_pixel_unet`], the bidirectional stand-ins
   for diffusion LMs [`get_tiny_llada_like_lm`] and [`get_tiny_dream_like_lm`], and the locally built tokenizers
   they use ([`get_tiny_clip_tokenizer`], [`get_tiny_t5_tokenizer`], [`get_tiny_lm_tokenizer`]). They live in
   ``diffusers_ext.models.tiny_components`` and ``diffusers_ext.models.tiny_tokenizers`` because the zoo's training
   scripts build the same architectures; the kit re-exports them.
2. **A registry of dummy pipeline setups** (``registry.py``): every pipeline class of ours registers how to build
   tiny components and call arguments with [`register_dummy_pipeline`]; [`get_dummy_components`],
   [`get_dummy_inputs`] and [`get_dummy_batch_inputs`] read it. A method registers its pipeline in
   ``diffusers_ext/testing/dummies/<method>.py``; those modules are imported on the first registry miss, so the
   lookup also works in a fresh interpreter.
3. **Conformance suites**: [`PipelineConformanceTests`] (``pipeline_conformance.py``) and
   [`SchedulerConformanceTests`] (``scheduler_conformance.py``) are mixins for pytest test classes. A method issue
   adds one registration and one test class:

```py
# diffusers_ext/testing/dummies/my_method.py
register_dummy_pipeline(MyPipeline, components_fn, inputs_fn, batch_params=("prompt",), bad_inputs=[...])

# tests/test_pipeline_my_method.py
class TestMyPipeline(PipelineConformanceTests):
    pipeline_class = MyPipeline
```
"""

from ..models.tiny_components import (
    get_tiny_dream_like_lm,
    get_tiny_flux_components,
    get_tiny_llada_like_lm,
    get_tiny_pixel_unet,
    get_tiny_sd3_components,
    get_tiny_sd_components,
    get_tiny_sdxl_components,
)
from ..models.tiny_tokenizers import get_tiny_clip_tokenizer, get_tiny_lm_tokenizer, get_tiny_t5_tokenizer
from .outputs import count_module_forwards, output_to_numpy
from .pipeline_conformance import PipelineConformanceTests
from .registry import (
    BadInput,
    DummyPipelineSpec,
    get_dummy_batch_inputs,
    get_dummy_components,
    get_dummy_inputs,
    get_dummy_spec,
    register_dummy_pipeline,
    registered_pipelines,
)
from .scheduler_conformance import SchedulerConformanceTests


__all__ = [
    "BadInput",
    "DummyPipelineSpec",
    "PipelineConformanceTests",
    "SchedulerConformanceTests",
    "count_module_forwards",
    "get_dummy_batch_inputs",
    "get_dummy_components",
    "get_dummy_inputs",
    "get_dummy_spec",
    "get_tiny_clip_tokenizer",
    "get_tiny_dream_like_lm",
    "get_tiny_flux_components",
    "get_tiny_llada_like_lm",
    "get_tiny_lm_tokenizer",
    "get_tiny_pixel_unet",
    "get_tiny_sd3_components",
    "get_tiny_sd_components",
    "get_tiny_sdxl_components",
    "get_tiny_t5_tokenizer",
    "output_to_numpy",
    "register_dummy_pipeline",
    "registered_pipelines",
]
