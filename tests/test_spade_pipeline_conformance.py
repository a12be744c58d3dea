"""The diffusers_ext pipeline contract (`PipelineConformanceTests`) on SPADE's `SurrogatePredictivePipeline`."""

from diffusers_ext import SurrogatePredictivePipeline
from diffusers_ext.testing import PipelineConformanceTests


class TestSurrogatePredictivePipelineConformance(PipelineConformanceTests):
    pipeline_class = SurrogatePredictivePipeline
