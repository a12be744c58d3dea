"""benchmarks/graph_grpo/graph_grpo.py `--merge_from`: results files of separate dataset runs join into one report without
measuring anything, each dataset keeping the command of the run that measured it; files that do not fit together (other
settings, a dataset twice, recorded targets that do not rebuild) are refused."""

import argparse
import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from diffusers_ext.evaluation.protocol import mean_spread, targets_met


bench = load_benchmark("graph_grpo", "graph_grpo_benchmark")

KEYS = ("valid", "unique", "novel", "vun", "mmd_degree", "mmd_clustering", "mmd_spectral", "edges_mean")
KEYS += ("ratio_degree", "ratio_spectral", "ratio_ratio")


def measurements(base: float) -> dict:
    return {key: mean_spread([base + 0.01 * i for i in range(5)]) for key in KEYS}


def section(dataset: str, grpo: float) -> dict:
    """One dataset's section of a results file (made-up measurements, computed targets)."""
    part = {
        "pretraining": {"command": f"python training/train_graph_flow.py --dataset_name {dataset}", "cached": False},
        "validation": {"validation": [{"name": "lr=0.0001", "candidate": 1e-4, "score": 0.6}]},
        "runs": [
            {"seed": seed, "seconds": 3.0, "reward_curve": [0.5, 0.6], "test": {"vun": grpo}} for seed in range(5)
        ],
        "summary": {
            "pretrained": measurements(0.5),
            "pretrained_500_steps": measurements(0.55),
            "grpo": measurements(grpo),
            "learning_rate": 1e-4,
        },
    }
    part["summary"]["targets"] = bench.dataset_targets(part["summary"], dataset, 500)
    return part


def write_run(
    folder: Path, dataset: str, command: str, grpo: float = 0.7, datasets=None, reward=True, **changed
) -> Path:
    """A results file as a run of `--datasets <dataset>` (or of each of `datasets`) writes it. `reward=False` writes
    it as runs did before the shaped planar reward (no `planar_reward` setting, no `reward` in the sections)."""
    datasets = datasets or [dataset]
    skip = ("output_dir", "no_cache", "from_results", "merge_from")
    settings = {k: v for k, v in vars(bench.parse_args([])).items() if k not in skip}  # the defaults, as a run records
    settings.update(datasets=datasets, **changed)
    parts = {name: section(name, grpo) for name in datasets}
    if reward:
        for name, part in parts.items():
            part["reward"] = bench.reward_name(argparse.Namespace(**settings), name)
    else:
        settings.pop("planar_reward")
    results = {
        "command": command,
        "settings": settings,
        "code_hash": f"{dataset}-hash-0123456789",
        "datasets": parts,
        "seconds": 100.0 if dataset == "tree" else 200.0,
    }
    results["summary"] = {"targets": bench.all_targets(results)}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "graph_grpo.json"
    path.write_text(json.dumps(results))
    return path


