#!/usr/bin/env python
"""Peak memory against image size and sequence length, per method family, for the "running at scale" docs pages.

    python benchmarks/scale/memory_scaling.py                  # every part at its default sizes
    python benchmarks/scale/memory_scaling.py --parts dirp grpo

Each part runs one unit of a method's work (one decode, one DIRP iteration, one training step, ...) at 3 sizes with
models built from configs at reduced width and random weights, in float32 on the CPU, and measures its peak memory
with `diffusers_ext.metrics.peak_memory_bytes` (torch's CPU allocator events: the work's own activations, gradients
and optimiser state; weights and inputs that exist before the call are not counted). A least-squares line through
the 3 points gives bytes per unit of size (per token, per image token, per pixel, per latent position); the
report extrapolates that line to the sizes users run, AT THE SAME REDUCED WIDTH: an extrapolation along the size
axis only, not a measurement, and not a prediction for the full-width model (whose activations per position are
larger by roughly its width ratio).

Parts:
- `dlm`: `DiffusionLMPipeline` + `SOARScheduler(max_beam_size=1)`, one block of `G` generated tokens after a 32-token
  prompt, 2 steps (a bidirectional Llama, hidden 256, 4 layers, vocabulary 32000); x = prompt + generated tokens.
- `pll`: `beam_score="pll"` rescoring of 2 complete beams (`pseudo_log_likelihoods`, 16 probes per forward) on the
  same model; x = sequence tokens.
- `dnd`: `DivideAndDenoisePipeline` with 2 SD1.5-shaped UNets at a fifth of the width, 2 steps; x = latent positions.
- `dirp`: one DIRP iteration (differentiable DDIM round trip through the VAE and UNet, gradient-checkpointed, and its
  backward), SD-shaped UNet and VAE at a fifth of the width, 2 inversion steps; x = image pixels.
- `nvs`: `SemanticNVSPipeline` in `"warped+iterative"` mode, 1 input and 2 target views, 2 steps, guidance 2; a
  multi-view UNet with channels (32, 64, 128) and a DINOv2 encoder of width 32 (patch 8); x = image pixels per view.
- `grpo`: one `DiffusionGRPOTrainer` step (2 images of one prompt, 2 SDE steps, LoRA rank 4) on an SD3 transformer
  of 2 joint blocks, width 128 (the test kit's SD3 text encoders and one-downsampling VAE); x = image tokens (latent
  2x2 patches; SD3 at 1024 px has 4096).
- `unlearning`: one `ConstrainedUnlearningTrainer` step (reverse-KL constraint, batch 2 per part, LoRA rank 4) on an
  SD1.5-shaped UNet at a fifth of the width; x = latent positions (SD at 512 px has 64x64).

Writes `benchmarks/scale/results/memory_scaling.json` and `memory_scaling.md`.
"""

