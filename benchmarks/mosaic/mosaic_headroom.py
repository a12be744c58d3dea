#!/usr/bin/env python
"""Headroom of a mosaic text-to-image world: can its model show the papers' effects at all?

    python benchmarks/mosaic/mosaic_headroom.py --model_path PIPELINE_FOLDER

Measures a `StableDiffusionPipeline`-format mosaic model (the 64x64 world of `training/train_text_to_image_from_scratch.py
--resolution 64`) with the exact mosaic judge (`diffusers_ext.evaluation.mosaic.MosaicEvaluator`), before any
method is measured on it:

- **Capability.** Test prompts of every mosaic task, judged per task: a single object with its colour, counts
  (1-4), relations. Targets: single >= 0.9, count >= 0.6, relation >= 0.4.
- **Composition gap** (the room Divide-and-Denoise needs). Prompts naming two and three objects with their colours
  (`evaluation.divide_and_denoise.mosaic_composition.make_prompts`): the model on the whole prompt, against
  MultiDiffusion given the oracle layout (each object's box from a real mosaic placement, one sub-prompt per object):
  `evaluation.divide_and_denoise.region_multidiffusion.WindowMultiDiffusion`, whose views are windows around the
  boxes (cropped, or the full canvas), owning each box and a margin around it, bootstrapped for a share of the first
  steps, each step taken once (as published) or resampled several times (RePaint's resampling); the window, margin,
  bootstrap share and resampling are chosen on validation with the guidance. Targets: single prompt
  <= 0.5, oracle-layout MultiDiffusion >= 0.7 (a method that finds the layout itself then has room between the two).
- **Concepts** (the room unlearning needs). For each colour and shape, prompts that ask for it and prompts that do
  not (`evaluation.mosaic_unlearning.concept_prompt_sets`); the concept most often present on validation is judged
  on test. Targets: presence >= 0.9 on its prompts, judge accuracy on the retained prompts >= 0.6.

Protocol: every method's guidance scale is chosen on validation prompts (the mosaic test split's stream with seed
1000), then the test prompts (seed 2000) are judged once with the frozen choice. Both methods get the same guidance grid, the
same initial latents and the same number of sampling steps; the oracle-layout reference (an upper reference) is also
given its own settings grid.

Not measured here yet (the issue's other headroom parts): mimicry (a LoRA mimic and the protections) and RL (the
SD3-format model's reward).
"""

import argparse
import os

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "mosaic_headroom"
SPLIT_SEEDS = {"validation": 1000, "test": 2000}
COMPOSITION_SHAPES = {"2_objects": ("circle", "square"), "3_objects": ("circle", "square", "triangle")}
CAPABILITY_TARGETS = {"single": 0.9, "count": 0.6, "relation": 0.4}
SINGLE_PROMPT_MAX = 0.5
ORACLE_LAYOUT_MIN = 0.7


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", required=False, default=None, help="A StableDiffusionPipeline folder.")
    parser.add_argument("--capability_prompts", type=int, default=400, help="Test prompts of the capability part.")
    parser.add_argument("--composition_prompts", type=int, default=100, help="Test prompts per composition setting.")
    parser.add_argument("--validation_fraction", type=float, default=0.5, help="Validation prompts, as a fraction.")
    parser.add_argument("--guidance_grid", type=float, nargs="+", default=[3.0, 5.0, 7.5])
    parser.add_argument("--num_inference_steps", type=int, default=25)
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument(
        "--oracle_configs",
        nargs="+",
        default=["16,2,1.0,1", "16,2,1.0,8"],
        help="MultiDiffusion settings `window,margin,bootstrap[,resampling]` tried on validation with every guidance:"
        " the window side in latents (the latent canvas side: full-canvas views; smaller: cropped views), the margin"
        " around each box in latents, the share of the first steps that bootstrap, and how many times each step is"
        " taken (default 1: as published).",
    )
    parser.add_argument(
        "--concepts", nargs="+", default=None, help="Concepts tried (default: every colour and shape)."
    )
    parser.add_argument("--concept_prompts", type=int, default=60, help="Test prompts per kind (concept, retained).")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["capability", "composition", "concepts"],
        choices=["capability", "composition", "concepts"],
    )
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.utils import check_positive_int

    for name in ("capability_prompts", "composition_prompts", "num_inference_steps", "batch_size"):
        check_positive_int(name, getattr(args, name))
    if not 0 < args.validation_fraction <= 1:
        parser.error(f"--validation_fraction must be in (0, 1], got {args.validation_fraction}.")
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import parse_oracle_config

    try:
        args.oracle_configs = [parse_oracle_config(text) for text in args.oracle_configs]
    except ValueError as error:
        parser.error(f"--oracle_configs: {error}")
    check_positive_int("concept_prompts", args.concept_prompts)
    if any(g < 1 for g in args.guidance_grid):
        parser.error(f"--guidance_grid values must be >= 1, got {args.guidance_grid}.")
    if args.from_results is None:
        if args.model_path is None:
            parser.error("--model_path is required (a StableDiffusionPipeline folder of the mosaic world).")
        if not os.path.isfile(os.path.join(args.model_path, "model_index.json")):
            parser.error(f"--model_path {args.model_path!r} is not a pipeline folder (no model_index.json).")
    return args


