"""benchmarks/divide_and_denoise/mosaic_divide_and_denoise.py and the shared composition sampler on a tiny untrained
StableDiffusionPipeline: every method runs from paired latents, grids respect the tuning budget, targets are computed
from what was measured."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark


bench = load_benchmark("mosaic_divide_and_denoise", "mosaic_divide_and_denoise_benchmark")


def test_strip_regions_partition_the_canvas_left_to_right():
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import strip_regions

    regions = strip_regions(3, 16)
    assert regions.shape == (3, 16, 16)
    assert torch.equal(regions.sum(dim=0), torch.ones(16, 16))
    columns = [regions[k, 0].nonzero().flatten() for k in range(3)]
    assert [int(c.min()) for c in columns] == [0, 5, 11] and [int(c.max()) for c in columns] == [4, 10, 15]
    assert torch.equal(regions[:, 0], regions[:, 15])  # vertical strips: every row alike
    with pytest.raises(ValueError, match="num_objects"):
        strip_regions(0, 16)


def test_grids_keep_the_tuning_budget_in_order_and_the_oracle_its_own_grid(tiny_sd_pipeline_folder):
    args = bench.parse_args(
        ["--model_path", str(tiny_sd_pipeline_folder), "--tuning_budget", "5", "--guidance_grid", "2", "3"]
        + ["--oracle_configs", "16,2,1.0,16", "8,1,0.5,1", "--oracle_guidance", "2", "4"]
    )
    grids = bench.method_grids(args)
    assert [c["guidance"] for c in grids["whole_prompt"]] == [2.0, 3.0]
    assert len(grids["multidiffusion"]) == 5 and len(grids["divide_and_denoise"]) == 5
    first = grids["divide_and_denoise"][0]
    assert first == {
        "guidance": 2.0,
        "utility": "cross_attention",
        "allocator": "proportional_response",
        "alignment_scale": 0.1,
    }
    assert len(grids["oracle_layout"]) == 4  # not truncated: an upper reference, not a competitor
    assert grids["oracle_layout"][0] == {
        "window": 16,
        "margin": 2,
        "bootstrap": 1.0,
        "resampling": 16,
        "guidance": 2.0,
    }


@pytest.mark.parametrize(
    "bad",
    [
        ["--utilities", "nope"],
        ["--bootstrap_grid", "1.5"],
        ["--resampling_grid", "0"],
        ["--guidance_grid", "0.5"],
        ["--oracle_configs", "16,2"],
        ["--oracle_configs", "16,2,1.5,4"],
        ["--tuning_budget", "0"],
    ],
)
def test_bad_settings_are_refused_before_loading(tiny_sd_pipeline_folder, bad):
    with pytest.raises((SystemExit, ValueError)):
        bench.parse_args(["--model_path", str(tiny_sd_pipeline_folder), *bad])


def test_a_folder_that_is_not_a_pipeline_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tmp_path)])


def test_methods_share_their_initial_latents(tiny_sd_pipeline_folder):
    """Paired comparisons: the whole prompt and composable diffusion with one agent are the same sampler on the same
    noise when the sub-prompt is the whole caption."""
    from diffusers import StableDiffusionPipeline

    from diffusers_ext import AverageAllocator
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import CompositionSampler

    pipe = StableDiffusionPipeline.from_pretrained(tiny_sd_pipeline_folder)
    pipe.set_progress_bar_config(disable=True)
    config = MosaicConfig(resolution=pipe.vae.config.sample_size)
    sampler = CompositionSampler(pipe, config, {"test": 3}, num_inference_steps=2)
    prompts = [{"caption": "a red circle", "sub_prompts": ["a red circle"]}]
    whole = sampler.single_prompt(prompts, 3.0, "test")
    averaged = sampler.divide_and_denoise(prompts, 3.0, "test", allocator=AverageAllocator())
    assert whole.shape == averaged.shape == (1, config.resolution, config.resolution, 3)
    np.testing.assert_allclose(whole, averaged, atol=1e-4)
    assert torch.equal(sampler.latents(0, "test"), sampler.latents(0, "test"))
    assert not torch.equal(sampler.latents(0, "test"), sampler.latents(1, "test"))


def test_a_tiny_run_measures_every_method_and_rebuilds(tiny_sd_pipeline_folder, tmp_path):
    argv = ["--model_path", str(tiny_sd_pipeline_folder), "--validation_prompts", "1", "--test_prompts", "2"]
    argv += ["--num_inference_steps", "1", "--guidance_grid", "3", "--bootstrap_grid", "0.4", "--resampling_grid", "1"]
    argv += [
        "--utilities",
        "cross_attention",
        "guidance_delta",
        "--allocators",
        "proportional_response",
        "--alignment_grid",
        "1.0",
    ]
    argv += ["--oracle_configs", "4,1,1.0,1", "--output_dir", str(tmp_path)]
    results = bench.main(argv)
    methods = results["summary"]["methods"]
    assert list(methods) == list(bench.METHODS)
    for method, record in methods.items():
        assert len(record["validation"]) == (2 if method == "divide_and_denoise" else 1)
        assert record["test"]["n"] == 2
        assert 0 <= record["test"]["overall_standard_error"] <= 0.5
    targets = results["summary"]["targets"]
    dnd, whole = methods["divide_and_denoise"]["test"]["overall"], methods["whole_prompt"]["test"]["overall"]
    assert targets[0]["value"] == pytest.approx(dnd - whole) and targets[0]["threshold"] == 0.2
    best = max(methods[m]["test"]["overall"] for m in bench.BASELINES)
    assert targets[1]["value"] == pytest.approx(dnd - best) and targets[1]["threshold"] == 0.1
    written = json.loads((tmp_path / "mosaic_divide_and_denoise.json").read_text())
    assert "--model_path" not in written["command"] and "--output_dir" not in written["command"]
    assert written["model"]["name"] == Path(tiny_sd_pipeline_folder).name
    assert "Divide-and-Denoise" in (tmp_path / "mosaic_divide_and_denoise.md").read_text()
    rebuilt = bench.main(
        ["--from_results", str(tmp_path / "mosaic_divide_and_denoise.json"), "--output_dir", str(tmp_path)]
    )
    assert [r["value"] for r in rebuilt["summary"]["targets"]] == [r["value"] for r in targets]


def test_object_token_indices_point_at_each_agents_colour_and_shape_words(tiny_sd_pipeline_folder):
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(tiny_sd_pipeline_folder, subfolder="tokenizer")
    prompt = {
        "sub_prompts": ["a red circle", "a blue square"],
        "agent_groups": [{"colour": "red", "shape": "circle"}, {"colour": "blue", "shape": "square"}],
    }
    indices = bench.object_token_indices(tokenizer, prompt)
    for sub_prompt, group, positions in zip(prompt["sub_prompts"], prompt["agent_groups"], indices):
        ids = tokenizer(sub_prompt).input_ids
        words = tokenizer(group["colour"], add_special_tokens=False).input_ids
        words += tokenizer(group["shape"], add_special_tokens=False).input_ids
        assert [ids[i] for i in positions] == words
        assert 0 not in positions and ids[1] not in [ids[i] for i in positions]  # neither BOS nor "a"
    prompt["agent_groups"][0]["colour"] = "green"
    with pytest.raises(ValueError, match="'green' is not among the tokens"):
        bench.object_token_indices(tokenizer, prompt)