import argparse
import os
import sys
import time
import types


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
PARTS = ("dlm", "pll", "dnd", "dirp", "nvs", "grpo", "unlearning")
DEFAULT_SIZES = {
    "dlm": [32, 64, 128],  # generated tokens (after a 32-token prompt)
    "pll": [32, 64, 128],  # generated tokens (after a 32-token prompt)
    "dnd": [16, 24, 32],  # latent side
    "dirp": [16, 24, 32],  # latent side (image side x8)
    "nvs": [32, 48, 64],  # image side
    "grpo": [32, 64, 96],  # image side (latents side / 2, tokens (side / 4)^2)
    "unlearning": [16, 24, 32],  # latent side
}
PROMPT_TOKENS = 32
WIDTH_FRACTION = 0.2  # of SD1.5's UNet and VAE channels, as benchmarks/scale/scale.py
# The sizes users run, in each part's unit, for the extrapolated rows (at the measured reduced width).
REAL_SIZES = {
    "dlm": {"LLaDA gen 256 + prompt 128": 384, "1024 tokens": 1024},
    "pll": {"LLaDA gen 256 + prompt 128": 384, "1024 tokens": 1024},
    "dnd": {"SD1.5 512 px (64x64 latents)": 64 * 64, "SDXL 1024 px (128x128 latents)": 128 * 128},
    "dirp": {"512 px": 512 * 512, "1024 px": 1024 * 1024},
    "nvs": {"256 px views": 256 * 256, "512 px views": 512 * 512},
    "grpo": {"SD3 512 px (1024 tokens)": 1024, "SD3 1024 px (4096 tokens)": 4096},
    "unlearning": {"SD1.5 512 px (64x64 latents)": 64 * 64, "768 px (96x96 latents)": 96 * 96},
}
UNITS = {
    "dlm": "token",
    "pll": "token",
    "dnd": "latent position",
    "dirp": "image pixel",
    "nvs": "image pixel",
    "grpo": "image token",
    "unlearning": "latent position",
}
R2_THRESHOLD = 0.98  # the line the extrapolation follows must describe the measured points


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    for part in PARTS:
        parser.add_argument(
            f"--{part}_sizes", type=int, nargs=3, default=DEFAULT_SIZES[part], help=f"The 3 sizes of `{part}`."
        )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=RESULTS, help="Where memory_scaling.json/.md go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.utils import check_positive_int

    for part in PARTS:
        sizes = getattr(args, f"{part}_sizes")
        for size in sizes:
            check_positive_int(f"{part}_sizes", size)
        if len(set(sizes)) != 3:
            parser.error(f"--{part}_sizes must be 3 different sizes, got {sizes}.")
    return args


def _scale_module():
    """benchmarks/scale/scale.py, for its SD-shaped builders (one definition of those shapes)."""
    from diffusers_ext.evaluation.reporting import load_script

    return load_script(os.path.join(HERE, "scale.py"), "scale_benchmark")


# ----------------------------------------------------------------------------------------------------------------
# Diffusion LMs
# ----------------------------------------------------------------------------------------------------------------


def _lm(args):
    scale = _scale_module()
    shape = types.SimpleNamespace(
        seed=args.seed, prompt_length=PROMPT_TOKENS, gen_length=max(args.dlm_sizes + args.pll_sizes), hidden_size=256
    )
    shape.num_layers, shape.vocab_size = 4, 32000
    model, tokenizer = scale.build_llada_shaped_lm(shape)
    return model, tokenizer, {"hidden_size": 256, "num_layers": 4, "vocab_size": 32000}


def measure_dlm(args, sizes) -> tuple[dict, list[int]]:
    import torch

    from diffusers_ext import DiffusionLMPipeline, SOARScheduler
    from diffusers_ext.metrics import peak_memory_bytes

    model, tokenizer, shape = _lm(args)
    prompt = torch.randint(6, 32000, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(args.seed))
    peaks = []
    for gen in sizes:
        pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=gen, max_beam_size=1), tokenizer)
        pipe.set_progress_bar_config(disable=True)

        def run(gen=gen, pipe=pipe):
            return pipe(
                input_ids=prompt,
                gen_length=gen,
                block_length=gen,
                num_inference_steps=2,
                eos_early_stop=False,
                output_type="seq",
            )

        with torch.no_grad():
            peaks.append(peak_memory_bytes(run))
    return (
        {**shape, "parameters": sum(p.numel() for p in model.parameters()), "steps": 2},
        [PROMPT_TOKENS + g for g in sizes],
        peaks,
    )


def measure_pll(args, sizes):
    import torch

    from diffusers_ext import DiffusionLMPipeline, SOARScheduler
    from diffusers_ext.metrics import peak_memory_bytes
    from diffusers_ext.pipelines.diffusion_lm.pll_rescoring import pseudo_log_likelihoods

    model, tokenizer, shape = _lm(args)
    adapter = DiffusionLMPipeline(
        model, SOARScheduler(beam_score="pll"), tokenizer
    ).adapter  # the one it rescores with
    peaks = []
    for gen in sizes:
        length = PROMPT_TOKENS + gen
        sequences = torch.randint(6, 32000, (2, length), generator=torch.Generator().manual_seed(args.seed))
        attention = torch.ones_like(sequences)

        def run(s=sequences, a=attention):
            return pseudo_log_likelihoods(adapter, model, s, a, PROMPT_TOKENS, tokenizer.mask_token_id, chunk_size=16)

        with torch.no_grad():
            peaks.append(peak_memory_bytes(run))
    return {**shape, "rows": 2, "chunk_size": 16}, [PROMPT_TOKENS + g for g in sizes], peaks


