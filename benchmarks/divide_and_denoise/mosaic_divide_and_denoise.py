#!/usr/bin/env python
"""Divide-and-Denoise on the 64x64 mosaic world: one model, one prompt per object, three objects in one image.

    python benchmarks/divide_and_denoise/mosaic_divide_and_denoise.py --model_path diffusers_ext/zoo/mosaic-t2i-64

The composition condition the world's headroom met (`benchmarks/mosaic/results/mosaic_headroom.md`): on prompts naming a
circle, a square and a triangle in three colours, the model on the whole prompt draws 0 of 40 test images right. The
agents are the same model with one sub-prompt per object ("a red circle", ...;
`evaluation.divide_and_denoise.mosaic_composition.make_prompts`). Methods, all from the same initial latents
(`CompositionSampler`, the headroom's sampler):

- **whole prompt**: the pipeline on the caption;
- **composable diffusion**: the agents' guided predictions averaged everywhere (`AverageAllocator`);
- **MultiDiffusion, default strips**: region-based MultiDiffusion (`RegionMultiDiffusion`) on equal vertical strips,
  one sub-prompt per strip, with its bootstrapping and resampling tuned;
- **Divide-and-Denoise**: `DivideAndDenoisePipeline`, the fair division of every step (utility, allocator,
  alignment tuned); the cross-attention utility reads each agent's object words (colour and shape), as
  Attend-and-Excite's `token_indices`;
- **MultiDiffusion, oracle layout** (upper reference, told where each object goes): `WindowMultiDiffusion` with
  each object's box from a real mosaic placement.

Protocol: every method's settings are chosen on validation prompts (the mosaic stream with seed 1000), then the test
prompts (seed 2000) are judged once with the frozen choices. The prompts, latents and counts are the headroom's, so
the whole prompt and oracle rows can be checked against it. Every non-oracle method gets up to `--tuning_budget`
validation settings (its grid, truncated in order if longer); the oracle reference's grid is `--oracle_configs` x
`--oracle_guidance` (by default the single setting the headroom chose on these validation prompts). Judge: the exact
`MosaicEvaluator` (object, colour, overall: every named object present once in its colour), independent of every
method. Standard errors are binomial over the test images. No training is involved (one sample per prompt; no seeds
beyond the paired latents).

Targets (overall judge accuracy, test): D&D >= whole prompt + 0.2; D&D >= the best non-oracle baseline + 0.1. The
gap to the oracle layout is reported. Writes `benchmarks/divide_and_denoise/results/mosaic_divide_and_denoise.{json,md}`.
"""

import argparse
import itertools
import os

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "mosaic_divide_and_denoise"
SPLIT_SEEDS = {"validation": 1000, "test": 2000}
SHAPES = ("circle", "square", "triangle")
BASELINES = ("whole_prompt", "composable", "multidiffusion")
METHODS = (*BASELINES, "divide_and_denoise", "oracle_layout")
LABELS = {
    "whole_prompt": "whole prompt",
    "composable": "composable diffusion (average)",
    "multidiffusion": "MultiDiffusion, default strips",
    "divide_and_denoise": "Divide-and-Denoise",
    "oracle_layout": "MultiDiffusion, oracle layout (upper reference)",
}
SINGLE_PROMPT_MARGIN = 0.2
BASELINE_MARGIN = 0.1
ALLOCATORS = {
    # the pipeline's default: proportional response (Nash welfare), 20 warm-started iterations, blur sigma 1
    "proportional_response": {
        "solver": "proportional_response",
        "num_iterations": 20,
        "tol": 1e-4,
        "spatial_sigma": 1,
    },
    # equal-area entropic OT, smoother maps, sharpened to a hard split after a fifth of the steps
    "sinkhorn_annealed": {"solver": "sinkhorn", "num_iterations": 50, "spatial_sigma": 2, "anneal_start": 0.2},
}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument
    from diffusers_ext.utils import check_positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", default=None, help="A StableDiffusionPipeline folder of the mosaic world.")
    parser.add_argument("--validation_prompts", type=int, default=20, help="Validation prompts.")
    parser.add_argument("--test_prompts", type=int, default=40, help="Test prompts.")
    parser.add_argument("--num_inference_steps", type=int, default=25)
    parser.add_argument("--guidance_grid", type=float, nargs="+", default=[2.0, 3.0, 5.0])
    parser.add_argument(
        "--bootstrap_grid", type=float, nargs="+", default=[0.0, 0.4, 1.0], help="MultiDiffusion bootstrap shares."
    )
    parser.add_argument(
        "--resampling_grid", type=int, nargs="+", default=[1, 4], help="MultiDiffusion passes per step."
    )
    parser.add_argument(
        "--utilities", nargs="+", default=["cross_attention", "guidance_delta"], help="D&D utilities tried."
    )
    parser.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    parser.add_argument(
        "--alignment_grid", type=float, nargs="+", default=[0.1, 1.0], help="D&D alignment scales tried."
    )
    parser.add_argument("--max_iter_to_align", type=int, default=15, help="D&D steps that align.")
    parser.add_argument(
        "--tuning_budget", type=int, default=24, help="Validation settings each non-oracle method may try."
    )
    parser.add_argument(
        "--oracle_configs",
        nargs="+",
        default=["16,2,1.0,16"],
        help="Oracle-layout settings `window,margin,bootstrap,resampling` (the headroom's validation choice).",
    )
    parser.add_argument("--oracle_guidance", type=float, nargs="+", default=[2.0])
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in ("validation_prompts", "test_prompts", "num_inference_steps", "tuning_budget", "batch_size"):
        check_positive_int(name, getattr(args, name))
    if any(g < 1 for g in [*args.guidance_grid, *args.oracle_guidance]):
        parser.error(f"guidance values must be >= 1, got {args.guidance_grid} and {args.oracle_guidance}.")
    if any(not 0 <= b <= 1 for b in args.bootstrap_grid):
        parser.error(f"--bootstrap_grid values must be in [0, 1], got {args.bootstrap_grid}.")
    if any(r < 1 for r in args.resampling_grid):
        parser.error(f"--resampling_grid values must be >= 1, got {args.resampling_grid}.")
    from diffusers_ext.pipelines.divide_and_denoise.utilities import UTILITIES

    unknown = [u for u in args.utilities if u not in UTILITIES]
    if unknown:
        parser.error(f"--utilities {unknown} are not D&D utilities; expected a subset of {list(UTILITIES)}.")
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import parse_oracle_config

    try:
        args.oracle_configs = [parse_oracle_config(text) for text in args.oracle_configs]
    except ValueError as error:
        parser.error(f"--oracle_configs: {error}")
    if args.from_results is None:
        if args.model_path is None:
            parser.error("--model_path is required (a StableDiffusionPipeline folder of the mosaic world).")
        if not os.path.isfile(os.path.join(args.model_path, "model_index.json")):
            parser.error(f"--model_path {args.model_path!r} is not a pipeline folder (no model_index.json).")
    return args


