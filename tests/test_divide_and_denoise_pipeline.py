"""DivideAndDenoisePipeline: the conformance suite, then behaviour specific to dividing a sample among models."""

from diffusers_ext import DivideAndDenoisePipeline
from diffusers_ext.testing import PipelineConformanceTests


class TestDivideAndDenoisePipeline(PipelineConformanceTests):
    pipeline_class = DivideAndDenoisePipeline
