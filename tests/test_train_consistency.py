"""The consistency-training scripts: exact resume under `accelerate launch`, diffusers-loadable results, errors."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from script_launch import (
    accelerate_cpu_launch,
    assert_one_line_argument_error,
    assert_world_size,
    run_bad_arguments,
)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_consistency.py")
REGRESSOR_SCRIPT = os.path.join(REPO, "training", "train_augmentation_regressor.py")
TINY = [
    "--use_ema",
    "--block_out_channels",
    "8",
    "16",
    "--norm_num_groups",
    "4",
    "--train_batch_size",
    "4",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
    "--num_stages",
    "2",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": REPO}


def _feature_network(folder):
    from diffusers_ext import AugmentationRegressor

    torch.manual_seed(0)
    AugmentationRegressor(sample_size=8, block_out_channels=(4, 8), layers_per_block=1).save_pretrained(folder)
    return str(folder)


def _launch(output_dir, steps, *extra):
    cmd = [
        *accelerate_cpu_launch(),
        SCRIPT,
        "--output_dir",
        str(output_dir),
        "--max_train_steps",
        str(steps),
        *TINY,
        *extra,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.two_process
def test_two_process_mfd_resume_equals_uninterrupted_run_and_samples_with_diffusers(tmp_path):
    features = _feature_network(tmp_path / "features")
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    # 4 steps over 2 ECT stages: the first is denoising (r = 0), the second a real consistency step. The run is
    # interrupted after its checkpoint at step 2 (a copy of that checkpoint alone) and resumed to the end.
    log = _launch(straight, 4, "--loss", "mfd", "--feature_network", features)
    assert (straight / "checkpoint-2").is_dir() and (straight / "checkpoint-4").is_dir()
    assert_world_size(log, straight / "checkpoint-4")
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    log = _launch(resumed, 4, "--loss", "mfd", "--feature_network", features, "--resume_from_checkpoint", "latest")
    assert "Resuming from" in log and "checkpoint-2" in log

    name = os.path.join("unet", "diffusion_pytorch_model.safetensors")
    a, b = load_file(resumed / name), load_file(straight / name)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{key} differs after resume")
    early = load_file(resumed / "checkpoint-2" / "model.safetensors")
    assert any(not torch.equal(early[k], a[k]) for k in early if k in a)

    from diffusers import CMStochasticIterativeScheduler, ConsistencyModelPipeline

    from diffusers_ext import load_pipeline

    pipe = ConsistencyModelPipeline.from_pretrained(resumed)
    assert isinstance(pipe.scheduler, CMStochasticIterativeScheduler)
    pipe.set_progress_bar_config(disable=True)
    for steps in (1, 2):
        images = pipe(batch_size=2, num_inference_steps=steps, output_type="np").images
        assert images.shape == (2, 8, 8, 1) and (images >= 0).all() and (images <= 1).all()
    assert isinstance(load_pipeline(str(resumed)), ConsistencyModelPipeline)
    card = (resumed / "README.md").read_text()
    assert card.startswith("---\n") and "train_consistency.py" in card and "manifold feature distance" in card


BAD_ARGUMENTS = [
    (["--loss", "mfd"], "--loss mfd needs --feature_network"),
    (["--loss", "mfd", "--feature_network", "/nonexistent"], "--feature_network"),
    (["--num_stages", "5"], "--num_stages 5 exceeds --max_train_steps 4"),
    (["--resume_from_checkpoint", "checkpoint-9"], "--resume_from_checkpoint"),
]


@pytest.fixture(scope="module")
def bad_argument_runs(tmp_path_factory):
    """Every `BAD_ARGUMENTS` case run as the command line would, all in one interpreter."""
    root = tmp_path_factory.mktemp("bad_arguments")
    return run_bad_arguments(
        SCRIPT, BAD_ARGUMENTS, root, ["--report_to", "none", "--max_train_steps", "4"], env=_env()
    )


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_arguments_fail_with_one_line_error(bad_argument_runs, case):
    assert_one_line_argument_error(bad_argument_runs[case], BAD_ARGUMENTS[case][1])


@pytest.mark.slow
def test_fine_tunes_the_pretrained_zoo_ddpm_unet_class_conditionally(tmp_path):
    from diffusers_ext import zoo

    out = tmp_path / "out"
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(out),
        "--pretrained_model_name_or_path",
        zoo.path("digits-ddpm"),
        "--loss",
        "pseudo_huber",
        "--max_train_steps",
        "2",
        "--train_batch_size",
        "2",
        "--stage_offset",
        "1",
        "--num_stages",
        "1",
        "--report_to",
        "tensorboard",
        *["--validation_class_labels", "3", "7", "--num_validation_images", "1", "--validation_steps", "1"],
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # Validation (diffusers' flags, class labels for prompts): after each step, as files and tensorboard images.
    from test_training_utils import _tensorboard_events

    assert sorted(os.listdir(out / "validation" / "step-2")) == ["00-3.png", "01-7.png"]
    events = _tensorboard_events(out / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [1, 2]
    from diffusers import ConsistencyModelPipeline

    pipe = ConsistencyModelPipeline.from_pretrained(out)
    assert pipe.unet.config.num_class_embeds == 11
    pipe.set_progress_bar_config(disable=True)
    images = pipe(batch_size=2, class_labels=[3, 7], num_inference_steps=1, output_type="np").images
    assert images.shape == (2, 8, 8, 1)
    assert "base_model:" in (out / "README.md").read_text()


@pytest.mark.slow
def test_augmentation_regressor_script_resumes_and_saves_a_loadable_network(tmp_path):
    base = [
        sys.executable,
        REGRESSOR_SCRIPT,
        "--block_out_channels",
        "4",
        "8",
        "--layers_per_block",
        "1",
        "--train_batch_size",
        "8",
        "--checkpointing_steps",
        "2",
        "--report_to",
        "none",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder, extra in ((straight, []), (resumed, ["--resume_from_checkpoint", "latest"])):
        if extra:  # resume the same run from its step-2 checkpoint
            shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
        cmd = [*base, "--output_dir", str(folder), "--max_train_steps", "4", *extra]
        result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    from diffusers_ext import AugmentationRegressor

    a = AugmentationRegressor.from_pretrained(tmp_path / "resumed")
    b = AugmentationRegressor.from_pretrained(tmp_path / "straight")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert "held-out R^2" not in (tmp_path / "resumed" / "README.md").read_text()
    assert "heldout_r2" in (tmp_path / "resumed" / "README.md").read_text()


def test_unconditional_validation_samples_go_to_the_folder(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_consistency", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "out"
    script.main(["--output_dir", str(out), "--max_train_steps", "2", *TINY, "--validation_steps", "1"])
    assert sorted(os.listdir(out / "validation")) == ["step-1", "step-2"]
    assert sorted(os.listdir(out / "validation" / "step-2")) == [f"{i:02d}-sample.png" for i in range(4)]
