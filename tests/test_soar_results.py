"""The committed SOAR benchmark results: the issue's summary keys, targets computed from the measurements."""

import json

from benchmark_scripts import results_file


KEYS = (
    "task",
    "greedy_full_accuracy",
    "greedy_full_nfe",
    "soar_accuracy",
    "soar_nfe",
    "soar_row_forwards",
    "threshold_accuracy_at_soar_nfe",
    "pll_rescoring_accuracy",
    "headroom_any_order",
    "headroom_score_search",
    "targets",
)


def test_summary_has_the_issue_keys_and_consistent_targets():
    results = json.loads(results_file("soar.json").read_text(encoding="utf-8"))
    summary = results["summary"]
    assert all(key in summary for key in KEYS)
    assert {"name", "value", "threshold", "met"} <= set(summary["targets"][0])
    for target in summary["targets"]:
        assert target["met"] == (target["value"] >= target["threshold"]) or "<=" in target["name"]
        if "<=" in target["name"]:
            assert target["met"] == (target["value"] <= target["threshold"])
    assert summary["soar_nfe"] == results["sudoku"]["test_runs"][-4]["nfe"]
    assert results["sudoku"]["chosen_soar"]["name"] == summary["soar_setting"]
