"""The connectivity benchmark (`benchmarks/connectivity/connectivity.py`): ours trained by the documented command, the
point estimates' settings chosen on validation seeds disjoint from the test seeds, MMD^2 judged at every bandwidth, a
tiny run writing every output, the `--from_results` rebuild, and the committed results."""

import json
import os
import re

import pytest
import torch
from benchmark_scripts import load_benchmark


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "connectivity", "results", "connectivity.json")
DOCS = os.path.join(ROOT, "docs", "connectivity.md")


def benchmark():
    return load_benchmark("connectivity", "connectivity_benchmark")


def test_validation_seeds_must_differ_from_test_seeds():
    bench = benchmark()
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "2", "5", "6", "--validation_seeds", "0", "1", "2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--lrrnn_steps_grid", "0", "10"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--ridge_lambda_grid", "1", "0"])
    args = bench.parse_args([])
    assert not set(args.seeds) & set(args.validation_seeds) and len(args.seeds) >= 3
    assert len(args.ridge_lambda_grid) >= 2  # the point estimate gets its penalty tuned on the judge


def test_ours_is_trained_by_the_documented_command_with_the_validated_settings():
    """The benchmark adds nothing to the documented training command but the data it shares with the baselines,
    the output folder, trackers off and the read-out noise std validation chose; the script's defaults are the
    settings validation chose (3000 steps per flow, cosine, 100 Euler steps, the committed noise std), and a user's
    pipeline samples with those Euler steps by default."""
    import inspect

    from diffusers_ext import ConnectivityPipeline
    from diffusers_ext.evaluation.reporting import load_script

    bench = benchmark()
    argv = bench.training_argv("quadstable", 106, bench.parse_args([]), "out")
    flags = {arg for arg in argv if arg.startswith("--")}
    data = {"--num_neurons", "--num_dynamics_steps", "--num_transitions", "--data_seed", "--seed"}
    assert flags == {"--dataset_name", "--output_dir", "--report_to", *data}
    script = load_script(os.path.join(ROOT, "training", "train_connectivity_flow.py"), "train_connectivity_flow")
    defaults = script.parse_args(["--output_dir", "out"])
    assert (defaults.max_train_steps, defaults.input_flow_fraction, defaults.lr_scheduler) == (6000, 0.5, "cosine")
    assert defaults.eval_inference_steps == 100
    with open(RESULTS, encoding="utf-8") as f:
        chosen = json.load(f)["chosen_settings"]["ours"]
    assert defaults.ridge_noise_std == chosen
    assert bench.training_argv("quadstable", 106, bench.parse_args([]), "out", chosen)[-2:] == [
        "--ridge_noise_std",
        f"{chosen:g}",
    ]
    call = inspect.signature(ConnectivityPipeline.__call__).parameters
    assert call["num_inference_steps"].default == defaults.eval_inference_steps
    # the data flags only restate the script's defaults: the documented command trains on the same sizes
    for flag in data - {"--data_seed", "--seed"}:
        assert int(argv[argv.index(flag) + 1]) == getattr(defaults, flag[2:])
    # and the docs' command sets no training flag of its own
    with open(DOCS, encoding="utf-8") as f:
        commands = re.findall(r"accelerate launch training/train_connectivity_flow\.py[^\n]*(?:\\\n[^\n]*)*", f.read())
    assert commands and all(
        set(re.findall(r"--\w+", command))
        <= {"--dataset_name", "--output_dir", "--train_data_file", "--resume_from_checkpoint"}
        for command in commands
    )


def test_the_judge_reports_every_bandwidth_and_their_sum():
    """MMD^2 is linear in the kernel: the summed kernel's value is the sum of the single bandwidths' values."""
    from diffusers_ext.evaluation.connectivity import BANDWIDTH_FACTORS, loading_distances

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(200, 4, generator=generator), 1.3 * torch.randn(200, 4, generator=generator)
    distances = loading_distances(a, b, 1.5)
    by_bandwidth = distances["mmd2_by_bandwidth"]
    assert list(by_bandwidth) == [f"{factor:g}" for factor in BANDWIDTH_FACTORS]
    assert sum(by_bandwidth.values()) == pytest.approx(distances["mmd2"], rel=1e-9)
    assert all(value > 0 for value in by_bandwidth.values())  # different scales: every kernel sees it
    bench = benchmark()
    improvement = {"mmd2_summed": {"z": 5.0}, "mmd2_0.25": {"z": 1.5}, "mmd2_2": {"z": 3.0}, "sliced_w2": {"z": -9}}
    assert bench.worst_kernel(improvement) == ("0.25", 1.5)  # the target reads the weakest kernel, not the sum


