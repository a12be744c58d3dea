"""benchmarks/unlearning/latent_world_unlearning.py: the validation choice rule, the grid, and a tiny end-to-end run (slow)."""

import argparse
import json
import os

import pytest
from benchmark_scripts import load_benchmark

from diffusers_ext.evaluation.protocol import targets_status


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    return load_benchmark("latent_world_unlearning", "latent_unlearn_bench")


def _run(name, method, rate, fd):
    return {"name": name, "method": method, "forget_rate": rate, "retained_frechet": fd}


def test_choice_is_the_lowest_fd_among_settings_that_forget_else_the_most_forgetting():
    bench = _bench()
    runs = [
        _run("reverse_kl x0.5", "reverse_kl", 0.01, 3.0),
        _run("reverse_kl x1", "reverse_kl", 0.0, 2.0),
        _run("likelihood x0.5", "likelihood", 0.10, 1.0),
        _run("likelihood x1", "likelihood", 0.05, 9.0),
        _run("forward_kl x1", "forward_kl", 0.02, 5.0),
        _run("esd eta=0.5", "esd", 0.30, 0.5),
        _run("esd eta=1", "esd", 0.0, 4.0),
        _run("siss w=1", "siss", 0.5, 1.0),
    ]
    chosen = bench.choose({r["name"]: r for r in runs}, target=0.02, methods=bench.METHODS)
    assert {m: c["name"] for m, c in chosen.items()} == {
        "reverse_kl": "reverse_kl x1",
        "likelihood": "likelihood x1",
        "forward_kl": "forward_kl x1",
        "esd": "esd eta=1",
        "siss": "siss w=1",
    }
    assert (
        chosen["reverse_kl"]["meets_target_on_validation"] and not chosen["likelihood"]["meets_target_on_validation"]
    )


def test_every_method_gets_its_grid_with_the_same_retain_term():
    bench = _bench()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--retain_weight", "3", "--esd_etas", "1", "2"])
    runs = bench.grid(args)
    assert {method for _, method, _, _ in runs} == {*bench.CONSTRAINED, *bench.BASELINES}
    assert all(overrides["retain_weight"] == 3 for _, _, overrides, _ in runs)
    assert [o["esd_negative_guidance"] for _, m, o, _ in runs if m == "esd"] == [1.0, 2.0]
    assert all((factor is None) == (method in bench.BASELINES) for _, method, _, factor in runs)


def test_a_method_subset_keeps_only_its_grid_and_must_keep_the_compared_pair():
    bench = _bench()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--unlearn_methods", "reverse_kl", "esd", "siss"])
    assert {method for _, method, _, _ in bench.grid(args)} == {"reverse_kl", "esd", "siss"}
    bench.check_arguments(args)
    for methods in (["esd", "siss"], ["reverse_kl", "siss"]):
        args = parser.parse_args(["--unlearn_methods", *methods])
        with pytest.raises(ValueError, match="--unlearn_methods"):
            bench.check_arguments(args)


def test_an_unknown_model_is_refused_with_the_zoo_names():
    bench = _bench()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--unlearn_model", "no-such-model"])
    with pytest.raises(ValueError, match="--unlearn_model 'no-such-model'.*mosaic-t2i-64"):
        bench.check_arguments(args)
    assert bench.model_folder("mosaic-t2i-64").endswith(os.path.join("zoo", "mosaic-t2i-64"))


@pytest.mark.slow
def test_tiny_run_writes_a_protocol_results_file(tmp_path):
    bench = _bench()
    bench.main(
        [
            "--unlearn_steps",
            "1",
            "--unlearn_seeds",
            "0",
            "1",
            "--num_train_prompts",
            "2",
            "--val_prompts",
            "2",
            "--test_forget_prompts",
            "2",
            "--test_retain_prompts",
            "3",
            "--feature_steps",
            "2",
            "--unlearn_pool_size",
            "4",
            "--unlearn_batch_size",
            "2",
            "--unlearn_inference_steps",
            "1",
            "--level_factors",
            "1",
            "--forward_kl_factors",
            "1",
            "--esd_etas",
            "1",
            "--siss_weights",
            "1",
            "--output_dir",
            str(tmp_path),
            "--unlearn_cache_dir",
            str(tmp_path / "cache"),
        ]
    )
    with open(tmp_path / "latent_world_unlearning.json", encoding="utf-8") as f:
        results = json.load(f)
    summary = results["summary"]
    assert len(summary["targets"]) == 4 and {"value", "threshold", "met"} <= summary["targets"][0].keys()
    assert "second judge" in summary["targets"][1]["name"]
    assert summary["targets"][1]["value"] == summary["test"]["reverse_kl"]["forget_rate_classifier"]["mean"]
    assert set(summary["test"]) == {*bench.CONSTRAINED, *bench.BASELINES}
    assert summary["test"]["esd"]["num_seeds"] == 2
    assert summary["sanity"]["judge_concept_rate_on_real_renders_of_its_prompts"] == 1.0
    assert targets_status(summary["targets"]) in (tmp_path / "latent_world_unlearning.md").read_text()
    assert (tmp_path / "latent_world_unlearning.png").stat().st_size > 0
