"""The SemanticNVS benchmark's independent judge (diffusers_ext/evaluation/semantic_nvs.py) and the benchmark's
protocol pieces: labels from renders, the network's contract, training that learns, the scene bootstrap."""

import math
import os

import pytest
import torch
from benchmark_scripts import load_benchmark

from diffusers_ext.evaluation.semantic_nvs import (
    EVALUATOR_HELDOUT_SEED,
    EVALUATOR_TRAIN_SEED,
    SceneEvaluator,
    bootstrap_frechet,
    embed_views,
    evaluator_accuracy,
    evaluator_loss,
    render_single_views,
    scene_labels,
    train_scene_evaluator,
)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def semantic_nvs_benchmark():
    return load_benchmark("semantic_nvs", "nvs_bench")


def test_labels_count_classes_and_pool_log_depth():
    classes = torch.full((1, 8, 8), -1)
    classes[0, 4:] = 0  # floor: lower half
    classes[0, 4, :2] = 1  # 2 pixels of class 1: below the presence minimum
    classes[0, 6:, 6:] = 3  # 4 pixels of class 3
    depths = torch.full((1, 1, 8, 8), math.e)
    depths[0, 0, :2, :2] = 1.0
    labels = scene_labels(classes, depths)
    assert labels["presence"].tolist() == [[0.0, 0.0, 1.0, 0.0]]
    assert labels["regions"][0].tolist() == pytest.approx([0.5, 26 / 64, 2 / 64, 0.0, 4 / 64, 0.0])
    assert labels["depth"].shape == (1, 4, 4)
    assert labels["depth"][0, 0, 0].item() == pytest.approx(0.0) and labels["depth"][0, 3, 3].item() == pytest.approx(
        1
    )
    with pytest.raises(ValueError, match="disagree"):
        scene_labels(classes, depths[:, :, :4])


def test_evaluator_shapes_and_bad_input():
    torch.manual_seed(0)
    model = SceneEvaluator(16).eval()
    images = torch.rand(3, 3, 16, 16)
    out = model(images)
    assert out["presence"].shape == (3, 4) and out["regions"].shape == (3, 6) and out["depth"].shape == (3, 4, 4)
    assert embed_views(model, images, batch_size=2).shape == (3, 32)
    assert torch.allclose(embed_views(model, images, batch_size=2), model.embed(images).detach())
    with pytest.raises(ValueError, match=r"\(N, 3, 16, 16\)"):
        model.embed(torch.rand(3, 3, 32, 32))
    with pytest.raises(ValueError, match="multiple of 4"):
        SceneEvaluator(10)
    with pytest.raises(ValueError, match="`steps` must be an int >= 1"):
        train_scene_evaluator(steps=0)


def test_seed_ranges_are_disjoint_from_training_and_old_heldout_scenes():
    bench = semantic_nvs_benchmark()
    old_heldout = 10**9
    ranges = [EVALUATOR_TRAIN_SEED, EVALUATOR_HELDOUT_SEED, bench.VALIDATION_SCENE_SEED, bench.TEST_SCENE_SEED]
    assert len(set(ranges)) == len(ranges) and all(r > old_heldout + 10**6 for r in ranges)
    assert min(abs(a - b) for i, a in enumerate(ranges) for b in ranges[i + 1 :]) >= 10**7  # seeds + offsets fit


def test_short_training_learns_and_is_deterministic():
    torch.set_num_threads(1)
    data = render_single_views(EVALUATOR_TRAIN_SEED, 64)
    torch.manual_seed(0)
    untrained = SceneEvaluator(16).eval()
    with torch.no_grad():
        before = evaluator_loss(untrained(data["images"]), data).item()
    model = train_scene_evaluator(seed=0, num_views=64, steps=25, batch_size=16)
    again = train_scene_evaluator(seed=0, num_views=64, steps=25, batch_size=16)
    with torch.no_grad():
        after = evaluator_loss(model(data["images"]), data).item()
        assert torch.equal(model.embed(data["images"]), again.embed(data["images"]))
    assert after < 0.8 * before
    accuracy = evaluator_accuracy(model, data["images"], data)
    assert set(accuracy) == {"presence_accuracy", "presence_exact", "region_mae", "depth_r2", "views"}
    assert 0.0 <= accuracy["presence_exact"] <= accuracy["presence_accuracy"] <= 1.0 and accuracy["views"] == 64


def test_bootstrap_frechet_is_zero_on_identical_sets_and_pairs_a_reference():
    generator = torch.Generator().manual_seed(0)
    real = torch.randn(40, 4, generator=generator)
    same = bootstrap_frechet(real, real, groups=20, num_bootstrap=20)
    assert same["frechet"] == pytest.approx(0.0, abs=1e-9) and same["stderr"] == pytest.approx(0.0, abs=1e-9)
    near = real + 0.1 * torch.randn(40, 4, generator=generator)
    far = real + 1.0 + torch.randn(40, 4, generator=generator)
    result = bootstrap_frechet(near, real, groups=20, num_bootstrap=50, reference=far)
    assert result["frechet"] < result["reference_frechet"]
    assert 0.5 < result["relative_improvement"] <= 1.0 and result["relative_improvement_stderr"] > 0
    assert result["stderr"] > 0
    with pytest.raises(ValueError, match="groups=7"):
        bootstrap_frechet(near, real, groups=7)
    with pytest.raises(ValueError, match="`reference` has shape"):
        bootstrap_frechet(near, real, groups=20, reference=far[:10])


def test_benchmark_refuses_bad_arguments():
    bench = semantic_nvs_benchmark()
    for argv in (["--test_scenes", "4"], ["--validation_scenes", "2"], ["--seeds", "0", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    args = bench.parse_args([])
    assert len(args.seeds) >= 3 and len(args.baseline_guidance) == 6
    semantic_grid = len(args.semantic_guidance) * len(args.iterative_starts)
    assert len(args.baseline_guidance) == semantic_grid  # the baseline gets the same tuning budget


@pytest.mark.slow
def test_tiny_benchmark_run_writes_a_protocol_results_file(tmp_path):
    import json

    from diffusers_ext.evaluation.protocol import targets_status

    bench = semantic_nvs_benchmark()
    bench.main(
        [
            "--validation_scenes",
            "8",
            "--test_scenes",
            "8",
            "--seeds",
            "0",
            "1",
            "2",
            "--semantic_guidance",
            "1",
            "--iterative_starts",
            "0",
            "--baseline_guidance",
            "1",
            "--evaluator_steps",
            "5",
            "--evaluator_views",
            "32",
            "--evaluator_heldout_views",
            "16",
            "--num_inference_steps",
            "2",
            "--num_bootstrap",
            "5",
            "--cache_dir",
            str(tmp_path / "cache"),
            "--output_dir",
            str(tmp_path),
        ]
    )
    results = json.loads((tmp_path / "semantic_nvs.json").read_text(encoding="utf-8"))
    summary = results["summary"]
    assert len(summary["targets"]) == 3 and all(
        {"name", "value", "threshold", "met"} <= t.keys() for t in summary["targets"]
    )
    assert set(summary["sanity"]["judge"]) == {"seed 0", "seed 1", "seed 2"}
    assert summary["test"]["90.0"][bench.METHOD]["frechet"]["n"] == 3
    assert targets_status(summary["targets"]) in (tmp_path / "semantic_nvs.md").read_text(encoding="utf-8")
