import json

import pytest
import torch
from diffusers import DDIMScheduler, DDPMPipeline, UNet2DModel

from diffusers_ext import ClassConditionalDDPMPipeline, load_pipeline


def _tiny_unet(num_class_embeds=None):
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        num_class_embeds=num_class_embeds,
    )


def test_loads_a_diffusers_pipeline_folder(tmp_path):
    DDPMPipeline(_tiny_unet(), DDIMScheduler(num_train_timesteps=50)).save_pretrained(tmp_path)
    pipe = load_pipeline(tmp_path)
    assert type(pipe) is DDPMPipeline


def test_loads_our_pipeline_folder_with_kwargs(tmp_path):
    ClassConditionalDDPMPipeline(
        _tiny_unet(3), DDIMScheduler(num_train_timesteps=50), null_class_label=2
    ).save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["_class_name"] == "ClassConditionalDDPMPipeline" and index["null_class_label"] == 2
    pipe = load_pipeline(tmp_path, torch_dtype=torch.float64)
    assert type(pipe) is ClassConditionalDDPMPipeline and pipe.unet.dtype == torch.float64


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        load_pipeline(tmp_path / "missing")
    with pytest.raises(ValueError, match="no model_index.json"):
        load_pipeline(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "NoSuchPipeline"}))
    with pytest.raises(ValueError, match="'NoSuchPipeline' is neither"):
        load_pipeline(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(ValueError, match="'UNet2DModel' is neither"):
        load_pipeline(tmp_path)
