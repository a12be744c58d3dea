"""The GRPO/E2PO benchmark: the committed results recompute from their runs; a tiny run of the script (slow)."""

import json
import math
import os
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "e2po", "results", "e2po.json")
KEYS = (
    "grpo_eval_gain_per_seed",
    "eval_standard_error",
    "e2po_frac_zero_std_ratio",
    "e2po_steps_to_grpo_final_ratio",
    "trainer_overhead_fraction",
    "num_seeds",
    "eval_samples",
    "targets",
    "sanity",
)


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def test_committed_summary_recomputes_from_the_runs():
    with open(RESULTS, encoding="utf-8") as f:
        results = json.load(f)
    summary, runs = results["summary"], results["runs"]
    assert all(key in summary for key in KEYS), sorted(set(KEYS) - set(summary))
    assert summary["num_seeds"] >= 3 and summary["eval_samples"] >= 500
    for row in summary["targets"]:
        expected = row["value"] <= row["threshold"] if row["comparison"] == "<=" else row["value"] >= row["threshold"]
        assert row["met"] == (expected and math.isfinite(row["value"]))
    learn = runs["learn"]["grpo"]
    gains = [r["eval"][-1]["reward"] - r["eval"][0]["reward"] for r in learn.values()]
    assert gains == pytest.approx(summary["grpo_eval_gain_per_seed"])
    assert all(len(r["train"]["reward"]) >= 100 for r in learn.values())
    regime = runs["regime"]
    ratio = mean(mean(r["train"]["frac_reward_zero_std"]) for r in regime["e2po"].values()) / mean(
        mean(r["train"]["frac_reward_zero_std"]) for r in regime["grpo"].values()
    )
    assert ratio == pytest.approx(summary["e2po_frac_zero_std_ratio"])
    overheads = [
        mean(r["train"]["time/overhead_fraction"]) for part in runs.values() for a in part.values() for r in a.values()
    ]
    assert mean(overheads) == pytest.approx(summary["trainer_overhead_fraction"])


@pytest.mark.slow
def test_a_tiny_run_of_the_benchmark_writes_every_output(tmp_path):
    command = [
        sys.executable,
        "benchmarks/e2po/e2po.py",
        "--seeds",
        "0",
        "--learn_steps",
        "2",
        "--regime_steps",
        "2",
        "--eval_every",
        "2",
        "--images_per_step",
        "16",
        "--eval_samples",
        "30",
        "--validation_samples",
        "10",
        "--workers",
        "1",
        "--noise_levels",
        "0.7",
        "--group_sizes",
        "8",
        "--max_scales",
        "0.02",
        "0.05",
        "--thresholds",
        "0.99",
        "0.999",
        "--output_dir",
        str(tmp_path),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    results = json.loads((tmp_path / "e2po.json").read_text())
    assert {"learn", "regime"} == set(results["runs"]) and results["validation"]["e2po_max_scale"] in (0.02, 0.05)
    assert len(results["summary"]["targets"]) == 4
    assert (tmp_path / "e2po.md").is_file() and (tmp_path / "e2po.png").is_file()