def test_tiny_run_chooses_on_validation_then_tests_once(tmp_path):
    bench = benchmark()
    train_args = (
        "--max_train_steps 8 --train_batch_size 16 --hidden_size 8 --readout_networks 2 --readout_neurons 30 "
        "--eval_inference_steps 2 --checkpointing_steps 100"
    )
    tiny = [
        "--ground_truths", "quadstable", "ring", "--seeds", "100", "101", "102", "--validation_seeds", "0",
        "--ridge_lambda_grid", "0.01", "1", "--lrrnn_steps_grid", "2", "4", "--ridge_noise_std_grid", "0.01", "0.001", "--num_neurons", "60",
        "--num_transitions", "200", "--num_dynamics_steps", "10", "--train_args", train_args,
        "--num_inference_steps", "2", "--lrrnn_free_transitions", "100", "--num_eval_neurons", "60",
        "--num_resamples", "2",
    ]  # fmt: skip
    results = bench.main([*tiny, "--output", str(tmp_path / "connectivity.json")])
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"connectivity{suffix}").is_file()
    choices = results["validation"]["choices"]
    assert results["validation"]["seeds"] == [0]
    for method, grid in (("ours", [0.01, 0.001]), ("ridge_m_given", [0.01, 1.0]), ("lrrnn_all_fitted", [2, 4])):
        assert [row["candidate"] for row in choices[method]["validation"]] == grid
        scores = [row["score"] for row in choices[method]["validation"]]
        assert choices[method]["chosen"]["candidate"] == grid[scores.index(min(scores))]
    assert results["chosen_settings"] == {m: r["chosen"]["candidate"] for m, r in choices.items()}
    assert {run["seed"] for run in results["runs"]} == {100, 101, 102}  # the test seeds, each run once
    assert len(results["runs"]) == 6 and all(len(run["fresh_networks_reproduce"]) == 2 for run in results["runs"])
    assert all(train_args in run["training"]["command"] for run in results["runs"])
    chosen_noise = f"--ridge_noise_std {results['chosen_settings']['ours']:g}"
    assert all(chosen_noise in run["training"]["command"] for run in results["runs"])
    targets = results["summary"]["targets"]
    assert len(targets) == 6 and sum("worst kernel" in row["name"] for row in targets) == 4
    markdown = (tmp_path / "connectivity.md").read_text()
    assert "## Validation (seeds [0]" in markdown and "fresh ground-truth networks" in markdown
    assert "MMD^2 0.25" in markdown and "Chosen: ours: noise std" in markdown and "| noise std |" in markdown
    rebuilt = bench.main(
        ["--from_results", str(tmp_path / "connectivity.json"), "--output", str(tmp_path / "re.json")]
    )
    assert rebuilt["summary"]["targets"] == results["summary"]["targets"]


def test_committed_results_were_chosen_on_validation_and_recompute():
    bench = benchmark()
    with open(RESULTS, encoding="utf-8") as f:
        results = json.load(f)
    settings = results["settings"]
    assert len(settings["seeds"]) >= 3 and not set(settings["seeds"]) & set(settings["validation_seeds"])
    assert settings["train_args"] == "" and settings["num_inference_steps"] is None  # the documented command
    choices = results["validation"]["choices"]
    assert results["chosen_settings"]["ours"] == choices["ours"]["chosen"]["candidate"]
    assert len(choices["ours"]["validation"]) == len(settings["ridge_noise_std_grid"]) >= 2
    assert results["chosen_settings"]["ridge_m_given"] == choices["ridge_m_given"]["chosen"]["candidate"]
    assert len(choices["ridge_m_given"]["validation"]) == len(settings["ridge_lambda_grid"]) >= 2
    assert bench.targets_from_results(results) == results["summary"]["targets"]
