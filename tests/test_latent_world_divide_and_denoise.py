"""benchmarks/divide_and_denoise/latent_world_divide_and_denoise.py: its prompts need every expert, the oracle layout covers each
expert's object, every method gets a validation grid, and a tiny `run()` (slow) returns a computed targets list."""

import argparse
import os

import pytest
import torch
from benchmark_scripts import load_benchmark

from diffusers_ext.data.mosaic import MosaicConfig
from diffusers_ext.evaluation.protocol import targets_status


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    return load_benchmark("latent_world_divide_and_denoise", "latent_dnd_bench")


def _args(bench, argv=()):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_prompts_need_every_expert_and_give_each_its_own_sub_prompt():
    bench = _bench()
    shapes = ("circle", "square", "triangle")
    prompts = bench.make_prompts(shapes, 5, seed=1, colours=MosaicConfig().colours)
    assert prompts == bench.make_prompts(shapes, 5, seed=1, colours=MosaicConfig().colours)  # deterministic
    for prompt in prompts:
        assert sorted(g["shape"] for g in prompt["groups"]) == sorted(shapes)
        assert len({g["colour"] for g in prompt["groups"]}) == 3  # distinct colours
        for shape, group, sub in zip(shapes, prompt["agent_groups"], prompt["sub_prompts"]):
            assert group["shape"] == shape and sub == f"a {group['colour']} {shape}"
            assert sub in prompt["caption"]


def test_oracle_layout_gives_each_expert_its_object_box():
    bench = _bench()
    prompt = bench.make_prompts(("circle", "square"), 1, seed=2, colours=MosaicConfig().colours)[0]
    regions = bench.oracle_regions(prompt, seed=3, latent_size=8, resolution=32)
    assert regions.shape == (2, 8, 8)
    assert (regions.flatten(1).sum(dim=1) >= 1).all()  # every expert has a region
    assert regions.sum(dim=0).min() == 0  # the background is left to the allocator (shared equally)
    assert torch.equal(regions, bench.oracle_regions(prompt, seed=3, latent_size=8, resolution=32))


def test_every_method_is_tuned_on_the_same_guidance_grid():
    bench = _bench()
    args = _args(bench)
    grids = {m: bench.method_configs(m, args) for m in bench.methods_for(3)}
    guidance = sorted(set(args.dnd_guidance_grid))
    for method, configs in grids.items():
        assert sorted({c["guidance"] for c in configs}) == guidance, method
    # the methods with a second knob get the same number of configurations
    assert len(grids["divide_and_denoise"]) == len(grids["averaging"]) == len(grids["multidiffusion"])


@pytest.mark.slow
def test_tiny_run_returns_a_computed_targets_list(tmp_path):
    bench = _bench()
    args = _args(
        bench,
        [
            "--dnd_seeds",
            "0",
            "--dnd_finetune_steps",
            "2",
            "--dnd_finetune_samples",
            "8",
            "--dnd_val_prompts",
            "1",
            "--dnd_test_prompts",
            "1",
            "--dnd_images",
            "1",
            "--dnd_steps",
            "2",
            "--dnd_sanity_images",
            "1",
            "--dnd_guidance_grid",
            "4",
            "--dnd_cache_dir",
            str(tmp_path),
        ],
    )
    results = bench.run(args)
    targets = results["summary"]["targets"]
    assert [t["threshold"] for t in targets] == [0.2, 0.2]
    assert targets_status(targets).endswith("targets met")
    assert "all_experts_best_on_their_own_shape" in results["summary"]["sanity"]
    results["command"] = "cmd"
    bench.write_report(results, str(tmp_path / "r"))
    assert targets_status(targets) in (tmp_path / "r.md").read_text()
