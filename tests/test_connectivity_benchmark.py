"""The connectivity benchmark (`benchmarks/connectivity/connectivity.py`): training lengths chosen on validation seeds disjoint
from the test seeds, a tiny run writing every output, the `--from_results` rebuild, and the committed results."""

import json
import os

import pytest
from benchmark_scripts import load_benchmark


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "connectivity", "results", "connectivity.json")


def benchmark():
    return load_benchmark("connectivity", "connectivity_benchmark")


def test_validation_seeds_must_differ_from_test_seeds():
    bench = benchmark()
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "2", "5", "6", "--validation_seeds", "0", "1", "2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--flow_steps_grid", "0", "10"])
    args = bench.parse_args([])
    assert not set(args.seeds) & set(args.validation_seeds)
    with pytest.raises(SystemExit):
        bench.parse_args(["--inference_steps_grid", "20", "0"])
    # the same tuning budget: ours' training steps x Euler steps against each lrRNN's Adam steps
    assert len(bench.ours_candidates(args)) == len(args.lrrnn_steps_grid) >= 2


def test_tiny_run_chooses_on_validation_then_tests_once(tmp_path):
    bench = benchmark()
    tiny = [
        "--ground_truths", "quadstable", "ring", "--seeds", "100", "101", "102", "--validation_seeds", "0",
        "--flow_steps_grid", "3", "6", "--lrrnn_steps_grid", "2", "4", "--num_neurons", "60",
        "--num_transitions", "200", "--num_dynamics_steps", "10", "--batch_size", "16", "--hidden_size", "8",
        "--readout_networks", "2", "--readout_neurons", "30", "--lrrnn_free_transitions", "100",
        "--inference_steps_grid", "2", "--num_eval_neurons", "60", "--num_resamples", "2",
    ]  # fmt: skip
    results = bench.main([*tiny, "--output", str(tmp_path / "connectivity.json")])
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"connectivity{suffix}").is_file()
    choices = results["validation"]["choices"]
    assert results["validation"]["seeds"] == [0]
    ours = choices["ours"]
    grid = [{"flow_steps": 3, "inference_steps": 2}, {"flow_steps": 6, "inference_steps": 2}]
    assert [row["candidate"] for row in ours["validation"]] == grid
    scores = [row["measurement"]["mean_reproduced_rate"] for row in ours["validation"]]
    assert ours["chosen"]["candidate"] == grid[scores.index(max(scores))]  # the best, ties to fewer steps
    for method in bench.BASELINES:
        mmd2 = [row["measurement"]["mean_mmd2"][method] for row in choices[method]["validation"]]
        assert choices[method]["chosen"]["candidate"] == [2, 4][mmd2.index(min(mmd2))]
    assert results["training_steps"] == {m: r["chosen"]["candidate"] for m, r in choices.items()}
    assert {run["seed"] for run in results["runs"]} == {100, 101, 102}  # the test seeds, each run once
    assert len(results["runs"]) == 6 and all(len(run["fresh_networks_reproduce"]) == 2 for run in results["runs"])
    assert len(results["summary"]["targets"]) == 6
    markdown = (tmp_path / "connectivity.md").read_text()
    assert "## Validation (seeds [0]" in markdown and "fresh ground-truth networks" in markdown
    assert f"Chosen: ours {bench.describe_ours(ours['chosen']['candidate'])}" in markdown
    rebuilt = bench.main(
        ["--from_results", str(tmp_path / "connectivity.json"), "--output", str(tmp_path / "re.json")]
    )
    assert rebuilt["summary"]["targets"] == results["summary"]["targets"]


def test_committed_results_were_chosen_on_validation_and_recompute():
    bench = benchmark()
    with open(RESULTS, encoding="utf-8") as f:
        results = json.load(f)
    settings = results["settings"]
    assert len(settings["seeds"]) >= 3 and not set(settings["seeds"]) & set(settings["validation_seeds"])
    choices = results["validation"]["choices"]
    assert results["training_steps"]["ours"] == choices["ours"]["chosen"]["candidate"]
    grid = len(settings["flow_steps_grid"]) * len(settings.get("inference_steps_grid", [None]))
    assert len(choices["ours"]["validation"]) == grid >= 2
    assert bench.targets_from_results(results) == results["summary"]["targets"]
