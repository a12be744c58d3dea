"""The manifold-flow benchmark (`benchmarks/manifold_flow/manifold_flow.py`): learning rates chosen on validation seeds
disjoint from the test seeds, a tiny run writing every output, the `--from_results` rebuild, and the committed
results."""

import json
import os

import pytest
from benchmark_scripts import load_benchmark


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "manifold_flow", "results", "manifold_flow.json")
TINY = [
    "--ambient_dims", "4", "64", "--train_sizes", "16", "32", "--seeds", "100", "101", "102",
    "--validation_ambient_dims", "4", "--validation_train_size", "16", "--steps", "4", "--batch_size", "16",
    "--num_tokens", "2", "--hidden_size", "8", "--num_layers", "1", "--num_eval_samples", "64",
    "--num_judge_points", "32", "--num_inference_steps", "3", "--num_projections", "16", "--noise_train_size", "16",
    "--noise_ambient_dim", "6", "--workers", "1",
]  # fmt: skip


def benchmark():
    return load_benchmark("manifold_flow", "manifold_flow_benchmark")


def test_arguments_keep_validation_and_test_apart():
    bench = benchmark()
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "5", "6", "--validation_seeds", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--ambient_dims", "2", "16"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--train_sizes", "64"])
    args = bench.parse_args([])
    assert not set(args.seeds) & set(args.validation_seeds) and len(args.seeds) >= 3
    assert args.ambient_dims == [4, 16, 64, 256] and args.train_sizes == [64, 256, 1024]


def test_tiny_run_chooses_on_validation_then_tests_once(tmp_path):
    bench = benchmark()
    results = bench.main([*TINY, "--output", str(tmp_path / "manifold_flow.json")])
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"manifold_flow{suffix}").is_file()
    choices = results["validation"]["choices"]
    for method in bench.METHODS:
        record = choices[method]
        assert [row["candidate"] for row in record["validation"]] == [1e-3, 3e-3]
        scores = [row["score"] for row in record["validation"]]
        assert record["chosen"]["candidate"] == [1e-3, 3e-3][scores.index(min(scores))]
        assert results["learning_rates"][method] == record["chosen"]["candidate"]
    test = [r for r in results["runs"] if r["split"] == "test" and "learning_rate" in r]
    assert {r["seed"] for r in test} == {100, 101, 102}
    trained_as = {"two_head_noise_aware": "two_head"}  # the two-head model rescored with the noise-aware head
    assert all(r["learning_rate"] == results["learning_rates"][trained_as.get(r["method"], r["method"])] for r in test)
    # one run per method and cell: 2 D x 2 n x 3 seeds x 3 methods, plus the noise condition's 3 x 3 (+ 3 rescored)
    assert len([r for r in test if r["condition"] == "clean"]) == 36
    assert len([r for r in test if r["condition"] == "noise"]) == 12
    validation = [r for r in results["runs"] if r["split"] == "validation" and "learning_rate" in r]
    assert {r["seed"] for r in validation} == {0} and len(validation) == 6
    # every method of a cell shares its data and judging draws: the oracle's floor and the reference are per cell
    assert len(results["summary"]["targets"]) == 2 + 2 + 2
    assert results["summary"]["sanity"]["oracle_off_manifold_rms_max"] < 1e-5
    assert results["summary"]["sanity"]["two_head_off_manifold_rms_max"] < 1e-5
    jobs = {r["job_id"]: r["job_cpu_seconds"] for r in results["runs"]}
    assert len(jobs) == 6 + 36 + 9 + 10 and results["summary"]["sanity"]["total_job_cpu_seconds"] == sum(jobs.values())
    markdown = (tmp_path / "manifold_flow.md").read_text()
    assert "## Validation (seeds [0]" in markdown and "Off-subspace noise" in markdown
    rebuilt = bench.main(
        ["--from_results", str(tmp_path / "manifold_flow.json"), "--output", str(tmp_path / "re.json")]
    )
    assert rebuilt["summary"]["targets"] == results["summary"]["targets"]


@pytest.mark.skipif(not os.path.isfile(RESULTS), reason="no committed results yet")
def test_committed_results_were_chosen_on_validation_and_recompute():
    bench = benchmark()
    with open(RESULTS, encoding="utf-8") as f:
        results = json.load(f)
    settings = results["settings"]
    assert len(settings["seeds"]) >= 3 and not set(settings["seeds"]) & set(settings["validation_seeds"])
    assert settings["ambient_dims"] == [4, 16, 64, 256] and settings["train_sizes"] == [64, 256, 1024]
    choices = results["validation"]["choices"]
    assert results["learning_rates"] == {m: choices[m]["chosen"]["candidate"] for m in bench.METHODS}
    assert all(len(choices[m]["validation"]) == len(settings["learning_rate_grid"]) >= 2 for m in bench.METHODS)
    assert bench.targets_from_results(results) == results["summary"]["targets"]
    # the budget: every training run well under a minute at one thread (the wall time of the whole run, which
    # depends on what else the machine ran, is recorded and discussed in the record's README)
    assert results["summary"]["sanity"]["max_train_cpu_seconds"] < 60
    assert results["summary"]["sanity"]["wall_seconds"] > 0
