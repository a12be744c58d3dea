#!/usr/bin/env python
"""Headroom of a mosaic text-to-image world: can its model show the papers' effects at all?

    python benchmarks/mosaic_headroom.py --model_path PIPELINE_FOLDER

Measures a `StableDiffusionPipeline`-format mosaic model (the 64x64 world of `training/train_text_to_image.py
--resolution 64`) with the exact mosaic judge (`diffusers_ext.evaluation.mosaic.MosaicEvaluator`), before any
method is measured on it:

- **Capability.** Test prompts of every mosaic task, judged per task: a single object with its colour, counts
  (1-4), relations. Targets: single >= 0.9, count >= 0.6, relation >= 0.4.
- **Composition gap** (the room Divide-and-Denoise needs). Prompts naming two and three objects with their colours
  (`evaluation.divide_and_denoise.mosaic_composition.make_prompts`): the model on the whole prompt, against
  region-based MultiDiffusion with bootstrapping (`evaluation.divide_and_denoise.region_multidiffusion`) given
  the oracle layout (each object's box from a real mosaic placement, one sub-prompt per object; outside the boxes
  its bootstrapped views see the empty canvas). Targets: single prompt <= 0.5, oracle-layout MultiDiffusion >= 0.7 (a method that
  finds the layout itself then has room between the two).

Protocol: every method's guidance scale is chosen on validation prompts (the mosaic test split's stream with seed
1000), then the test prompts (seed 2000) are judged once with the frozen choice. Both methods get the same grid, the
same initial latents and the same number of sampling steps.

Not measured here yet (the issue's other headroom parts): mimicry (a LoRA mimic and the protections), concepts
(unlearning) and RL (the SD3-format model's reward).
"""

import argparse
import os

import numpy as np
import torch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
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
        "--bootstrap_fraction",
        type=float,
        default=0.4,
        help="Share of the first steps in which MultiDiffusion bootstraps its views (its default: 20 of 50).",
    )
    parser.add_argument(
        "--parts", nargs="+", default=["capability", "composition"], choices=["capability", "composition"]
    )
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.utils import check_positive_int

    for name in ("capability_prompts", "composition_prompts", "num_inference_steps", "batch_size"):
        check_positive_int(name, getattr(args, name))
    if not 0 < args.validation_fraction <= 1:
        parser.error(f"--validation_fraction must be in (0, 1], got {args.validation_fraction}.")
    if not 0 <= args.bootstrap_fraction <= 1:
        parser.error(f"--bootstrap_fraction must be in [0, 1], got {args.bootstrap_fraction}.")
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
    from diffusers_ext.evaluation.mosaic import evaluate_text_to_image
    from diffusers_ext.evaluation.reporting import choose_on_validation

    def measure(guidance, split):
        return evaluate_text_to_image(
            pipe,
            config,
            _num_prompts(args, args.capability_prompts, split),
            SPLIT_SEEDS[split],
            guidance,
            args.num_inference_steps,
            split="test",
            batch_size=args.batch_size,
        )

    return choose_on_validation(
        list(args.guidance_grid), measure, score=lambda m: m["overall"], names=lambda g: f"guidance {g}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------------------------------


class CompositionSampler:
    """The model on the whole prompt, and MultiDiffusion with the oracle layout, from the same initial latents."""

    def __init__(self, pipe, config, args):
        from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import RegionMultiDiffusion

        self.pipe, self.config, self.args = pipe, config, args
        self.latent_size = config.resolution // pipe.vae_scale_factor
        # The bootstrapped views show the world's empty canvas outside their box.
        background = torch.tensor(config.background, dtype=torch.float32).view(3, 1, 1) / 127.5 - 1.0
        self.multidiffusion = RegionMultiDiffusion(
            pipe, background.expand(3, config.resolution, config.resolution), args.bootstrap_fraction
        )

    def latents(self, index: int, split: str) -> torch.Tensor:
        shape = (1, self.pipe.unet.config.in_channels, self.latent_size, self.latent_size)
        return torch.randn(shape, generator=torch.Generator().manual_seed(SPLIT_SEEDS[split] * 1000 + index))

    def single_prompt(self, prompts: list[dict], guidance: float, split: str) -> np.ndarray:
        images = []
        for start in range(0, len(prompts), self.args.batch_size):
            chunk = prompts[start : start + self.args.batch_size]
            latents = torch.cat([self.latents(start + i, split) for i in range(len(chunk))])
            images.append(
                self.pipe(
                    [p["caption"] for p in chunk],
                    height=self.config.resolution,
                    width=self.config.resolution,
                    num_inference_steps=self.args.num_inference_steps,
                    guidance_scale=guidance,
                    latents=latents.to(self.pipe.unet.dtype),
                    output_type="np",
                ).images
            )
        return np.concatenate(images)

    def oracle_layout(self, prompts: list[dict], guidance: float, split: str) -> np.ndarray:
        from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import oracle_regions

        images = []
        for index, prompt in enumerate(prompts):
            seed = SPLIT_SEEDS[split] * 1000 + index
            boxes = oracle_regions(prompt, seed, self.latent_size, self.config.resolution)
            images.append(
                self.multidiffusion(
                    prompt["sub_prompts"],
                    boxes,
                    self.latents(index, split).to(self.pipe.unet.dtype),
                    num_inference_steps=self.args.num_inference_steps,
                    guidance_scale=guidance,
                    generator=torch.Generator().manual_seed(seed),
                )
            )
        return np.concatenate(images)


def measure_composition(pipe, config, args) -> dict:
    from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import make_prompts
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize
    from diffusers_ext.evaluation.reporting import choose_on_validation

    judge = MosaicEvaluator(config)
    sampler = CompositionSampler(pipe, config, args)
    record = {}
    for setting, shapes in COMPOSITION_SHAPES.items():
        prompts = {
            split: make_prompts(
                shapes, _num_prompts(args, args.composition_prompts, split), SPLIT_SEEDS[split], config.colours
            )
            for split in SPLIT_SEEDS
        }
        record[setting] = {}
        for method in ("single_prompt", "oracle_layout"):
            sample = getattr(sampler, method)

            def measure(guidance, split, sample=sample, prompts=prompts):
                images = sample(prompts[split], guidance, split)
                return summarize([judge.evaluate(image, p) for image, p in zip(images, prompts[split])])

            record[setting][method] = choose_on_validation(
                list(args.guidance_grid), measure, score=lambda m: m["overall"], names=lambda g: f"guidance {g}"
            )
    return record


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
            "| setting | method | guidance (validation) | test overall | test colour | test object |",
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
                    f"| {setting} | {label} | {r['chosen']['candidate']} | {t['overall']:.3f} | "
                    f"{t.get('colour', float('nan')):.3f} | {t.get('object', float('nan')):.3f} |"
                )
        lines.append("")
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
