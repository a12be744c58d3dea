#!/usr/bin/env python
"""Measure flow matching on a low-dimensional manifold: the two-head model against ambient and latent flow matching.

    python benchmarks/manifold_flow/manifold_flow.py

Test bed: the ring Gaussian mixture of `diffusers_ext.data.manifolds` (8 components of std 0.25 on a circle of radius
2, intrinsic and subspace dimension d = 2) embedded in R^D by a random orthonormal map, D in `--ambient_dims`, with
`--train_sizes` training points (nested: the first n of one draw of 1024 per seed, the same latent points for every
D). Three methods get the same transformer body (`--num_tokens` tokens of width `--hidden_size`, `--num_layers`
layers), the same `--steps` AdamW steps of batch `--batch_size` and the same learning-rate grid:

- **ambient FM**: `PlainFlowTransformerModel` on x in R^D (the body's input and output maps are D-wide);
- **latent FM**: uncentred PCA to R^d, `PlainFlowTransformerModel` on the coordinates, samples mapped back (what a
  practitioner would run);
- **two-head**: `ManifoldFlowTransformerModel`, the PCA subspace, the transformer tangent head on the d coordinates
  and the analytic orthogonal head.

Judges (exact, `evaluation.manifold_flow`): the squared velocity error against the closed-form optimal velocity on
`--num_judge_points` fresh (data, noise, sigma) triples, sigma stratified on [1e-3, 1] (latent FM: the error of its
velocity mapped back, against the true velocity's part along the subspace); the sliced 2-Wasserstein distance of the
samples' true subspace coordinates to `--num_eval_samples` fresh draws; the RMS distance of samples to the true
subspace (truth 0). Every method of a (D, seed) cell is sampled from the same initial noise with 50 Euler steps of
`FlowMatchEulerDiscreteScheduler` and judged on the same triples and reference draws, so differences between methods
are paired over seeds. Floors: the exact velocity sampled by the same pipeline (the oracle), and a second fresh
draw; the training points themselves show what memorising them scores.

Validation, then test once: each method's learning rate is chosen from `--learning_rate_grid` on the
`--validation_seeds` (their own embeddings and data) at D in `--validation_ambient_dims` and n =
`--validation_train_size`, by the geometric mean of its velocity error; the frozen choices run once on the test
`--seeds`. An off-subspace noise condition (`--noise_std` at D = `--noise_ambient_dim`, n = `--noise_train_size`)
shows where latent FM and the two-head model differ: the two-head model is scored with the noise-free orthogonal
head and with the one whose noise std is the PCA residual (the same trained tangent head). Writes
`benchmarks/manifold_flow/results/manifold_flow.json`, `.md` and `.png`.
"""

