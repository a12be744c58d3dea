"""Bad inputs that used to pass silently or fail with a raw traceback: diffusion-LM positions, NaN guidance, negative
confidence thresholds, a zero checkpoint limit, a non-JSON model_index.json, and `diffusers-ext purify`'s inputs."""

import argparse
import json
import os

import numpy as np
import pytest
import torch

from diffusers_ext.cli import main
from diffusers_ext.utils import check_positive_int, is_number


def test_diffusion_lm_refuses_more_positions_than_the_model_has():
    from diffusers_ext import DiffusionLMPipeline, zoo

    pipe = DiffusionLMPipeline.from_pretrained(zoo.path("addition-mdm"))
    pipe.set_progress_bar_config(disable=True)
    limit = pipe.model.config.max_position_embeddings  # 17
    prompt = "<|bos|>12+34="
    prompt_tokens = len(pipe.tokenizer(prompt, add_special_tokens=False).input_ids)
    with pytest.raises(ValueError, match=rf"plus `gen_length` {limit} need .* the model has {limit} "):
        pipe(prompt=prompt, gen_length=limit, eos_early_stop=False)
    with pytest.raises(ValueError, match="`max_position_embeddings` in its config"):
        pipe(prompt=prompt * 50, gen_length=4, eos_early_stop=False)
    fits = limit - prompt_tokens
    out = pipe(prompt=prompt, gen_length=fits, block_length=fits, output_type="seq", eos_early_stop=False)
    assert out.sequences.shape == (1, fits)  # exactly the model's positions still work


def test_nan_is_not_a_number_for_range_checks():
    assert not is_number(float("nan")) and is_number(1.5) and is_number(float("inf")) and not is_number(True)


def test_check_positive_int_names_the_argument_the_value_and_what_was_expected():
    check_positive_int("steps", 3)
    check_positive_int("index", 0, minimum=0)
    check_positive_int("rank", None, optional=True)
    for value in (0, 2.0, True, None, "3"):
        with pytest.raises(ValueError, match=f"`steps` must be a positive int, got {value!r}\\."):
            check_positive_int("steps", value)
    with pytest.raises(ValueError, match="`index` must be an int >= 0, got -1"):
        check_positive_int("index", -1, minimum=0)
    with pytest.raises(ValueError, match="`rank` must be a positive int or None, got 0"):
        check_positive_int("rank", 0, optional=True)
    with pytest.raises(TypeError, match="`n` must be a positive int \\(the support size\\), got 0"):
        check_positive_int("n", 0, error=TypeError, expected="a positive int (the support size)")


def test_nan_guidance_scale_is_refused():
    from diffusers import DDIMScheduler

    from diffusers_ext import ClassConditionalDDPMPipeline, DiffusionLMPipeline
    from diffusers_ext.testing import get_tiny_pixel_unet
    from diffusers_ext.testing.dummies.diffusion_lm import get_components, get_inputs

    pipe = ClassConditionalDDPMPipeline(get_tiny_pixel_unet(seed=0, num_class_embeds=11), DDIMScheduler(), 10)
    with pytest.raises((TypeError, ValueError), match="guidance_scale"):
        pipe(class_labels=[1], num_inference_steps=2, guidance_scale=float("nan"), output_type="np")
    lm = DiffusionLMPipeline(**get_components())
    with pytest.raises(ValueError, match="`guidance_scale` must be a number >= 1"):
        lm(**{**get_inputs(), "guidance_scale": float("nan")})
    with pytest.raises(ValueError, match="`temperature` must be a number >= 0"):
        lm(**{**get_inputs(), "temperature": float("nan")})


@pytest.mark.parametrize("measure", ["prob", "margin"])
def test_negative_confidence_threshold_is_refused(measure):
    from diffusers_ext import SOARScheduler

    with pytest.raises(ValueError, match=r"`confidence_threshold`=-0.1 is below every value"):
        SOARScheduler(confidence_threshold=-0.1, confidence_measure=measure)
    SOARScheduler(confidence_threshold=0.0, confidence_measure=measure)
    SOARScheduler(confidence_threshold=-0.5, confidence_measure="neg_entropy")  # negative entropies are negative


