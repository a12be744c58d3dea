"""The EpiDiff training script: a loadable pipeline folder, exact resume, a user CSV, the two-process launch and
argument errors."""

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, as_command_line, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_epidiff.py")
TINY = [
    "--dataset_name", "simulator", "--sim_nodes", "4", "--sim_steps", "80", "--history", "5", "--horizon", "3",
    "--hidden_size", "8", "--num_heads", "2", "--num_layers", "1", "--num_train_timesteps", "20",
    "--train_batch_size", "4", "--checkpointing_steps", "2", "--report_to", "none", "--disable_tqdm", "true",
    "--eval_num_samples", "2", "--eval_inference_steps", "2",
]  # fmt: skip


def _run_in_process(output_dir, steps, *extra):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_epidiff", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra]
    with as_command_line(SCRIPT, argv):
        module.main(argv)


def _weights(folder):
    return load_file(os.path.join(folder, "denoiser", "diffusion_pytorch_model.safetensors"))


def test_run_resume_and_load(tmp_path):
    torch.set_num_threads(1)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_in_process(straight, 4)
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    _run_in_process(resumed, 4, "--resume_from_checkpoint", "latest")
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")

    from diffusers_ext import EpiDiffForecastPipeline

    pipe = EpiDiffForecastPipeline.from_pretrained(str(straight))
    pipe.set_progress_bar_config(disable=True)
    assert pipe.denoiser.config.window_length == 8 and pipe.scheduler.config.num_train_timesteps == 20
    out = pipe(torch.rand(2, 4, 5) * 10, torch.ones(4, 4), num_samples=3, num_inference_steps=2)
    assert out.samples.shape == (2, 3, 4, 3) and out.quantiles.shape[0] == 2
    card = (straight / "README.md").read_text()
    assert "train_epidiff.py" in card and "validation MAE" in card


def test_trains_on_a_user_csv(tmp_path):
    from diffusers_ext.data.epidemics import simulate_metapopulation_sir

    series = simulate_metapopulation_sir(num_nodes=3, num_steps=60, seed=1)
    counts = tmp_path / "counts.csv"
    with open(counts, "w") as f:
        f.write(
            "week,a,b,c\n"
            + "".join(f"{t},{','.join(str(int(v)) for v in row)}\n" for t, row in enumerate(series.values))
        )
    adjacency = tmp_path / "adjacency.csv"
    adjacency.write_text("a,b\nb,c\n")
    out = tmp_path / "out"
    tiny = list(TINY)
    tiny[tiny.index("simulator")] = "csv"
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_epidiff", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(
        ["--output_dir", str(out), "--max_train_steps", "2", *tiny, "--counts_csv", str(counts), "--adjacency_csv",
         str(adjacency), "--sim_nodes", "3"]
    )  # fmt: skip
    from diffusers_ext import EpiDiffForecastPipeline

    pipe = EpiDiffForecastPipeline.from_pretrained(str(out))
    assert np.isfinite(pipe.denoiser.config.data_mean) and pipe.denoiser.config.data_std > 0


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_launch(tmp_path):
    cmd = [*accelerate_cpu_launch(), SCRIPT, "--output_dir", str(tmp_path), "--max_train_steps", "2", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_world_size(result.stdout + result.stderr, tmp_path / "checkpoint-2")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset_name", "nope"], "--dataset_name"),
        (["--dataset_name", "csv"], "--counts_csv"),
        (["--horizon", "0"], "--horizon"),
        (["--learning_rate", "0"], "--learning_rate"),
        (["--hidden_size", "9"], "--hidden_size"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        _run_in_process(tmp_path, 2, *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
