"""The SemanticNVS and semantic-encoder training scripts: tiny runs that save loadable results, and bad arguments."""

import os
import subprocess
import sys

import pytest
import torch
from script_launch import assert_one_line_argument_error, run_bad_arguments


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVS = os.path.join(REPO, "training", "train_semantic_nvs.py")
ENCODER = os.path.join(REPO, "training", "train_semantic_encoder.py")
TINY = [
    "--resolution",
    "8",
    "--block_out_channels",
    "8",
    "16",
    "--train_batch_size",
    "2",
    "--max_train_steps",
    "2",
    "--checkpointing_steps",
    "1",
    "--report_to",
    "none",
]


def _run(script, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=600)


def test_encoder_then_nvs_training_give_a_working_pipeline(tmp_path):
    encoder_dir, nvs_dir = tmp_path / "encoder", tmp_path / "nvs"
    result = _run(
        ENCODER,
        "--output_dir",
        str(encoder_dir),
        "--resolution",
        "8",
        "--train_batch_size",
        "2",
        "--max_train_steps",
        "2",
        "--num_hidden_layers",
        "1",
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heldout_patch_accuracy" in (encoder_dir / "README.md").read_text()
    validation = ["--num_validation_images", "2", "--validation_steps", "1", "--validation_inference_steps", "2"]
    result = _run(
        NVS,
        "--output_dir",
        str(nvs_dir),
        "--semantic_encoder",
        str(encoder_dir),
        *TINY,
        *validation,
        "--report_to",
        "tensorboard",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (nvs_dir / "checkpoint-2").is_dir() and not (nvs_dir / "checkpoint-1").exists()
    # the paper's surrogate (blurred clean targets) stays available
    blur_dir = tmp_path / "nvs-blur"
    result = _run(
        NVS,
        "--output_dir",
        str(blur_dir),
        "--semantic_encoder",
        str(encoder_dir),
        *TINY,
        "--iterative_surrogate",
        "blur",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--iterative_surrogate blur" in (blur_dir / "README.md").read_text()
    # Validation: two fixed scenes after each step, input view then the generated target, as files and events.
    from PIL import Image
    from test_training_utils import _tensorboard_events

    assert sorted(os.listdir(nvs_dir / "validation")) == ["step-1", "step-2"]
    assert sorted(os.listdir(nvs_dir / "validation" / "step-2")) == ["00-scene.png", "01-scene.png"]
    assert Image.open(nvs_dir / "validation" / "step-2" / "00-scene.png").size == (24, 8)  # 3 views of 8x8
    events = _tensorboard_events(nvs_dir / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [1, 2]

    from diffusers_ext import SemanticNVSPipeline
    from diffusers_ext.data.procedural_scenes import sample_scene_batch

    pipe = SemanticNVSPipeline.from_pretrained(nvs_dir)
    pipe.set_progress_bar_config(disable=True)
    scenes = sample_scene_batch(torch.Generator().manual_seed(0), 1, 2, 8)
    out = pipe(
        images=scenes["images"][:, :1],
        input_intrinsics=scenes["intrinsics"][:, :1],
        input_c2w=scenes["c2w"][:, :1],
        target_intrinsics=scenes["intrinsics"][:, 1:],
        target_c2w=scenes["c2w"][:, 1:],
        depths=scenes["depths"][:, :1],
        num_inference_steps=2,
        output_type="np",
    )
    assert out.images.shape == (1, 1, 8, 8, 3)


BAD_ARGUMENTS = [
    (["--no_semantics", "--semantic_encoder", "x"], "exactly one"),
    (["--semantic_encoder", "/nonexistent/encoder"], "--semantic_encoder"),
    (["--no_semantics", "--num_views", "1"], "--num_views"),
    (["--no_semantics", "--resolution", "9"], "--resolution 9"),
    (["--no_semantics", "--self_cond_prob", "1.5"], "--self_cond_prob must be in [0, 1], got 1.5"),
    (["--no_semantics", "--iterative_surrogate", "noise"], "--iterative_surrogate"),
    (["--no_semantics", "--train_data_dir", "a", "--dataset_name", "b"], "at most one of --train_data_dir"),
    (["--no_semantics", "--train_data_dir", "/nonexistent/captures"], "--train_data_dir"),
]


@pytest.fixture(scope="module")
def bad_argument_runs(tmp_path_factory):
    """Every `BAD_ARGUMENTS` case run as the command line would, all in one interpreter."""
    root = tmp_path_factory.mktemp("bad_arguments")
    return run_bad_arguments(NVS, BAD_ARGUMENTS, root, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_arguments(bad_argument_runs, case):
    assert_one_line_argument_error(bad_argument_runs[case], BAD_ARGUMENTS[case][1])


def _write_captures(root, with_depth):
    """Two procedural scenes of three views each, written in the multi-view folder format."""
    import json

    import numpy as np
    from PIL import Image

    from diffusers_ext.data.procedural_scenes import random_scene, render_orbit

    for index in range(2):
        scene = render_orbit(random_scene(torch.Generator().manual_seed(index), num_objects=2), 3, 8, sweep_deg=60)
        folder = root / f"scene{index}"
        folder.mkdir(parents=True)
        frames = []
        for view in range(3):
            pixels = (scene["images"][view].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{view}.png")
            frame = {
                "image": f"{view}.png",
                "intrinsics": scene["intrinsics"][view].tolist(),
                "c2w": scene["c2w"][view].tolist(),
            }
            if with_depth:
                np.save(folder / f"{view}.npy", scene["depths"][view, 0].numpy())
                frame["depth"] = f"{view}.npy"
            frames.append(frame)
        (folder / "cameras.json").write_text(json.dumps({"frames": frames}))


# 30 s: a second data source through the training path test_encoder_then_nvs_training covers by default
@pytest.mark.slow
def test_training_on_captures_from_a_folder(tmp_path):
    encoder = os.path.join(REPO, "diffusers_ext", "zoo", "procedural-semantic-encoder")
    _write_captures(tmp_path / "captures", with_depth=True)
    result = _run(
        NVS,
        "--output_dir",
        str(tmp_path / "nvs"),
        "--semantic_encoder",
        encoder,
        *TINY,
        "--train_data_dir",
        str(tmp_path / "captures"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 posed multi-view scenes at 8x8" in (tmp_path / "nvs" / "README.md").read_text()

    _write_captures(tmp_path / "no-depth", with_depth=False)
    result = _run(
        NVS,
        "--output_dir",
        str(tmp_path / "nvs2"),
        "--semantic_encoder",
        encoder,
        *TINY,
        "--train_data_dir",
        str(tmp_path / "no-depth"),
    )
    assert result.returncode == 2 and "no depth" in result.stderr.strip().splitlines()[-1]


# 30 s: a second data source through the training path test_encoder_then_nvs_training covers by default
@pytest.mark.slow
def test_training_on_a_saved_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    from diffusers_ext.data.multiview_folder import MultiViewSceneDataset

    _write_captures(tmp_path / "captures", with_depth=False)
    scenes = MultiViewSceneDataset.from_folder(str(tmp_path / "captures"), resolution=8)
    rows = [scenes[i] for i in range(len(scenes))]
    dataset = datasets.Dataset.from_dict(
        {
            "images": [
                [(image.permute(1, 2, 0) * 255).round().byte().numpy() for image in row["images"]] for row in rows
            ],
            "intrinsics": [row["intrinsics"].tolist() for row in rows],
            "c2w": [row["c2w"].tolist() for row in rows],
        }
    )
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(tmp_path / "saved"))
    result = _run(
        NVS, "--output_dir", str(tmp_path / "nvs"), "--no_semantics", *TINY, "--dataset_name", str(tmp_path / "saved")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 posed multi-view scenes" in (tmp_path / "nvs" / "README.md").read_text()
    result = _run(
        NVS,
        "--output_dir",
        str(tmp_path / "nvs2"),
        "--no_semantics",
        *TINY,
        "--dataset_name",
        str(tmp_path / "saved"),
        "--dataset_split",
        "test",
    )
    assert result.returncode == 2 and "--dataset_split 'test'" in result.stderr.strip().splitlines()[-1]


def test_dropped_scenes_get_the_unconditional_branch_semantics():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_semantic_nvs", NVS)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    inputs = torch.full((2, 1, 4, 3, 3), 5.0)
    warped, iterative = torch.full((2, 2, 4, 3, 3), 1.0), torch.full((2, 4, 3, 3), 2.0)
    coverage = torch.zeros(2, 2, 1, 3, 3, dtype=torch.bool)
    coverage[..., 0] = True
    modes = ["warped+iterative", "warped"]
    features, masks = script.compose_semantics(
        inputs, warped, coverage, modes, [iterative, None], keep=torch.tensor([True, True])
    )
    assert (
        (features[0, 0] == 5).all() and (features[0, 1:, :, :, 0] == 1).all() and (features[0, 1:, ..., 1:] == 2).all()
    )
    assert (masks[:, 0] == 1).all() and (masks[0, 1:] == 1).all() and (masks[1, 1:] == coverage[1]).all()
    features, masks = script.compose_semantics(
        inputs, warped, coverage, modes, [iterative, None], keep=torch.tensor([False, False])
    )
    # unconditional: no input-view or warped features; the iterative ones stay where the scene's mode has them
    assert (features[:, 0] == 0).all() and (masks[:, 0] == 0).all()
    assert (features[0, 1:] == 2).all() and (masks[0, 1:] == 1).all()
    assert (features[1] == 0).all() and (masks[1] == 0).all()
