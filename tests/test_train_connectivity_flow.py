"""The connectivity-flow training script: a loadable result, exact resume across the switch between the two flows,
the two-process launch, argument errors."""

import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_connectivity_flow.py")
TINY = [
    "--dataset_name",
    "limit_cycle",
    "--num_neurons",
    "40",
    "--num_dynamics_steps",
    "5",
    "--num_transitions",
    "300",
    "--hidden_size",
    "8",
    "--num_layers",
    "1",
    "--train_batch_size",
    "16",
    "--readout_networks",
    "2",
    "--readout_neurons",
    "20",
    "--eval_inference_steps",
    "2",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
]


def _run_in_process(output_dir, steps, *extra):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_connectivity_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra])


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def test_run_resume_and_load(tmp_path):
    torch.set_num_threads(1)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_in_process(
        straight, 6, "--validation_steps", "5", "--num_validation_images", "1", "--checkpoints_total_limit", "3"
    )
    # resume from the checkpoint of step 2 (input flow), across the switch to the output flow at step 3
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    _run_in_process(resumed, 6, "--resume_from_checkpoint", "latest")
    a, b = _weights(straight), _weights(resumed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    # steps 1-3 train the input flow, steps 4-6 the output flow: after the switch the input flow stays frozen
    early = load_file(os.path.join(straight, "checkpoint-2", "model.safetensors"))
    assert any(not torch.equal(early[k], a[k]) for k in early if k.startswith("input_velocity"))
    after_switch = load_file(os.path.join(straight, "checkpoint-4", "model.safetensors"))
    moved = {k for k in after_switch if not torch.equal(after_switch[k], a[k])}
    assert moved and all(k.startswith("output_velocity") for k in moved)

    from diffusers_ext import ConnectivityPipeline

    pipe = ConnectivityPipeline.from_pretrained(str(straight))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(num_neurons=7, num_networks=2, num_inference_steps=2, num_dynamics_steps=3)
    assert out.loadings.shape == (2, 7, 4) and out.trajectories.shape == (2, 25, 4, 2)
    assert pipe.model.config.output_scale != 1.0  # set from the read-out targets
    assert (straight / "validation" / "step-5.txt").is_file()
    assert "train_connectivity_flow.py" in (straight / "README.md").read_text()


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_launch(tmp_path):
    cmd = [*accelerate_cpu_launch(), SCRIPT, "--output_dir", str(tmp_path), "--max_train_steps", "4", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_world_size(result.stdout + result.stderr, tmp_path / "checkpoint-2")


@pytest.mark.parametrize(
    "args, message",
    [(["--input_flow_fraction", "1.5"], "--input_flow_fraction"), (["--ridge_lambda", "0"], "--ridge_lambda")],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        _run_in_process(tmp_path, 2, *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
