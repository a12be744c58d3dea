#!/usr/bin/env python
"""SemanticNVS on held-out procedural scenes: quality against camera distance for each semantic mode.

    python benchmarks/semantic_nvs.py

In one process, on the same scenes, cameras and seeds: the zoo's no-semantics baseline (`procedural-nvs-baseline`)
and the zoo SemanticNVS model (`procedural-nvs`) in every `semantic_mode`, generating two target views (azimuth
+d and -d) from one input view at each camera distance d. Scores: PSNR and SSIM to the rendered ground truth, and
the Fréchet distance between generated and real target views in the semantic encoder's feature space. Also the time
to warp 4 views of 64x64 feature maps with 256 channels. Writes `benchmarks/results/semantic_nvs.{json,md,png}`.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MODES = ("none", "warped", "iterative", "warped+iterative")
DELAYED = "semantic/warped+iterative (delayed)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_scenes", type=int, default=96, help="Held-out scenes per distance.")
    parser.add_argument("--distances", type=float, nargs="+", default=[15.0, 30.0, 60.0, 90.0],
                        help="Azimuth offsets of the targets from the input view (degrees).")  # fmt: skip
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps.")
    parser.add_argument("--guidance_scale", type=float, default=2.0, help="Classifier-free guidance.")
    parser.add_argument("--iterative_start", type=float, default=0.8,
                        help="iterative_start of the extra 'delayed' warped+iterative row.")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="Seed of the scenes and the sampling noise.")
    parser.add_argument("--model", type=str, default=None, help="A SemanticNVSPipeline folder (default: the zoo's).")
    parser.add_argument("--baseline_model", type=str, default=None,
                        help="The no-semantics pipeline folder (default: the zoo's).")  # fmt: skip
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where semantic_nvs.json/.md/.png go.")
    args = parser.parse_args(argv)
    if args.num_scenes < 8:
        parser.error(f"--num_scenes must be >= 8 for a Fréchet distance, got {args.num_scenes}.")
    return args


def semantic_descriptors(encoder, images: torch.Tensor) -> torch.Tensor:
    """Per-image descriptors `(N, 4 * C)`: the encoder's patch features average-pooled to a 2x2 grid."""
    from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_map

    with torch.no_grad():
        features = semantic_feature_map(encoder, images)
    return F.adaptive_avg_pool2d(features, 2).flatten(1)