import argparse
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("ambient", "latent", "two_head")
LABELS = {
    "ambient": "ambient FM",
    "latent": "latent FM (PCA)",
    "two_head": "two-head",
    "two_head_noise_aware": "two-head, noise-aware orthogonal head",
}
LATENT_DIM = 2
MAX_FLAT_RATIO = 1.2
MIN_AMBIENT_GROWTH = 2.0
MIN_Z = 2.0
MIN_TARGET_DIM = 64


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ambient_dims", type=int, nargs="+", default=[4, 16, 64, 256], help="D of the test grid.")
    parser.add_argument("--train_sizes", type=int, nargs="+", default=[64, 256, 1024], help="n of the test grid.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102], help="Test seeds (>= 3).")
    parser.add_argument("--validation_seeds", type=int, nargs="+", default=[0], help="Seeds of the validation split.")
    parser.add_argument("--validation_ambient_dims", type=int, nargs="+", default=[4, 256], help="D on validation.")
    parser.add_argument("--validation_train_size", type=int, default=256, help="n on validation.")
    parser.add_argument(
        "--learning_rate_grid", type=float, nargs="+", default=[1e-3, 3e-3], help="Each method's learning rates."
    )
    parser.add_argument("--steps", type=int, default=1500, help="AdamW steps of every training run.")
    parser.add_argument("--batch_size", type=int, default=256, help="Training batch.")
    parser.add_argument("--num_tokens", type=int, default=4, help="Tokens of every transformer.")
    parser.add_argument("--hidden_size", type=int, default=32, help="Token width.")
    parser.add_argument("--num_layers", type=int, default=2, help="Transformer layers.")
    parser.add_argument("--num_attention_heads", type=int, default=2, help="Attention heads.")
    parser.add_argument("--num_inference_steps", type=int, default=50, help="Euler steps when sampling.")
    parser.add_argument("--num_eval_samples", type=int, default=8192, help="Samples and fresh draws per judgement.")
    parser.add_argument("--num_judge_points", type=int, default=4096, help="Triples of the velocity error.")
    parser.add_argument("--num_projections", type=int, default=128, help="Directions of the sliced W2.")
    parser.add_argument("--noise_std", type=float, default=0.1, help="Off-subspace noise std (0: no such condition).")
    parser.add_argument("--noise_ambient_dim", type=int, default=64, help="D of the noise condition.")
    parser.add_argument("--noise_train_size", type=int, default=1024, help="n of the noise condition.")
    parser.add_argument("--workers", type=int, default=2, help="Worker processes (one thread each).")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "manifold_flow.json"))
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.from_results:
        return args
    overlap = sorted(set(args.seeds) & set(args.validation_seeds))
    if overlap:
        parser.error(f"--validation_seeds must be disjoint from the test --seeds, both hold {overlap}.")
    for name in ("ambient_dims", "validation_ambient_dims"):
        if min(getattr(args, name)) <= LATENT_DIM:
            parser.error(f"--{name} must exceed the subspace dimension {LATENT_DIM}, got {getattr(args, name)}.")
    for name in ("train_sizes", "steps", "batch_size", "num_eval_samples", "num_judge_points", "workers"):
        values = getattr(args, name)
        if min(values if isinstance(values, list) else [values]) < 1:
            parser.error(f"--{name} must be positive, got {values}.")
    if len(set(args.train_sizes)) < 2 or len(set(args.ambient_dims)) < 2:
        parser.error("--train_sizes and --ambient_dims need at least two values each (slopes and ratios).")
    if min(args.learning_rate_grid) <= 0:
        parser.error(f"--learning_rate_grid must hold positive rates, got {args.learning_rate_grid}.")
    if args.noise_std < 0 or args.noise_ambient_dim <= LATENT_DIM:
        parser.error("--noise_std must be >= 0 and --noise_ambient_dim must exceed the subspace dimension.")
    return args


# ---------------------------------------------------------------------------------------------------- one job


def cell_data(job: dict) -> dict:
    """The manifold, training points, oracle and the shared judging draws of a (split, condition, D, seed) cell."""
    from diffusers_ext.data.manifolds import make_manifold
    from diffusers_ext.evaluation.manifold_flow import GaussianMixtureVelocityModel

    seed, dim = job["seed"], job["ambient_dim"]
    manifold = make_manifold("ring_mixture", dim, noise_std=job["noise_std"], seed=7919 * dim + seed)
    pool = manifold.sample(max(job["pool_size"], job["train_size"]), seed)  # the same latent points for every D
    oracle = GaussianMixtureVelocityModel.from_manifold(manifold)
    m = job["num_eval_samples"]
    return {
        "manifold": manifold,
        "train": pool[: job["train_size"]],
        "oracle": oracle,
        "reference": oracle.sample_data(m, torch.Generator().manual_seed(20_000 + seed)),
        "noise": torch.randn(m, dim, generator=torch.Generator().manual_seed(30_000 + seed), dtype=torch.float64),
    }


def sample_scores(samples, cell, job) -> dict:
    """Sliced W2 on the true subspace, RMS distance to it, and (noise condition) the sliced W2 in all of R^D."""
    from diffusers_ext.evaluation.manifold_flow import manifold_sliced_wasserstein, off_manifold_rms
    from diffusers_ext.metrics import sliced_wasserstein

    basis = cell["manifold"].basis
    scores = {
        "sliced_w2": manifold_sliced_wasserstein(
            samples, cell["reference"], basis, job["num_projections"], seed=50_000 + job["seed"]
        ),
        "off_manifold_rms": off_manifold_rms(samples, basis),
    }
    if job["noise_std"] > 0:
        generator = torch.Generator().manual_seed(60_000 + job["seed"])
        scores["sliced_w2_ambient"] = sliced_wasserstein(samples, cell["reference"], job["num_projections"], generator)
    return scores


