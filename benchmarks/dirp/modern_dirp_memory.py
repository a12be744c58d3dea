#!/usr/bin/env python
"""Peak memory of one DIRP iteration against a plain inversion round trip, on SDXL, SD3 and Flux.

    python benchmarks/dirp/modern_dirp_memory.py
    python benchmarks/dirp/modern_dirp_memory.py --full_size      # also the computed full-size memory

For each family the real diffusers classes at reduced width with 64x64 latents (512x512 images through an 8x VAE;
`diffusers_ext.models.tiny_components.get_reduced_width_components`) run, in one process and alternating in order,
`--repeats` times each:

- the plain round trip: `DIRPPipeline.reconstruction_error` (encode, K-step inversion, K-step reconstruction,
  decode, no gradients): what a user runs to see how an image reconstructs;
- one DIRP iteration: `DIRPPipeline(...)(num_iterations=1)` (the iteration with gradients through every model call,
  checkpointed, its backward and Adam step, plus the error before and after).

Peak memory is `diffusers_ext.metrics.peak_memory_bytes` (the CPU allocator's events: the work's own memory; the
weights, which exist before the call, are not counted). Target per family: the iteration's peak <= 3.5x the round
trip's.

`--full_size` adds the computed memory of the same two calls for the full-size models (SDXL at 1024 px, SD3.5-large
and Flux.1-dev at 1024 px, bf16 weights, their published configurations, T5-XXL states of 256 / 512 tokens), by the
formula of docs/dirp.md (Memory): the weights, the stored latents and image state, and the largest of the models'
own peaks, each traced with fake tensors (`torch._subclasses.FakeTensorMode`, nothing allocated) under
`torch.distributed._tools.mem_tracker.MemTracker`, which sums every tensor's bytes as the work creates and frees
them. It is a computation, not a measurement on a GPU (no allocator rounding, fragmentation or workspace).

Writes `benchmarks/dirp/results/modern_dirp_memory.json` and `.md`.
"""

