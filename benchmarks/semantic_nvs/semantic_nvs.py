#!/usr/bin/env python
"""SemanticNVS against its same-budget baseline, judged by an independent evaluator: validation, then test once.

    python benchmarks/semantic_nvs/semantic_nvs.py

In one process: the zoo SemanticNVS model (`procedural-nvs`, `semantic_mode="warped+iterative"`) and the zoo
no-semantics baseline (`procedural-nvs-baseline`) generate two target views (azimuth +d and -d) from one input view
of procedural scenes, at the shortest and the longest camera distance d.

1. **Judge**: Fréchet distances are computed in the embedding of `diffusers_ext.evaluation.semantic_nvs`'s
   `SceneEvaluator`, a CNN trained here (one per seed, cached under `benchmarks/.cache/` keyed by its settings and
   code) on scenes of its own seed range with a composition-and-depth objective; not in the space of the semantic
   encoder the model conditions on (that distance is still written, labelled "not a judge"). Its accuracy on real
   renders is in `summary.sanity`.
2. **Validation**: each model gets a grid of the same size over its sampler options (the baseline: 6 guidance
   scales; SemanticNVS: 3 guidance scales x 2 `iterative_start`) on validation scenes; the option with the lowest
   Fréchet distance (mean over distances and judges) is frozen.
3. **Test**: scenes of a seed range never used before, evaluated once with the frozen options, for each seed
   (sampling noise and judge): PSNR, SSIM, Fréchet distance with its bootstrap standard error over scenes, and
   each view's agreement with the rendered truth of its target as the judge reads it (visible classes, depth).
   References: real views of other scenes, and the input view copied to every target.
4. **Targets** (computed): at the longest distance the Fréchet distance improves on the baseline's by >= 5% (mean
   over seeds); at the shortest distance PSNR does not drop; warping 4 x 256 x 64 x 64 features takes < 50 ms.

Writes `benchmarks/semantic_nvs/results/semantic_nvs.{json,md,png}`.
"""

import argparse
import itertools
import json
import os
import time

