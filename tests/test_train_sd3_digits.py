"""train_sd3_digits.py: gradient accumulation, checkpoints, exact resume over both stages, validation images."""

import importlib.util
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
    spec = importlib.util.spec_from_file_location(
        "train_sd3_digits", os.path.join(REPO, "training/train_sd3_digits.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = [
    "--vae_steps", "3",
    "--max_train_steps", "4",
    "--train_batch_size", "4",
    "--gradient_accumulation_steps", "2",
    "--checkpointing_steps", "2",
    "--num_layers", "1",
    "--eval_samples_per_class", "1",
    "--eval_inference_steps", "2",
    "--logging_steps", "1",
]  # fmt: skip


def _weights(folder):
    return {
        sub: load_file(os.path.join(folder, sub, "diffusion_pytorch_model.safetensors"))
        for sub in ("vae", "transformer")
    }


VALIDATION = ["--validation_prompt", "a handwritten digit one", "--num_validation_images", "2"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted tiny run: 3 autoencoder + 4 transformer steps of 2 micro-batches, validation at 6 and 7."""
    folder = tmp_path_factory.mktemp("sd3") / "straight"
    _script().main(["--output_dir", str(folder), *TINY, *VALIDATION, "--validation_steps", "6"])
    return folder


def test_checkpoints_progress_and_validation_images_reach_the_tracker_and_the_folder(straight):
    from test_training_utils import _tensorboard_events

    assert sorted(d for d in os.listdir(straight) if d.startswith("checkpoint-")) == [
        "checkpoint-2",  # autoencoder stage (3 steps), then the transformer's
        "checkpoint-4",
        "checkpoint-6",
        "checkpoint-7",
    ]
    assert sorted(os.listdir(straight / "validation")) == ["step-6", "step-7"]
    assert sorted(os.listdir(straight / "validation" / "step-7")) == [
        "00-a_handwritten_digit_one.png",
        "01-a_handwritten_digit_one.png",
    ]
    events = _tensorboard_events(straight / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [6, 7]
    assert {"vae_loss", "transformer_loss"} <= set(events.Tags()["scalars"])
    from diffusers import StableDiffusion3Pipeline

    assert isinstance(StableDiffusion3Pipeline.from_pretrained(str(straight)), StableDiffusion3Pipeline)


def _resume_equals_straight(straight, tmp_path, checkpoint):
    resumed = tmp_path / f"from-{checkpoint}"
    resumed.mkdir()
    shutil.copytree(straight / checkpoint, resumed / checkpoint)
    _script().main(["--output_dir", str(resumed), *TINY, "--resume_from_checkpoint", "latest", *VALIDATION])
    expected, got = _weights(straight), _weights(resumed)
    for sub in expected:
        for name in expected[sub]:
            torch.testing.assert_close(got[sub][name], expected[sub][name], rtol=0, atol=0, msg=f"{sub}.{name}")
    images = [(folder / "validation" / "step-7" / "00-a_handwritten_digit_one.png") for folder in (straight, resumed)]
    assert images[0].read_bytes() == images[1].read_bytes()  # the same seeded validation images


def test_resume_inside_the_transformer_stage_equals_the_uninterrupted_run(straight, tmp_path):
    _resume_equals_straight(straight, tmp_path, "checkpoint-4")


def test_resume_inside_the_autoencoder_stage_equals_the_uninterrupted_run(straight, tmp_path):
    _resume_equals_straight(straight, tmp_path, "checkpoint-2")


def test_earlier_option_names_still_parse_and_validation_needs_a_prompt(tmp_path):
    script = _script()
    args = script.parse_args(["--output_dir", str(tmp_path), "--train_steps", "7", "--batch_size", "3"])
    assert (args.max_train_steps, args.train_batch_size, args.eval_inference_steps) == (7, 3, 10)
    assert args.resume_from_checkpoint is None and args.mixed_precision is None
    assert script.parse_args(["--output_dir", str(tmp_path), "--eval_steps", "4"]).eval_inference_steps == 4
    with pytest.raises(SystemExit):
        script.parse_args(["--output_dir", str(tmp_path), "--validation_steps", "5"])
    with pytest.raises(SystemExit):
        script.parse_args(["--output_dir", str(tmp_path), "--gradient_accumulation_steps", "0"])