import argparse
import os
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
FAMILIES = ("sdxl", "sd3", "flux")
RATIO_THRESHOLD = 3.5
IMAGE_SIDE = 512  # 64x64 latents through the 8x VAE


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--num_inversion_steps", type=int, default=4)
    parser.add_argument("--inversion_strength", type=float, default=0.5)
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="Alternating repeats of the two calls per family.")
    parser.add_argument("--full_size", action="store_true", help="Also compute the full-size models' memory.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=RESULTS, help="Where modern_dirp_memory.json/.md go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.utils import check_positive_int

    for name in ("num_inversion_steps", "batch_size", "repeats"):
        check_positive_int(name, getattr(args, name))
    if not 0 < args.inversion_strength <= 1:
        parser.error(f"--inversion_strength must lie in (0, 1], got {args.inversion_strength}.")
    return args


def _pipeline(family: str, seed: int):
    from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline

    from diffusers_ext import DIRPPipeline
    from diffusers_ext.models.tiny_components import get_reduced_width_components

    classes = {"sdxl": StableDiffusionXLPipeline, "sd3": StableDiffusion3Pipeline, "flux": FluxPipeline}
    pipe = DIRPPipeline.from_pipe(classes[family](**get_reduced_width_components(family, seed)))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _calls(pipe, images, args):
    """The two calls compared: the plain round trip and one DIRP iteration, on the same images."""
    options = {"num_inversion_steps": args.num_inversion_steps, "inversion_strength": args.inversion_strength}

    def round_trip():
        return pipe.reconstruction_error(images, **options)

    def iteration():
        return pipe(images, num_iterations=1, perceptual="l2", output_type="pt", **options)

    return {"round_trip": round_trip, "iteration": iteration}


def measure_family(family: str, args) -> dict:
    import torch

    from diffusers_ext.metrics import peak_memory_bytes

    pipe = _pipeline(family, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.batch_size, 3, IMAGE_SIDE, IMAGE_SIDE, generator=generator)
    calls = _calls(pipe, images, args)
    peaks = {name: [] for name in calls}
    seconds = {name: [] for name in calls}
    for repeat in range(args.repeats):
        order = list(calls) if repeat % 2 == 0 else list(reversed(calls))
        for name in order:
            start = time.perf_counter()
            peaks[name].append(peak_memory_bytes(calls[name]))
            seconds[name].append(time.perf_counter() - start)
    error = float(calls["round_trip"]().mean())
    denoiser = pipe.denoiser
    return {
        "denoiser": type(denoiser).__name__,
        "denoiser_parameters": sum(p.numel() for p in denoiser.parameters()),
        "vae_parameters": sum(p.numel() for p in pipe.vae.parameters()),
        "latent_shape": [args.batch_size, *pipe.encode_images(images[:1]).shape[1:]],
        "peak_bytes": peaks,
        "seconds": seconds,
        "ratio": max(peaks["iteration"]) / max(peaks["round_trip"]),
        "round_trip_error": error,
    }


# ----------------------------------------------------------------------------------------------------------------
# Full-size models, computed with fake tensors
# ----------------------------------------------------------------------------------------------------------------


def _full_size_pipeline(family: str):
    """The full-size model of `family` (published configurations, diffusers 0.42 class names) built from fake
    tensors: SDXL base 1.0, SD3.5-large, Flux.1-dev, with their VAEs and text encoders (T5-XXL for SD3.5 / Flux)."""
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        FlowMatchEulerDiscreteScheduler,
        FluxTransformer2DModel,
        SD3Transformer2DModel,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from diffusers_ext import DIRPPipeline
    from diffusers_ext.models.tiny_tokenizers import get_tiny_clip_tokenizer, get_tiny_t5_tokenizer

    def real(scheduler_class, **config):  # a scheduler's schedule is read as numbers: real tensors
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return scheduler_class(**config)

    def clip(hidden, layers, heads, projection, with_projection):
        config = CLIPTextConfig(
            vocab_size=49408,
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            projection_dim=projection,
            max_position_embeddings=77,
            hidden_act="gelu",
        )
        return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)

    t5 = lambda: T5EncoderModel(  # noqa: E731
        T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                 feed_forward_proj="gated-gelu", relative_attention_num_buckets=32)
    )  # fmt: skip
    vae = lambda channels, **kw: AutoencoderKL(  # noqa: E731
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        latent_channels=channels,
        **kw,
    )
    if family == "sdxl":
        unet = UNet2DConditionModel(
            sample_size=128,
            layers_per_block=2,
            block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2, 10),
            attention_head_dim=(5, 10, 20),
            use_linear_projection=True,
            cross_attention_dim=2048,
            addition_embed_type="text_time",
            addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816,
        )
        pipe = DIRPPipeline(
            unet=unet,
            scheduler=real(EulerDiscreteScheduler, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear"),
            vae=vae(4, scaling_factor=0.13025),
            text_encoder=clip(768, 12, 12, 768, False),
            tokenizer=get_tiny_clip_tokenizer(),
            text_encoder_2=clip(1280, 32, 20, 1280, True),
            tokenizer_2=get_tiny_clip_tokenizer(),
        )
    elif family == "sd3":
        transformer = SD3Transformer2DModel(
            sample_size=128,
            patch_size=2,
            in_channels=16,
            num_layers=38,
            attention_head_dim=64,
            num_attention_heads=38,
            joint_attention_dim=4096,
            caption_projection_dim=2432,
            pooled_projection_dim=2048,
            out_channels=16,
            pos_embed_max_size=192,
            qk_norm="rms_norm",
        )
        pipe = DIRPPipeline(
            transformer=transformer,
            scheduler=real(FlowMatchEulerDiscreteScheduler, shift=3.0),
            vae=vae(16, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5305),
            text_encoder=clip(768, 12, 12, 768, True),
            tokenizer=get_tiny_clip_tokenizer(),
            text_encoder_2=clip(1280, 32, 20, 1280, True),
            tokenizer_2=get_tiny_clip_tokenizer(),
            text_encoder_3=t5(),
            tokenizer_3=get_tiny_t5_tokenizer(),
        )
    else:
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=19,
            num_single_layers=38,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=4096,
            pooled_projection_dim=768,
            guidance_embeds=True,
            axes_dims_rope=(16, 56, 56),
        )
        pipe = DIRPPipeline(
            transformer=transformer,
            scheduler=real(
                FlowMatchEulerDiscreteScheduler, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15
            ),
            vae=vae(16, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611),
            text_encoder=clip(768, 12, 12, 768, False),
            tokenizer=get_tiny_clip_tokenizer(),
            text_encoder_2=t5(),
            tokenizer_2=get_tiny_t5_tokenizer(),
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


# Full-size conditions: (prompt states, pooled) shapes of each model's text encoders for one prompt
FULL_SIZE_CONDITIONS = {
    "sdxl": {"encoder_hidden_states": (77, 2048), "text_embeds": (1280,), "time_ids": (6,)},
    "sd3": {"encoder_hidden_states": (77 + 256, 4096), "pooled_projections": (2048,)},
    "flux": {"encoder_hidden_states": (512, 4096), "pooled_projections": (768,)},
}
FULL_SIZE_LATENTS = {"sdxl": (4, 128, 128), "sd3": (16, 128, 128), "flux": (16, 128, 128)}


def _frozen_weights_mem_tracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    class FrozenWeightsMemTracker(MemTracker):
        """MemTracker for frozen weights: it installs no gradient hooks on them (they take none)."""

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    return FrozenWeightsMemTracker


def _traced_peak(work) -> int:
    """The peak bytes of the tensors `work()` creates (weights excluded), traced with fake tensors."""
    import torch

    tracker = _frozen_weights_mem_tracker()()
    with tracker:
        work()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    by_kind = {str(k).split(".")[-1].split(":")[0].lower(): int(v) for k, v in peak.items()}
    return by_kind["total"] - by_kind.get("param", 0) - by_kind.get("buffer", 0)


def compute_full_size(family: str, args) -> dict:
    r"""
    The memory of the two calls for the full-size model of `family` at 1024 px in bf16, by the formula of
    docs/dirp.md with each model's own term traced with fake tensors:

        round trip = W + |x| + |z| + max(F_model, F_encoder, F_decoder)
        iteration  = W + 2K |z| + 4 |x| + max(A_model, A_encoder, A_decoder)

    W: every component's weights (bf16); x: the float32 images, z: float32 latents (2K checkpointed step inputs; the
    image, its gradient and Adam's two moments); F_*: one forward's peak without gradients; A_*: one forward and
    backward's peak with gradients to the input (a checkpointed call's recomputation and backward; the VAE decoder
    layer by layer, as DIRP checkpoints it).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from diffusers_ext.pipelines.dirp.ddim_inversion import vae_layer_checkpointing
    from diffusers_ext.pipelines.pipeline_utils import decode_vae_latents, encode_vae_latents

    steps = args.num_inversion_steps
    default_dtype = torch.get_default_dtype()
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_default_dtype(torch.bfloat16)  # built in bf16 (fake tensors cannot be cast after)
        try:
            pipe = _full_size_pipeline(family)
        finally:
            torch.set_default_dtype(default_dtype)
        parameters = {
            name: sum(p.numel() for p in module.parameters())
            for name in ("unet", "transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
            if (module := getattr(pipe, name, None)) is not None
        }
        for name in parameters:
            getattr(pipe, name).requires_grad_(False)
        denoiser, vae = pipe.denoiser, pipe.vae
        model_family = pipe.denoiser_family()
        from diffusers_ext.pipelines.denoiser_families import Conditions

        cond = Conditions(
            {
                name: torch.randn(1, *shape, dtype=torch.bfloat16)
                for name, shape in FULL_SIZE_CONDITIONS[family].items()
            }
        )
        timestep = torch.full((1,), 500.0)
        latent_shape = (1, *FULL_SIZE_LATENTS[family])

        def model(grad: bool):
            z = torch.randn(latent_shape).requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                out = model_family.predict(denoiser, z, timestep, cond, torch.bfloat16).float()
                if grad:
                    out.sum().backward()

        def encoder(grad: bool):
            x = torch.randn(1, 3, 1024, 1024).requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                out = encode_vae_latents(vae, x).float()
                if grad:
                    out.sum().backward()

        def decoder(grad: bool):
            z = torch.randn(latent_shape).requires_grad_(grad)
            with torch.set_grad_enabled(grad), vae_layer_checkpointing(vae, grad):
                out = decode_vae_latents(vae, z).float()
                if grad:
                    out.sum().backward()

        terms = {}
        for name, work in (("model", model), ("encoder", encoder), ("decoder", decoder)):
            terms[f"forward_{name}"] = _traced_peak(lambda work=work: work(False))
            terms[f"backward_{name}"] = _traced_peak(lambda work=work: work(True))
    weights = 2 * sum(parameters.values())
    image, latent = 4 * 3 * 1024 * 1024, 4 * int(torch.tensor(latent_shape).prod())
    forward_peak = max(terms[f"forward_{n}"] for n in ("model", "encoder", "decoder"))
    backward_peak = max(terms[f"backward_{n}"] for n in ("model", "encoder", "decoder"))
    round_trip = {"weights": weights, "work": image + latent + forward_peak}
    iteration = {"weights": weights, "work": 2 * steps * latent + 4 * image + backward_peak}
    for row in (round_trip, iteration):
        row["total"] = row["weights"] + row["work"]
    return {
        "image_side": 1024,
        "dtype": "bfloat16",
        "num_inversion_steps": steps,
        "parameters": parameters,
        "terms": terms,
        "round_trip": round_trip,
        "iteration": iteration,
        "ratio": iteration["total"] / round_trip["total"],
        "work_ratio": iteration["work"] / round_trip["work"],
    }


# ----------------------------------------------------------------------------------------------------------------
# Targets and report
# ----------------------------------------------------------------------------------------------------------------


def memory_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            f"{family}: one DIRP iteration's peak / a plain round trip's",
            summary[family]["ratio"],
            RATIO_THRESHOLD,
            "<=",
        )
        for family in FAMILIES
        if family in summary
    ]


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = [
        "## Measured at reduced width (CPU, float32, 64x64 latents)",
        "",
        "| family | denoiser (parameters) | round trip peak MiB | DIRP iteration peak MiB | ratio | seconds (round trip / iteration) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        if family not in summary:
            continue
        row = summary[family]
        peaks, seconds = row["peak_bytes"], row["seconds"]
        lines.append(
            f"| {family} | {row['denoiser']} ({row['denoiser_parameters'] / 1e6:.2f} M) | "
            f"{' / '.join(_mib(p) for p in peaks['round_trip'])} | {' / '.join(_mib(p) for p in peaks['iteration'])} | "
            f"{row['ratio']:.2f} | {min(seconds['round_trip']):.1f} / {min(seconds['iteration']):.1f} |"
        )
    full = summary.get("full_size")
    if full:
        lines += [
            "",
            "## Computed for the full-size models (bf16, 1024 px, fake-tensor trace)",
            "",
            "Peak = weights (all components, bf16) + the call's own memory by the formula of docs/dirp.md (Memory), "
            "each model's forward / forward-and-backward peak traced with fake tensors.",
            "",
            "| model | parameters (B) | round trip: weights GiB + work GiB = peak GiB | DIRP iteration: weights GiB + work GiB = peak GiB | ratio |",
            "| --- | --- | --- | --- | --- |",
        ]
        for family, row in full.items():
            cells = []
            for name in ("round_trip", "iteration"):
                part = row[name]
                cells.append(f"{_gib(part['weights'])} + {_gib(part['work'])} = {_gib(part['total'])}")
            lines.append(
                f"| {FULL_SIZE_NAMES[family]} | {sum(row['parameters'].values()) / 1e9:.2f} | {cells[0]} | {cells[1]} "
                f"| {row['ratio']:.2f} |"
            )
    return lines


FULL_SIZE_NAMES = {"sdxl": "SDXL 1.0 at 1024 px", "sd3": "SD3.5-large at 1024 px", "flux": "Flux.1-dev at 1024 px"}


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
        summary = {}
        if args.full_size:  # first: a computation, quick next to the measurements
            summary["full_size"] = {}
            for family in args.families:
                summary["full_size"][family] = compute_full_size(family, args)
                print(f"{family} full size: {summary['full_size'][family]['ratio']:.2f}", file=sys.stderr)
        for family in args.families:
            summary[family] = measure_family(family, args)
            print(f"{family}: ratio {summary[family]['ratio']:.2f}", file=sys.stderr)
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
            "image_side": IMAGE_SIDE,
            "wall_seconds": time.perf_counter() - start,
            "summary": summary,
        }
    write_results(
        os.path.join(args.output_dir, "modern_dirp_memory"),
        results,
        "DIRP on SDXL, SD3 and Flux: one iteration's peak memory against a plain inversion round trip",
        report_sections(results),
        settings_line=(
            f"Settings: K = {results['settings']['num_inversion_steps']} inversion steps, strength "
            f"{results['settings']['inversion_strength']}, batch {results['settings']['batch_size']}, "
            f"{results['image_side']}x{results['image_side']} images (64x64 latents), gradient checkpointing on."
        ),
    )
    return results


if __name__ == "__main__":
    main()