def test_merge_keeps_each_dataset_and_its_command(tmp_path):
    tree = write_run(tmp_path / "tree", "tree", "python benchmarks/graph_grpo/graph_grpo.py")
    planar = write_run(
        tmp_path / "planar", "planar", "python benchmarks/graph_grpo/graph_grpo.py --datasets planar", grpo=0.5
    )
    before = {name: json.loads(path.read_text()) for name, path in (("tree", tree), ("planar", planar))}
    out = tmp_path / "out"
    merged = bench.main(["--merge_from", str(tree), str(planar), "--output_dir", str(out)])

    written = json.loads((out / "graph_grpo.json").read_text())
    assert written == json.loads(json.dumps(merged))
    assert list(written["datasets"]) == ["tree", "planar"] and written["settings"]["datasets"] == ["tree", "planar"]
    for name in ("tree", "planar"):
        section = dict(written["datasets"][name])
        assert section.pop("measured_by") == {
            "command": before[name]["command"],
            "code_hash": before[name]["code_hash"],
            "seconds": before[name]["seconds"],
        }
        assert section == before[name]["datasets"][name]  # the measurements, untouched
    # the targets are each file's recorded rows, in order
    assert (
        written["summary"]["targets"] == before["tree"]["summary"]["targets"] + before["planar"]["summary"]["targets"]
    )
    assert (
        written["command"]
        == "python benchmarks/graph_grpo/graph_grpo.py; python benchmarks/graph_grpo/graph_grpo.py --datasets planar"
    )
    assert [source["datasets"] for source in written["merged_from"]] == [["tree"], ["planar"]]
    assert written["seconds"] == 300.0
    met, total = targets_met(written["summary"]["targets"])
    assert total == 12 and 0 < met < total  # planar's GRPO gain (0.5 -> 0.5) is not met, tree's is
    report = (out / "graph_grpo.md").read_text()
    assert f"## Targets: {met} of {total} targets met" in report
    assert "## tree-16" in report and "## planar-16" in report and (out / "graph_grpo.png").is_file()
    assert (
        "Measured by `python benchmarks/graph_grpo/graph_grpo.py --datasets planar` (code hash `planar-hash-`"
        in report
    )

    # a merged file merges (and rebuilds) again with the same per-dataset records, not its own joined command
    again = bench.main(["--merge_from", str(out / "graph_grpo.json"), "--output_dir", str(tmp_path / "again")])
    assert again["datasets"] == written["datasets"] and again["summary"] == written["summary"]
    rebuilt = bench.main(["--from_results", str(out / "graph_grpo.json"), "--output_dir", str(tmp_path / "re")])
    assert rebuilt["summary"]["targets"] == written["summary"]["targets"]


def test_merge_refuses_files_that_do_not_fit(tmp_path):
    tree = write_run(tmp_path / "tree", "tree", "python benchmarks/graph_grpo/graph_grpo.py")
    other = write_run(
        tmp_path / "other",
        "planar",
        "python benchmarks/graph_grpo/graph_grpo.py --pretrain_steps 3000",
        pretrain_steps=3000,
    )
    with pytest.raises(ValueError, match="pretrain_steps"):
        bench.merge_results([str(tree), str(other)])
    twice = write_run(tmp_path / "twice", "tree", "python benchmarks/graph_grpo/graph_grpo.py --datasets tree")
    with pytest.raises(ValueError, match="'tree' is in an earlier file"):
        bench.merge_results([str(tree), str(twice)])
    planar = write_run(tmp_path / "planar", "planar", "python benchmarks/graph_grpo/graph_grpo.py --datasets planar")
    tampered = json.loads(planar.read_text())
    grpo_vun = tampered["datasets"]["planar"]["summary"]["grpo"]["vun"]
    grpo_vun.update(mean=0.9, values=[0.9] * 5)  # the recorded targets no longer rebuild
    planar.write_text(json.dumps(tampered))
    with pytest.raises(ValueError, match="differs from the recorded"):
        bench.merge_results([str(tree), str(planar)])
    with pytest.raises(SystemExit):
        bench.parse_args(["--merge_from", str(tree), "--from_results", str(tree)])


def test_a_dataset_is_re_measured_with_another_reward_and_merged_with_the_others_untouched(tmp_path):
    # an earlier merged-style file (tree and planar, validity rewards, written before rewards were recorded) and a
    # new planar run with the shaped reward
    earlier = write_run(
        tmp_path / "earlier",
        "tree",
        "python benchmarks/graph_grpo/graph_grpo.py",
        datasets=["tree", "planar"],
        reward=False,
    )
    shaped = write_run(
        tmp_path / "shaped",
        "planar",
        "python benchmarks/graph_grpo/graph_grpo.py --datasets planar --planar_reward planar_shaped",
        grpo=0.5,
        planar_reward="planar_shaped",
    )
    assert json.loads(shaped.read_text())["datasets"]["planar"]["reward"] == "planar_shaped"
    with pytest.raises(ValueError, match="'planar' is in an earlier file"):
        bench.merge_results([str(earlier), str(shaped)])
    with pytest.raises(ValueError, match=r"has no dataset \['tree'\]"):
        bench.merge_results([f"{shaped}:tree"])
    out = tmp_path / "out"
    merged = bench.main(["--merge_from", f"{earlier}:tree", str(shaped), "--output_dir", str(out)])
    before = json.loads(earlier.read_text())
    tree = dict(merged["datasets"]["tree"])
    assert tree.pop("measured_by")["command"] == "python benchmarks/graph_grpo/graph_grpo.py"
    assert tree == before["datasets"]["tree"]  # untouched, and naming no reward
    assert merged["datasets"]["planar"]["reward"] == "planar_shaped"
    assert [(f["datasets"], f.get("only")) for f in merged["merged_from"]] == [
        (["tree"], ["tree"]),
        (["planar"], None),
    ]
    report = (out / "graph_grpo.md").read_text()
    assert f"--merge_from {earlier}:tree".replace(str(tmp_path) + "/", "") in report
    assert "GRPO reward: `tree_validity`" in report and "GRPO reward: `planar_shaped`" in report
    rebuilt = bench.main(["--from_results", str(out / "graph_grpo.json"), "--output_dir", str(tmp_path / "re")])
    assert rebuilt["summary"]["targets"] == merged["summary"]["targets"]