def judge(model, cell, job, latent_basis=None) -> dict:
    """The velocity error (on the cell's shared triples) and the sample scores of one trained model."""
    from diffusers_ext.evaluation.manifold_flow import (
        model_velocity_fn,
        sample_latent_flow,
        sample_pipeline,
        velocity_errors,
        velocity_errors_along,
    )

    triples = torch.Generator().manual_seed(40_000 + job["seed"])
    if latent_basis is None:
        velocity = velocity_errors(model_velocity_fn(model), cell["oracle"], job["num_judge_points"], triples)
        samples = sample_pipeline(model, cell["noise"].to(model.dtype), job["num_inference_steps"])
    else:
        velocity = velocity_errors_along(
            model_velocity_fn(model), latent_basis, cell["oracle"], job["num_judge_points"], triples
        )
        samples = sample_latent_flow(model, latent_basis, cell["noise"], job["num_inference_steps"])
    return {"velocity": velocity, **sample_scores(samples, cell, job)}


def run_job(job: dict) -> list[dict]:
    """One job in its own process (one thread): a method trained and judged on one cell (`kind="train"`), or the
    cell's references (`kind="reference"`: the oracle's samples, a second fresh draw, the training points). Each row
    records its job's `job_id` and CPU seconds (`job_cpu_seconds`: training and judging, the same for a job's rows)."""
    torch.set_num_threads(1)
    start = time.process_time()
    rows = _run_job(job)
    seconds = time.process_time() - start
    return [{**row, "job_id": job["job_id"], "job_cpu_seconds": seconds} for row in rows]


