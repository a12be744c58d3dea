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
    pipe = load_pipeline(tmp_path, dtype=torch.float64)
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


_GENERIC_LOAD = """
import sys
order, folders = sys.argv[1], sys.argv[2:]
if order == "diffusers_ext first":
    import diffusers_ext
    assert "diffusers" not in sys.modules  # the import stays lazy
    from diffusers import DiffusionPipeline
else:
    from diffusers import DiffusionPipeline
    import diffusers_ext
for folder in folders:
    pipe = DiffusionPipeline.from_pretrained(folder)
    print(type(pipe).__module__, type(pipe).__name__, *sorted(type(c).__name__ for c in pipe.components.values()))
import diffusers
try:
    diffusers.NoSuchPipeline
except AttributeError:
    print("still AttributeError")
print(diffusers.DDPMPipeline.__module__)
"""


def test_diffusers_generic_loader_loads_the_packs_folders_after_import(tmp_path):
    import os
    import subprocess
    import sys

    from diffusers_ext import DivideAndDenoisePipeline, SemanticNVSPipeline, zoo
    from diffusers_ext.testing import get_dummy_components

    folders = {}
    ClassConditionalDDPMPipeline(
        _tiny_unet(3), DDIMScheduler(num_train_timesteps=50), null_class_label=2
    ).save_pretrained(tmp_path / "class_conditional")
    folders["class_conditional"] = "ClassConditionalDDPMPipeline DDIMScheduler UNet2DModel"
    for cls, name in ((DivideAndDenoisePipeline, "divide_and_denoise"), (SemanticNVSPipeline, "semantic_nvs")):
        cls(**get_dummy_components(cls)).save_pretrained(tmp_path / name)
    folders["divide_and_denoise"] = "DivideAndDenoisePipeline DDIMScheduler MultiDenoiserModel"
    folders["semantic_nvs"] = "SemanticNVSPipeline"
    paths = [str(tmp_path / name) for name in folders] + [zoo.path("lomdm-markov"), zoo.path("addition-mdm")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    for order in ("diffusers_ext first", "diffusers first"):
        result = subprocess.run(
            [sys.executable, "-c", _GENERIC_LOAD, order, *paths], capture_output=True, text=True, env=env
        )
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        assert len(lines) == len(paths) + 2, lines
        for line, expected in zip(lines, [*folders.values(), "LoMDMPipeline", "DiffusionLMPipeline"]):
            assert line.startswith("diffusers_ext " + expected.split()[0]), (order, line)
            assert set(expected.split()[1:]) <= set(line.split()[2:]), (order, line)
        assert lines[-2:] == ["still AttributeError", "diffusers.pipelines.ddpm.pipeline_ddpm"], (order, lines)
