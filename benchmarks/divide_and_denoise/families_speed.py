#!/usr/bin/env python
"""Divide-and-Denoise on SDXL, SD3 and Flux against what a user runs instead: K plain pipeline calls.

    python benchmarks/divide_and_denoise/families_speed.py
    python benchmarks/divide_and_denoise/families_speed.py --families flux --repetitions 3   # a smaller run

For each family, K experts (the family's real denoiser class at reduced width, different random weights, sharing the
test kit's tiny text encoders and VAE) compose with `DivideAndDenoisePipeline.from_pipelines` at its defaults (the
fair division, the cross- / joint-attention utility, the alignment step) on one prompt each; the baseline is what a
user would run instead: each expert's own `StableDiffusionXLPipeline` / `StableDiffusion3Pipeline` / `FluxPipeline`
on its prompt, K calls. Both sides take the same steps, 64x64 latents, guidance (SDXL 5.0 and SD3 7.0 classifier-free
on both sides, Flux's distilled 3.5) and `output_type="latent"`; the two alternate in one process (the order swapped
every repetition) and the ratio of their wall times is taken per repetition (median and min reported, the median
judged). Speed needs no trained weights; these are CPU figures of this machine, not accelerator figures.

The reduced-width denoisers keep each family's structure (SDXL's three UNet levels with cross-attention on the lower
two and its added time/pooled conditioning, at a fifth of its width; SD3's joint blocks over 2x2 patches and Flux's
double- and single-stream blocks over packed 2x2 patches, with 4 attention heads of 64 and a few blocks), and the
families' default text lengths (SD3: 77 CLIP + 256 T5 tokens, Flux: 512 T5 tokens) against 1024 image tokens.

Writes `benchmarks/divide_and_denoise/results/families_speed.json` and `.md`.
"""

import argparse
import os
import statistics
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
FAMILIES = ("sdxl", "sd3", "flux")
RATIO_TARGET = 1.05  # D&D wall / K plain pipeline calls of the family (issue 57)
PROMPTS = ["a red cube on a table", "a blue ball in the grass", "a green tree by a lake"]
GUIDANCE = {"sdxl": 5.0, "sd3": 7.0, "flux": 3.5}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="Families to run.")
    parser.add_argument("--experts", type=int, default=2, help="K, the number of experts (and plain calls).")
    parser.add_argument("--latent_size", type=int, default=64, help="Latent side (both sides of the comparison).")
    parser.add_argument("--steps", type=int, default=4, help="Denoising steps of every call.")
    parser.add_argument("--repetitions", type=int, default=9, help="Timed repetitions of each side.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the weights and the noise.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where the results go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.experts <= len(PROMPTS):
        parser.error(f"--experts must be in [1, {len(PROMPTS)}], got {args.experts}.")
    return args


def _denoiser(family: str, seed: int):
    """The family's denoiser class at reduced width, conditioned like the test kit's tiny text encoders."""
    import torch
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, UNet2DConditionModel

    torch.manual_seed(seed)
    if family == "sdxl":
        return UNet2DConditionModel(
            sample_size=64,
            in_channels=4,
            out_channels=4,
            layers_per_block=2,
            block_out_channels=(64, 128, 256),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 1, 2),
            cross_attention_dim=32,  # the kit's two CLIP encoders, 16 + 16
            attention_head_dim=(2, 4, 8),
            norm_num_groups=32,
            use_linear_projection=True,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=6 * 8 + 16,
        ).eval()
    if family == "sd3":
        return SD3Transformer2DModel(
            sample_size=64,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=4,
            attention_head_dim=64,  # SD3's head size, 4 heads instead of 24
            num_attention_heads=4,
            joint_attention_dim=48,  # the kit's T5
            caption_projection_dim=256,
            pooled_projection_dim=40,  # the kit's two CLIP encoders' pooled projections, 16 + 24
            pos_embed_max_size=64,
        ).eval()
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,  # 2x2 patches of the kit VAE's one latent channel
        num_layers=2,
        num_single_layers=4,
        attention_head_dim=64,  # 4 heads of 64 (Flux.1: 24 of 128)
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[8, 28, 28],
        guidance_embeds=True,
    ).eval()