def _run_job(job: dict) -> list[dict]:
    from diffusers_ext.evaluation.manifold_flow import sample_pipeline
    from diffusers_ext.evaluation.manifold_flow import train_velocity_model as train

    cell = cell_data(job)
    keys = ("split", "condition", "ambient_dim", "train_size", "seed")
    row = {key: job[key] for key in keys}
    if job["kind"] == "reference":
        rows = []
        oracle = sample_pipeline(cell["oracle"], cell["noise"], job["num_inference_steps"])
        second = cell["oracle"].sample_data(
            job["num_eval_samples"], torch.Generator().manual_seed(70_000 + job["seed"])
        )
        rows.append({**row, "train_size": None, "method": "oracle", **sample_scores(oracle, cell, job)})
        rows.append({**row, "train_size": None, "method": "second_draw", **sample_scores(second, cell, job)})
        for n in job["train_sizes"]:
            sized = cell_data({**job, "train_size": n})
            rows.append(
                {**row, "train_size": n, "method": "training_points", **sample_scores(sized["train"], cell, job)}
            )
        return rows

    from diffusers_ext import ManifoldFlowTransformerModel
    from diffusers_ext.evaluation.manifold_flow import PlainFlowTransformerModel
    from diffusers_ext.models.manifold_flow import uncentred_pca

    method, seed = job["method"], job["seed"]
    architecture = {k: job[k] for k in ("num_tokens", "hidden_size", "num_layers", "num_attention_heads")}
    train_points = cell["train"]
    latent_basis, fit = uncentred_pca(train_points, LATENT_DIM)
    torch.manual_seed(seed)
    if method == "two_head":
        model = ManifoldFlowTransformerModel(ambient_dim=job["ambient_dim"], latent_dim=LATENT_DIM, **architecture)
        model.set_subspace(latent_basis)
        data = train_points
    elif method == "ambient":
        model = PlainFlowTransformerModel(ambient_dim=job["ambient_dim"], **architecture)
        data = train_points
    else:
        model = PlainFlowTransformerModel(ambient_dim=LATENT_DIM, **architecture)
        data = train_points @ latent_basis
    start = time.process_time()
    info = train(model, data.float(), job["steps"], job["learning_rate"], job["batch_size"], seed=seed)
    train_seconds = time.process_time() - start
    common = {
        **row,
        "learning_rate": job["learning_rate"],
        "final_loss": info["final_loss"],
        "train_cpu_seconds": train_seconds,
        "pca_explained_fraction": fit.explained_fraction,
        "pca_residual_std": fit.residual_std,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    rows = [{**common, "method": method, **judge(model, cell, job, latent_basis if method == "latent" else None)}]
    if method == "two_head" and job["noise_std"] > 0:
        model.set_orthogonal_noise_std(fit.residual_std)  # the same tangent head, the noise-aware orthogonal head
        rows.append({**common, "method": "two_head_noise_aware", **judge(model, cell, job)})
    return rows


# ---------------------------------------------------------------------------------------------------- the grid


def base_job(args) -> dict:
    keys = (
        "steps", "batch_size", "num_tokens", "hidden_size", "num_layers", "num_attention_heads",
        "num_inference_steps", "num_eval_samples", "num_judge_points", "num_projections",
    )  # fmt: skip
    return {key: getattr(args, key) for key in keys}


def cells(args, split: str) -> list[dict]:
    """The (condition, D, n, seed) cells of a split."""
    base = {
        **base_job(args),
        "split": split,
        "noise_std": 0.0,
        "condition": "clean",
        "pool_size": max(args.train_sizes),
    }
    if split == "validation":
        return [
            {**base, "ambient_dim": dim, "train_size": args.validation_train_size, "seed": seed}
            for dim in args.validation_ambient_dims
            for seed in args.validation_seeds
        ]
    found = [
        {**base, "ambient_dim": dim, "train_size": n, "seed": seed}
        for dim in args.ambient_dims
        for n in args.train_sizes
        for seed in args.seeds
    ]
    if args.noise_std > 0:
        noisy = {**base, "noise_std": args.noise_std, "condition": "noise", "train_size": args.noise_train_size}
        found += [{**noisy, "ambient_dim": args.noise_ambient_dim, "seed": seed} for seed in args.seeds]
    return found


def reference_jobs(args) -> list[dict]:
    """One references job per (split, condition, D, seed): the oracle, a second draw, the training points of each n."""
    jobs, seen = [], set()
    for split in ("validation", "test"):
        for cell in cells(args, split):
            key = (split, cell["condition"], cell["ambient_dim"], cell["seed"])
            if key in seen:
                continue
            seen.add(key)
            sizes = sorted(
                {
                    c["train_size"]
                    for c in cells(args, split)
                    if (split, c["condition"], c["ambient_dim"], c["seed"]) == key
                }
            )
            jobs.append({**cell, "kind": "reference", "train_sizes": sizes})
    return jobs


def validation_score(rows: list[dict], method: str, learning_rate: float) -> float:
    """The geometric mean over validation cells of the method's velocity error at `learning_rate` (every cell weighs
    the same, whatever its D)."""
    errors = [
        r["velocity"]["along" if method == "latent" else "total"]
        for r in rows
        if r["method"] == method and r["learning_rate"] == learning_rate
    ]
    return math.exp(sum(math.log(e) for e in errors) / len(errors))


def choose_learning_rates(args, rows: list[dict]) -> dict:
    """Each method's learning rate, chosen on validation (`reporting.choose_on_validation`, test measured later)."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    choices = {}
    for method in METHODS:

        def measure(rate, split, method=method):
            cell_rows = [r for r in rows if r["method"] == method and r["learning_rate"] == rate]
            return {
                "velocity_error_geometric_mean": validation_score(rows, method, rate),
                "cells": [
                    {
                        "ambient_dim": r["ambient_dim"],
                        "seed": r["seed"],
                        "velocity": r["velocity"],
                        "sliced_w2": r["sliced_w2"],
                    }
                    for r in cell_rows
                ],
            }

        choices[method] = choose_on_validation(
            args.learning_rate_grid,
            measure,
            lambda measurement: measurement["velocity_error_geometric_mean"],
            maximize=False,
            names=lambda rate: f"lr {rate:g}",
            test=False,
        )
    return choices


# ---------------------------------------------------------------------------------------------------- summary


def velocity_value(row: dict) -> float:
    """The velocity error a method is compared by: the total (latent FM: along the subspace, all it has)."""
    return row["velocity"]["along" if row["method"] == "latent" else "total"]


def fit_slope(xs, ys) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def paired(rows: list[dict], method_a: str, method_b: str, value, **where) -> dict:
    """`mean_spread` of `value(a) - value(b)` over seeds (paired: same cells), with `z = mean / sem`."""
    from diffusers_ext.evaluation.protocol import mean_spread

    def pick(method):
        return {
            r["seed"]: value(r) for r in rows if r["method"] == method and all(r[k] == v for k, v in where.items())
        }

    a, b = pick(method_a), pick(method_b)
    seeds = sorted(set(a) & set(b))
    diff = mean_spread([a[s] - b[s] for s in seeds])
    diff["z"] = diff["mean"] / diff["sem"] if diff["sem"] > 0 else (math.inf if diff["mean"] > 0 else 0.0)
    return diff


def summarise(runs: list[dict], args_settings: dict) -> dict:
    from diffusers_ext.evaluation.protocol import mean_spread

    test = [r for r in runs if r["split"] == "test" and r["condition"] == "clean"]
    dims, sizes = args_settings["ambient_dims"], args_settings["train_sizes"]
    grid = {}
    for method in ("oracle", "second_draw"):  # references of a (D, seed) cell, whatever n
        grid[method] = {
            f"D={dim}": {
                key: mean_spread([r[key] for r in test if r["method"] == method and r["ambient_dim"] == dim])
                for key in ("sliced_w2", "off_manifold_rms")
            }
            for dim in dims
        }
    for method in (*METHODS, "training_points"):
        grid[method] = {}
        for dim in dims:
            for n in sizes:
                rows = [r for r in test if r["method"] == method and r["ambient_dim"] == dim and r["train_size"] == n]
                entry = {
                    "sliced_w2": mean_spread([r["sliced_w2"] for r in rows]),
                    "off_manifold_rms": mean_spread([r["off_manifold_rms"] for r in rows]),
                }
                if "velocity" in rows[0]:
                    entry["velocity_error"] = mean_spread([velocity_value(r) for r in rows])
                    entry["velocity_error_along"] = mean_spread([r["velocity"]["along"] for r in rows])
                    if method != "latent":
                        entry["velocity_error_orthogonal"] = mean_spread([r["velocity"]["orthogonal"] for r in rows])
                    entry["train_cpu_seconds"] = mean_spread([r["train_cpu_seconds"] for r in rows])
                grid[method][f"D={dim},n={n}"] = entry
    low, high = min(dims), max(dims)
    growth = {}
    for method in METHODS:
        growth[method] = {}
        for n in sizes:
            at = {dim: grid[method][f"D={dim},n={n}"]["velocity_error"]["mean"] for dim in (low, high)}
            per_seed = {}
            for r in test:
                if r["method"] == method and r["train_size"] == n and r["ambient_dim"] in (low, high):
                    per_seed.setdefault(r["seed"], {})[r["ambient_dim"]] = velocity_value(r)
            growth[method][str(n)] = {
                "ratio_of_means": at[high] / at[low],
                "per_seed_ratio": mean_spread([v[high] / v[low] for v in per_seed.values() if len(v) == 2]),
            }
    differences = {}
    for baseline in ("ambient", "latent"):
        differences[baseline] = {}
        for dim in dims:
            for n in sizes:
                key = f"D={dim},n={n}"
                differences[baseline][key] = {
                    "sliced_w2": paired(
                        test, baseline, "two_head", lambda r: r["sliced_w2"], ambient_dim=dim, train_size=n
                    ),
                    "velocity_error_along": paired(
                        test, baseline, "two_head", lambda r: r["velocity"]["along"], ambient_dim=dim, train_size=n
                    ),
                }
    slopes = {}
    for method in (*METHODS, "training_points"):
        slopes[method] = {}
        for dim in dims:
            means = [grid[method][f"D={dim},n={n}"] for n in sizes]
            slopes[method][str(dim)] = {"sliced_w2": fit_slope(sizes, [m["sliced_w2"]["mean"] for m in means])}
            if "velocity_error" in means[0]:
                slopes[method][str(dim)]["velocity_error"] = fit_slope(
                    sizes, [m["velocity_error"]["mean"] for m in means]
                )
    noise = None
    noisy = [r for r in runs if r["split"] == "test" and r["condition"] == "noise"]
    if noisy:
        noise = {}
        for method in (*METHODS, "two_head_noise_aware", "oracle", "second_draw"):
            rows = [r for r in noisy if r["method"] == method]
            entry = {
                key: mean_spread([r[key] for r in rows])
                for key in ("sliced_w2", "sliced_w2_ambient", "off_manifold_rms")
            }
            if "velocity" in rows[0]:
                entry["velocity_error"] = mean_spread([velocity_value(r) for r in rows])
                entry["velocity_error_along"] = mean_spread([r["velocity"]["along"] for r in rows])
                entry["pca_residual_std"] = mean_spread([r["pca_residual_std"] for r in rows])
            noise[method] = entry
        noise["two_head_minus_noise_aware"] = {
            key: paired(noisy, "two_head", "two_head_noise_aware", lambda r, key=key: r[key])
            for key in ("sliced_w2", "sliced_w2_ambient")
        }
        noise["latent_minus_two_head"] = {
            key: paired(noisy, "latent", "two_head", lambda r, key=key: r[key])
            for key in ("sliced_w2", "sliced_w2_ambient")
        }
    return {"grid": grid, "growth": growth, "differences": differences, "slopes": slopes, "noise_condition": noise}


def targets_from_results(results: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    settings, summary = results["settings"], results["summary_measurements"]
    low, high = min(settings["ambient_dims"]), max(settings["ambient_dims"])
    rows = []
    for n in settings["train_sizes"]:
        ratio = summary["growth"]["two_head"][str(n)]["ratio_of_means"]
        rows.append(target(f"two-head velocity error, D={high} / D={low}, n={n}", ratio, MAX_FLAT_RATIO, "<="))
    for n in settings["train_sizes"]:
        ratio = summary["growth"]["ambient"][str(n)]["ratio_of_means"]
        rows.append(target(f"ambient FM velocity error, D={high} / D={low}, n={n}", ratio, MIN_AMBIENT_GROWTH))
    for dim in settings["ambient_dims"]:
        if dim < MIN_TARGET_DIM:
            continue
        for n in settings["train_sizes"]:
            z = summary["differences"]["ambient"][f"D={dim},n={n}"]["sliced_w2"]["z"]
            rows.append(
                target(f"sliced W2: ambient FM minus two-head, D={dim}, n={n}, in paired SE over seeds", z, MIN_Z)
            )
    return rows


def sanity(results: dict) -> dict:
    grid = results["summary_measurements"]["grid"]
    test = [r for r in results["runs"] if r["split"] == "test" and "train_cpu_seconds" in r]
    found = {
        "oracle_sliced_w2_floor": {k: v["sliced_w2"]["mean"] for k, v in grid["oracle"].items()},
        "second_draw_sliced_w2": {k: v["sliced_w2"]["mean"] for k, v in grid["second_draw"].items()},
        "oracle_off_manifold_rms_max": max(v["off_manifold_rms"]["mean"] for v in grid["oracle"].values()),
        "two_head_off_manifold_rms_max": max(v["off_manifold_rms"]["mean"] for v in grid["two_head"].values()),
        "pca_explained_fraction_min": min(r["pca_explained_fraction"] for r in test if r["condition"] == "clean"),
        "training_points_sliced_w2": {k: v["sliced_w2"]["mean"] for k, v in grid["training_points"].items()},
        "max_train_cpu_seconds": max(r["train_cpu_seconds"] for r in test),
        "wall_seconds": results["wall_seconds"],
    }
    timed = {r["job_id"]: r["job_cpu_seconds"] for r in results["runs"] if "job_cpu_seconds" in r}
    if timed:  # one entry per job (its rows share the job's time); runs written before it was kept have none
        found["total_job_cpu_seconds"] = sum(timed.values())
    return found


# ---------------------------------------------------------------------------------------------------- report


def fmt(entry: dict, digits: int = 4) -> str:
    return f"{entry['mean']:.{digits}g} +- {entry['sem']:.2g}"


def report_sections(results: dict) -> list[str]:
    settings, summary = results["settings"], results["summary_measurements"]
    grid, dims, sizes = summary["grid"], settings["ambient_dims"], settings["train_sizes"]
    lines = ["## Velocity error against the exact velocity (mean +- SE over seeds; lower is better)", ""]
    lines += [
        "Total squared error `E |v - v*|^2` on sigma in [1e-3, 1]; latent FM has no velocity across its subspace, so "
        "its row is the error along the subspace (the two-head model's along-subspace error is in the results file).",
        "",
        "| method | " + " | ".join(f"D={d}" for d in dims) + " | D=" + f"{max(dims)} / D={min(dims)} |",
        "| --- | " + " | ".join("---" for _ in dims) + " | --- |",
    ]
    for n in sizes:
        for method in METHODS:
            cells = [fmt(grid[method][f"D={d},n={n}"]["velocity_error"]) for d in dims]
            ratio = summary["growth"][method][str(n)]["ratio_of_means"]
            lines.append(f"| {LABELS[method]}, n={n} | " + " | ".join(cells) + f" | {ratio:.3g} |")
    lines += ["", "## Sliced W2 on the subspace to fresh draws (mean +- SE over seeds; lower is better)", ""]
    lines += [
        "| method | " + " | ".join(f"D={d}" for d in dims) + " |",
        "| --- | " + " | ".join("---" for _ in dims) + " |",
    ]
    for n in sizes:
        for method in (*METHODS, "training_points"):
            label = LABELS.get(method, "the training points themselves")
            lines.append(
                f"| {label}, n={n} | "
                + " | ".join(fmt(grid[method][f"D={d},n={n}"]["sliced_w2"]) for d in dims)
                + " |"
            )
    for method, label in (("oracle", "oracle (exact velocity, same sampler)"), ("second_draw", "a second fresh draw")):
        lines.append(f"| {label} | " + " | ".join(fmt(grid[method][f"D={d}"]["sliced_w2"]) for d in dims) + " |")
    lines += [
        "",
        "Paired differences over seeds (same data, noise, triples and reference draws), `z` = mean / SE:",
        "",
    ]
    lines += [
        "| cell | ambient FM minus two-head (SW) | z | latent FM minus two-head (SW) | z |",
        "| --- | --- | --- | --- | --- |",
    ]
    for d in dims:
        for n in sizes:
            a = summary["differences"]["ambient"][f"D={d},n={n}"]["sliced_w2"]
            b = summary["differences"]["latent"][f"D={d},n={n}"]["sliced_w2"]
            lines.append(f"| D={d}, n={n} | {fmt(a, 3)} | {a['z']:.3g} | {fmt(b, 3)} | {b['z']:.3g} |")
    lines += ["", "## RMS distance of samples to the true subspace (truth 0)", ""]
    lines += [
        "| method | " + " | ".join(f"D={d}" for d in dims) + " |",
        "| --- | " + " | ".join("---" for _ in dims) + " |",
    ]
    for method in METHODS:
        n = max(sizes)
        lines.append(
            f"| {LABELS[method]}, n={n} | "
            + " | ".join(fmt(grid[method][f"D={d},n={n}"]["off_manifold_rms"], 3) for d in dims)
            + " |"
        )
    lines += ["", "## Error against n: fitted log-log slopes (theory for d = 2: -1/d = -0.5 for the distance)", ""]
    lines += [
        "| method | " + " | ".join(f"D={d}: SW / velocity" for d in dims) + " |",
        "| --- | " + " | ".join("---" for _ in dims) + " |",
    ]
    for method in METHODS:
        cells = [
            f"{summary['slopes'][method][str(d)]['sliced_w2']:.2f} / {summary['slopes'][method][str(d)]['velocity_error']:.2f}"
            for d in dims
        ]
        lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
    lines.append(
        "| the training points | "
        + " | ".join(f"{summary['slopes']['training_points'][str(d)]['sliced_w2']:.2f} / -" for d in dims)
        + " |"
    )
    noise = summary.get("noise_condition")
    if noise:
        lines += [
            "",
            f"## Off-subspace noise: std {settings['noise_std']} at D={settings['noise_ambient_dim']}, "
            f"n={settings['noise_train_size']} (mean +- SE over seeds)",
            "",
            "| method | velocity error | SW on the subspace | SW in R^D | RMS distance to the subspace |",
            "| --- | --- | --- | --- | --- |",
        ]
        for method in (*METHODS, "two_head_noise_aware", "oracle", "second_draw"):
            entry = noise[method]
            velocity = fmt(entry["velocity_error"]) if "velocity_error" in entry else "-"
            label = LABELS.get(method, {"oracle": "oracle", "second_draw": "a second fresh draw"}.get(method))
            lines.append(
                f"| {label} | {velocity} | {fmt(entry['sliced_w2'])} | {fmt(entry['sliced_w2_ambient'])} | "
                f"{fmt(entry['off_manifold_rms'], 3)} |"
            )
        gain = noise["two_head_minus_noise_aware"]["sliced_w2_ambient"]
        lines += ["", f"SW in R^D, two-head minus noise-aware two-head: {fmt(gain, 3)} (z {gain['z']:.3g}, paired)."]
    return lines + validation_section(results)


def validation_section(results: dict) -> list[str]:
    validation = results["validation"]
    lines = [
        "",
        f"## Validation (seeds {validation['seeds']}, D in {validation['ambient_dims']}, n={validation['train_size']}; "
        "the test seeds were run once with the choices)",
        "",
        "| method | "
        + " | ".join(row["name"] for row in validation["choices"][METHODS[0]]["validation"])
        + " | chosen |",
        "| --- | " + " | ".join("---" for _ in validation["choices"][METHODS[0]]["validation"]) + " | --- |",
    ]
    for method in METHODS:
        record = validation["choices"][method]
        cells = [f"{row['score']:.4g}" for row in record["validation"]]
        lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + f" | {record['chosen']['name']} |")
    lines += [
        "",
        "Scores: the geometric mean over the validation cells of each method's velocity error (lower is better).",
    ]
    return lines


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings, summary = results["settings"], results["summary_measurements"]
    grid, dims, sizes = summary["grid"], settings["ambient_dims"], settings["train_sizes"]
    colours = {"ambient": "tab:red", "latent": "tab:green", "two_head": "tab:blue"}
    fig, axes = plt.subplots(2, len(dims), figsize=(4 * len(dims), 7.5), squeeze=False)
    for j, dim in enumerate(dims):
        for i, metric in enumerate(("sliced_w2", "velocity_error")):
            ax = axes[i, j]
            for method in METHODS:
                means = [grid[method][f"D={dim},n={n}"][metric] for n in sizes]
                slope = summary["slopes"][method][str(dim)][metric]
                ax.errorbar(
                    sizes, [m["mean"] for m in means], yerr=[m["sem"] for m in means], marker="o", capsize=3,
                    color=colours[method], label=f"{LABELS[method]} (slope {slope:.2f})",
                )  # fmt: skip
            if metric == "sliced_w2":
                floor = grid["oracle"][f"D={dim}"]["sliced_w2"]["mean"]
                ax.axhline(floor, color="0.4", ls="--", lw=1, label="oracle floor")
                memorised = [grid["training_points"][f"D={dim},n={n}"]["sliced_w2"]["mean"] for n in sizes]
                ax.plot(sizes, memorised, color="0.6", ls=":", marker=".", label="training points")
                first = grid["two_head"][f"D={dim},n={sizes[0]}"]["sliced_w2"]["mean"]
                ax.plot(sizes, [first * (n / sizes[0]) ** (-1 / LATENT_DIM) for n in sizes], color="k", lw=0.8,
                        label=f"n^(-1/d), d={LATENT_DIM}")  # fmt: skip
                ax.set_ylabel("sliced W2 on the subspace")
            else:
                ax.set_ylabel("velocity error")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("training points n")
            ax.set_title(f"D = {dim}")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    import sys

    from diffusers_ext.evaluation.reporting import command, rebuild_results, run_jobs, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    title = "Flow matching on a low-dimensional manifold: two-head vs ambient and latent flow matching"
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        return write_results(
            stem, results, title, report_sections(results), figures={".png": lambda p: plot(results, p)}
        )
    if len(args.seeds) < 3:
        print("warning: fewer than 3 seeds; the measurement protocol asks for >= 3", file=sys.stderr)
    torch.set_num_threads(1)
    begin = time.time()

    def log(message):
        print(f"[{time.time() - begin:7.1f}s] {message}", flush=True)

    validation_jobs = [
        {**cell, "kind": "train", "method": method, "learning_rate": rate}
        for cell in cells(args, "validation")
        for method in METHODS
        for rate in args.learning_rate_grid
    ]
    references = reference_jobs(args)
    log(f"validation: {len(validation_jobs)} training runs, and {len(references)} reference jobs")
    first = validation_jobs + references
    outputs = run_jobs(run_job, [({**job, "job_id": i},) for i, job in enumerate(first)], args.workers)
    runs = [row for rows in outputs for row in rows]
    choices = choose_learning_rates(args, [r for r in runs if r["split"] == "validation" and "learning_rate" in r])
    rates = {method: record["chosen"]["candidate"] for method, record in choices.items()}
    log(f"chosen on validation: {rates}")
    test_jobs = [
        {**cell, "kind": "train", "method": method, "learning_rate": rates[method]}
        for cell in cells(args, "test")
        for method in METHODS
    ]
    log(f"test: {len(test_jobs)} training runs")
    jobs = [({**job, "job_id": len(first) + i},) for i, job in enumerate(test_jobs)]
    outputs = run_jobs(run_job, jobs, args.workers)
    runs += [row for rows in outputs for row in rows]
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "from_results")}
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": settings,
        "validation": {
            "seeds": args.validation_seeds,
            "ambient_dims": args.validation_ambient_dims,
            "train_size": args.validation_train_size,
            "choices": choices,
        },
        "learning_rates": rates,
        "runs": runs,
        "wall_seconds": time.time() - begin,
    }
    results["summary_measurements"] = summarise(runs, settings)
    results["summary"] = {
        "targets": targets_from_results(results),
        "sanity": sanity(results),
        "paired": "differences between methods are paired over seeds: every method of a (D, n, seed) cell is trained "
        "on the same points and judged on the same initial noise, triples and reference draws",
    }
    write_results(
        stem,
        results,
        title,
        report_sections(results),
        f"Settings: ring Gaussian mixture (d = {LATENT_DIM}), D in {args.ambient_dims}, n in {args.train_sizes}, "
        f"{len(args.seeds)} test seeds, {args.steps} steps of batch {args.batch_size} for every method, learning rates "
        f"{rates} (chosen on validation), {args.num_inference_steps} Euler steps, {args.workers} worker processes of "
        "one thread.",
        figures={".png": lambda p: plot(results, p)},
    )
    log(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