# ----------------------------------------------------------------------------------------------------------------
# Image pipelines
# ----------------------------------------------------------------------------------------------------------------


def _sd(args, latent_size, experts=1):
    scale = _scale_module()
    shape = types.SimpleNamespace(width_fraction=WIDTH_FRACTION, seed=args.seed, latent_size=latent_size)
    return scale._sd_pipelines(shape, experts=experts)


def measure_dnd(args, sizes):
    import torch

    from diffusers_ext import DivideAndDenoisePipeline
    from diffusers_ext.metrics import peak_memory_bytes

    pipes = _sd(args, max(sizes), experts=2)
    pipe = DivideAndDenoisePipeline.from_pipelines(pipes)
    pipe.set_progress_bar_config(disable=True)
    peaks = []
    for side in sizes:

        def run(side=side):
            return pipe(
                prompt=["a red cube", "a blue ball"],
                height=side * 8,
                width=side * 8,
                num_inference_steps=2,
                output_type="latent",
                generator=torch.Generator().manual_seed(args.seed),
            )

        peaks.append(peak_memory_bytes(run))
    unet = pipes[0].unet
    return (
        {"experts": 2, "unet_channels": list(unet.config.block_out_channels), "steps": 2},
        [s * s for s in sizes],
        peaks,
    )


def measure_dirp(args, sizes):
    import torch

    from diffusers_ext import DIRPPipeline
    from diffusers_ext.metrics import peak_memory_bytes

    sd = _sd(args, max(sizes))[0]
    pipe = DIRPPipeline(
        unet=sd.unet, scheduler=sd.scheduler, vae=sd.vae, text_encoder=sd.text_encoder, tokenizer=sd.tokenizer
    )
    pipe.set_progress_bar_config(disable=True)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder):
        module.requires_grad_(False)
    noise_fn = pipe.noise_function(1, "cpu", "")
    peaks = []
    for side in sizes:
        images = torch.rand((1, 3, side * 8, side * 8), generator=torch.Generator().manual_seed(args.seed)) * 2 - 1

        def iteration(images=images):
            x = images.clone().requires_grad_(True)
            recon = pipe.reconstruct(x, 2, 0.5, "", gradient_checkpointing=True, noise_fn=noise_fn)
            (recon - x).pow(2).mean().backward()
            return x.grad

        peaks.append(peak_memory_bytes(iteration))
    return (
        {
            "unet_channels": list(pipe.unet.config.block_out_channels),
            "vae_channels": list(pipe.vae.config.block_out_channels),
            "num_inversion_steps": 2,
        },
        [(s * 8) ** 2 for s in sizes],
        peaks,
    )


def measure_nvs(args, sizes):
    import torch
    from diffusers import DDIMScheduler
    from transformers import Dinov2Config, Dinov2Model

    from diffusers_ext import SemanticMultiViewUNetModel, SemanticNVSPipeline
    from diffusers_ext.data.procedural_scenes import random_scene, render_orbit
    from diffusers_ext.metrics import peak_memory_bytes

    channels, semantic = (32, 64, 128), 32
    peaks = []
    for side in sizes:
        torch.manual_seed(args.seed)
        unet = SemanticMultiViewUNetModel(
            sample_size=side,
            semantic_channels=semantic,
            block_out_channels=channels,
            down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=16,
            attention_head_dim=16,
        ).eval()
        encoder = Dinov2Model(
            Dinov2Config(
                hidden_size=semantic,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=4 * semantic,
                patch_size=8,
                image_size=side,
            )
        ).eval()
        pipe = SemanticNVSPipeline(
            unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100), semantic_encoder=encoder
        )
        pipe.set_progress_bar_config(disable=True)
        scene = render_orbit(random_scene(torch.Generator().manual_seed(args.seed), num_objects=2), 3, side)

        def run(scene=scene, pipe=pipe):
            return pipe(
                images=scene["images"][None, :1],
                input_intrinsics=scene["intrinsics"][None, :1],
                input_c2w=scene["c2w"][None, :1],
                target_intrinsics=scene["intrinsics"][None, 1:],
                target_c2w=scene["c2w"][None, 1:],
                depths=scene["depths"][None, :1],
                semantic_mode="warped+iterative",
                num_inference_steps=2,
                guidance_scale=2.0,
                generator=torch.Generator().manual_seed(args.seed),
                output_type="pt",
            )

        peaks.append(peak_memory_bytes(run))
    return (
        {"unet_channels": list(channels), "semantic_channels": semantic, "views": "1 input + 2 targets", "steps": 2},
        [s * s for s in sizes],
        peaks,
    )


