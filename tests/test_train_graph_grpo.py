"""The Graph-GRPO script: a tiny run saves a loadable pipeline, resume equals an uninterrupted run, two CPU
processes train together, argument errors."""

import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from script_launch import (
    CPU_LAUNCH_ENV,
    accelerate_cpu_launch,
    as_command_line,
    assert_one_line_argument_error,
    assert_world_size,
    run_bad_arguments,
)


pytest.importorskip("networkx")
pytest.importorskip("trl")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_graph_grpo.py")
TINY = [
    "--num_nodes", "6", "--num_generations", "4", "--train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--num_inference_steps", "3", "--learning_rate", "1e-3", "--checkpointing_steps", "1", "--report_to", "none",
    "--num_eval_graphs", "4", "--disable_tqdm", "true", "--seed", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("pretrained")
    scheduler = GraphDiscreteFlowScheduler(edge_marginals=[0.7, 0.3])
    GraphFlowPipeline(model=GraphTransformerModel.tiny(), scheduler=scheduler).save_pretrained(str(folder))
    return str(folder)


def _run(pretrained, output_dir, steps, *extra):
    spec = importlib.util.spec_from_file_location("train_graph_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = [
        "--pretrained_model_name_or_path", pretrained, "--output_dir", str(output_dir),
        "--max_train_steps", str(steps), *TINY, *extra,
    ]  # fmt: skip
    with as_command_line(SCRIPT, argv):
        return module.main(argv)


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def test_tiny_run_saves_a_loadable_pipeline_and_resume_is_exact(tmp_path, pretrained):
    torch.set_num_threads(1)
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _run(pretrained, resumed, 2)
    _run(pretrained, resumed, 3, "--resume_from_checkpoint", "latest")
    history = _run(pretrained, straight, 3)
    assert len(history) == 3
    a, b = _weights(resumed), _weights(straight)
    base = _weights(pretrained)
    assert any((a[name] - base[name]).abs().max() > 0 for name in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=f"{name} differs after resume")
    from diffusers_ext import GraphFlowPipeline

    pipe = GraphFlowPipeline.from_pretrained(str(resumed))
    pipe.set_progress_bar_config(disable=True)
    assert len(pipe(num_graphs=2, num_nodes=6, num_inference_steps=2).graphs) == 2
    metrics = json.loads((resumed / "validation_metrics.json").read_text())
    assert set(metrics) == {f"{k} (3 steps)" for k in ("valid", "unique", "novel", "vun")}
    assert "train_graph_grpo.py" in (resumed / "README.md").read_text()


def test_planar_shaped_reward_takes_its_statistics_from_the_planar_training_split(tmp_path, pretrained):
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.rewards import PlanarShapedReward

    torch.set_num_threads(1)
    history = _run(
        pretrained, tmp_path / "shaped", 1, "--dataset_name", "planar", "--reward_funcs", "planar_shaped",
        "--num_eval_graphs", "0",
    )  # fmt: skip
    mean = history[0]["rewards/planar_shaped_reward/mean"]
    assert history[0]["reward"] == pytest.approx(mean) and 0.0 <= mean <= 1.0
    spec = importlib.util.spec_from_file_location("train_graph_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reward = module.build_reward("planar_shaped", [6], 0)
    expected = PlanarShapedReward(spectre_splits("planar", 6, 0)["train"])
    assert isinstance(reward, PlanarShapedReward)
    np.testing.assert_array_equal(reward.reference_orbits, expected.reference_orbits)
    np.testing.assert_array_equal(reward.reference_degree, expected.reference_degree)


def test_two_cpu_processes(tmp_path, pretrained):
    out = tmp_path / "ddp"
    command = [
        *accelerate_cpu_launch(2), SCRIPT, "--pretrained_model_name_or_path", pretrained, "--output_dir", str(out),
        "--max_train_steps", "1", *TINY,
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **CPU_LAUNCH_ENV}, timeout=300, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_world_size(result.stderr + result.stdout, out / "checkpoint-1")
    assert (out / "model_index.json").is_file()


def test_bad_arguments_fail_with_one_line_errors(tmp_path, pretrained):
    cases = [
        ([], "--pretrained_model_name_or_path is required"),
        (["--pretrained_model_name_or_path", str(tmp_path)], "is not a pipeline folder"),
        (["--pretrained_model_name_or_path", pretrained, "--reward_funcs", "qed"], "--reward_funcs 'qed' unknown"),
        (["--pretrained_model_name_or_path", pretrained, "--dataset_name", "sbm"], "--dataset_name"),
        (["--pretrained_model_name_or_path", pretrained, "--num_generations", "1"], "num_generations"),
        (["--pretrained_model_name_or_path", pretrained, "--num_eval_graphs", "-1"], "--num_eval_graphs"),
    ]
    runs = run_bad_arguments(SCRIPT, cases, tmp_path, common=["--num_nodes", "6"])
    for run, (_, message) in zip(runs, cases):
        assert_one_line_argument_error(run, message)