def method_grids(args) -> dict[str, list[dict]]:
    """Every method's validation grid, in the order it is tried; a non-oracle grid longer than the tuning budget keeps
    its first `--tuning_budget` settings."""
    guidance = [{"guidance": g} for g in args.guidance_grid]
    grids = {
        "whole_prompt": guidance,
        "composable": guidance,
        "multidiffusion": [
            {"guidance": g, "bootstrap": b, "resampling": r}
            for r, b, g in itertools.product(args.resampling_grid, args.bootstrap_grid, args.guidance_grid)
        ],
        "divide_and_denoise": [
            {"guidance": g, "utility": u, "allocator": a, "alignment_scale": s}
            for a, s, u, g in itertools.product(
                args.allocators, args.alignment_grid, args.utilities, args.guidance_grid
            )
        ],
    }
    grids = {method: grid[: args.tuning_budget] for method, grid in grids.items()}
    grids["oracle_layout"] = [dict(config, guidance=g) for config in args.oracle_configs for g in args.oracle_guidance]
    return grids


def object_token_indices(tokenizer, prompt: dict) -> list[list[int]]:
    """Per agent, the positions of its object's words (colour and shape) in its sub-prompt's tokens: the concept
    tokens the cross-attention utility reads (Attend-and-Excite's `token_indices`; "a" attends everywhere)."""
    indices = []
    for sub_prompt, group in zip(prompt["sub_prompts"], prompt["agent_groups"]):
        ids = tokenizer(sub_prompt).input_ids
        positions = []
        for word in (group["colour"], group["shape"]):
            word_ids = tokenizer(word, add_special_tokens=False).input_ids
            starts = [i for i in range(len(ids)) if ids[i : i + len(word_ids)] == word_ids]
            if not starts:
                raise ValueError(f"the word {word!r} is not among the tokens of the sub-prompt {sub_prompt!r}.")
            positions += range(starts[0], starts[0] + len(word_ids))
        indices.append(positions)
    return indices


def sample_method(sampler, method: str, prompts: list[dict], candidate: dict, split: str, args):
    """Images `(N, H, W, 3)` of `method` with the settings `candidate` on `prompts`."""
    from diffusers_ext import AverageAllocator, FairDivisionAllocator

    guidance = candidate["guidance"]
    if method == "whole_prompt":
        return sampler.single_prompt(prompts, guidance, split)
    if method == "composable":
        return sampler.divide_and_denoise(prompts, guidance, split, allocator=AverageAllocator())
    if method == "multidiffusion":
        return sampler.region_multidiffusion(prompts, guidance, candidate["bootstrap"], candidate["resampling"], split)
    if method == "divide_and_denoise":
        return np.concatenate(
            [
                sampler.divide_and_denoise(
                    [prompt],
                    guidance,
                    split,
                    index=index,
                    allocator=FairDivisionAllocator(**ALLOCATORS[candidate["allocator"]]),
                    utility=candidate["utility"],
                    token_indices=object_token_indices(sampler.pipe.tokenizer, prompt)
                    if candidate["utility"] == "cross_attention"
                    else None,
                    alignment_scale=candidate["alignment_scale"],
                    max_iter_to_align=args.max_iter_to_align,
                )
                for index, prompt in enumerate(prompts)
            ]
        )
    if method == "oracle_layout":
        return sampler.oracle_layout(prompts, candidate, split)
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}.")