# ----------------------------------------------------------------------------------------------------------------
# Trainers
# ----------------------------------------------------------------------------------------------------------------


def measure_grpo(args, sizes):
    import tempfile

    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import LoraConfig

    from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from diffusers_ext.metrics import peak_memory_bytes
    from diffusers_ext.models.tiny_components import get_tiny_sd3_components
    from diffusers_ext.rewards import BrightnessReward

    layers, heads, head_dim = 2, 4, 32
    peaks, tokens = [], []
    for side in sizes:
        components = get_tiny_sd3_components(args.seed)
        torch.manual_seed(args.seed)
        components["transformer"] = SD3Transformer2DModel(
            sample_size=side // 2,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=layers,
            attention_head_dim=head_dim,
            num_attention_heads=heads,
            joint_attention_dim=48,
            caption_projection_dim=heads * head_dim,
            pooled_projection_dim=40,
            pos_embed_max_size=max(64, side // 4),
        ).eval()
        pipe = StableDiffusion3Pipeline(**components)
        with tempfile.TemporaryDirectory() as folder:
            config = DiffusionGRPOConfig(
                output_dir=folder,
                max_steps=1,
                num_generations=2,
                per_device_train_batch_size=2,
                num_inference_steps=2,
                guidance_scale=1.0,
                height=side,
                width=side,
                max_sequence_length=8,
                save_steps=1000,
                seed=args.seed,
            )
            trainer = DiffusionGRPOTrainer(
                pipe,
                [BrightnessReward(1.0)],
                config,
                train_dataset=["a cat"],
                peft_config=LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian"),
            )
            peaks.append(peak_memory_bytes(trainer.training_step))
        tokens.append((side // 4) ** 2)
    return (
        {
            "transformer_layers": layers,
            "transformer_width": heads * head_dim,
            "images_per_step": 2,
            "sde_steps": 2,
            "lora_rank": 4,
            "image_sides": list(sizes),
        },
        tokens,
        peaks,
    )


def measure_unlearning(args, sizes):
    from diffusers import DDPMScheduler, StableDiffusionPipeline
    from peft import LoraConfig

    from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
    from diffusers_ext.metrics import peak_memory_bytes

    peaks = []
    for side in sizes:
        sd = _sd(args, side)[0]
        sd.unet.register_to_config(sample_size=side)
        scheduler = DDPMScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, steps_offset=1
        )
        pipe = StableDiffusionPipeline(
            vae=sd.vae,
            text_encoder=sd.text_encoder,
            tokenizer=sd.tokenizer,
            unet=sd.unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        config = ConstrainedUnlearningConfig(
            constraint="reverse_kl",
            forget_prompts=["a photo of a cat"],
            retain_prompts=["a photo of a dog"],
            per_device_train_batch_size=2,
            pool_size=2,
            pool_sampling_steps=2,
            pool_refresh_steps=1000,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = ConstrainedUnlearningTrainer(
            pipe, config, peft_config=LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian")
        )
        trainer.training_step()  # the sample pools are drawn at the first step; the measured step trains only
        peaks.append(peak_memory_bytes(trainer.training_step))
    return (
        {
            "unet_channels": list(sd.unet.config.block_out_channels),
            "batch_per_part": 2,
            "constraint": "reverse_kl",
            "lora_rank": 4,
        },
        [s * s for s in sizes],
        peaks,
    )


# ----------------------------------------------------------------------------------------------------------------
# Fit and report
# ----------------------------------------------------------------------------------------------------------------


def fit_line(x: list[float], y: list[float]) -> dict:
    """Least squares `y = intercept + slope * x`, with the fit's R^2."""
    n = len(x)
    mean_x, mean_y = sum(x) / n, sum(y) / n
    sxx = sum((a - mean_x) ** 2 for a in x)
    sxy = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    total = sum((b - mean_y) ** 2 for b in y)
    residual = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y))
    return {"slope": slope, "intercept": intercept, "r2": 1.0 - residual / total if total > 0 else 1.0}


def memory_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            f"{part}: peak memory linear in {UNITS[part]}s (R^2 of the fit)", summary[part]["fit"]["r2"], R2_THRESHOLD
        )
        for part in PARTS
        if part in summary
    ]


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = [
        f"CPU, float32, random weights, models at reduced width; peak memory from torch's CPU allocator events "
        f"(`diffusers_ext.metrics.peak_memory_bytes`); {results['machine']['torch_threads']} torch threads.",
        "",
        "The extrapolated columns follow each part's fitted line to the sizes users run, at the SAME reduced width: "
        "an extrapolation along the size axis, not a measurement, and not the full-width model's memory.",
        "",
    ]
    for part in PARTS:
        if part not in summary:
            continue
        entry = summary[part]
        fit = entry["fit"]
        lines += [f"## {part}", "", f"Setup: {entry['shape']}.", ""]
        lines += [f"| {UNITS[part]}s | peak MiB (measured) |", "| --- | --- |"]
        lines += [f"| {x:,} | {_mib(y)} |" for x, y in zip(entry["x"], entry["peak_bytes"])]
        lines += [
            "",
            f"Fit: {fit['slope']:,.1f} bytes per {UNITS[part]} + {_mib(fit['intercept'])} MiB (R^2 {fit['r2']:.4f}).",
            "",
            "| extrapolated to (same reduced width) | " + UNITS[part] + "s | peak MiB (extrapolation) |",
            "| --- | --- | --- |",
        ]
        lines += [
            f"| {name} | {x:,} | {_mib(y)} |"
            for name, (x, y) in ((n, (v["x"], v["peak_bytes"])) for n, v in entry["extrapolated"].items())
        ]
        lines.append("")
    return lines


