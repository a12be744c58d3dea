"""benchmarks/graph_grpo/graph_grpo_molecules.py: the top-k AUC on a hand example, the oracle's bookkeeping, the GA's re-noise
and regenerate step, and a tiny end-to-end run (pretraining, validation, three methods, targets, report files)."""

import importlib.util
import json

import pytest
from benchmark_scripts import load_benchmark


pytest.importorskip("rdkit")
pytest.importorskip("networkx")

bench = load_benchmark("graph_grpo_molecules", "graph_grpo_molecules_benchmark")


def test_top_k_curve_and_auc_hand_example():
    scores = [0.5, 0.9, 0.9, 0.0, 0.7]
    keys = ["A", "B", "B", None, "C"]  # a repeat of B and an invalid molecule do not count twice
    # k = 2: 0.25 (A, 0), 0.7 (B, A), 0.7, 0.7, 0.8 (B, C)
    assert bench.top_k_curve(scores, keys, k=2, budget=5) == pytest.approx([0.25, 0.7, 0.7, 0.7, 0.8])
    assert bench.top_k_auc(scores, keys, k=2, budget=5) == pytest.approx((0.25 + 0.7 * 3 + 0.8) / 5)
    # a shorter budget ignores later calls; a longer one keeps the last value
    assert bench.top_k_auc(scores, keys, k=2, budget=2) == pytest.approx((0.25 + 0.7) / 2)
    assert bench.top_k_curve(scores, keys, k=2, budget=7)[-2:] == pytest.approx([0.8, 0.8])
    # a repeated key keeps its best score
    assert bench.top_k_curve([0.2, 0.6], ["A", "A"], k=1, budget=2) == pytest.approx([0.2, 0.6])
    with pytest.raises(ValueError, match="same length"):
        bench.top_k_curve([0.1], [], k=1, budget=1)
    with pytest.raises(ValueError, match="budget"):
        bench.top_k_curve([0.1], ["A"], k=1, budget=0)


def test_oracle_records_every_call_in_order():
    from diffusers_ext.data.molecules import smiles_to_graph

    oracle = bench.QEDOracle()
    broken = smiles_to_graph("CCO")
    broken.add_node(3, label=0)  # a second fragment
    scores = oracle([smiles_to_graph("c1ccccc1"), broken])
    assert len(oracle) == 2 and oracle.smiles == ["c1ccccc1", None]
    assert scores == oracle.scores and scores[0] == pytest.approx(0.4426, abs=1e-4) and scores[1] == 0.0


def test_regenerate_keeps_node_counts_and_is_seeded():
    import torch

    from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel
    from diffusers_ext.data.molecules import NUM_EDGE_CLASSES, NUM_NODE_CLASSES, smiles_to_graph

    torch.manual_seed(0)
    model = GraphTransformerModel(
        num_node_classes=NUM_NODE_CLASSES, num_edge_classes=NUM_EDGE_CLASSES, node_dim=16, edge_dim=8, num_layers=1,
        num_heads=2, num_random_walk_steps=2,
    )  # fmt: skip
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=NUM_NODE_CLASSES, num_edge_classes=NUM_EDGE_CLASSES)
    pipe = GraphFlowPipeline(model=model, scheduler=scheduler)
    parents = [smiles_to_graph("c1ccccc1"), smiles_to_graph("CCO")]
    first = bench.regenerate(pipe, parents, 0.25, 8, torch.Generator().manual_seed(0))
    again = bench.regenerate(pipe, parents, 0.25, 8, torch.Generator().manual_seed(0))
    assert [g.number_of_nodes() for g in first] == [6, 3]
    assert [sorted(g.edges(data="label")) for g in first] == [sorted(g.edges(data="label")) for g in again]


@pytest.mark.skipif(
    importlib.util.find_spec("moses") is None, reason="the molsets wheel is not installed (pip install --no-deps)"
)
def test_tiny_end_to_end_run_writes_the_results(tmp_path):
    argv = [
        "--budget", "24", "--batch_size", "8", "--num_generations", "4", "--refine_top_k", "1", "--ga_parents", "2",
        "--num_inference_steps", "3", "--train_max_steps", "2", "--pretrain_steps", "2", "--pretrain_batch_size", "4",
        "--node_dim", "16", "--edge_dim", "8", "--num_layers", "1", "--num_train_molecules", "100",
        "--bon_steps", "3", "--ga_noise_fractions", "0.5", "--learning_rates", "1e-3", "3e-3",
        "--output_dir", str(tmp_path / "results"), "--cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    results = bench.main(argv)
    assert set(results["methods"]) == {"best_of_n", "graph_ga", "graph_grpo"}
    for part in results["methods"].values():
        assert [r["seed"] for r in part["runs"]] == [0, 1, 2]
        for run in part["runs"]:
            assert run["calls"] == 24 and 0 <= run["auc_top10"] <= run["top10"] <= 1
            assert 0 <= run["valid"] <= 1 and len(run["curve"]) == 0  # 24 calls: no 25th-call point
        assert part["summary"]["auc_top10"]["n"] == 3
    assert len(results["methods"]["graph_grpo"]["validation"]["validation"]) == 2
    assert results["methods"]["graph_grpo"]["runs"][0]["steps"] == 2  # ceil(24 / (8 + 1 * 4))
    names = [row["name"] for row in results["summary"]["targets"]]
    assert len(names) == 3 and names[0].startswith("headroom")
    written = json.loads((tmp_path / "results" / "graph_grpo_molecules.json").read_text())
    assert written["command"].startswith("python benchmarks/graph_grpo/graph_grpo_molecules.py --budget 24")
    assert "--output_dir" not in written["command"] and "--cache_dir" not in written["command"]
    report = (tmp_path / "results" / "graph_grpo_molecules.md").read_text()
    assert "targets met" in report and "PMO" in report
    # the report rebuilds from the file alone, measuring nothing
    rebuilt = bench.main(["--from_results", str(tmp_path / "results" / "graph_grpo_molecules.json"), "--output_dir",
                          str(tmp_path / "rebuilt")])  # fmt: skip
    assert rebuilt["summary"]["targets"] == results["summary"]["targets"]
