"""The shared benchmark reporting module: command, results files, rebuild, cache, validation grid, worker pool."""

import json
import os

import pytest

from diffusers_ext.evaluation.protocol import target
from diffusers_ext.evaluation.reporting import (
    ResultCache,
    choose_on_validation,
    command,
    rebuild_results,
    run_jobs,
    targets_table,
    without_machine_paths,
    write_results,
)


def test_command_is_one_spelling():
    assert command("/x/benchmarks/soar/soar.py", ["--seed", "1"]) == "python benchmarks/soar/soar.py --seed 1"
    # the path below the nearest `benchmarks` folder: a script in its method's folder, or a flat one
    assert command("/r/benchmarks/zoo/zoo.py", []) == "python benchmarks/zoo/zoo.py"
    assert command("/r/benchmarks/scale/../zoo/zoo.py", []) == "python benchmarks/zoo/zoo.py"
    assert command("zoo.py", []) == "python benchmarks/zoo.py"
    omitted = command("x.py", ["--out", "results/a", "--seed", "1", "--out=results/b"], omit=("--out",))
    assert omitted == "python benchmarks/x.py --seed 1"
    with pytest.raises(ValueError, match="script"):
        command("zoo", [])


def test_write_results_outputs(tmp_path):
    results = {
        "command": command("demo.py", ["--quick"]),
        "summary": {"targets": [target("a | b", 0.5, 0.4), target("c", 2.0, 1.0, "<=")]},
    }
    drawn = []
    stem = str(tmp_path / "out" / "demo")
    write_results(
        stem,
        results,
        "Demo",
        sections=["## More", "", "text"],
        settings_line="seed 0",
        figures={".png": lambda path: drawn.append(path) or open(path, "w").close()},
    )
    with open(stem + ".json") as f:
        assert json.load(f) == results
    markdown = open(stem + ".md").read()
    assert markdown.startswith("# Demo\n\nCommand: `python benchmarks/demo.py --quick` (")
    assert "seed 0" in markdown and "## Targets: 1 of 2 targets met" in markdown and "## More" in markdown
    assert "| a \\| b | 0.5 | >= 0.4 | yes |" in markdown
    assert "| c | 2 | <= 1 | no |" in markdown
    assert drawn == [stem + ".png"] and "![demo.png](demo.png)" in markdown
    assert markdown.count("| target | value | threshold | met |") == 1


def test_targets_table_needs_protocol_rows():
    with pytest.raises(ValueError, match="comparison"):
        targets_table([{"name": "x", "value": 1.0, "threshold": 1.0, "met": True}])
    row = targets_table([target("x", float("inf"), 1.0, "<=")])[2]
    assert row == "| x | inf | <= 1 | no |"


def test_rebuild_results_adds_comparison_and_keeps_values(tmp_path):
    path = tmp_path / "r.json"
    old = {
        "command": "python benchmarks/x.py",
        "m": 0.7,
        "summary": {"targets": [{"name": "m >= 0.5", "value": 0.7, "threshold": 0.5, "met": True}]},
    }
    path.write_text(json.dumps(old))
    rebuilt = rebuild_results(str(path), lambda r: [target("m >= 0.5", r["m"], 0.5)], rel_to=str(tmp_path))
    assert rebuilt["summary"]["targets"][0]["comparison"] == ">="
    assert rebuilt["command"] == old["command"] and rebuilt["rebuilt_from_results"]["file"] == "r.json"
    with pytest.raises(ValueError, match="differs"):
        rebuild_results(str(path), lambda r: [target("m >= 0.5", r["m"], 0.8)])
    with pytest.raises(ValueError, match="rows"):
        rebuild_results(str(path), lambda r: [])


def test_result_cache_hits_and_misses(tmp_path):
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    root = str(tmp_path / "cache")
    cache = ResultCache(root, {"steps": 10}, [str(code)])
    calls = []
    value, hit = cache.get_or_compute("run", lambda: calls.append(1) or {"loss": 0.5})
    assert (value, hit) == ({"loss": 0.5}, False)
    value, hit = ResultCache(root, {"steps": 10}, [str(code)]).get_or_compute("run", lambda: calls.append(1) or {})
    assert (value, hit) == ({"loss": 0.5}, True) and len(calls) == 1
    assert ResultCache(root, {"steps": 11}, [str(code)]).load("run") is None  # changed setting
    code.write_text("x = 2\n")
    assert ResultCache(root, {"steps": 10}, [str(code)]).load("run") is None  # changed code
    code.write_text("x = 1\n")
    assert ResultCache(root, {"steps": 10}, [str(code)], enabled=False).load("run") is None
    assert os.path.dirname(cache.path("w.safetensors")) == cache.folder


def test_choose_on_validation_picks_validation_best_and_tests_once():
    calls = []

    def measure(candidate, split):
        calls.append((candidate, split))
        return {
            "accuracy": {"validation": {1: 0.2, 2: 0.9, 3: 0.9}, "test": {1: 1.0, 2: 0.5, 3: 0.1}}[split][candidate]
        }

    record = choose_on_validation([1, 2, 3], measure, score=lambda m: m["accuracy"])
    assert record["chosen"] == {"name": "2", "candidate": 2, "score": 0.9}  # tie: the earlier one
    assert record["test"] == {"accuracy": 0.5}
    assert [c for c in calls if c[1] == "test"] == [(2, "test")]
    assert [v["candidate"] for v in record["validation"]] == [1, 2, 3]
    lowest = choose_on_validation([1, 2, 3], measure, score=lambda m: m["accuracy"], maximize=False)
    assert lowest["chosen"]["candidate"] == 1
    calls.clear()
    frozen = choose_on_validation([1, 2, 3], measure, score=lambda m: m["accuracy"], test=False)
    assert frozen["test"] is None and {split for _, split in calls} == {"validation"}
    with pytest.raises(ValueError, match="candidates"):
        choose_on_validation([], measure, score=len)


def _add(a, b):
    return a + b


def test_run_jobs_in_process_and_in_order():
    assert run_jobs(_add, [(1, 2), (3, 4)]) == [3, 7]
    with pytest.raises(ValueError, match="workers"):
        run_jobs(_add, [(1, 2)], workers=0)


def test_without_machine_paths_keeps_only_the_last_component_of_absolute_paths():
    assert without_machine_paths("python t.py --output_dir /tmp/runs/x4/ --lr 2e-3 --data rel/dir") == (
        "python t.py --output_dir x4 --lr 2e-3 --data rel/dir"
    )
    assert without_machine_paths("/work/wt/steel-runs/r1") == "r1"
