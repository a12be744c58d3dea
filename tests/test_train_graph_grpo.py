"""The Graph-GRPO script: a tiny run saves a loadable pipeline, resume equals an uninterrupted run, two CPU
processes train together, a tiny molecule run (QED and similarity rewards, molecule metrics), argument errors."""

import gzip
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
# the molecule runs draw node counts from the pipeline's distribution: no --num_nodes
TINY_MOLECULES = TINY[: TINY.index("--num_nodes")] + TINY[TINY.index("--num_nodes") + 2 :]
# the novelty reference of the tiny molecule run (its moses_data_dir's train.csv.gz) and its pretraining molecules
SMALL_MOLECULES = [
    "CC", "CO", "CN", "CF", "CS", "CCl", "CBr", "C=C", "C=O", "C#N", "CCC", "CCO", "OCO", "CC=O", "CC#N",
]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("pretrained")
    scheduler = GraphDiscreteFlowScheduler(edge_marginals=[0.7, 0.3])
    GraphFlowPipeline(model=GraphTransformerModel.tiny(), scheduler=scheduler).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def molecule_pretrained(tmp_path_factory):
    """`(pipeline folder, moses_data_dir)`: an untrained tiny molecule pipeline whose scheduler has the marginals and
    node counts (2 or 3 heavy atoms) of `SMALL_MOLECULES`, as `train_graph_flow.py --dataset_name moses` builds it,
    and a folder whose `train.csv.gz` holds those molecules."""
    pytest.importorskip("rdkit")
    from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel
    from diffusers_ext.data.molecules import NUM_EDGE_CLASSES, NUM_NODE_CLASSES, molecules_to_dense

    torch.manual_seed(0)
    X, E, mask = molecules_to_dense(SMALL_MOLECULES, 3)
    node_p0, edge_p0 = GraphDiscreteFlowScheduler.marginals_from_dense(X, E, mask, NUM_NODE_CLASSES, NUM_EDGE_CLASSES)
    counts = torch.bincount(mask.sum(1), minlength=4).double()
    scheduler = GraphDiscreteFlowScheduler(
        num_node_classes=NUM_NODE_CLASSES, num_edge_classes=NUM_EDGE_CLASSES, node_marginals=node_p0,
        edge_marginals=edge_p0, node_count_probs=(counts / counts.sum()).tolist(),
    )  # fmt: skip
    model = GraphTransformerModel(
        num_node_classes=NUM_NODE_CLASSES, num_edge_classes=NUM_EDGE_CLASSES, node_dim=16, edge_dim=8, num_layers=1,
        num_heads=2, num_random_walk_steps=2,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("molecules")
    GraphFlowPipeline(model=model, scheduler=scheduler).save_pretrained(str(root / "pipeline"))
    (root / "moses").mkdir()
    with gzip.open(root / "moses" / "train.csv.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(["SMILES", *SMALL_MOLECULES]) + "\n")
    return str(root / "pipeline"), str(root / "moses")


def _run(pretrained, output_dir, steps, *extra, tiny=TINY):
    spec = importlib.util.spec_from_file_location("train_graph_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = [
        "--pretrained_model_name_or_path", pretrained, "--output_dir", str(output_dir),
        "--max_train_steps", str(steps), *tiny, *extra,
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


def test_tiny_molecule_run_with_qed_and_similarity_writes_molecule_metrics(tmp_path, molecule_pretrained):
    from diffusers_ext import GraphFlowPipeline
    from diffusers_ext.data.molecules import NUM_NODE_CLASSES, molecule_metrics
    from diffusers_ext.rewards.molecules import qed_reward

    torch.set_num_threads(1)
    folder, data_dir = molecule_pretrained
    out = tmp_path / "qed"
    history = _run(
        folder, out, 2, "--dataset_name", "moses", "--reward_funcs", "qed", "similarity", "--similarity_target",
        "CCO", "--moses_data_dir", data_dir, "--num_eval_graphs", "16", tiny=TINY_MOLECULES,
    )  # fmt: skip
    assert len(history) == 2
    for step in history:
        qed, similarity = step["rewards/qed_reward/mean"], step["rewards/similarity_reward/mean"]
        assert 0.0 <= qed <= 1.0 and 0.0 <= similarity <= 1.0
        assert step["reward"] == pytest.approx(qed + similarity)
    assert any(step["rewards/qed_reward/mean"] > 0 for step in history)  # some valid molecules were scored
    a, base = _weights(out), _weights(folder)
    assert any((a[name] - base[name]).abs().max() > 0 for name in a)

    pipe = GraphFlowPipeline.from_pretrained(str(out))
    assert pipe.scheduler.config.num_node_classes == NUM_NODE_CLASSES
    pipe.set_progress_bar_config(disable=True)
    # the final check: 16 samples (seed 1, 3 steps, node counts from the pipeline) against train.csv.gz
    graphs = pipe(num_graphs=16, num_inference_steps=3, generator=torch.Generator().manual_seed(1)).graphs
    assert {g.number_of_nodes() for g in graphs} <= {2, 3}
    expected = molecule_metrics(graphs, SMALL_MOLECULES)
    expected["qed"] = sum(qed_reward(graphs)) / len(graphs)
    metrics = json.loads((out / "validation_metrics.json").read_text())
    assert metrics == pytest.approx({f"{k} (3 steps)": v for k, v in expected.items()})
    assert expected["valid"] > 0 and expected["novel"] < 1.0  # the novelty reference is train.csv.gz
    assert "train_graph_grpo.py" in (out / "README.md").read_text()


@pytest.mark.two_process
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
        (["--pretrained_model_name_or_path", pretrained, "--reward_funcs", "sa"], "--reward_funcs 'sa' unknown"),
        (["--pretrained_model_name_or_path", pretrained, "--reward_funcs", "qed"], "--dataset_name tree"),
        (["--pretrained_model_name_or_path", pretrained, "--dataset_name", "sbm"], "--dataset_name"),
        (["--pretrained_model_name_or_path", pretrained, "--num_generations", "1"], "num_generations"),
        (["--pretrained_model_name_or_path", pretrained, "--num_eval_graphs", "-1"], "--num_eval_graphs"),
    ]
    runs = run_bad_arguments(SCRIPT, cases, tmp_path, common=["--num_nodes", "6"])
    for run, (_, message) in zip(runs, cases):
        assert_one_line_argument_error(run, message)


def test_molecule_argument_errors(tmp_path, pretrained, molecule_pretrained):
    folder, data_dir = molecule_pretrained
    moses = ["--dataset_name", "moses", "--moses_data_dir", data_dir]
    cases = [
        ([*moses, "--pretrained_model_name_or_path", folder, "--reward_funcs", "similarity"], "--similarity_target"),
        (
            [*moses, "--pretrained_model_name_or_path", folder, "--reward_funcs", "similarity", "--similarity_target",
             "C1CC"],
            "--similarity_target must be a SMILES string RDKit parses, got 'C1CC'",
        ),
        (
            [*moses, "--pretrained_model_name_or_path", folder, "--reward_funcs", "qed", "similarity",
             "--similarity_target", ""],
            "--similarity_target",
        ),
        ([*moses, "--pretrained_model_name_or_path", folder, "--reward_funcs", "tree_validity"], "--dataset_name moses"),
        ([*moses, "--pretrained_model_name_or_path", pretrained, "--reward_funcs", "qed"], "molecule pipeline"),
        (
            ["--dataset_name", "moses", "--moses_data_dir", str(tmp_path), "--pretrained_model_name_or_path", folder,
             "--reward_funcs", "qed"],
            "--moses_data_dir",
        ),
    ]  # fmt: skip
    runs = run_bad_arguments(SCRIPT, cases, tmp_path, common=TINY_MOLECULES)
    for run, (_, message) in zip(runs, cases):
        assert_one_line_argument_error(run, message)


def test_missing_rdkit_names_the_molecules_extra(tmp_path, pretrained):
    # an `rdkit` package that fails to import, first on the path: what an environment without RDKit sees
    (tmp_path / "rdkit").mkdir()
    (tmp_path / "rdkit" / "__init__.py").write_text("raise ImportError('No module named rdkit')\n")
    path = os.pathsep.join(p for p in (str(tmp_path), REPO, os.environ.get("PYTHONPATH")) if p)
    cases = [
        (["--pretrained_model_name_or_path", pretrained, "--dataset_name", "moses", "--reward_funcs", "qed"],
         "diffusers-ext[molecules]"),
    ]  # fmt: skip
    runs = run_bad_arguments(SCRIPT, cases, tmp_path, env={**os.environ, "PYTHONPATH": path})
    assert_one_line_argument_error(runs[0], cases[0][1])
