import os

import pytest
import torch


# The tiny models in these tests run far faster on one thread than on two contended ones (OpenMP waits dominate).
# Set OMP_NUM_THREADS to choose another count.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


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