def main(argv=None) -> dict:
    import platform

    import torch

    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: memory_targets(r["summary"]), rel_to=REPO)
    else:
        torch.manual_seed(args.seed)
        start = time.perf_counter()
        measure = {
            "dlm": measure_dlm,
            "pll": measure_pll,
            "dnd": measure_dnd,
            "dirp": measure_dirp,
            "nvs": measure_nvs,
            "grpo": measure_grpo,
            "unlearning": measure_unlearning,
        }
        summary = {}
        for part in args.parts:
            part_start = time.perf_counter()
            shape, x, peaks = measure[part](args, getattr(args, f"{part}_sizes"))
            fit = fit_line(x, peaks)
            summary[part] = {
                "shape": shape,
                "unit": UNITS[part],
                "x": x,
                "peak_bytes": peaks,
                "fit": fit,
                "extrapolated": {
                    name: {"x": value, "peak_bytes": fit["intercept"] + fit["slope"] * value}
                    for name, value in REAL_SIZES[part].items()
                },
                "seconds": time.perf_counter() - part_start,
            }
            print(f"{part}: {peaks} at {x} ({summary[part]['seconds']:.0f} s)", file=sys.stderr)
        summary["targets"] = memory_targets(summary)
        results = {
            "command": command(__file__, argv, omit=("--output_dir",)),
            "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
            },
            "dtype": "float32",
            "wall_seconds": time.perf_counter() - start,
            "summary": summary,
        }
    write_results(
        os.path.join(args.output_dir, "memory_scaling"),
        results,
        "Peak memory against image size and sequence length (CPU, float32, reduced width)",
        report_sections(results),
    )
    return results


if __name__ == "__main__":
    main()
