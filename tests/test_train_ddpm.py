"""The DDPM training script under `accelerate launch`: exact resume, argument errors, a loadable result."""

import os
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
SCRIPT = os.path.join(REPO, "training", "train_ddpm.py")
TINY = [
    "--class_conditional",
    "--use_ema",
    "--block_out_channels",
    "8",
    "16",
    "--norm_num_groups",
    "4",
    "--layers_per_block",
    "1",
    "--train_batch_size",
    "4",
    "--lr_scheduler",
    "constant",
    "--lr_warmup_steps",
    "0",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


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
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _unet_weights(folder):
    return load_file(os.path.join(folder, "unet", "diffusion_pytorch_model.safetensors"))


# 70-95 s (three interpreters per launch): in the slow run. The default run keeps a real two-process resume in
# tests/test_train_consistency.py, so every launch path through tests/script_launch.py is still exercised.
@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _launch(resumed, 3)
    assert_world_size(log, resumed / "checkpoint-3")
    log = _launch(resumed, 6, "--resume_from_checkpoint", "latest")
    assert "Resuming from" in log and "checkpoint-3" in log
    _launch(straight, 6)

    a, b = _unet_weights(resumed), _unet_weights(straight)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    # The comparison is sensitive: the checkpoint after 3 steps is far from the final weights.
    early = load_file(os.path.join(resumed, "checkpoint-3", "model.safetensors"))
    assert any(not torch.equal(early[k], a[k]) for k in early if k in a)

    from diffusers_ext import load_pipeline

    pipe = load_pipeline(str(resumed))
    pipe.set_progress_bar_config(disable=True)
    images = pipe(class_labels=[0, 1], num_inference_steps=2, output_type="np").images
    assert images.shape == (2, 8, 8, 1)
    card = (resumed / "README.md").read_text()
    assert "ACCELERATE_USE_CPU=true torchrun --standalone --nproc_per_node 2 " in card and "train_ddpm.py" in card


BAD_ARGUMENTS = [
    (["--train_data_dir", "/nonexistent/folder"], "--train_data_dir"),
    (["--resolution", "7"], "--resolution 7"),
    (["--block_types", "plain"], "--block_types"),
    (["--resume_from_checkpoint", "checkpoint-999"], "--resume_from_checkpoint"),
]


@pytest.fixture(scope="module")
def bad_argument_runs(tmp_path_factory):
    """Every `BAD_ARGUMENTS` case run as the command line would, all in one interpreter."""
    root = tmp_path_factory.mktemp("bad_arguments")
    return run_bad_arguments(
        SCRIPT, BAD_ARGUMENTS, root, ["--report_to", "none", "--max_train_steps", "1"], env=_env()
    )


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_arguments_fail_with_one_line_error(bad_argument_runs, case):
    assert_one_line_argument_error(bad_argument_runs[case], BAD_ARGUMENTS[case][1])


def _image_folder(root, size):
    from PIL import Image

    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (size, size), (40 * i, 200 if label == "a" else 20, 90)).save(root / label / f"{i}.png")
    return root


def test_trains_on_a_datasets_image_folder(tmp_path):
    data = _image_folder(tmp_path / "data", 12)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(out),
        "--train_data_dir",
        str(data),
        "--resolution",
        "8",
        "--max_train_steps",
        "2",
        *TINY,
        "--report_to",
        "tensorboard",
        "--mixed_precision",
        "bf16",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    from diffusers_ext import load_pipeline

    pipe = load_pipeline(str(out))
    assert pipe.unet.config.in_channels == 3 and pipe.unet.config.num_class_embeds == 3
    assert pipe.config.null_class_label == 2
    assert list((out / "logs").rglob("events.out.tfevents.*")), "no tensorboard log written"


def test_image_folder_with_too_small_images_is_a_one_line_error(tmp_path):
    data = _image_folder(tmp_path / "data", 4)
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(tmp_path / "out"),
        "--train_data_dir",
        str(data),
        "--resolution",
        "8",
        "--max_train_steps",
        "1",
        "--report_to",
        "none",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 2
    assert "smaller than --resolution 8" in result.stderr.strip().splitlines()[-1]


def _bad_run(tmp_path, *args):
    cmd = [sys.executable, SCRIPT, "--max_train_steps", "1", "--report_to", "none", "--resolution", "8", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_unreadable_image_is_named_before_training(tmp_path):
    data = _image_folder(tmp_path / "data", 12)
    (data / "b" / "2.png").write_bytes(b"not a png at all")
    out = tmp_path / "out"
    last = _bad_run(tmp_path, "--output_dir", str(out), "--train_data_dir", str(data))
    assert "2.png" in last and "is not a readable image" in last, last
    assert not out.exists() or not any(out.glob("checkpoint-*"))


def test_output_dir_that_is_a_file_fails_at_once(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"")
    last = _bad_run(tmp_path, "--output_dir", str(target))
    assert "argument --output_dir" in last and "is an existing file, not a folder" in last, last
    last = _bad_run(tmp_path, "--output_dir", str(target / "sub"))
    assert "cannot be created" in last and "is a file, not a folder" in last, last


def _script_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_ddpm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_samples_reach_the_tracker_and_the_folder_and_leave_training_alone(tmp_path):
    from test_training_utils import _tensorboard_events

    script = _script_module()
    common = ["--max_train_steps", "3", *TINY, "--ddpm_num_inference_steps", "2"]
    validation = ["--validation_class_labels", "3", "7", "--num_validation_images", "2", "--validation_steps", "2"]
    script.main(["--output_dir", str(tmp_path / "v"), *common, *validation, "--report_to", "tensorboard"])
    assert sorted(os.listdir(tmp_path / "v" / "validation")) == ["step-2", "step-3"]
    assert sorted(os.listdir(tmp_path / "v" / "validation" / "step-3")) == [
        "00-3.png",
        "01-3.png",
        "02-7.png",
        "03-7.png",
    ]
    events = _tensorboard_events(tmp_path / "v" / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [2, 3]
    script.main(["--output_dir", str(tmp_path / "plain"), *common])  # no validation: the same weights (EMA kept)
    assert not (tmp_path / "plain" / "validation").exists()
    a, b = _unet_weights(tmp_path / "v"), _unet_weights(tmp_path / "plain")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    unconditional = [a for a in common if a != "--class_conditional"]
    script.main(["--output_dir", str(tmp_path / "u"), *unconditional, "--validation_steps", "5"])
    assert len(os.listdir(tmp_path / "u" / "validation" / "step-3")) == 4  # only after training; 4 by default
    with pytest.raises(SystemExit):
        script.parse_args(["--output_dir", str(tmp_path / "x"), "--validation_class_labels", "1"])
