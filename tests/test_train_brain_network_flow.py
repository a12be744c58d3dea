"""The brain-network flow training script: a loadable pipeline of valid matrices, exact resume, a user's folder
(correlation and SPD), the pack's world on the real HCP group mean, and bad folders named before training."""

import importlib.util
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, as_command_line, assert_world_size

from diffusers_ext.data.brain_networks import is_brainspace_available, to_correlation


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_brain_network_flow.py")
TINY = [
    "--hidden_size", "16", "--num_layers", "1", "--train_batch_size", "8", "--eval_inference_steps", "3",
    "--checkpointing_steps", "2", "--report_to", "none", "--seed", "3", "--logging_steps", "1",
]  # fmt: skip


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_brain_network_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_in_process(output_dir, steps, *extra):
    argv = ["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra]
    with as_command_line(SCRIPT, argv):
        _module().main(argv)


def _folder(path, spd=False, n=5, count=16):
    generator = torch.Generator().manual_seed(0)
    series = torch.randn(count, 4 * n, n, generator=generator, dtype=torch.float64)
    covariance = series.transpose(1, 2) @ series / (4 * n)
    matrices = covariance if spd else to_correlation(covariance)
    os.makedirs(path, exist_ok=True)
    np.save(os.path.join(path, "matrices.npy"), matrices.numpy())
    ages = torch.rand(count, generator=generator).tolist()
    rows = ["age,sex"] + [f"{a:.3f},{i % 2}" for i, a in enumerate(ages)]
    with open(os.path.join(path, "covariates.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    return matrices


def test_run_resume_and_load_a_users_folder(tmp_path):
    torch.set_num_threads(1)
    data = tmp_path / "data"
    _folder(data)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ["--train_data_dir", str(data)]
    _run_in_process(
        straight,
        6,
        *common,
        "--validation_steps",
        "5",
        "--num_validation_images",
        "4",
        "--checkpoints_total_limit",
        "3",
    )
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    _run_in_process(resumed, 6, *common, "--resume_from_checkpoint", "latest")
    weights = [load_file(os.path.join(f, "model", "diffusion_pytorch_model.safetensors")) for f in (straight, resumed)]
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0, msg=f"{name} after resume")
    from diffusers_ext import BrainNetworkFlowPipeline

    pipe = BrainNetworkFlowPipeline.from_pretrained(str(straight))
    pipe.set_progress_bar_config(disable=True)
    out = pipe([[0.2, 0.0], [0.8, 1.0]], num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    matrices = out.matrices
    assert matrices.shape == (2, 5, 5) and torch.linalg.eigvalsh(matrices).min() > 0
    torch.testing.assert_close(torch.diagonal(matrices, dim1=1, dim2=2), torch.ones(2, 5, dtype=torch.float64))
    assert (straight / "validation" / "step-5.txt").is_file()
    metrics = json.loads((straight / "training_metrics.json").read_text())
    assert metrics["covariates"] == ["age", "sex"] and metrics["num_features"] == 10
    assert "train_brain_network_flow.py" in (straight / "README.md").read_text()


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    data = tmp_path / "data"
    _folder(data)

    def launch(output_dir, steps, *extra):
        cmd = [*accelerate_cpu_launch(), SCRIPT, "--output_dir", str(output_dir), "--max_train_steps", str(steps)]
        cmd += ["--train_data_dir", str(data), *TINY, *extra]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout + result.stderr

    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    assert_world_size(launch(resumed, 2), resumed / "checkpoint-2")
    assert "Resuming from" in launch(resumed, 4, "--resume_from_checkpoint", "latest")
    launch(straight, 4)
    weights = [load_file(os.path.join(f, "model", "diffusion_pytorch_model.safetensors")) for f in (resumed, straight)]
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0, msg=f"{name} after resume")


def test_spd_matrices_with_the_log_cholesky_map(tmp_path):
    torch.set_num_threads(1)
    _folder(tmp_path / "data", spd=True)
    _run_in_process(
        tmp_path / "out", 2, "--train_data_dir", str(tmp_path / "data"), "--matrix_type", "spd", "--spd_map",
        "log_cholesky",
    )  # fmt: skip
    from diffusers_ext import BrainNetworkFlowPipeline, SPDMatrixCodec

    pipe = BrainNetworkFlowPipeline.from_pretrained(str(tmp_path / "out"))
    assert isinstance(pipe.codec, SPDMatrixCodec) and pipe.codec.config.map == "log_cholesky"
    pipe.set_progress_bar_config(disable=True)
    matrices = pipe([[0.5, 1.0]], num_inference_steps=2).matrices
    assert torch.linalg.eigvalsh(matrices).min() > 0


@pytest.mark.skipif(not is_brainspace_available(), reason="the brainspace wheel is not installed")
def test_the_world_on_the_hcp_group_mean(tmp_path):
    torch.set_num_threads(1)
    _run_in_process(tmp_path / "out", 2, "--num_train_subjects", "8")
    from diffusers_ext import BrainNetworkFlowPipeline

    pipe = BrainNetworkFlowPipeline.from_pretrained(str(tmp_path / "out"))
    assert pipe.codec.num_features == 4950 and pipe.model.config.num_covariates == 2


@pytest.mark.skipif(
    not is_brainspace_available() or importlib.util.find_spec("nibabel") is None,
    reason="the brainspace wheel or nibabel is not installed",
)
def test_the_sliding_window_trajectory_of_the_real_run(tmp_path):
    torch.set_num_threads(1)
    _run_in_process(
        tmp_path / "out", 2, "--dataset_name", "sliding_window", "--num_regions", "10", "--window_step", "20"
    )
    from diffusers_ext import BrainNetworkFlowPipeline

    pipe = BrainNetworkFlowPipeline.from_pretrained(str(tmp_path / "out"))
    assert pipe.codec.num_features == 45 and pipe.model.config.num_covariates == 1
    with open(tmp_path / "out" / "training_metrics.json") as f:
        assert json.load(f)["covariates"] == ["time"]
    assert "ONE subject" in (tmp_path / "out" / "README.md").read_text()
    pipe.set_progress_bar_config(disable=True)
    matrices = pipe([[0.25], [0.75]], num_inference_steps=2).matrices
    assert matrices.shape == (2, 10, 10) and torch.linalg.eigvalsh(matrices).min() > 0


def test_bad_folders_are_named_before_training(tmp_path):
    module = _module()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="must hold matrices.npy"):
        _run_in_process(tmp_path / "a", 2, "--train_data_dir", str(empty))
    bad = tmp_path / "bad"
    matrices = _folder(bad)
    matrices[3, 0, 0] = 2.0
    np.save(bad / "matrices.npy", matrices.numpy())
    with pytest.raises(ValueError, match=r"`matrices\[3\]` does not have a unit diagonal"):
        _run_in_process(tmp_path / "b", 2, "--train_data_dir", str(bad))
    short = tmp_path / "short"
    _folder(short)
    (short / "covariates.csv").write_text("age,sex\n0.1,0\n")
    with pytest.raises(ValueError, match="has 1 rows but matrices.npy holds 16 matrices"):
        _run_in_process(tmp_path / "c", 2, "--train_data_dir", str(short))
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").glob("checkpoint-*"))
    with pytest.raises(SystemExit):
        module.parse_args(["--output_dir", str(tmp_path / "d"), "--train_data_dir", str(tmp_path / "missing")])
