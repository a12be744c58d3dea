"""The SemanticNVS and semantic-encoder training scripts: tiny runs that save loadable results, and bad arguments."""

import os
import subprocess
import sys

import pytest
import torch


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVS = os.path.join(REPO, "training", "train_semantic_nvs.py")
ENCODER = os.path.join(REPO, "training", "train_semantic_encoder.py")
TINY = ["--resolution", "8", "--block_out_channels", "8", "16", "--train_batch_size", "2", "--max_train_steps", "2",
        "--checkpointing_steps", "1", "--report_to", "none"]  # fmt: skip


def _run(script, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=600)


def test_encoder_then_nvs_training_give_a_working_pipeline(tmp_path):
    encoder_dir, nvs_dir = tmp_path / "encoder", tmp_path / "nvs"
    result = _run(ENCODER, "--output_dir", str(encoder_dir), "--resolution", "8", "--train_batch_size", "2",
                  "--max_train_steps", "2", "--num_hidden_layers", "1", "--report_to", "none")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heldout_patch_accuracy" in (encoder_dir / "README.md").read_text()
    result = _run(NVS, "--output_dir", str(nvs_dir), "--semantic_encoder", str(encoder_dir), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (nvs_dir / "checkpoint-2").is_dir() and not (nvs_dir / "checkpoint-1").exists()
    # the paper's surrogate (blurred clean targets) stays available
    blur_dir = tmp_path / "nvs-blur"
    result = _run(NVS, "--output_dir", str(blur_dir), "--semantic_encoder", str(encoder_dir), *TINY,
                  "--iterative_surrogate", "blur")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--iterative_surrogate blur" in (blur_dir / "README.md").read_text()

    from diffusers_ext import SemanticNVSPipeline
    from diffusers_ext.data.procedural_scenes import sample_scene_batch

    pipe = SemanticNVSPipeline.from_pretrained(nvs_dir)
    pipe.set_progress_bar_config(disable=True)
    scenes = sample_scene_batch(torch.Generator().manual_seed(0), 1, 2, 8)
    out = pipe(images=scenes["images"][:, :1], input_intrinsics=scenes["intrinsics"][:, :1],
               input_c2w=scenes["c2w"][:, :1], target_intrinsics=scenes["intrinsics"][:, 1:],
               target_c2w=scenes["c2w"][:, 1:], depths=scenes["depths"][:, :1], num_inference_steps=2,
               output_type="np")  # fmt: skip
    assert out.images.shape == (1, 1, 8, 8, 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no_semantics", "--semantic_encoder", "x"], "exactly one"),
        (["--semantic_encoder", "/nonexistent/encoder"], "--semantic_encoder"),
        (["--no_semantics", "--num_views", "1"], "--num_views"),
        (["--no_semantics", "--resolution", "9"], "--resolution 9"),
        (["--no_semantics", "--self_cond_prob", "1.5"], "--self_cond_prob must be in [0, 1], got 1.5"),
        (["--no_semantics", "--iterative_surrogate", "noise"], "--iterative_surrogate"),
    ],
)
def test_bad_arguments(tmp_path, args, message):
    result = _run(NVS, "--output_dir", str(tmp_path), *args)
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1]