def _num_prompts(args, total: int, split: str) -> int:
    return max(1, round(total * args.validation_fraction)) if split == "validation" else total


# ---------------------------------------------------------------------------------------------------------------------
# capability
# ---------------------------------------------------------------------------------------------------------------------


def measure_capability(pipe, config, args) -> dict:
    from diffusers_ext.evaluation.mosaic import capability_on_validation

    return capability_on_validation(
        pipe,
        config,
        args.capability_prompts,
        args.guidance_grid,
        args.num_inference_steps,
        SPLIT_SEEDS,
        validation_fraction=args.validation_fraction,
        batch_size=args.batch_size,
    )


# ---------------------------------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------------------------------


def _candidate_name(candidate: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in candidate.items())


def measure_composition(pipe, config, args) -> dict:
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import CompositionSampler, make_prompts
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize
    from diffusers_ext.evaluation.reporting import choose_on_validation

    judge = MosaicEvaluator(config)
    sampler = CompositionSampler(pipe, config, SPLIT_SEEDS, args.num_inference_steps, args.batch_size)
    record = {}
    for setting, shapes in COMPOSITION_SHAPES.items():
        prompts = {
            split: make_prompts(
                shapes, _num_prompts(args, args.composition_prompts, split), SPLIT_SEEDS[split], config.colours
            )
            for split in SPLIT_SEEDS
        }
        record[setting] = {}
        grids = {
            "single_prompt": [{"guidance": g} for g in args.guidance_grid],
            "oracle_layout": [
                {"guidance": g, **config}
                for config in args.oracle_configs
                if config["window"] <= sampler.latent_size
                for g in args.guidance_grid
            ],
        }
        samplers = {
            "single_prompt": lambda ps, candidate, split: sampler.single_prompt(ps, candidate["guidance"], split),
            "oracle_layout": sampler.oracle_layout,
        }
        for method, grid in grids.items():
            sample = samplers[method]

            def measure(candidate, split, sample=sample, prompts=prompts):
                images = sample(prompts[split], candidate, split)
                return summarize([judge.evaluate(image, p) for image, p in zip(images, prompts[split])])

            record[setting][method] = choose_on_validation(
                grid, measure, score=lambda m: m["overall"], names=_candidate_name
            )
    return record


# ---------------------------------------------------------------------------------------------------------------------
# concepts
# ---------------------------------------------------------------------------------------------------------------------


def measure_concepts(pipe, config, args, guidance: float) -> dict:
    """The concept unlearning would remove: for each candidate colour or shape, how often the base model draws it
    for prompts that ask for it (presence), and the judge's overall accuracy on prompts that do not (the retained
    set). The concept with the highest presence on validation (ties: higher retained accuracy) is judged once on
    test, at the capability part's guidance."""
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator
    from diffusers_ext.evaluation.mosaic_unlearning import (
        concept_presence,
        concept_prompt_sets,
        judge_accuracy,
        sample_prompts,
    )
    from diffusers_ext.evaluation.reporting import choose_on_validation

    judge = MosaicEvaluator(config)
    concepts = args.concepts or list(config.colours) + list(config.shapes)

    def measure(concept, split):
        count = _num_prompts(args, args.concept_prompts, split)
        sets = concept_prompt_sets(config, concept, {split: count}, seed=SPLIT_SEEDS[split])[split]
        record = {"n": count}
        for kind, seed_offset in (("forget", 0), ("retain", 1)):
            prompts = sets[kind]
            images = sample_prompts(
                pipe,
                [p["caption"] for p in prompts],
                SPLIT_SEEDS[split] * 10 + seed_offset,
                args.num_inference_steps,
                guidance,
                args.batch_size,
            )
            if kind == "forget":
                record["presence"] = float(concept_presence(judge, images, concept).mean())
                record["concept_accuracy"] = float(np.nanmean(judge_accuracy(judge, images, prompts)["overall"]))
            else:
                record["retained_accuracy"] = float(np.nanmean(judge_accuracy(judge, images, prompts)["overall"]))
        return record

    result = choose_on_validation(
        concepts, measure, score=lambda m: m["presence"] + 1e-3 * m["retained_accuracy"], names=str
    )
    result["guidance"] = guidance
    return result


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------


