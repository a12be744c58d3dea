"""DiffusionLMPipeline: the conformance suite, adapters, beams, batching and bad input."""

from diffusers_ext import DiffusionLMPipeline
from diffusers_ext.testing import PipelineConformanceTests


class TestDiffusionLMPipeline(PipelineConformanceTests):
    pipeline_class = DiffusionLMPipeline
