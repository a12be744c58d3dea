"""The manifold-flow training script: a loadable result on the subspace, exact resume, a user's .npy with a learned
subspace and the noise estimate, the two-process launch, argument errors."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, as_command_line, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_manifold_flow.py")
TINY = [
    "--ambient_dim", "10", "--num_train_samples", "64", "--num_tokens", "2", "--hidden_size", "8", "--num_layers",
    "1", "--train_batch_size", "16", "--eval_inference_steps", "3", "--checkpointing_steps", "2", "--report_to",
    "none", "--seed", "3", "--logging_steps", "1",
]  # fmt: skip


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_manifold_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_in_process(output_dir, steps, *extra):
    argv = ["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra]
    with as_command_line(SCRIPT, argv):
        _module().main(argv)


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def test_run_resume_and_load(tmp_path):
    torch.set_num_threads(1)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_in_process(
        straight, 6, "--validation_steps", "5", "--num_validation_images", "8", "--checkpoints_total_limit", "3"
    )
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    _run_in_process(resumed, 6, "--resume_from_checkpoint", "latest")
    a, b = _weights(straight), _weights(resumed)
    assert set(a) == set(b) and "subspace" in a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    early = load_file(os.path.join(straight, "checkpoint-2", "model.safetensors"))
    assert any(not torch.equal(early[k], a[k]) for k in early if k.startswith("tangent_head"))
    assert torch.equal(early["subspace"], a["subspace"])  # fitted once, not trained

    from diffusers_ext import ManifoldFlowPipeline, load_pipeline
    from diffusers_ext.data.manifolds import make_manifold

    truth = make_manifold("ring_mixture", 10, seed=0).basis.float()
    for pipe in (ManifoldFlowPipeline.from_pretrained(str(straight)), load_pipeline(str(straight))):
        pipe.set_progress_bar_config(disable=True)
        out = pipe(batch_size=5, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
        assert out.samples.shape == (5, 10)
        on_truth = out.samples @ truth @ truth.T
        assert (out.samples - on_truth).norm(dim=-1).max() < 1e-4  # on the data's subspace, which PCA recovered
    assert (straight / "validation" / "step-5.txt").is_file() and (straight / "validation" / "step-6.txt").is_file()
    metrics = json.loads((straight / "training_metrics.json").read_text())
    assert metrics["pca_explained_fraction"] > 1 - 1e-6
    assert "train_manifold_flow.py" in (straight / "README.md").read_text()


def test_a_users_npy_with_a_learned_subspace_and_the_noise_estimate(tmp_path):
    torch.set_num_threads(1)
    from diffusers_ext.data.manifolds import make_manifold

    points = make_manifold("swiss_roll", 7, noise_std=0.05, seed=1).sample(200, 0).numpy()
    np.save(tmp_path / "cloud.npy", points.astype(np.float32))
    out = tmp_path / "out"
    extra = ["--train_data_file", str(tmp_path / "cloud.npy"), "--latent_dim", "3", "--learn_subspace"]
    _run_in_process(out, 4, *extra, "--estimate_noise")
    from diffusers_ext import ManifoldFlowPipeline

    pipe = ManifoldFlowPipeline.from_pretrained(str(out))
    model = pipe.model
    assert model.config.ambient_dim == 7 and model.config.latent_dim == 3 and model.config.learn_subspace
    assert 0.03 < model.config.orthogonal_noise_std < 0.07
    start = load_file(os.path.join(out, "checkpoint-2", "model.safetensors"))["subspace"]
    assert not torch.equal(start, _weights(out)["subspace"])  # the subspace trains
    with pytest.raises(ValueError, match="point cloud"):
        np.save(tmp_path / "bad.npy", np.zeros(5))
        _run_in_process(tmp_path / "bad", 2, "--train_data_file", str(tmp_path / "bad.npy"))
    with pytest.raises(ValueError, match="--latent_dim 7"):
        _run_in_process(tmp_path / "wide", 2, "--train_data_file", str(tmp_path / "cloud.npy"), "--latent_dim", "7")


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}

    def launch(output_dir, steps, *extra):
        cmd = [*accelerate_cpu_launch(), SCRIPT, "--output_dir", str(output_dir), "--max_train_steps", str(steps)]
        result = subprocess.run([*cmd, *TINY, *extra], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout + result.stderr

    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    assert_world_size(launch(resumed, 2), resumed / "checkpoint-2")
    log = launch(resumed, 4, "--resume_from_checkpoint", "latest")
    assert "Resuming from" in log
    launch(straight, 4)
    a, b = _weights(resumed), _weights(straight)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ambient_dim", "2"], "--ambient_dim"),
        (["--hidden_size", "9"], "--hidden_size"),
        (["--noise_std", "-1"], "--noise_std"),
        (["--train_data_file", "missing.npy"], "--train_data_file"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        _run_in_process(tmp_path, 2, *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