def headroom_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    targets = []
    capability = summary.get("capability")
    if capability:
        by_task = capability["test"].get("by_task", {})
        for task, threshold in CAPABILITY_TARGETS.items():
            targets.append(target(f"capability: {task} (test)", by_task.get(task, float("nan")), threshold))
    composition = summary.get("composition")
    if composition:
        for setting, record in composition.items():
            single = record["single_prompt"]["test"]["overall"]
            oracle = record["oracle_layout"]["test"]["overall"]
            targets.append(target(f"composition {setting}: single prompt (test)", single, SINGLE_PROMPT_MAX, "<="))
            targets.append(
                target(f"composition {setting}: MultiDiffusion + oracle layout (test)", oracle, ORACLE_LAYOUT_MIN)
            )
    concepts = summary.get("concepts")
    if concepts:
        test, name = concepts["test"], concepts["chosen"]["candidate"]
        targets.append(target(f"concepts: presence of {name!r} for its prompts (test)", test["presence"], 0.9))
        targets.append(
            target(f"concepts: retained-set accuracy without {name!r} (test)", test["retained_accuracy"], 0.6)
        )
    return targets


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = []
    capability = summary.get("capability")
    if capability:
        test = capability["test"]
        lines += [
            "## Capability",
            "",
            f"Guidance {capability['chosen']['candidate']} (chosen on validation). Test, {test['n']} prompts: overall "
            f"{test['overall']:.3f}; per task "
            + ", ".join(f"{k} {v:.3f}" for k, v in test.get("by_task", {}).items())
            + "; per skill "
            + ", ".join(f"{k} {test[k]:.3f}" for k in ("object", "colour", "count", "relation") if k in test)
            + ".",
            "",
        ]
    composition = summary.get("composition")
    if composition:
        lines += [
            "## Composition gap",
            "",
            "| setting | method | settings (validation) | test overall | test colour | test object |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for setting, record in composition.items():
            for method, label in (
                ("single_prompt", "whole prompt"),
                ("oracle_layout", "MultiDiffusion + oracle layout"),
            ):
                r = record[method]
                t = r["test"]
                lines.append(
                    f"| {setting} | {label} | {r['chosen']['name']} | {t['overall']:.3f} | "
                    f"{t.get('colour', float('nan')):.3f} | {t.get('object', float('nan')):.3f} |"
                )
        lines.append("")
    concepts = summary.get("concepts")
    if concepts:
        lines += [
            "## Concepts",
            "",
            f"Guidance {concepts['guidance']} (the capability part's choice). Validation, per candidate concept:",
            "",
            "| concept | presence | accuracy on its prompts | retained-set accuracy |",
            "| --- | --- | --- | --- |",
        ]
        for row in concepts["validation"]:
            m = row["measurement"]
            lines.append(
                f"| {row['name']} | {m['presence']:.3f} | {m['concept_accuracy']:.3f} | {m['retained_accuracy']:.3f} |"
            )
        t = concepts["test"]
        lines += [
            "",
            f"Chosen: {concepts['chosen']['name']}. Test ({t['n']} prompts of each kind): presence {t['presence']:.3f}, "
            f"accuracy on its prompts {t['concept_accuracy']:.3f}, retained-set accuracy {t['retained_accuracy']:.3f}.",
            "",
        ]
    return lines


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, NAME)
    title = "Headroom of the mosaic text-to-image world"
    if args.from_results is not None:
        results = rebuild_results(args.from_results, lambda r: headroom_targets(r["summary"]), rel_to=ROOT)
        return write_results(stem, results, title, report_sections(results))

    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.loading import load_pipeline

    pipe = load_pipeline(args.model_path).to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    config = MosaicConfig(resolution=pipe.vae.config.sample_size)
    summary = {}
    if "capability" in args.parts:
        summary["capability"] = measure_capability(pipe, config, args)
    if "composition" in args.parts:
        summary["composition"] = measure_composition(pipe, config, args)
    if "concepts" in args.parts:
        chosen = summary.get("capability", {}).get("chosen", {}).get("candidate", args.guidance_grid[0])
        summary["concepts"] = measure_concepts(pipe, config, args, chosen)
    summary["targets"] = headroom_targets(summary)
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "model_path")}
    results = {
        "command": command(__file__, omit=("--output_dir", "--model_path")),
        "settings": settings,
        "model": {"resolution": config.resolution, "unet_parameters": sum(p.numel() for p in pipe.unet.parameters())},
        "summary": summary,
    }
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