import torch
import torch.nn.functional as F


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
CACHE = os.path.join(HERE, ".cache", "semantic_nvs")
# Scene seed ranges of this benchmark; training uses small step seeds and the old held-out scenes 10**9 + seed.
VALIDATION_SCENE_SEED = 2_100_000_000
TEST_SCENE_SEED = 2_200_000_000
REAL_FLOOR_OFFSET = 50_000  # a second, disjoint set of real test-range scenes: the real-vs-real Fréchet floor
VALIDATION_SAMPLING_SEED = 1000
METHOD = "semantic/warped+iterative"


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--validation_scenes", type=int, default=20, help="Validation scenes per distance.")
    parser.add_argument("--test_scenes", type=int, default=32, help="Test scenes per distance.")
    parser.add_argument(
        "--distances",
        type=float,
        nargs="+",
        default=[15.0, 90.0],
        help="Azimuth offsets of the targets (degrees); the first is the PSNR claim's, the last the Fréchet claim's.",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Test seeds (sampling noise, judge).")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps (fixed for both models).")
    parser.add_argument(
        "--semantic_guidance",
        type=float,
        nargs="+",
        default=[1.0, 2.0, 3.0],
        help="Guidance scales tried for SemanticNVS on validation.",
    )
    parser.add_argument(
        "--iterative_starts",
        type=float,
        nargs="+",
        default=[0.0, 0.8],
        help="iterative_start values tried for SemanticNVS on validation.",
    )
    parser.add_argument(
        "--baseline_guidance",
        type=float,
        nargs="+",
        default=[1.0, 1.5, 2.0, 3.0, 4.0, 5.0],
        help="Guidance scales tried for the baseline on validation (as many options as SemanticNVS).",
    )
    parser.add_argument("--evaluator_views", type=int, default=2048, help="Training renders of each judge.")
    parser.add_argument("--evaluator_steps", type=int, default=1600, help="Training steps of each judge.")
    parser.add_argument("--evaluator_heldout_views", type=int, default=512, help="Renders for the judge's accuracy.")
    parser.add_argument("--num_bootstrap", type=int, default=200, help="Scene resamples for standard errors.")
    parser.add_argument("--model", type=str, default=None, help="A SemanticNVSPipeline folder (default: the zoo's).")
    parser.add_argument(
        "--baseline_model", type=str, default=None, help="The no-semantics pipeline folder (default: the zoo's)."
    )
    parser.add_argument("--cache_dir", type=str, default=CACHE, help="Where trained judges are cached.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where semantic_nvs.json/.md/.png go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in ("validation_scenes", "test_scenes"):
        if getattr(args, name) < 8:
            parser.error(f"--{name} must be >= 8 for a Fréchet distance, got {getattr(args, name)}.")
    if len(args.seeds) != len(set(args.seeds)):
        parser.error(f"--seeds must be distinct, got {args.seeds}.")
    return args


def semantic_descriptors(encoder, images: torch.Tensor) -> torch.Tensor:
    """The conditioning encoder's patch features pooled to 2x2, `(N, 4 * C)`: reported, never a judge."""
    from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_map

    with torch.no_grad():
        features = semantic_feature_map(encoder, images)
    return F.adaptive_avg_pool2d(features, 2).flatten(1)


def warp_milliseconds(repeats: int = 10) -> dict:
    """Median time to warp 4 views of 64x64 feature maps with 256 channels (z-buffer), on this process's threads.

    `cpu_ms` is the process CPU time per warp (the target's figure: on a shared machine the wall time mostly
    measures the other processes); `wall_ms` and the load average are recorded beside it.
    """
    from diffusers_ext.data.procedural_scenes import default_intrinsics
    from diffusers_ext.geometry.camera import orbit_trajectory
    from diffusers_ext.pipelines.semantic_nvs.warp import forward_warp

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4, 256, 64, 64, generator=generator)
    depth = 2 + torch.rand(4, 1, 64, 64, generator=generator)
    poses = orbit_trajectory(8, 4.0)
    intrinsics = default_intrinsics(4, 64)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        forward_warp(features, depth, intrinsics, poses[:4], intrinsics, poses[4:])
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {
        "cpu_ms": 1000 * sorted(cpu)[len(cpu) // 2],
        "wall_ms": 1000 * sorted(wall)[len(wall) // 2],
        "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
    }


def load_or_train_judge(seed: int, args) -> tuple:
    """The judge of `seed`, from the cache when its settings and code are unchanged; and whether it was cached."""
    from safetensors.torch import load_file, save_file

    from diffusers_ext.evaluation import semantic_nvs as judge_module
    from diffusers_ext.evaluation.reporting import ResultCache

    settings = {"seed": seed, "views": args.evaluator_views, "steps": args.evaluator_steps, "size": 16}
    code = [
        judge_module.__file__,
        os.path.join(ROOT, "diffusers_ext", "data", "procedural_scenes.py"),
        os.path.join(ROOT, "diffusers_ext", "geometry", "camera.py"),
    ]
    cache = ResultCache(args.cache_dir, settings, code)
    path = cache.path("judge.safetensors")
    if cache.has("judge.safetensors"):
        model = judge_module.SceneEvaluator(16)
        model.load_state_dict(load_file(path))
        return model.eval(), True
    model = judge_module.train_scene_evaluator(seed, args.evaluator_views, args.evaluator_steps)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    return model, False


def scene_split(base_seed: int, distance: float, count: int, size: int) -> dict:
    from diffusers_ext.data.procedural_scenes import sample_scene_batch

    generator = torch.Generator().manual_seed(base_seed + round(10 * distance))
    return sample_scene_batch(generator, count, 3, size, azimuth_offsets_deg=[0.0, distance, -distance])


def targets_of(scenes: dict) -> torch.Tensor:
    """The real target views `(B * 2, 3, S, S)`, scene-major."""
    return scenes["images"][:, 1:].reshape(-1, *scenes["images"].shape[2:])


def truth_of(scenes: dict) -> dict:
    """The judge's labels (visible classes, class fractions, 4x4 log depth) of the real target views, from the renderer."""
    from diffusers_ext.evaluation.semantic_nvs import scene_labels

    size = scenes["images"].shape[-1]
    return scene_labels(
        scenes["classes"][:, 1:].reshape(-1, size, size), scenes["depths"][:, 1:].reshape(-1, 1, size, size)
    )


def against_truth(judge, images: torch.Tensor, truth: dict) -> dict:
    """Per-view agreement of generated views with the rendered truth of their targets, read by the judge."""
    from diffusers_ext.evaluation.semantic_nvs import evaluator_accuracy

    accuracy = evaluator_accuracy(judge, images, truth)
    return {f"truth_{k}": accuracy[k] for k in ("presence_accuracy", "region_mae", "depth_r2")}


def generate(pipe, scenes, mode, guidance_scale, iterative_start, seed, args) -> tuple[torch.Tensor, float]:
    """Target views `(B * 2, 3, S, S)` in [0, 1], scene-major, and the seconds they took."""
    start = time.perf_counter()
    out = pipe(
        images=scenes["images"][:, :1],
        input_intrinsics=scenes["intrinsics"][:, :1],
        input_c2w=scenes["c2w"][:, :1],
        target_intrinsics=scenes["intrinsics"][:, 1:],
        target_c2w=scenes["c2w"][:, 1:],
        depths=scenes["depths"][:, :1] if "warped" in mode else None,
        semantic_mode=mode,
        iterative_start=iterative_start,
        num_inference_steps=args.num_inference_steps,
        guidance_scale=guidance_scale,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
    )
    return out.images.reshape(-1, *out.images.shape[2:]).float(), time.perf_counter() - start


def per_scene_psnr(generated: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    from diffusers_ext.metrics import peak_signal_noise_ratio

    return peak_signal_noise_ratio(generated, real).reshape(-1, 2).mean(-1)


def score(generated, real, judges, encoder, real_encoder_features) -> dict:
    """Validation scores: PSNR, and the Fréchet distance under each judge (and their mean)."""
    from diffusers_ext.evaluation.semantic_nvs import embed_views
    from diffusers_ext.metrics import frechet_distance

    fds = [frechet_distance(embed_views(j, generated), embed_views(j, real)) for j in judges]
    return {
        "psnr": float(per_scene_psnr(generated, real).mean()),
        "frechet": sum(fds) / len(fds),
        "frechet_per_judge": fds,
        "frechet_conditioning_encoder_not_a_judge": frechet_distance(
            semantic_descriptors(encoder, generated), real_encoder_features
        ),
    }


def validate(models, scenes, judges, encoder, args) -> dict:
    """Every option of each model on the validation scenes; the frozen choice is the lowest mean Fréchet distance.

    Per model, a `reporting.choose_on_validation` record; the test split runs every model's choice together
    (`test_once`, paired seeds and judges)."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    grids = {
        "baseline": [{"guidance_scale": g, "iterative_start": 0.0} for g in args.baseline_guidance],
        METHOD: [
            {"guidance_scale": g, "iterative_start": s}
            for g, s in itertools.product(args.semantic_guidance, args.iterative_starts)
        ],
    }
    real = {d: targets_of(s) for d, s in scenes.items()}
    real_enc = {d: semantic_descriptors(encoder, r) for d, r in real.items()}

    def measure(option, split, pipe, mode, name):
        per_distance = {}
        for d, scene in scenes.items():
            generated, seconds = generate(
                pipe, scene, mode, option["guidance_scale"], option["iterative_start"], VALIDATION_SAMPLING_SEED, args
            )
            per_distance[str(d)] = score(generated, real[d], judges, encoder, real_enc[d]) | {"seconds": seconds}
        mean_fd = sum(v["frechet"] for v in per_distance.values()) / len(per_distance)
        print(f"validation {name} {option}: mean FD {mean_fd:.4f}", flush=True)
        return {"mean_frechet": mean_fd, "distances": per_distance}

    return {
        name: choose_on_validation(
            grid,
            lambda option, split, name=name: measure(option, split, *models[name], name),
            score=lambda m: m["mean_frechet"],
            maximize=False,
            names=json.dumps,
            test=False,
        )
        for name, grid in grids.items()
    }


def test_once(models, choices, scenes, judges, encoder, args) -> dict:
    """The frozen options on the test scenes, per seed; the seed picks the sampling noise and the judge."""
    from diffusers_ext.evaluation.semantic_nvs import bootstrap_frechet, embed_views
    from diffusers_ext.metrics import frechet_distance, structural_similarity

    runs = {name: {str(d): [] for d in scenes} for name in models}
    for seed_index, seed in enumerate(args.seeds):
        judge = judges[seed_index]
        for d, split in scenes.items():
            real, truth = targets_of(split), truth_of(split)
            real_features = embed_views(judge, real)
            generated = {}
            for name, (pipe, mode) in models.items():
                option = choices[name]
                generated[name], seconds = generate(
                    pipe, split, mode, option["guidance_scale"], option["iterative_start"], seed, args
                )
            base_features = embed_views(judge, generated["baseline"])
            base_psnr = per_scene_psnr(generated["baseline"], real)
            for name, images in generated.items():
                features = embed_views(judge, images)
                fd = bootstrap_frechet(
                    features,
                    real_features,
                    len(real) // 2,
                    args.num_bootstrap,
                    seed=seed,
                    reference=base_features if name != "baseline" else None,
                )
                psnr = per_scene_psnr(images, real)
                row = {
                    "seed": seed,
                    "frechet": fd["frechet"],
                    "frechet_stderr": fd["stderr"],
                    "psnr": float(psnr.mean()),
                    "psnr_stderr": float(psnr.std() / len(psnr) ** 0.5),
                    "ssim": float(structural_similarity(images, real, window_size=7).mean()),
                    "frechet_conditioning_encoder_not_a_judge": frechet_distance(
                        semantic_descriptors(encoder, images), semantic_descriptors(encoder, real)
                    ),
                } | against_truth(judge, images, truth)
                if name != "baseline":
                    change = psnr - base_psnr
                    row |= {
                        "frechet_improvement": fd["relative_improvement"],
                        "frechet_improvement_stderr": fd["relative_improvement_stderr"],
                        "psnr_change": float(change.mean()),
                        "psnr_change_stderr": float(change.std() / len(change) ** 0.5),
                    }
                runs[name][str(d)].append(row)
                print(f"test seed {seed} {d:g} deg {name}: FD {fd['frechet']:.4f} PSNR {row['psnr']:.2f}", flush=True)
    return runs


def reference_rows(scenes, judges, args) -> dict:
    """Free headroom and sanity references on the test scenes: a second set of real views, and the input copied."""
    from diffusers_ext.evaluation.semantic_nvs import embed_views
    from diffusers_ext.metrics import frechet_distance

    rows = {}
    for d, split in scenes.items():
        real = targets_of(split)
        other = targets_of(scene_split(TEST_SCENE_SEED + REAL_FLOOR_OFFSET, d, len(real) // 2, real.shape[-1]))
        copied = split["images"][:, :1].expand(-1, 2, -1, -1, -1).reshape(real.shape)
        rows[str(d)] = {
            "real_vs_real_frechet": [frechet_distance(embed_views(j, other), embed_views(j, real)) for j in judges],
            "copy_input_frechet": [frechet_distance(embed_views(j, copied), embed_views(j, real)) for j in judges],
            "copy_input_psnr": float(per_scene_psnr(copied, real).mean()),
            "copy_input_truth": [against_truth(j, copied, truth_of(split)) for j in judges],
        }
    return rows


def over_seeds(runs: dict, name: str, d: str, key: str) -> dict:
    """`mean_spread` of one test measurement of model `name` at distance `d` over the seeds, with the mean of its
    evaluation standard errors where the runs record them."""
    from diffusers_ext.evaluation.protocol import mean_spread

    rows = runs[name][d]
    stat = mean_spread([row[key] for row in rows])
    if f"{key}_stderr" in rows[0]:
        stat["evaluation_stderr"] = sum(row[f"{key}_stderr"] for row in rows) / len(rows)
    return stat


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded test runs, settings and warp timing (the run and `--from_results`)."""
    from diffusers_ext.evaluation.protocol import target

    settings, runs, warp = results["settings"], results["test"], results["summary"]["warp"]
    shortest, longest = str(settings["distances"][0]), str(settings["distances"][-1])
    improvement = over_seeds(runs, METHOD, longest, "frechet_improvement")
    psnr_change = over_seeds(runs, METHOD, shortest, "psnr_change")
    n = len(settings["seeds"])
    return [
        target(
            f"Fréchet distance at {float(longest):g}°, independent judge: relative improvement of warped+iterative "
            f"over the baseline (test, mean of {n} seeds)",
            improvement["mean"],
            0.05,
            ">=",
        ),
        target(
            f"PSNR at {float(shortest):g}°: warped+iterative minus baseline, dB (test, mean of {n} seeds)",
            psnr_change["mean"],
            0.0,
            ">=",
        ),
        target(
            f"warp of 4 x 256 x 64 x 64 features, ms of CPU time ({warp['threads']} thread)",
            warp["cpu_ms"],
            50.0,
            "<=",
        ),
    ]


def summarise(runs, validation, references, judge_sanity, warp, args) -> dict:
    """The summary's statistics and sanity checks; the targets are `targets_from_results` of the results."""
    from diffusers_ext.evaluation.protocol import mean_spread

    shortest, longest = str(args.distances[0]), str(args.distances[-1])

    per_distance = {
        d: {
            name: {
                key: over_seeds(runs, name, d, key)
                for key in (
                    "frechet",
                    "psnr",
                    "ssim",
                    "truth_presence_accuracy",
                    "truth_region_mae",
                    "truth_depth_r2",
                    "frechet_conditioning_encoder_not_a_judge",
                )
            }
            for name in runs
        }
        for d in runs["baseline"]
    }
    for d in per_distance:
        for key in ("frechet_improvement", "psnr_change"):
            per_distance[d][METHOD][key] = over_seeds(runs, METHOD, d, key)
        enc = [
            (b["frechet_conditioning_encoder_not_a_judge"] - m["frechet_conditioning_encoder_not_a_judge"])
            / b["frechet_conditioning_encoder_not_a_judge"]
            for b, m in zip(runs["baseline"][d], runs[METHOD][d])
        ]
        per_distance[d][METHOD]["frechet_improvement_conditioning_encoder_not_a_judge"] = mean_spread(enc)
    improvement = per_distance[longest][METHOD]["frechet_improvement"]
    psnr_change = per_distance[shortest][METHOD]["psnr_change"]
    floor = references[longest]["real_vs_real_frechet"]
    sanity = {
        "judge": judge_sanity,
        "headroom at the longest distance: baseline Fréchet (test mean) vs real-vs-real floor (mean over judges)": {
            "baseline": per_distance[longest]["baseline"]["frechet"]["mean"],
            "real_vs_real": sum(floor) / len(floor),
        },
        "references": references,
        "copying the input view scores a lower Fréchet distance than warped+iterative at the longest distance "
        "(then the distance rewards the input's content more than the right viewpoint)": sum(
            references[longest]["copy_input_frechet"]
        )
        / len(floor)
        < per_distance[longest][METHOD]["frechet"]["mean"],
        "improvement outside 2 evaluation standard errors at the longest distance": abs(improvement["mean"])
        > 2 * improvement["evaluation_stderr"],
        "conditioning-encoder Fréchet improvement at the longest distance (not a judge; the old, circular figure)": per_distance[
            longest
        ][METHOD]["frechet_improvement_conditioning_encoder_not_a_judge"]["mean"],
    }
    return {
        "sanity": sanity,
        "choices": {name: v["chosen"]["candidate"] for name, v in validation.items()},
        "validation_best_mean_frechet": {
            name: min(r["score"] for r in v["validation"]) for name, v in validation.items()
        },
        "test": per_distance,
        "longest_distance": {
            name.split("/")[-1]: {
                "frechet": per_distance[longest][name]["frechet"]["mean"],
                "psnr": per_distance[longest][name]["psnr"]["mean"],
            }
            for name in runs
        },
        "frechet_improvement_longest": improvement["mean"],
        "psnr_change_shortest": psnr_change["mean"],
        "warp_ms": warp["cpu_ms"],
        "warp": warp,
    }


def validation_scores(record: dict) -> list[tuple[dict, float]]:
    """`(option, mean validation Fréchet)` of every option of one model's validation record: a
    `choose_on_validation` record, or the `{"grid_size", "options", "chosen"}` one of files written before it."""
    if "validation" in record:
        return [(row["candidate"], row["score"]) for row in record["validation"]]
    return [(row["option"], row["mean_frechet"]) for row in record["options"]]


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    distances = [str(d) for d in results["settings"]["distances"]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), dpi=100)
    for name, v in results["validation"].items():
        by_start = {}
        for candidate, score in validation_scores(v):
            by_start.setdefault(candidate["iterative_start"], []).append((candidate["guidance_scale"], score))
        for start, points in by_start.items():
            label = name if name == "baseline" else f"{name} (iterative_start {start:g})"
            axes[0].plot(*zip(*sorted(points)), marker="o", label=label)
    axes[0].set_xlabel("guidance scale")
    axes[0].set_ylabel("validation Fréchet (judge), mean over distances")
    axes[0].legend(fontsize=7)
    for ax, key, label in (
        (axes[1], "frechet", "test Fréchet distance (independent judge)"),
        (axes[2], "psnr", "test PSNR (dB)"),
    ):
        for offset, name in enumerate(s["test"][distances[0]]):
            means = [s["test"][d][name][key]["mean"] for d in distances]
            spread = [s["test"][d][name][key]["std"] for d in distances]
            ax.errorbar(
                [float(d) + 2 * offset for d in distances], means, yerr=spread, marker="o", capsize=3, label=name
            )
        if key == "frechet":
            floor = [sum(results["references"][d]["real_vs_real_frechet"]) / len(results["judges"]) for d in distances]
            ax.plot([float(d) for d in distances], floor, "k--", label="real vs real")
        ax.set_xlabel("camera distance (azimuth degrees)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    distances = [str(d) for d in results["settings"]["distances"]]
    lines = [
        "Frozen on validation: " + "; ".join(f"{k}: {v}" for k, v in s["choices"].items()),
        "",
        "Test, mean ± std over seeds (evaluation standard error: scene bootstrap for Fréchet, over scenes for PSNR):",
        "",
        "| model | distance | Fréchet (judge) | PSNR (dB) | SSIM | presence acc. vs truth (judge) | depth R² vs truth "
        "(judge) | Fréchet (conditioning encoder, not a judge) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in distances:
        for name, v in s["test"][d].items():
            f, p = v["frechet"], v["psnr"]
            lines.append(
                f"| {name} | {float(d):g}° | {f['mean']:.4f} ± {f['std']:.4f} (se {f['evaluation_stderr']:.4f}) | "
                f"{p['mean']:.2f} ± {p['std']:.2f} (se {p['evaluation_stderr']:.2f}) | {v['ssim']['mean']:.3f} | "
                f"{v['truth_presence_accuracy']['mean']:.3f} | {v['truth_depth_r2']['mean']:.3f} | "
                f"{v['frechet_conditioning_encoder_not_a_judge']['mean']:.3f} |"
            )
    for d in distances:
        r = results["references"][d]
        copy = {
            k: sum(t[k] for t in r["copy_input_truth"]) / len(r["copy_input_truth"])
            for k in ("truth_presence_accuracy", "truth_depth_r2")
        }
        lines.append(
            f"| real views of other scenes | {float(d):g}° | "
            f"{sum(r['real_vs_real_frechet']) / len(r['real_vs_real_frechet']):.4f} | | | | | |"
        )
        lines.append(
            f"| copy the input view | {float(d):g}° | "
            f"{sum(r['copy_input_frechet']) / len(r['copy_input_frechet']):.4f} | {r['copy_input_psnr']:.2f} | | "
            f"{copy['truth_presence_accuracy']:.3f} | {copy['truth_depth_r2']:.3f} | |"
        )
    return lines


def write_outputs(results, output_dir, stem="semantic_nvs"):
    """`<stem>.json`, `.md` and `.png` in `output_dir`, through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        os.path.join(output_dir, stem),
        results,
        "SemanticNVS on procedural scenes (independent judge, validation then test)",
        report_sections(results),
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=ROOT)
        write_outputs(results, args.output_dir, os.path.splitext(os.path.basename(args.from_results))[0])
        return results
    torch.set_num_threads(1)
    from diffusers_ext import SemanticNVSPipeline, zoo
    from diffusers_ext.evaluation.semantic_nvs import (
        EVALUATOR_HELDOUT_SEED,
        evaluator_accuracy,
        render_single_views,
        scene_labels,
    )

    torch.manual_seed(0)
    semantic = SemanticNVSPipeline.from_pretrained(args.model or zoo.path("procedural-nvs"))
    baseline = SemanticNVSPipeline.from_pretrained(args.baseline_model or zoo.path("procedural-nvs-baseline"))
    for pipe in (semantic, baseline):
        pipe.set_progress_bar_config(disable=True)
    encoder = semantic.semantic_encoder
    size = semantic.unet.config.sample_size
    models = {"baseline": (baseline, "none"), METHOD: (semantic, "warped+iterative")}

    start = time.perf_counter()
    judges, judge_sanity = [], {}
    test_scenes = {d: scene_split(TEST_SCENE_SEED, d, args.test_scenes, size) for d in args.distances}
    test_real = torch.cat([targets_of(s) for s in test_scenes.values()])
    test_labels = scene_labels(
        torch.cat([s["classes"][:, 1:].reshape(-1, size, size) for s in test_scenes.values()]),
        torch.cat([s["depths"][:, 1:].reshape(-1, 1, size, size) for s in test_scenes.values()]),
    )
    for seed in args.seeds:
        judge, cached = load_or_train_judge(seed, args)
        heldout = render_single_views(EVALUATOR_HELDOUT_SEED + seed, args.evaluator_heldout_views, size)
        judge_sanity[f"seed {seed}"] = {
            "cached": cached,
            "heldout_real_renders": evaluator_accuracy(judge, heldout["images"], heldout),
            "test_real_target_views": evaluator_accuracy(judge, test_real, test_labels),
        }
        print(f"judge {seed}: {judge_sanity[f'seed {seed}']}", flush=True)
        judges.append(judge)
    judge_seconds = time.perf_counter() - start

    validation_scenes = {
        d: scene_split(VALIDATION_SCENE_SEED, d, args.validation_scenes, size) for d in args.distances
    }
    validation = validate(models, validation_scenes, judges, encoder, args)
    choices = {name: v["chosen"]["candidate"] for name, v in validation.items()}
    runs = test_once(models, choices, test_scenes, judges, encoder, args)
    references = reference_rows(test_scenes, judges, args)
    warp = warp_milliseconds()

    results = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k != "from_results"}
        | {"output_dir": None, "cache_dir": None},
        "seed_ranges": {
            "validation_scenes": VALIDATION_SCENE_SEED,
            "test_scenes": TEST_SCENE_SEED,
            "real_floor_scenes": TEST_SCENE_SEED + REAL_FLOOR_OFFSET,
            "validation_sampling_seed": VALIDATION_SAMPLING_SEED,
        },
        "judges": list(judge_sanity),
        "judge_seconds": judge_seconds,
        "validation": validation,
        "test": runs,
        "references": references,
    }
    results["summary"] = summarise(runs, validation, references, judge_sanity, warp, args)
    results["summary"] = {"targets": targets_from_results(results), **results["summary"]}
    write_outputs(results, args.output_dir)
    return results
    print(json.dumps({k: results["summary"][k] for k in ("targets", "choices")}, indent=2))


if __name__ == "__main__":
    main()
