"""The SD3-format text-to-image script on mosaic: a loadable StableDiffusion3Pipeline on a given autoencoder, exact
resume, errors before any work."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_text_to_image_sd3.py")
TINY = [
    "--num_train_samples",
    "24",
    "--num_layers",
    "1",
    "--attention_head_dim",
    "8",
    "--num_attention_heads",
    "2",
    "--text_hidden_size",
    "16",
    "--text_layers",
    "1",
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


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    """A tiny 32 px -> 8x8x4 `AutoencoderKL` folder (the script reads any trained one)."""
    from diffusers_ext.data.mosaic import mosaic_tokenizer
    from diffusers_ext.models.stable_diffusion_components import build_stable_diffusion_components

    torch.manual_seed(0)
    vae, _, _ = build_stable_diffusion_components(mosaic_tokenizer(16), resolution=32, vae_channels=(8, 8, 8))
    path = tmp_path_factory.mktemp("vae")
    vae.save_pretrained(path)
    return str(path)


def _run(output_dir, vae_folder, steps, *extra, expect=0):
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(output_dir),
        "--pretrained_vae_model_name_or_path",
        vae_folder,
        "--max_train_steps",
        str(steps),
        *TINY,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == expect, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_trains_saves_and_loads_as_a_stable_diffusion_3_pipeline(tmp_path, vae_folder):
    out = tmp_path / "out"
    _run(out, vae_folder, 2, "--eval_num_prompts", "2", "--eval_inference_steps", "2", "--save_dtype", "float16")
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(str(out), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    # SD3's latent normalisation, computed from the data, not the autoencoder's defaults
    assert pipe.vae.config.shift_factor not in (None, 0.0) and pipe.vae.config.scaling_factor != 0.18215
    images = pipe(
        ["a red circle", "three blue squares"],
        height=32,
        width=32,
        num_inference_steps=2,
        max_sequence_length=8,
        output_type="np",
    ).images
    assert images.shape == (2, 32, 32, 3)
    card = (out / "README.md").read_text()
    assert "train_text_to_image_sd3.py" in card and "judge_overall" in card and "max_sequence_length=8" in card
    weights = load_file(str(out / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert next(iter(weights.values())).dtype == torch.float16
    # the text encoders stayed at their seeded initialisation (the script seeds the global RNG with --seed 3)
    from diffusers_ext.data.mosaic import mosaic_tokenizer
    from diffusers_ext.models.stable_diffusion_components import build_stable_diffusion_3_components

    torch.manual_seed(3)
    fresh = build_stable_diffusion_3_components(
        mosaic_tokenizer(16),
        sample_size=8,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        text_hidden_size=16,
        text_layers=1,
    )[2]
    saved = load_file(str(out / "text_encoder_3" / "model.safetensors"))
    shared = [k for k in fresh.state_dict() if k in saved]
    assert len(shared) == len(saved)
    assert all(torch.equal(saved[k].float(), fresh.state_dict()[k].half().float()) for k in shared)


@pytest.mark.slow
def test_resume_is_exact(tmp_path, vae_folder):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _run(resumed, vae_folder, 4)
    (resumed / "checkpoint-4").rename(resumed / "unused")
    log = _run(resumed, vae_folder, 4, "--resume_from_checkpoint", "latest")
    assert "checkpoint-2" in log
    _run(straight, vae_folder, 4)
    name = "diffusion_pytorch_model.safetensors"
    a = load_file(str(resumed / "transformer" / name))
    b = load_file(str(straight / "transformer" / name))
    early = load_file(str(resumed / "checkpoint-2" / "model.safetensors"))
    assert any(not torch.equal(early[k], a[k]) for k in a)  # the run moved the transformer after step 2
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pretrained_vae_model_name_or_path", "/nonexistent/vae"], "--pretrained_vae_model_name_or_path"),
        (["--resolution", "30"], "--resolution"),
        (["--prompt_dropout", "1.0"], "--prompt_dropout"),
        (["--max_sequence_length", "0"], "--max_sequence_length"),
    ],
)
def test_bad_arguments_are_rejected_by_the_parser(tmp_path, capsys, vae_folder, args, message):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_text_to_image_sd3", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as error:
        script.parse_args(["--output_dir", str(tmp_path), "--pretrained_vae_model_name_or_path", vae_folder, *args])
    assert error.value.code == 2 and message in capsys.readouterr().err


def test_warm_start_keeps_the_autoencoder_text_encoders_and_latent_scale_and_trains_the_transformer(
    tmp_path, vae_folder
):
    base, warm = tmp_path / "base", tmp_path / "warm"
    _run(base, vae_folder, 2)
    command = [sys.executable, SCRIPT, "--output_dir", str(warm), "--pretrained_model_name_or_path", str(base)]
    # No model options: a warm start takes the transformer and encoders from the folder (the defaults would not fit).
    command += [
        "--max_train_steps",
        "2",
        "--num_train_samples",
        "24",
        "--train_batch_size",
        "4",
        "--report_to",
        "none",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for part, name in [
        ("vae", "diffusion_pytorch_model.safetensors"),
        ("text_encoder", "model.safetensors"),
        ("text_encoder_3", "model.safetensors"),
    ]:
        before, after = load_file(str(base / part / name)), load_file(str(warm / part / name))
        assert all(torch.equal(before[k], after[k]) for k in before), part
    name = "transformer/diffusion_pytorch_model.safetensors"
    before, after = load_file(str(base / name)), load_file(str(warm / name))
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    from diffusers import AutoencoderKL

    configs = [AutoencoderKL.load_config(str(folder / "vae")) for folder in (base, warm)]
    assert [c["shift_factor"] for c in configs] == [configs[0]["shift_factor"]] * 2
    assert [c["scaling_factor"] for c in configs] == [configs[0]["scaling_factor"]] * 2
    assert f"continued from `{base}`" in (warm / "README.md").read_text()
    for part in ("vae", "transformer", "text_encoder", "text_encoder_3"):  # no path of the starting folder saved
        assert str(base) not in (warm / part / "config.json").read_text(), part


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--pretrained_model_name_or_path", "/nonexistent/pipe"], "exactly one of"),
        (["--max_length", "12"], "--max_length must be the pretrained text encoders' 16"),
    ],
)
def test_warm_start_rejects_two_sources_and_a_mismatched_tokenizer(tmp_path, capsys, vae_folder, extra, message):
    import importlib.util

    base = tmp_path / "base"
    for part in ("vae", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3"):
        (base / part).mkdir(parents=True)
    (base / "text_encoder" / "config.json").write_text('{"max_position_embeddings": 16}')
    spec = importlib.util.spec_from_file_location("train_text_to_image_sd3", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    source = ["--pretrained_vae_model_name_or_path", vae_folder] if "exactly one of" in message else []
    source += [] if "exactly one of" in message else ["--pretrained_model_name_or_path", str(base)]
    with pytest.raises(SystemExit) as error:
        script.parse_args(["--output_dir", str(tmp_path / "out"), *source, *extra])
    assert error.value.code == 2 and message in capsys.readouterr().err
