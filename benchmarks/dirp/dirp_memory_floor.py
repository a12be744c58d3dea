#!/usr/bin/env python
"""Where DIRP's peak memory on Stable Diffusion's block structure comes from: a profile of its floor.

    python benchmarks/dirp/dirp_memory_floor.py

`benchmarks/scale/scale.py` measures one DIRP iteration (the differentiable DDIM round trip through the VAE and the
UNet, and its backward, with the default layer-wise checkpointing) at 4.03x the peak memory of a plain inversion +
reconstruction, against a 3x target. This script builds the same models (`scale.py`'s SD1.5-shaped UNet and SD-shaped
VAE at the same width, 512 px images) and measures, with the same allocator counter (`metrics.peak_memory_bytes`,
the torch profiler's memory events on the CPU), the parts of that iteration separately:

- the plain round trip (no gradients) and one DIRP iteration, as `scale.py` does;
- the same iteration with no inversion step (`num_inversion_steps=0`): the VAE's encode and decode and their
  checkpointed backward alone, no UNet call;
- the VAE's decoder alone and its encoder alone, each forward without gradients and forward + checkpointed backward;
- the iteration again with plain checkpointing, where nothing is kept (`checkpointed` keeps the outputs of attention
  over long key sequences so the backward does not run that attention twice; this part shows what that costs).

Targets: the iteration's ratio to the plain round trip against the 3x target (re-measured here), and the floor claim:
the VAE round trip's backward alone reaches at least 90% of the whole iteration's peak, so the UNet calls and the
inversion add (almost) nothing and what remains is the VAE's backward at full resolution, which layer-wise
checkpointing already cuts to one layer's working set. Writes `benchmarks/dirp/results/dirp_memory_floor.{json,md}`.
"""

