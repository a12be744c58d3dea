"""The graph flow pretraining script: a tiny run saves a loadable pipeline, resume equals an uninterrupted run,
argument errors."""

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import load_file


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_graph_flow.py")
TINY = [
    "--num_nodes", "8", "--node_dim", "16", "--edge_dim", "8", "--num_layers", "1", "--num_heads", "2",
    "--num_random_walk_steps", "3", "--train_batch_size", "8", "--checkpointing_steps", "2", "--report_to", "none",
    "--num_eval_graphs", "4", "--eval_inference_steps", "3", "--seed", "1",
]  # fmt: skip


def _run(output_dir, steps, *extra):
    spec = importlib.util.spec_from_file_location("train_graph_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra])


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def test_tiny_run_saves_a_loadable_pipeline_and_resume_is_exact(tmp_path):
    torch.set_num_threads(1)
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _run(resumed, 2, "--dataset_name", "planar")
    _run(resumed, 4, "--dataset_name", "planar", "--resume_from_checkpoint", "latest")
    _run(straight, 4, "--dataset_name", "planar")
    a, b = _weights(resumed), _weights(straight)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")

    from diffusers_ext import GraphFlowPipeline, load_pipeline

    for pipe in (GraphFlowPipeline.from_pretrained(str(resumed)), load_pipeline(str(resumed))):
        assert type(pipe).__name__ == "GraphFlowPipeline"
        pipe.set_progress_bar_config(disable=True)
        out = pipe(num_graphs=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0))
        # node counts come from the training distribution (all graphs have 8 nodes)
        assert [g.number_of_nodes() for g in out.graphs] == [8, 8]
    # the noise is the training marginals: a planar graph of 8 nodes has 13 to 18 of its 28 pairs as edges
    assert 13 / 28 <= pipe.scheduler.edge_marginals[1] <= 18 / 28
    metrics = json.loads((resumed / "validation_metrics.json").read_text())
    assert set(metrics) == {f"{k} (3 steps)" for k in ("valid", "unique", "novel", "vun")}
    assert "train_graph_flow.py" in (resumed / "README.md").read_text()


@pytest.mark.parametrize(
    "args, message", [(["--num_nodes", "2"], "--num_nodes"), (["--dataset_name", "sbm"], "--dataset_name")]
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        _run(tmp_path, 1, *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.skipif(
    importlib.util.find_spec("rdkit") is None or importlib.util.find_spec("moses") is None,
    reason="needs RDKit and the molsets wheel (pip install --no-deps molsets)",
)
def test_tiny_moses_run_has_the_molecule_vocabulary_and_node_counts(tmp_path):
    from diffusers_ext import GraphFlowPipeline
    from diffusers_ext.data.molecules import NUM_EDGE_CLASSES, NUM_NODE_CLASSES

    torch.set_num_threads(1)
    _run(tmp_path, 2, "--dataset_name", "moses", "--max_heavy_atoms", "12", "--num_train_molecules", "50")
    pipe = GraphFlowPipeline.from_pretrained(str(tmp_path))
    config = pipe.scheduler.config
    assert (config.num_node_classes, config.num_edge_classes) == (NUM_NODE_CLASSES, NUM_EDGE_CLASSES)
    assert pipe.model.config.num_node_classes == NUM_NODE_CLASSES
    counts = pipe.scheduler.node_count_probs
    assert len(counts) == 13 and float(counts[:8].sum()) < 0.5  # node counts up to 12, most near the top
    assert float(pipe.scheduler.node_marginals[0]) > 0.5  # carbon is most of the atoms
    metrics = json.loads((tmp_path / "validation_metrics.json").read_text())
    assert set(metrics) == {f"{k} (3 steps)" for k in ("valid", "unique", "novel", "vun", "qed")}
    assert "MOSES molecules" in (tmp_path / "README.md").read_text()