def test_each_dataset_trains_with_its_reward():
    args = bench.parse_args([])
    assert bench.reward_name(args, "tree") == "tree_validity"
    assert bench.reward_name(args, "planar") == "planar_shaped"  # the reference's planar reward, by default
    argv = bench.grpo_argv(args, "planar", "pre", "out", 0, 1e-4)
    assert argv[argv.index("--reward_funcs") + 1] == "planar_shaped"
    validity = bench.parse_args(["--planar_reward", "planar_validity"])
    argv = bench.grpo_argv(validity, "planar", "pre", "out", 0, 1e-4)
    assert argv[argv.index("--reward_funcs") + 1] == "planar_validity"
    assert bench.section_reward({}, "planar") == "planar_validity"  # sections from before rewards were recorded
    assert bench.split_merge_source("a/b.json:tree,planar") == ("a/b.json", ["tree", "planar"])
    assert bench.split_merge_source("a/b.json") == ("a/b.json", None)


def test_the_committed_tree_gain_is_judged_with_the_paired_standard_error():
    """Run s of GRPO and the pretrained model's seed-s samples share their generator: the committed tree-16 per-seed
    V.U.N. give paired differences 0.075, 0.100, -0.025, 0.225, 0.025 (mean 0.080, paired SE 0.042), so the gain
    minus 2 SE is -0.004: not met (the unpaired SE made it met)."""
    from benchmark_scripts import results_file

    committed = json.loads(results_file("graph_grpo.json").read_text(encoding="utf-8"))
    summary = committed["datasets"]["tree"]["summary"]
    rows = {row["name"]: row for row in bench.dataset_targets(summary, "tree", 500)}
    gain = rows["tree: GRPO V.U.N. gain minus 2 paired SE"]
    assert gain["value"] == pytest.approx(0.080 - 2 * 0.04213, abs=1e-4) and not gain["met"]
    unpaired = {row["name"]: row for row in bench.dataset_targets(summary, "tree", 500, pairing="unpaired")}
    assert unpaired["tree: GRPO V.U.N. gain minus 2 SE"]["met"]  # what the file recorded before
    assert committed["summary"]["difference_se"].startswith("paired")


def test_a_file_with_unpaired_rows_is_checked_as_recorded_then_rebuilt_paired(tmp_path):
    path = write_run(tmp_path / "old", "tree", "python benchmarks/graph_grpo/graph_grpo.py")
    old = json.loads(path.read_text())
    old["summary"]["targets"] = bench.all_targets(old, "unpaired")
    path.write_text(json.dumps(old))
    rebuilt = bench.rebuild(str(path))
    names = [row["name"] for row in rebuilt["summary"]["targets"]]
    assert "tree: GRPO V.U.N. gain minus 2 paired SE" in names and not any(n.endswith("minus 2 SE") for n in names)
    assert rebuilt["rebuilt_from_results"]["replaced_rows"]["tree: GRPO V.U.N. gain minus 2 SE"] == [
        "tree: GRPO V.U.N. gain minus 2 paired SE"
    ]
    old["datasets"]["tree"]["summary"]["grpo"]["vun"]["mean"] = 0.1  # a tampered legacy file is still caught
    path.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="differs from the recorded"):
        bench.rebuild(str(path))
