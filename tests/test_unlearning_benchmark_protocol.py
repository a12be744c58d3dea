"""benchmarks/unlearning.py follows the protocol: its run cache is keyed by every run setting and the code, and its
targets are a computed list (docs/benchmarks.md)."""

import importlib.util
import json
import math
import os

import pytest


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "unlearning_bench", os.path.join(REPO, "benchmarks", "unlearning.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cache_key_follows_run_settings_not_run_selection(bench, tmp_path):
    base = bench.parse_args(["--cache_dir", str(tmp_path)])
    key = bench.run_cache_key(base)
    assert bench.cache_path(base).startswith(str(tmp_path)) and key[:20] in bench.cache_path(base)
    for changed in (["--max_steps", "151"], ["--retain_weight", "5"], ["--forget_class", "4"], ["--model", REPO]):
        assert bench.run_cache_key(bench.parse_args(["--cache_dir", str(tmp_path), *changed])) != key, changed
    for same in (["--seeds", "0", "1", "2", "3"], ["--report_only"], ["--output_dir", str(tmp_path)]):
        assert bench.run_cache_key(bench.parse_args(["--cache_dir", str(tmp_path), *same])) == key, same


def test_targets_are_computed_from_the_summary(bench):
    with open(os.path.join(REPO, "benchmarks", "results", "unlearning.json"), encoding="utf-8") as f:
        results = json.load(f)
    rows = bench.compute_targets(results["summary"], results["concept"], results["data"])
    assert len(rows) == 6 and all({"name", "value", "threshold", "comparison", "met"} <= row.keys() for row in rows)
    for row in rows:
        expected = row["value"] <= row["threshold"] if row["comparison"] == "<=" else row["value"] >= row["threshold"]
        assert row["met"] == (math.isfinite(row["value"]) and expected)
    headline = next(row for row in rows if "same retain term" in row["name"])
    assert headline["value"] == results["summary"]["reverse_kl_over_esd_retain_frechet"]
    missing = bench.compute_targets({"concept": {}}, {}, {})
    assert not any(row["met"] for row in missing)
