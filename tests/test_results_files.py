"""Every committed results file's target rows are complete and computed (benchmarks/README.md, rule 5).

Each `summary.targets` row of every `benchmarks/<method>/results/*.json` (and every nested `targets` list, such as the parts
of `latent_world.json`) carries `name, value, comparison, threshold, met`, and `met` is what `value comparison
threshold` gives, recomputed here by `protocol.target`.
"""

import json
import os

import pytest
from benchmark_scripts import all_results_files

from diffusers_ext.evaluation.protocol import target


RESULTS = [str(path) for path in all_results_files("*.json")]
FIELDS = {"name", "value", "comparison", "threshold", "met"}


def target_lists(node, where="$"):
    """`(where, rows)` of every list stored under a `targets` key anywhere in `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "targets" and isinstance(value, list):
                yield f"{where}.targets", value
            else:
                yield from target_lists(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from target_lists(value, f"{where}[{i}]")


def test_results_files_exist():
    assert len(RESULTS) >= 18


@pytest.mark.parametrize("path", RESULTS, ids=os.path.basename)
def test_target_rows_are_complete_and_computed(path):
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    lists = list(target_lists(results))
    if "summary" in results and "targets" in results["summary"]:
        assert results["summary"]["targets"], f"{path}: summary.targets is empty"
    for where, rows in lists:
        for row in rows:
            assert FIELDS <= set(row), f"{path} {where}: row {row} lacks {sorted(FIELDS - set(row))}"
            expected = target(row["name"], row["value"], row["threshold"], row["comparison"])
            assert row["met"] is expected["met"], (
                f"{path} {where}: {row['name']!r} met={row['met']} but computes {expected['met']}"
            )


@pytest.mark.parametrize("path", RESULTS, ids=os.path.basename)
def test_every_results_file_with_a_summary_has_targets(path):
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    assert "targets" in results.get("summary", {}), f"{path}: no summary.targets"