def warp_milliseconds(repeats: int = 10) -> float:
    """Median time to warp 4 views of 64x64 feature maps with 256 channels (z-buffer)."""
    from diffusers_ext.data.procedural_scenes import default_intrinsics
    from diffusers_ext.geometry.camera import orbit_trajectory
    from diffusers_ext.pipelines.semantic_nvs.warp import forward_warp

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4, 256, 64, 64, generator=generator)
    depth = 2 + torch.rand(4, 1, 64, 64, generator=generator)
    poses = orbit_trajectory(8, 4.0)
    intrinsics = default_intrinsics(4, 64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward_warp(features, depth, intrinsics, poses[:4], intrinsics, poses[4:])
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def evaluate(pipe, scenes, mode, args, encoder, real_descriptors, iterative_start=0.0):
    from diffusers_ext.metrics import frechet_distance, peak_signal_noise_ratio, structural_similarity

    start = time.perf_counter()
    out = pipe(
        images=scenes["images"][:, :1], input_intrinsics=scenes["intrinsics"][:, :1], input_c2w=scenes["c2w"][:, :1],
        target_intrinsics=scenes["intrinsics"][:, 1:], target_c2w=scenes["c2w"][:, 1:],
        depths=scenes["depths"][:, :1] if "warped" in mode else None, semantic_mode=mode, iterative_start=iterative_start,
        num_inference_steps=args.num_inference_steps, guidance_scale=args.guidance_scale,
        generator=torch.Generator().manual_seed(args.seed), output_type="pt",
    )  # fmt: skip
    seconds = time.perf_counter() - start
    generated = out.images.reshape(-1, *out.images.shape[2:]).float()
    real = scenes["images"][:, 1:].reshape(-1, *generated.shape[1:])
    return {
        "psnr": float(peak_signal_noise_ratio(generated, real).mean()),
        "ssim": float(structural_similarity(generated, real, window_size=7).mean()),
        "frechet": frechet_distance(semantic_descriptors(encoder, generated), real_descriptors),
        "coverage": float(out.coverage.float().mean()),
        "seconds": seconds,
    }


def write_outputs(results, output_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = results["distances"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=100)
    for name, per_distance in results["runs"].items():
        for ax, metric in zip(axes, ("frechet", "psnr", "ssim")):
            ax.plot(distances, [per_distance[str(d)][metric] for d in distances], marker="o", label=name)
    for ax, label in zip(axes, ("Fréchet distance (semantic features)", "PSNR (dB)", "SSIM")):
        ax.set_xlabel("camera distance (azimuth degrees)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "semantic_nvs.png"))
    plt.close(fig)

    lines = ["# SemanticNVS on procedural scenes", "", f"Command: `{results['command']}`", "",
             "| model / mode | " + " | ".join(f"FD @{d:g}°" for d in distances) + " | "
             + " | ".join(f"PSNR @{d:g}°" for d in distances) + " |",
             "| --- |" + " --- |" * (2 * len(distances))]  # fmt: skip
    for name, per_distance in results["runs"].items():
        fds = " | ".join(f"{per_distance[str(d)]['frechet']:.3f}" for d in distances)
        psnrs = " | ".join(f"{per_distance[str(d)]['psnr']:.2f}" for d in distances)
        lines.append(f"| {name} | {fds} | {psnrs} |")
    s = results["summary"]
    lines += ["", f"Fréchet improvement at the longest distance (baseline vs warped+iterative): "
              f"{100 * s['frechet_improvement_longest']:.1f}% (target >= 5%); PSNR change at the shortest distance: "
              f"{s['psnr_change_shortest']:+.2f} dB; warp of 4 x 256 x 64 x 64 features: {s['warp_ms']:.1f} ms "
              "(target < 50 ms)."]  # fmt: skip
    with open(os.path.join(output_dir, "semantic_nvs.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext import SemanticNVSPipeline, zoo
    from diffusers_ext.data.procedural_scenes import sample_scene_batch

    torch.manual_seed(args.seed)
    semantic = SemanticNVSPipeline.from_pretrained(args.model or zoo.path("procedural-nvs"))
    baseline = SemanticNVSPipeline.from_pretrained(args.baseline_model or zoo.path("procedural-nvs-baseline"))
    for pipe in (semantic, baseline):
        pipe.set_progress_bar_config(disable=True)
    encoder = semantic.semantic_encoder
    size = semantic.unet.config.sample_size

    runs = {"baseline": {}, **{f"semantic/{mode}": {} for mode in MODES}, DELAYED: {}}
    for distance in args.distances:
        generator = torch.Generator().manual_seed(10**9 + args.seed)  # held out: training seeds are small
        scenes = sample_scene_batch(
            generator, args.num_scenes, 3, size, azimuth_offsets_deg=[0.0, distance, -distance]
        )
        real = semantic_descriptors(encoder, scenes["images"][:, 1:].reshape(-1, 3, size, size))
        runs["baseline"][str(distance)] = evaluate(baseline, scenes, "none", args, encoder, real)
        for mode in MODES:
            runs[f"semantic/{mode}"][str(distance)] = evaluate(semantic, scenes, mode, args, encoder, real)
        runs[DELAYED][str(distance)] = evaluate(semantic, scenes, "warped+iterative", args, encoder, real,
                                                iterative_start=args.iterative_start)  # fmt: skip
        print(f"{distance:g} deg: " + ", ".join(f"{k} FD {v[str(distance)]['frechet']:.3f}" for k, v in runs.items()))

    longest, shortest = str(args.distances[-1]), str(args.distances[0])
    base_fd = runs["baseline"][longest]["frechet"]
    results = {
        "command": "python benchmarks/semantic_nvs.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "settings": vars(args) | {"output_dir": None},
        "distances": args.distances,
        "runs": runs,
        "summary": {
            "longest_distance": {
                name.split("/")[-1]: {"frechet": per[longest]["frechet"], "psnr": per[longest]["psnr"]}
                for name, per in runs.items()
            },
            "frechet_improvement_longest": (base_fd - runs["semantic/warped+iterative"][longest]["frechet"]) / base_fd,
            "psnr_change_shortest": runs["semantic/warped+iterative"][shortest]["psnr"]
            - runs["baseline"][shortest]["psnr"],
            "warp_ms": warp_milliseconds(),
        },
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "semantic_nvs.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    write_outputs(results, args.output_dir)
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
