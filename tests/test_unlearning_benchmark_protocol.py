"""benchmarks/unlearning/unlearning.py follows the protocol (benchmarks/README.md): its run cache is keyed by every run setting and
the code, levels are chosen on validation by one rule for every method, and its targets are a computed list."""

import json
import math
import os

import pytest
from benchmark_scripts import load_benchmark


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("unlearning", "unlearning_bench")


def test_cache_key_follows_run_settings_not_run_selection(bench, tmp_path):
    base = bench.parse_args(["--cache_dir", str(tmp_path)])
    key = bench.run_cache_key(base)
    path = bench.cache_path(base, 0, "data")
    assert path.startswith(str(tmp_path)) and key[:20] in path
    for changed in (
        ["--max_steps", "81"],
        ["--retain_weight", "5"],
        ["--forget_classes", "3", "4"],
        ["--model", REPO],
        ["--samples_per_class", "41"],
        ["--level_factors", "1", "2"],
    ):
        assert bench.run_cache_key(bench.parse_args(["--cache_dir", str(tmp_path), *changed])) != key, changed
    for same in (["--seeds", "0", "1", "2", "3"], ["--workers", "1"], ["--output_dir", str(tmp_path)]):
        assert bench.run_cache_key(bench.parse_args(["--cache_dir", str(tmp_path), *same])) == key, same


def test_baseline_gets_the_same_number_of_levels(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--level_factors", "1", "1.5", "2", "--esd_guidance", "1", "2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--forget_classes", "3", "--formulation_classes", "8"])


def _validation_cache(rates_fds, forget_class=3, seeds=(0, 1, 2)):
    """A cache whose runs read (forgotten rate, retained FD) on validation, the same on every seed."""
    return {
        f"concept/{forget_class}/{name}/{s}": {"validation": {"zoo": {"forgotten_rate": r, "retained_frechet": fd}}}
        for name, (r, fd) in rates_fds.items()
        for s in seeds
    }


def test_level_is_chosen_on_validation_at_matched_forgetting(bench):
    args = bench.parse_args([])
    cache = _validation_cache({"a": (0.05, 1.0), "b": (0.01, 2.0), "c": (0.0, 3.0)})
    choice = bench.choose_level(args, cache, 3, ["a", "b", "c"])
    assert choice["chosen"] == "b"  # "a" retains best but does not forget to the threshold
    cache = _validation_cache({"a": (0.2, 1.0), "b": (0.1, 2.0)})
    assert bench.choose_level(args, cache, 3, ["a", "b"])["chosen"] == "b"  # none forgets: the one forgetting most


def test_targets_are_computed_from_the_summary(bench):
    with open(os.path.join(REPO, "benchmarks", "unlearning", "results", "unlearning.json"), encoding="utf-8") as f:
        results = json.load(f)
    summary = results["summary"]
    rows = bench.compute_targets(summary)
    assert rows == summary["targets"]
    names = " ".join(row["name"] for row in rows)
    for needed in ("concept 3", "concept 8", "zoo classifier", "pixel-MLP judge", "ESD+retain", "data"):
        assert needed in names, needed
    for row in rows:
        expected = row["value"] <= row["threshold"] if row["comparison"] == "<=" else row["value"] >= row["threshold"]
        assert row["met"] == (math.isfinite(row["value"]) and expected)
    for forget_class, part in summary["concept"].items():
        ratio = part["reverse_kl_over_esd_retain_frechet"]["zoo"]
        headline = next(r for r in rows if r["name"].startswith(f"concept {forget_class}: reverse-KL over ESD+retain"))
        assert headline["value"] == ratio["mean"] and len(ratio["values"]) >= 3
        assert part["choices"]["reverse_kl"]["chosen"] in part["validation"]
    for key in ("zoo judge accuracy on real test digits", "mlp judge accuracy on real test digits"):
        assert summary["sanity"][key] > 0.9
    missing = bench.compute_targets({"concept": {"3": {}}})
    assert missing and not any(row["met"] for row in missing if "CPU seconds" not in row["name"])
