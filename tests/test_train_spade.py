"""training/train_spade.py: argument errors, a tiny run (built-in task and the user's own .npz) that saves a folder
the pipelines load, and exact resume under a two-process accelerate launch."""

import importlib.util
import os
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, as_command_line, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_spade.py")
TINY = [
    "--hidden_size", "8", "--time_embed_dim", "8", "--offline_size", "64", "--train_batch_size", "8",
    "--calibration_num_inference_steps", "2", "--support_k", "3", "--checkpointing_steps", "2", "--disable_tqdm",
    "true", "--seed", "3",
]  # fmt: skip


def _script_module():
    spec = importlib.util.spec_from_file_location("train_spade", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "gfp"], "--task"),
        (["--data_file", "missing.npz"], "--data_file"),
        (["--time_embed_dim", "7"], "--time_embed_dim"),
        (["--offline_size", "1"], "--offline_size"),
    ],
)
def test_bad_arguments_fail_before_any_work(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        _script_module().parse_args(["--output_dir", str(tmp_path), *args])


def test_tiny_run_saves_a_folder_the_pipelines_load(tmp_path):
    from diffusers_ext.pipelines.spade.pipeline_offline_optimization import OfflineOptimizationPipeline
    from diffusers_ext.pipelines.spade.pipeline_surrogate_predictive import SurrogatePredictivePipeline
    from diffusers_ext.pipelines.spade.search import EAConfig

    module = _script_module()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (40, 3)).astype(np.float32)
    y = -(x**2).sum(1)
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--data_file", str(tmp_path / "mine.npz"), "--max_train_steps", "2", *TINY]
    with as_command_line(SCRIPT, argv):
        module.main(argv)
    pipe = SurrogatePredictivePipeline.from_pretrained(str(out))
    assert pipe.model.config.x_dim == 3 and float(pipe.model.y_mean) == pytest.approx(float(y.mean()), abs=1e-5)
    result = pipe(x[:5], num_samples=4, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    assert result.samples.shape == (4, 5) and torch.isfinite(result.mean).all()
    search = OfflineOptimizationPipeline(model=pipe.model, scheduler=pipe.scheduler)
    ea = EAConfig(population_size=8, elite_size=4, num_generations=1)
    found = search(x, y, num_candidates=8, num_samples=2, num_inference_steps=2, ea=ea)
    assert found.candidates.shape == (8, 3)
    assert "train_spade.py" in (out / "README.md").read_text()
    task_out = tmp_path / "task"
    module.main(["--output_dir", str(task_out), "--task", "tfbind8", "--max_train_steps", "1", *TINY])
    assert SurrogatePredictivePipeline.from_pretrained(str(task_out)).model.config.x_dim == 24


def _launch(output_dir, steps, *extra):
    cmd = [*accelerate_cpu_launch(), SCRIPT, "--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    result = subprocess.run([*cmd, *extra], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _launch(resumed, 2)
    assert_world_size(log, resumed / "checkpoint-2")
    log = _launch(resumed, 4, "--resume_from_checkpoint", "latest")
    assert "checkpoint-2" in log
    _launch(straight, 4)
    a = load_file(os.path.join(resumed, "model", "diffusion_pytorch_model.safetensors"))
    b = load_file(os.path.join(straight, "model", "diffusion_pytorch_model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{key} differs after resume")
