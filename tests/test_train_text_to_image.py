"""training/train_text_to_image.py: fine-tuning a pretrained Stable Diffusion folder on captioned images, as
diffusers' example does: only the UNet changes, the result loads with `StableDiffusionPipeline`, a resumed run equals
an uninterrupted one, and bad input is refused before any model is loaded."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from script_launch import as_command_line, assert_one_line_argument_error, run_bad_arguments


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_text_to_image.py")
TINY = [
    "--resolution", "32", "--train_batch_size", "2", "--learning_rate", "1e-3", "--checkpointing_steps", "2",
    "--report_to", "none", "--seed", "5",
]  # fmt: skip


def _script():
    from diffusers_ext.evaluation.reporting import load_script

    return load_script(SCRIPT, "train_text_to_image")


@pytest.fixture(scope="module")
def captioned_folder(tmp_path_factory):
    """A `datasets` image folder of 6 coloured images (not square, larger than 32 px) with a metadata.jsonl."""
    from PIL import Image

    root = tmp_path_factory.mktemp("captioned")
    with open(root / "metadata.jsonl", "w", encoding="utf-8") as f:
        for i, colour in enumerate(["red", "green", "blue", "red", "green", "blue"]):
            value = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}[colour]
            Image.new("RGB", (44 + 2 * i, 36), value).save(root / f"{i}.png")
            f.write(json.dumps({"file_name": f"{i}.png", "text": f"a {colour} picture"}) + "\n")
    return root


def _train(out, base, data, steps, *extra):
    argv = [
        "--pretrained_model_name_or_path", str(base), "--train_data_dir", str(data), "--output_dir", str(out),
        "--max_train_steps", str(steps), *TINY, *extra,
    ]  # fmt: skip
    with as_command_line(SCRIPT, argv):
        _script().main(argv)


def _weights(folder, component):
    return load_file(os.path.join(folder, component, "diffusion_pytorch_model.safetensors"))


def test_fine_tunes_only_the_unet_and_saves_a_stable_diffusion_pipeline(
    tmp_path, tiny_sd_pipeline_folder, captioned_folder
):
    from diffusers import StableDiffusionPipeline

    out = tmp_path / "out"
    validation = ["--validation_prompt", "a red picture", "--num_validation_images", "1", "--validation_steps", "2"]
    _train(out, tiny_sd_pipeline_folder, captioned_folder, 3, "--random_flip", "--use_ema", "--snr_gamma", "5",
           "--num_inference_steps", "2", *validation)  # fmt: skip
    base_unet, unet = _weights(tiny_sd_pipeline_folder, "unet"), _weights(out, "unet")
    assert unet.keys() == base_unet.keys() and any(not torch.equal(unet[k], base_unet[k]) for k in unet)
    for frozen in ("vae", "text_encoder"):
        name = "model.safetensors" if frozen == "text_encoder" else "diffusion_pytorch_model.safetensors"
        base = load_file(os.path.join(tiny_sd_pipeline_folder, frozen, name))
        tuned = load_file(os.path.join(out, frozen, name))
        assert base.keys() == tuned.keys() and all(torch.equal(base[k], tuned[k]) for k in base), frozen
    pipe = StableDiffusionPipeline.from_pretrained(out)
    image = pipe("a blue picture", num_inference_steps=2, height=32, width=32, output_type="np").images
    assert image.shape == (1, 32, 32, 3) and bool((image >= 0).all() and (image <= 1).all())
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"base_model: {tiny_sd_pipeline_folder}" in card and "train_text_to_image.py" in card
    assert (out / "checkpoint-2").is_dir()
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step-2", "step-3"]


def test_resume_equals_the_uninterrupted_run(tmp_path, tiny_sd_pipeline_folder, captioned_folder):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    extra = ("--use_ema", "--noise_offset", "0.1")  # the EMA and every random draw resume too
    _train(whole, tiny_sd_pipeline_folder, captioned_folder, 4, *extra)
    _train(resumed, tiny_sd_pipeline_folder, captioned_folder, 2, *extra)
    _train(resumed, tiny_sd_pipeline_folder, captioned_folder, 4, "--resume_from_checkpoint", "latest", *extra)
    a, b = _weights(whole, "unet"), _weights(resumed, "unet")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_missing_caption_column_is_named_before_training(tmp_path, tiny_sd_pipeline_folder, captioned_folder):
    with pytest.raises(ValueError, match="--caption_column 'caption' is not a column"):
        _train(tmp_path / "out", tiny_sd_pipeline_folder, captioned_folder, 1, "--caption_column", "caption")
    assert not (tmp_path / "out" / "checkpoint-1").exists()


def test_a_resolution_the_vae_cannot_halve_is_refused(tmp_path, tiny_sd_pipeline_folder, captioned_folder):
    with pytest.raises(ValueError, match="--resolution must be a multiple of 2"):
        _train(tmp_path / "out", tiny_sd_pipeline_folder, captioned_folder, 1, "--resolution", "31")


BAD_ARGUMENTS = [
    (["--train_data_dir", "/nonexistent/folder"], "--train_data_dir"),
    (["--dataset_name", "some/dataset"], "exactly one of --dataset_name and --train_data_dir"),
    (["--pretrained_model_name_or_path", REPO], "model_index.json"),
    (["--snr_gamma", "0"], "--snr_gamma"),
    (["--ema_decay", "1"], "--ema_decay"),
]


@pytest.fixture(scope="module")
def bad_argument_runs(tmp_path_factory, tiny_sd_pipeline_folder, captioned_folder):
    root = tmp_path_factory.mktemp("bad_arguments")
    common = [
        "--pretrained_model_name_or_path",
        str(tiny_sd_pipeline_folder),
        "--train_data_dir",
        str(captioned_folder),
    ]
    cases = [(args, message) for args, message in BAD_ARGUMENTS]
    # a later flag wins in argparse: each case's own argv comes after the common flags
    return run_bad_arguments(SCRIPT, cases, root, [*common, "--report_to", "none", "--max_train_steps", "1"])


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_arguments_fail_with_one_line_error(bad_argument_runs, case):
    assert_one_line_argument_error(bad_argument_runs[case], BAD_ARGUMENTS[case][1])
