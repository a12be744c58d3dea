import os

import pytest
import torch


# The tiny models in these tests run far faster on one thread than on two contended ones (OpenMP waits dominate).
# Set OMP_NUM_THREADS to choose another count.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _two_process_marker(request):
    """Tell `script_launch` whether this test is marked `two_process` (a multi-process launch from an unmarked test
    fails there)."""
    import script_launch

    script_launch.current_test_is_marked_two_process = request.node.get_closest_marker("two_process") is not None
    yield
    script_launch.current_test_is_marked_two_process = None


@pytest.fixture(scope="session")
def tiny_sd_pipeline_folder(tmp_path_factory):
    """A saved `StableDiffusionPipeline` of the pack's tiny components (seed 0), for scripts that read a folder."""
    from diffusers import StableDiffusionPipeline

    from diffusers_ext.testing import get_tiny_sd_components

    folder = tmp_path_factory.mktemp("tiny_sd")
    StableDiffusionPipeline(**get_tiny_sd_components(seed=0)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_sd3_pipeline_folder(tmp_path_factory):
    """A saved `StableDiffusion3Pipeline` of the pack's tiny components (seed 0), for scripts that read a folder."""
    from diffusers import StableDiffusion3Pipeline

    from diffusers_ext.testing import get_tiny_sd3_components

    folder = tmp_path_factory.mktemp("tiny_sd3")
    StableDiffusion3Pipeline(**get_tiny_sd3_components(seed=0)).save_pretrained(folder)
    return folder