def measure_all(pipe, config, args) -> dict:
    """Every method chosen on validation, then judged once on test: `{method: choose_on_validation record}`."""
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import CompositionSampler, make_prompts
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize
    from diffusers_ext.evaluation.protocol import binomial_standard_error
    from diffusers_ext.evaluation.reporting import choose_on_validation

    judge = MosaicEvaluator(config)
    sampler = CompositionSampler(pipe, config, SPLIT_SEEDS, args.num_inference_steps, args.batch_size)
    counts = {"validation": args.validation_prompts, "test": args.test_prompts}
    prompts = {split: make_prompts(SHAPES, counts[split], SPLIT_SEEDS[split], config.colours) for split in counts}
    record = {}
    for method, grid in method_grids(args).items():

        def measure(candidate, split, method=method):
            images = sample_method(sampler, method, prompts[split], candidate, split, args)
            summary = summarize([judge.evaluate(image, p) for image, p in zip(images, prompts[split])])
            summary["overall_standard_error"] = binomial_standard_error(summary["overall"], summary["n"])
            return summary

        record[method] = choose_on_validation(
            grid, measure, score=lambda m: m["overall"], names=lambda c: ", ".join(f"{k} {v}" for k, v in c.items())
        )
        chosen, test = record[method]["chosen"], record[method]["test"]
        print(f"{method}: {chosen['name']} (validation {chosen['score']:.3f}); test {test['overall']:.3f}", flush=True)
    return record


def composition_targets(record: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    dnd = record["divide_and_denoise"]["test"]["overall"]
    whole = record["whole_prompt"]["test"]["overall"]
    best = max(BASELINES, key=lambda m: record[m]["test"]["overall"])
    return [
        target("D&D minus whole prompt (overall, test)", dnd - whole, SINGLE_PROMPT_MARGIN),
        target(
            f"D&D minus the best non-oracle baseline ({LABELS[best]}) (overall, test)",
            dnd - record[best]["test"]["overall"],
            BASELINE_MARGIN,
        ),
    ]


def report_sections(results: dict) -> list[str]:
    record = results["summary"]["methods"]
    oracle = record["oracle_layout"]["test"]["overall"]
    dnd = record["divide_and_denoise"]["test"]["overall"]
    lines = [
        "## Three objects, one prompt per object",
        "",
        "| method | settings (chosen on validation) | validation settings tried | validation overall | test overall (SE) "
        "| test object | test colour |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        r = record[method]
        t = r["test"]
        lines.append(
            f"| {LABELS[method]} | {r['chosen']['name']} | {len(r['validation'])} | {r['chosen']['score']:.3f} | "
            f"{t['overall']:.3f} ({t['overall_standard_error']:.3f}) | {t.get('object', float('nan')):.3f} | "
            f"{t.get('colour', float('nan')):.3f} |"
        )
    lines += [
        "",
        f"Gap to the oracle layout (upper reference): {oracle - dnd:+.3f} (oracle {oracle:.3f}, D&D {dnd:.3f}).",
        "",
        "### Divide-and-Denoise on validation, every setting",
        "",
        "| setting | overall | object | colour |",
        "| --- | --- | --- | --- |",
    ]
    for row in record["divide_and_denoise"]["validation"]:
        m = row["measurement"]
        lines.append(
            f"| {row['name']} | {m['overall']:.3f} | {m.get('object', float('nan')):.3f} | "
            f"{m.get('colour', float('nan')):.3f} |"
        )
    return lines + [""]


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, NAME)
    title = "Divide-and-Denoise on the 64x64 mosaic world (three objects)"
    if args.from_results is not None:
        results = rebuild_results(
            args.from_results, lambda r: composition_targets(r["summary"]["methods"]), rel_to=ROOT
        )
        return write_results(stem, results, title, report_sections(results))

    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.loading import load_pipeline

    torch.set_num_threads(1)
    pipe = load_pipeline(args.model_path).to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    config = MosaicConfig(resolution=pipe.vae.config.sample_size)
    record = measure_all(pipe, config, args)
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "model_path")}
    results = {
        # the model's folder is recorded by name: a path would name one machine's folders
        "command": command(__file__, argv, omit=("--output_dir", "--model_path")),
        "settings": settings,
        "model": {
            "name": os.path.basename(os.path.normpath(args.model_path)),
            "resolution": config.resolution,
            "unet_parameters": sum(p.numel() for p in pipe.unet.parameters()),
        },
        "summary": {"methods": record, "targets": composition_targets(record)},
    }
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