def test_checkpoints_total_limit_zero_is_refused(tmp_path, capsys):
    from diffusers_ext.training_utils import add_accelerate_arguments, save_checkpoint

    parser = argparse.ArgumentParser()
    add_accelerate_arguments(parser)
    assert parser.parse_args(["--checkpoints_total_limit", "2"]).checkpoints_total_limit == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--checkpoints_total_limit", "0"])
    assert "argument --checkpoints_total_limit: expected a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="`total_limit` must be None"):
        save_checkpoint(None, str(tmp_path), 1, total_limit=0)


def test_non_json_model_index_names_the_file(tmp_path):
    from diffusers_ext import load_pipeline

    (tmp_path / "model_index.json").write_text('{"_class_name": "DDPMPipeline",\n oops}')
    with pytest.raises(ValueError, match=r"model_index\.json is not valid JSON \(.* at line 2, column 2\)"):
        load_pipeline(str(tmp_path))
    (tmp_path / "model_index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="has no `_class_name` string"):
        load_pipeline(str(tmp_path))


# ------------------------------------------------------------------------------------------------ diffusers-ext purify

PURIFY_FAST = ["--num_iterations", "1", "--num_inversion_steps", "1"]


def _png(path, size, mode):
    import PIL.Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(0)
    shape = (size, size) if mode == "L" else (size, size, 3)
    PIL.Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode).save(path)
    return str(path)


def _purify_error(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(["purify", *args])
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_purify_refuses_channels_and_size_the_model_does_not_take(tmp_path, capsys):
    rgb = _png(tmp_path / "in" / "photo.png", 64, "RGB")
    out = tmp_path / "out"
    last = _purify_error(capsys, rgb, "--out", str(out))
    assert "is RGB (3 channels)" in last and "takes 1-channel (L) images; pass --convert" in last, last
    grey = _png(tmp_path / "grey" / "big.png", 64, "L")
    last = _purify_error(capsys, grey, "--out", str(out))
    assert "is 64x64, but 'digits-ddpm' works at 8x8; pass --resolution 8" in last, last
    assert not out.exists()
    # explicit options: converted and resized, and the command says so
    assert main(["purify", rgb, "--out", str(out), "--convert", "--resolution", "8", *PURIFY_FAST]) == 0
    printed = capsys.readouterr().out
    assert "converted RGB -> L (--convert)" in printed and "resized 64x64 -> 8x8" in printed
    assert sorted(os.listdir(out)) == ["photo.png", "purification.json"]


def test_purify_keeps_outputs_that_share_a_basename(tmp_path, capsys):
    a = _png(tmp_path / "a" / "x.png", 8, "L")
    b = _png(tmp_path / "b" / "x.png", 8, "L")
    c = _png(tmp_path / "b" / "x.bmp", 8, "L")
    out = tmp_path / "out"
    assert main(["purify", a, str(tmp_path / "b"), "--out", str(out), *PURIFY_FAST]) == 0
    assert sorted(os.listdir(out)) == ["purification.json", "x-2.png", "x-3.png", "x.png"]
    report = json.loads((out / "purification.json").read_text())
    assert {name: v["source"] for name, v in report["images"].items()} == {
        "x.png": a,
        "x-2.png": c,  # a folder's images are taken in name order: x.bmp before x.png
        "x-3.png": b,
    }
    assert "written as x-2.png" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-8"])
def test_purify_refuses_a_non_positive_resolution(tmp_path, capsys, value):
    grey = _png(tmp_path / "in" / "d.png", 8, "L")
    last = _purify_error(capsys, grey, "--out", str(tmp_path / "out"), "--resolution", value)
    assert "argument --resolution: expected a positive integer" in last, last


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA device")
def test_unavailable_device_is_a_one_line_error(tmp_path, capsys):
    grey = _png(tmp_path / "in" / "d.png", 8, "L")
    last = _purify_error(capsys, grey, "--out", str(tmp_path / "out"), "--device", "cuda")
    assert "--device 'cuda'" in last and "sees no CUDA device here; use --device cpu" in last, last
    last = _purify_error(capsys, grey, "--out", str(tmp_path / "out"), "--device", "gpu0")
    assert "--device 'gpu0' is not a torch device name" in last, last
    with pytest.raises(SystemExit):
        main(["demo", "--quick", "--output_dir", str(tmp_path / "demo"), "--device", "cuda"])
    assert "sees no CUDA device" in capsys.readouterr().err