def family_pipelines(family: str, experts: int, seed: int) -> list:
    """`experts` pipelines of the family sharing the kit's text encoders, VAE and scheduler, each with its own
    reduced-width denoiser."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline

    from diffusers_ext.models.tiny_components import (
        get_tiny_flux_components,
        get_tiny_sd3_components,
        get_tiny_sdxl_components,
    )

    builders = {
        "sdxl": (StableDiffusionXLPipeline, get_tiny_sdxl_components, "unet"),
        "sd3": (StableDiffusion3Pipeline, get_tiny_sd3_components, "transformer"),
        "flux": (FluxPipeline, lambda s: get_tiny_flux_components(s, guidance_embeds=True), "transformer"),
    }
    pipeline_class, components_of, name = builders[family]
    shared = components_of(seed)
    pipes = []
    for k in range(experts):
        pipe = pipeline_class(**{**shared, name: _denoiser(family, seed + k)})
        pipe.set_progress_bar_config(disable=True)
        pipes.append(pipe)
    return pipes


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def measure_family(family: str, args) -> dict:
    import torch

    from diffusers_ext import DivideAndDenoisePipeline

    pipes = family_pipelines(family, args.experts, args.seed)
    composition = DivideAndDenoisePipeline.from_pipelines(pipes)
    composition.set_progress_bar_config(disable=True)
    prompts = PROMPTS[: args.experts]
    scale = composition.vae_scale_factor
    common = {
        "height": args.latent_size * scale,
        "width": args.latent_size * scale,
        "num_inference_steps": args.steps,
        "guidance_scale": GUIDANCE[family],
        "output_type": "latent",
    }

    def divide_and_denoise():
        return composition(prompt=prompts, generator=torch.Generator().manual_seed(args.seed), **common)

    def plain_pipeline_calls():
        for pipe, prompt in zip(pipes, prompts):
            pipe(prompt=prompt, generator=torch.Generator().manual_seed(args.seed), **common)

    runs = {"divide_and_denoise": divide_and_denoise, "plain_pipeline_calls": plain_pipeline_calls}
    plain_pipeline_calls()  # warm-up of every code path, untimed
    timings = divide_and_denoise().timings
    wall = {name: [] for name in runs}
    order = list(runs)
    for repetition in range(args.repetitions):
        for name in order if repetition % 2 == 0 else order[::-1]:
            wall[name].append(_timed(runs[name]))
    ratios = [a / b for a, b in zip(wall["divide_and_denoise"], wall["plain_pipeline_calls"])]
    denoiser = pipes[0].unet if family == "sdxl" else pipes[0].transformer
    return {
        "shape": {
            "experts": args.experts,
            "latent_size": args.latent_size,
            "denoiser_class": type(denoiser).__name__,
            "denoiser_parameters": sum(p.numel() for p in denoiser.parameters()),
            "num_inference_steps": args.steps,
            "guidance_scale": GUIDANCE[family],
        },
        "baseline": f"{args.experts} plain {type(pipes[0]).__name__} calls, one per expert and prompt, alternating "
        "with the D&D call in one process",
        "wall_seconds": {name: _spread(values) for name, values in wall.items()},
        "ratio": _spread(ratios),
        "divide_and_denoise_timings_of_one_call": timings,
    }


def speed_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            f"{family}: D&D with {summary[family]['shape']['experts']} experts / as many plain pipeline calls "
            "(median wall ratio)",
            summary[family]["ratio"]["median"],
            RATIO_TARGET,
            "<=",
        )
        for family in FAMILIES
        if family in summary
    ]


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = [
        "## Wall time per family",
        "",
        "| family | denoiser (parameters) | D&D s (median) | plain calls s (median) | ratio median | ratio min | "
        "D&D time in model forwards, utility, allocation, alignment (one call, s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        if family not in summary:
            continue
        part = summary[family]
        timing = part["divide_and_denoise_timings_of_one_call"]
        split = ", ".join(f"{timing[k]:.3f}" for k in ("model_forwards", "utility", "allocation", "alignment"))
        lines.append(
            f"| {family} | {part['shape']['denoiser_class']} ({part['shape']['denoiser_parameters']:,}) | "
            f"{part['wall_seconds']['divide_and_denoise']['median']:.3f} | "
            f"{part['wall_seconds']['plain_pipeline_calls']['median']:.3f} | {part['ratio']['median']:.3f} | "
            f"{part['ratio']['min']:.3f} | {split} |"
        )
    lines += ["", f"Baselines: {'; '.join(summary[f]['baseline'] for f in FAMILIES if f in summary)}."]
    return lines


def main(argv=None) -> dict:
    import platform

    import torch

    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: speed_targets(r["summary"]), rel_to=REPO)
    else:
        start = time.perf_counter()
        summary = {family: measure_family(family, args) for family in args.families}
        summary["targets"] = speed_targets(summary)
        results = {
            "command": command(__file__, argv, omit=("--output_dir",)),
            "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
            },
            "wall_seconds": time.perf_counter() - start,
            "summary": summary,
        }
    write_results(
        os.path.join(args.output_dir, "families_speed"),
        results,
        "Divide-and-Denoise on SDXL, SD3 and Flux: wall time against plain pipeline calls (CPU, random weights)",
        report_sections(results),
    )
    return results


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    main()
