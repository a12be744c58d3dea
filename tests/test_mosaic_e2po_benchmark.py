"""benchmarks/e2po/mosaic_e2po.py on a tiny untrained StableDiffusion3Pipeline: both methods are tuned on validation with
equal budgets, trained from the same start on test, and the targets are computed from the measured curves."""

import json
import math

import pytest
from benchmark_scripts import load_benchmark


bench = load_benchmark("mosaic_e2po", "mosaic_e2po_benchmark")


def _summary(grpo_curves, e2po_curves, grpo_zero, e2po_zero):
    """A record of test runs with the given per-seed held-out curves (after each eval step) and zero-std fractions."""

    def runs(curves, zero):
        return [
            {
                "eval_steps": [10, 20],
                "eval": [{"mean": v} for v in curve],
                "train": {"frac_reward_zero_std": [z, z], "reward": [0.5, 0.5]},
            }
            for curve, z in zip(curves, zero)
        ]

    record = {
        "start": {"test": {"mean": 0.5}},
        "test": {"grpo": runs(grpo_curves, grpo_zero), "e2po": runs(e2po_curves, e2po_zero)},
    }
    return bench.summarize_runs(record)


def test_targets_follow_the_curves_and_the_verdict_the_standard_error():
    summary = _summary([[0.6, 0.7], [0.6, 0.7]], [[0.7, 0.8], [0.7, 0.8]], [0.2, 0.2], [0.05, 0.05])
    assert summary["e2po_steps_to_grpo_final"] == 10 and summary["steps_ratio"] == 0.5
    assert summary["zero_std_ratio"] == pytest.approx(0.25)
    assert summary["final_difference"] == pytest.approx(0.1) and summary["final_verdict"] == "win"
    targets = bench.e2po_targets(summary)
    assert [t["met"] for t in targets] == [True, True, True] and targets[2]["value"] == pytest.approx(0.1)
    # E2PO never reaches GRPO's final value: infinite ratio, a loss beyond 2 SE
    summary = _summary([[0.6, 0.9], [0.6, 0.8]], [[0.5, 0.55], [0.5, 0.6]], [0.2, 0.2], [0.2, 0.2])
    assert summary["e2po_steps_to_grpo_final"] is None and math.isinf(summary["steps_ratio"])
    assert summary["final_verdict"] == "loss"
    assert [t["met"] for t in bench.e2po_targets(summary)] == [False, False, False]
    # within 2 SE: a tie, which meets the final-reward target
    summary = _summary([[0.6, 0.7], [0.6, 0.8]], [[0.6, 0.65], [0.6, 0.8]], [0.2, 0.2], [0.2, 0.2])
    assert summary["final_verdict"] == "tie" and bench.e2po_targets(summary)[2]["met"]


def test_the_validation_budgets_must_be_equal_and_directions_must_pair_up(tiny_sd3_pipeline_folder):
    base = ["--model_path", str(tiny_sd3_pipeline_folder)]
    with pytest.raises(SystemExit):
        bench.parse_args(base + ["--learning_rates", "1e-4", "2e-4"])  # 2 GRPO settings against 4 E2PO ones
    with pytest.raises(SystemExit):
        bench.parse_args(base + ["--e2po_directions", "2", "4"])  # 6 perturbed members: no 4 +/- pairs
    with pytest.raises(SystemExit):
        bench.parse_args(base + ["--max_steps", "25"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tiny_sd3_pipeline_folder.parent)])
    args = bench.parse_args(base)
    grids = bench.grids(args)
    assert len(grids["grpo"]) == len(grids["e2po"]) == 4


def test_a_tiny_run_tunes_trains_and_rebuilds(tiny_sd3_pipeline_folder, tmp_path):
    argv = ["--model_path", str(tiny_sd3_pipeline_folder), "--seeds", "0", "1"]
    argv += ["--max_steps", "2", "--eval_every", "1"]
    argv += ["--validation_steps", "1", "--eval_prompts", "3", "--prompts_per_step", "1", "--num_generations", "4"]
    argv += ["--e2po_anchors", "2", "--e2po_directions", "1", "--e2po_max_scales", "0.1", "0.2"]
    argv += ["--learning_rates", "1e-4", "3e-4", "--rollout_steps", "2", "--num_inference_steps", "1"]
    argv += ["--output_dir", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
    results = bench.main(argv)
    record, summary = results["record"], results["summary"]
    assert [len(record["validation"][a]) for a in bench.ALGORITHMS] == [2, 2]
    assert record["chosen"]["e2po"]["learning_rate"] == record["chosen"]["grpo"]["learning_rate"]
    for algorithm in bench.ALGORITHMS:
        assert [r["seed"] for r in record["test"][algorithm]] == [0, 1]
        assert all(r["eval_steps"] == [1, 2] and len(r["eval"]) == 2 for r in record["test"][algorithm])
        assert (
            summary[algorithm]["steps"] == [0, 1, 2] and summary[algorithm]["curve"][0] == summary["start_test_reward"]
        )
    assert "e2po/scale" in record["test"]["e2po"][0]["train"]
    assert len(summary["targets"]) == 3
    written = json.loads((tmp_path / "mosaic_e2po.json").read_text())
    assert "--model_path" not in written["command"] and "--cache_dir" not in written["command"]
    rebuilt = bench.main(["--from_results", str(tmp_path / "mosaic_e2po.json"), "--output_dir", str(tmp_path)])
    assert [r["value"] for r in rebuilt["summary"]["targets"]] == [r["value"] for r in summary["targets"]]
    # a second invocation finds every run in the cache
    again = bench.main(argv)
    assert again["summary"]["grpo"]["curve"] == summary["grpo"]["curve"]
