"""The latent text-to-image script on mosaic: exact resume across its two phases, a loadable SD pipeline, errors."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_text_to_image_from_scratch.py")
TINY = [
    "--num_train_samples",
    "24",
    "--vae_channels",
    "8",
    "8",
    "8",
    "--unet_channels",
    "8",
    "16",
    "--attention_head_dim",
    "4",
    "--text_hidden_size",
    "16",
    "--train_batch_size",
    "4",
    "--lr_warmup_steps",
    "1",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(output_dir, vae_steps, unet_steps, *extra, processes=1):
    script = [
        SCRIPT,
        "--output_dir",
        str(output_dir),
        "--vae_steps",
        str(vae_steps),
        "--max_train_steps",
        str(unet_steps),
        *TINY,
        *extra,
    ]
    if processes == 1:
        cmd = [sys.executable, *script]
    else:
        cmd = [
            *accelerate_cpu_launch(processes),
            *script,
        ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.two_process
def test_trains_saves_and_loads_as_a_stable_diffusion_pipeline(tmp_path):
    out = tmp_path / "out"
    validation = ["--validation_prompt", "a red circle", "--num_validation_images", "2", "--validation_steps", "3"]
    _run(
        out,
        2,
        2,
        "--eval_num_prompts",
        "2",
        "--eval_steps",
        "2",
        "--save_dtype",
        "float16",
        *validation,
        "--report_to",
        "tensorboard",
    )
    # Validation (diffusers' flags): every 3 steps in the UNet phase and after the last one, as files and events.
    from test_training_utils import _tensorboard_events

    assert sorted(os.listdir(out / "validation")) == ["step-3", "step-4"]
    assert sorted(os.listdir(out / "validation" / "step-4")) == ["00-a_red_circle.png", "01-a_red_circle.png"]
    events = _tensorboard_events(out / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [3, 4]
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(out), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.unet.dtype == torch.float32 and pipe.vae.config.scaling_factor != 0.18215
    images = pipe(
        ["a red circle", "three blue squares"], height=32, width=32, num_inference_steps=2, output_type="np"
    ).images
    assert images.shape == (2, 32, 32, 3)
    assert pipe.tokenizer("a red circle").input_ids[0] == pipe.tokenizer.bos_token_id
    card = (out / "README.md").read_text()
    assert "train_text_to_image_from_scratch.py" in card and "judge_overall" in card and "float16" in card
    weights = load_file(str(out / "unet" / "diffusion_pytorch_model.safetensors"))
    assert next(iter(weights.values())).dtype == torch.float16


def test_warm_start_keeps_the_autoencoder_and_its_latent_scale_and_trains_the_unet(tmp_path):
    base, warm = tmp_path / "base", tmp_path / "warm"
    _run(base, 2, 2)
    command = [sys.executable, SCRIPT, "--output_dir", str(warm), "--pretrained_model_name_or_path", str(base)]
    # No --vae_steps: a warm start skips the autoencoder phase; the tiny model options are ignored (from the folder).
    tiny = TINY[:2] + TINY[TINY.index("--train_batch_size") :]
    result = subprocess.run(
        [*command, "--max_train_steps", "2", *tiny], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0 VAE + 2 UNet steps" in result.stdout + result.stderr
    for part, name, changed in (
        ("vae", "diffusion_pytorch_model.safetensors", False),
        ("unet", "diffusion_pytorch_model.safetensors", True),
    ):
        before, after = load_file(str(base / part / name)), load_file(str(warm / part / name))
        assert before.keys() == after.keys()
        differs = any(not torch.equal(before[key], after[key]) for key in before)
        assert differs == changed, part
    from diffusers import AutoencoderKL

    scale = [AutoencoderKL.load_config(str(folder / "vae"))["scaling_factor"] for folder in (base, warm)]
    assert scale[0] == scale[1]
    assert f"continued from `{base}`" in (warm / "README.md").read_text()
    for part in ("vae", "unet"):  # the saved configs do not name the folder the run started from
        assert str(base) not in (warm / part / "config.json").read_text(), part


@pytest.mark.parametrize(
    "args, message",
    [(["--vae_steps", "3"], "--vae_steps must be 0"), (["--max_length", "8"], "--max_length")],
)
def test_warm_start_rejects_an_autoencoder_phase_and_a_mismatched_tokenizer(tmp_path, capsys, args, message):
    base = tmp_path / "base"
    for part in ("vae", "unet", "text_encoder"):
        (base / part).mkdir(parents=True)
    (base / "text_encoder" / "config.json").write_text('{"max_position_embeddings": 16}')
    script = _load_script()
    with pytest.raises(SystemExit) as error:
        script.parse_args(["--output_dir", str(tmp_path / "out"), "--pretrained_model_name_or_path", str(base), *args])
    assert error.value.code == 2 and message in capsys.readouterr().err


def test_warm_start_names_a_folder_that_is_not_a_pipeline(tmp_path, capsys):
    script = _load_script()
    with pytest.raises(SystemExit):
        script.parse_args(["--output_dir", str(tmp_path / "out"), "--pretrained_model_name_or_path", str(tmp_path)])
    err = capsys.readouterr().err
    assert "--pretrained_model_name_or_path" in err and "missing ['vae', 'unet', 'text_encoder']" in err


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_across_phases_equals_an_uninterrupted_run(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _run(resumed, 2, 3, processes=2)  # checkpoints at 2 (end of the VAE phase) and 4 (inside the UNet phase)
    assert_world_size(log, resumed / "checkpoint-4")
    (resumed / "checkpoint-5").rename(resumed / "unused")  # resume from step 4, mid phase 2
    log = _run(resumed, 2, 3, "--resume_from_checkpoint", "latest", processes=2)
    assert "checkpoint-4" in log
    _run(straight, 2, 3, processes=2)
    for part in ("unet", "vae", "text_encoder"):
        name = "model.safetensors" if part == "text_encoder" else "diffusion_pytorch_model.safetensors"
        a, b = load_file(str(resumed / part / name)), load_file(str(straight / part / name))
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{part}.{key} differs after resume")


@pytest.mark.slow
def test_resume_in_the_vae_phase_is_exact(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _run(resumed, 3, 1)
    for name in ("checkpoint-4",):
        (resumed / name).rename(resumed / f"x-{name}")
    log = _run(resumed, 3, 1, "--resume_from_checkpoint", "latest")
    assert "checkpoint-2" in log
    _run(straight, 3, 1)
    a = load_file(str(resumed / "unet" / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(straight / "unet" / "diffusion_pytorch_model.safetensors"))
    early = load_file(str(resumed / "checkpoint-2" / "model_1.safetensors"))
    assert any(not torch.equal(early[f"unet.{k}"], a[k]) for k in a)  # the run did move the UNet after step 2
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_text_to_image_from_scratch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train_data_dir", "/nonexistent/folder"], "--train_data_dir"),
        (["--resolution", "30"], "--resolution"),
        (["--vae_channels", "8", "8"], "--vae_channels"),
        (["--unet_channels", "8", "8", "8", "8", "8"], "--unet_channels"),
        (["--prompt_dropout", "1.0"], "--prompt_dropout"),
        (["--unet_down_block_types", "DownBlock2D"], "--unet_down_block_types"),
        (["--unet_down_block_types", "UpBlock2D", "DownBlock2D"], "--unet_down_block_types"),
    ],
)
def test_bad_arguments_are_rejected_by_the_parser(tmp_path, capsys, args, message):
    script = _load_script()
    with pytest.raises(SystemExit) as error:
        script.parse_args(["--output_dir", str(tmp_path), *args])
    assert error.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--max_length", "5"], "--max_length"),
        (["--resume_from_checkpoint", "checkpoint-999"], "--resume_from_checkpoint"),
    ],
)
def test_bad_runs_fail_with_one_line_error(tmp_path, args, message):
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(tmp_path),
        "--report_to",
        "none",
        "--num_train_samples",
        "4",
        "--vae_steps",
        "1",
        "--max_train_steps",
        "1",
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert message in last and "error" in last
    assert "Traceback" not in result.stderr


def test_unet_down_block_types_drop_attention_where_asked_and_the_up_path_mirrors_them():
    from diffusers_ext.data.mosaic import mosaic_tokenizer
    from diffusers_ext.models.stable_diffusion_components import build_stable_diffusion_components

    tokenizer = mosaic_tokenizer(8)
    kwargs = {
        "resolution": 32,
        "vae_channels": (8, 8, 8),
        "unet_channels": (8, 16, 16),
        "attention_head_dim": 4,
        "text_hidden_size": 8,
        "max_length": 8,
    }
    _, _, unet = build_stable_diffusion_components(
        tokenizer, unet_down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"), **kwargs
    )
    assert unet.config.up_block_types == ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    assert not hasattr(unet.down_blocks[0], "attentions") and len(unet.down_blocks[1].attentions) == 1
    with pytest.raises(ValueError, match="unet_down_block_types.*3 levels"):
        build_stable_diffusion_components(tokenizer, unet_down_block_types=("DownBlock2D",), **kwargs)