import argparse
import os
from contextlib import contextmanager

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MEMORY_RATIO_TARGET = 3.0  # benchmarks/scale/scale.py's DIRP_MEMORY_RATIO_TARGET
FLOOR_SHARE = 0.9


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latent_size", type=int, default=64, help="Latent side (images are 8x larger).")
    parser.add_argument("--width_fraction", type=float, default=0.2, help="Model width as a fraction of SD1.5's.")
    parser.add_argument("--num_inversion_steps", type=int, default=3, help="DDIM inversion steps of the iteration.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=str, default=os.path.join(HERE, "results", "dirp_memory_floor.json"))
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in ("latent_size", "num_inversion_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not 0 < args.width_fraction <= 1:
        parser.error(f"--width_fraction must be in (0, 1], got {args.width_fraction}.")
    return args


@contextmanager
def nothing_kept():
    """Within the block, `ddim_inversion.checkpointed` recomputes everything (its torch < 2.4 path): no attention
    output is kept for the backward."""
    from diffusers_ext.pipelines.dirp import ddim_inversion

    saved = ddim_inversion.create_selective_checkpoint_contexts
    ddim_inversion.create_selective_checkpoint_contexts = None
    try:
        yield
    finally:
        ddim_inversion.create_selective_checkpoint_contexts = saved


def measure(args) -> dict:
    """Peak bytes of each part (`peak_memory_bytes`, above what exists before the call)."""
    from diffusers_ext import DIRPPipeline
    from diffusers_ext.evaluation.reporting import load_script
    from diffusers_ext.metrics import peak_memory_bytes
    from diffusers_ext.pipelines.dirp.ddim_inversion import vae_layer_checkpointing

    scale = load_script(os.path.join(REPO, "benchmarks", "scale", "scale.py"), "scale_benchmark")
    sd = scale._sd_pipelines(argparse.Namespace(**vars(args)), experts=1)[0]  # the models scale.py measures
    pipe = DIRPPipeline(
        unet=sd.unet, scheduler=sd.scheduler, vae=sd.vae, text_encoder=sd.text_encoder, tokenizer=sd.tokenizer
    )
    pipe.set_progress_bar_config(disable=True)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder):
        module.requires_grad_(False)
    size = args.latent_size * 8
    images = torch.rand((1, 3, size, size), generator=torch.Generator().manual_seed(args.seed)) * 2 - 1
    latents = pipe.encode_images(images).detach()
    noise_fn = pipe.noise_function(1, images.device, "")

    def iteration(steps):
        def run():
            x = images.clone().requires_grad_(True)
            recon = pipe.reconstruct(x, steps, 0.5, "", noise_fn=noise_fn)  # the default: layer-wise checkpointing
            (recon - x).pow(2).mean().backward()

        return run

    @torch.no_grad()
    def plain():
        pipe.reconstruct(images, args.num_inversion_steps, 0.5, "", gradient_checkpointing=False, noise_fn=noise_fn)

    def backward_through(part, source):
        def run():
            x = source.clone().requires_grad_(True)
            with vae_layer_checkpointing(pipe.vae, True):
                part(x).pow(2).mean().backward()

        return run

    def forward_only(part, source):
        @torch.no_grad()
        def run():
            part(source)

        return run

    parts = {
        "plain_round_trip": plain,
        "dirp_iteration": iteration(args.num_inversion_steps),
        "vae_round_trip_backward": iteration(0),
        "decoder_forward": forward_only(pipe.decode_latents, latents),
        "decoder_backward": backward_through(pipe.decode_latents, latents),
        "encoder_forward": forward_only(pipe.encode_images, images),
        "encoder_backward": backward_through(pipe.encode_images, images),
    }

    def without_kept_attention():
        with nothing_kept():
            iteration(args.num_inversion_steps)()

    parts["dirp_iteration_nothing_kept"] = without_kept_attention
    peaks = {name: peak_memory_bytes(run) for name, run in parts.items()}
    return {
        "shape": {
            "image_size": size,
            "latent_size": args.latent_size,
            "num_inversion_steps": args.num_inversion_steps,
            "unet_channels": list(pipe.unet.config.block_out_channels),
            "vae_channels": list(pipe.vae.config.block_out_channels),
            "full_resolution_activation_bytes": 4 * pipe.vae.config.block_out_channels[0] * size * size,
        },
        "peak_memory_bytes": peaks,
    }


def targets_from_results(results: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    peaks = results["peak_memory_bytes"]
    return [
        target(
            "dirp: peak memory of one iteration / plain round trip",
            peaks["dirp_iteration"] / peaks["plain_round_trip"],
            MEMORY_RATIO_TARGET,
            "<=",
        ),
        target(
            "floor: the VAE round trip's checkpointed backward alone / the whole iteration's peak",
            peaks["vae_round_trip_backward"] / peaks["dirp_iteration"],
            FLOOR_SHARE,
        ),
    ]


def report_sections(results: dict) -> list[str]:
    peaks = results["peak_memory_bytes"]
    unit = results["shape"]["full_resolution_activation_bytes"]
    plain = peaks["plain_round_trip"]
    labels = {
        "plain_round_trip": "plain inversion + reconstruction, no gradients (the reference)",
        "dirp_iteration": "one DIRP iteration: round trip + backward, layer-wise checkpointing",
        "vae_round_trip_backward": "the same with no inversion step: VAE encode + decode and backward only",
        "decoder_forward": "VAE decoder, forward, no gradients",
        "decoder_backward": "VAE decoder, forward + checkpointed backward",
        "encoder_forward": "VAE encoder, forward, no gradients",
        "encoder_backward": "VAE encoder, forward + checkpointed backward",
        "dirp_iteration_nothing_kept": "one DIRP iteration with plain checkpointing (no attention output kept)",
    }
    lines = [
        "## Peak memory of each part (MiB above what existed before the call)",
        "",
        f"A full-resolution activation of the VAE's first level ({results['shape']['vae_channels'][0]} channels x "
        f"{results['shape']['image_size']}^2, float32) is {unit / 2**20:.0f} MiB.",
        "",
        "| part | peak MiB | / plain round trip | full-resolution activations |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in labels.items():
        if name not in peaks:  # a record from before the part existed
            continue
        lines.append(
            f"| {label} | {peaks[name] / 2**20:.0f} | {peaks[name] / plain:.2f}x | {peaks[name] / unit:.1f} |"
        )
    return lines


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    title = "DIRP's peak memory on Stable Diffusion's block structure: where the floor is"
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        return write_results(stem, results, title, report_sections(results))
    torch.set_num_threads(1)
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        **measure(args),
    }
    results["summary"] = {"targets": targets_from_results(results)}
    settings = (
        f"Settings: {results['shape']['image_size']} px, the UNet and VAE of `benchmarks/scale/scale.py` at width "
        f"fraction {args.width_fraction}, {args.num_inversion_steps} inversion steps, one CPU thread."
    )
    return write_results(stem, results, title, report_sections(results), settings)


if __name__ == "__main__":
    main()
