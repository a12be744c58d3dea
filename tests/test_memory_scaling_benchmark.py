"""benchmarks/scale/memory_scaling.py: the line fit, and a tiny run that writes a results file the docs can cite."""

import json

import pytest
from benchmark_scripts import load_benchmark


memory_scaling = load_benchmark("memory_scaling", "memory_scaling_benchmark")


def test_fit_line_recovers_a_line_and_scores_a_curve_lower():
    fit = memory_scaling.fit_line([1, 2, 4], [10 + 3 * x for x in (1, 2, 4)])
    assert fit["slope"] == pytest.approx(3) and fit["intercept"] == pytest.approx(10) and fit["r2"] == pytest.approx(1)
    assert memory_scaling.fit_line([1, 2, 4], [1, 4, 16])["r2"] < 0.99


def test_sizes_must_differ():
    with pytest.raises(SystemExit):
        memory_scaling.parse_args(["--grpo_sizes", "16", "16", "32"])


def test_a_tiny_grpo_run_writes_results_with_targets_and_extrapolations(tmp_path):
    results = memory_scaling.main(["--parts", "grpo", "--grpo_sizes", "16", "24", "32", "--output_dir", str(tmp_path)])
    written = json.loads((tmp_path / "memory_scaling.json").read_text())
    assert written["command"] == "python benchmarks/scale/memory_scaling.py --parts grpo --grpo_sizes 16 24 32"
    grpo = written["summary"]["grpo"]
    assert grpo["x"] == [16, 36, 64] and all(p > 0 for p in grpo["peak_bytes"])  # image tokens, (side / 4)^2
    assert set(grpo["extrapolated"]) == set(memory_scaling.REAL_SIZES["grpo"])
    assert [t["name"] for t in written["summary"]["targets"]] == [
        "grpo: peak memory linear in image tokens (R^2 of the fit)"
    ]
    assert "extrapolation" in (tmp_path / "memory_scaling.md").read_text()
    assert results["summary"]["grpo"]["fit"] == grpo["fit"]
