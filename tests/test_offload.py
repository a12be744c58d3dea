"""diffusers' model offloading on every pipeline of the pack: the hooks along `model_cpu_offload_seq` install and the
output is exactly the one without them (docs/scale_image_pipelines.md, "Offloading").

On a machine without an accelerator diffusers refuses `enable_model_cpu_offload()` unless a device is named; with
`device="cpu"` the hooks move nothing, so this checks the offload sequence and the hooks' call order, not memory.
"""

import numpy as np
import pytest

from diffusers_ext.testing import get_dummy_components, get_dummy_inputs, output_to_numpy, registered_pipelines


@pytest.mark.parametrize("pipeline_class", registered_pipelines(), ids=lambda c: c.__name__)
def test_model_cpu_offload_gives_the_same_output(pipeline_class):
    plain = pipeline_class(**get_dummy_components(pipeline_class))
    plain.set_progress_bar_config(disable=True)
    expected = output_to_numpy(plain(**get_dummy_inputs(pipeline_class)))

    offloaded = pipeline_class(**get_dummy_components(pipeline_class))
    offloaded.set_progress_bar_config(disable=True)
    offloaded.enable_model_cpu_offload(device="cpu")
    assert offloaded._all_hooks, "no offload hook was installed"
    out = output_to_numpy(offloaded(**get_dummy_inputs(pipeline_class)))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
