#!/usr/bin/env python
"""Measure the brain-network flow (flow matching in the correlation codec's coordinates) against flow matching on the
raw upper-triangle vector, on a connectivity world with a known conditional law around the real HCP group mean.

    python benchmarks/brain_network_flow/brain_network_flow.py

The world (`diffusers_ext.data.brain_networks.ConnectivityWorld`, on the Schaefer-100 group mean of the `brainspace`
wheel): a subject of age `a` and sex `s` draws the young or the dedifferentiated old template with probabilities
`1 - a`, `a`, and its matrix is the sample correlation of 300 (sex 0) or 150 (sex 1) time points. Both methods train
the same `BrainNetworkFlowModel` (same width, depth, steps, batch and seeds) on the same subjects; they differ only in
the coordinates: `CorrelationMatrixCodec` (every decoded matrix valid) or `RawUpperTriangleCodec` (the strict upper
triangle, standardised; nothing keeps a decoded matrix positive definite). Both sample with
`BrainNetworkFlowPipeline` and `FlowMatchEulerDiscreteScheduler`.

Validation, then test once: each method's learning rate is chosen from the same grid on a validation training seed
by the mean MMD^2 over the covariate cells against validation truth draws; the frozen choices then train on the test
seeds and are judged once against fresh truth draws. Judges, on the matrices' upper triangles in correlation units
(neither method's own coordinates): validity (symmetric, unit diagonal, positive definite), unbiased MMD^2 to fresh
draws of the true law at each (age, sex) cell (Gaussian kernels at 0.5, 1, 2 x the median distance), the error of
the conditional mean against the true conditional mean (a Monte Carlo mean of 2 x 1000 draws per sex, mixed with
the exact weights), and the error of the age trend (the mean's change from age 0.1 to 0.9). Comparisons are paired
over (seed, cell) or (seed, sex) units. Headroom: a second truth draw (the floor) and the covariate-blind pooled truth.
Sanity on real data: the three real single-subject HCP matrices' distance to the nearest sample, against their
distance to the nearest world draw. Writes `benchmarks/brain_network_flow/results/brain_network_flow.json`, `.md`
and `.png`.
"""

import argparse
import itertools
import os
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("codec_flow", "raw_flow")
LABELS = {"codec_flow": "flow in the correlation codec", "raw_flow": "flow on the raw upper triangle"}
AGES = (0.1, 0.5, 0.9)
SEXES = (0, 1)
DIFFERENCE_SE = (
    "paired: both methods train on the same subjects with the same seeds and are judged against the same truth "
    "draws, so each difference's standard error is that of the per-unit differences (protocol.paired_difference)"
)


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_regions", type=int, default=100, help="Schaefer parcellation size of the world.")
    parser.add_argument("--num_train_subjects", type=int, default=1024, help="Training subjects per seed.")
    parser.add_argument("--train_steps", type=int, default=2000, help="Optimizer steps of both methods.")
    parser.add_argument("--batch_size", type=int, default=64, help="Training batch of both methods.")
    parser.add_argument("--hidden_size", type=int, default=256, help="Width of both velocity models.")
    parser.add_argument("--num_layers", type=int, default=3, help="Blocks of both velocity models.")
    parser.add_argument(
        "--learning_rates", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3], help="Validation grid (both)."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Test training seeds (>= 3).")
    parser.add_argument("--validation_seed", type=int, default=100, help="Training seed of the validation runs.")
    parser.add_argument("--samples_per_cell", type=int, default=64, help="Samples per (age, sex) cell.")
    parser.add_argument("--truth_draws", type=int, default=64, help="Fresh truth draws per cell for the MMD.")
    parser.add_argument("--mean_draws", type=int, default=1000, help="Draws per template and sex for true means.")
    parser.add_argument("--inference_steps", type=int, default=50, help="Euler steps of both samplers.")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "brain_network_flow.json"))
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    for name in ("num_train_subjects", "train_steps", "batch_size", "samples_per_cell", "truth_draws", "mean_draws"):
        if getattr(args, name) < 2:
            parser.error(f"--{name} must be >= 2, got {getattr(args, name)}.")
    return args


def cells():
    return list(itertools.product(AGES, SEXES))


def true_means(world, draws: int) -> dict:
    """`{(age, sex): (n, n)}`: the true conditional mean, the exact mixture of each template's Monte Carlo mean."""
    generator = torch.Generator().manual_seed(123_456)
    component_means = {}
    for sex in SEXES:
        for component, age in ((0, 0.0), (1, 1.0)):  # age 0 draws the young template only, age 1 the old one
            covariates = torch.tensor([[age, float(sex)]] * draws)
            component_means[component, sex] = world.sample(covariates, generator).matrices.mean(0)
    return {(age, sex): (1 - age) * component_means[0, sex] + age * component_means[1, sex] for age, sex in cells()}


def truth_draws(world, count: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {cell: world.sample(torch.tensor([list(map(float, cell))] * count), generator).matrices for cell in cells()}


def train_pipeline(method: str, world, seed: int, learning_rate: float, args):
    """Train `method` on `num_train_subjects` fresh subjects of training seed `seed`; its pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import BrainNetworkFlowModel, BrainNetworkFlowPipeline, CorrelationMatrixCodec
    from diffusers_ext.evaluation.brain_network_flow import RawUpperTriangleCodec
    from diffusers_ext.evaluation.manifold_flow import train_velocity_model

    generator = torch.Generator().manual_seed(seed)
    draw = world.sample(world.random_covariates(args.num_train_subjects, generator), generator)
    codec = (
        CorrelationMatrixCodec(args.num_regions) if method == "codec_flow" else RawUpperTriangleCodec(args.num_regions)
    )
    codec.fit(draw.matrices)
    torch.manual_seed(seed)
    model = BrainNetworkFlowModel(codec.num_features, 2, hidden_size=args.hidden_size, num_layers=args.num_layers)
    record = train_velocity_model(
        model,
        codec.encode(draw.matrices).float(),
        args.train_steps,
        learning_rate,
        batch_size=args.batch_size,
        seed=seed,
        covariates=draw.covariates,
    )
    pipe = BrainNetworkFlowPipeline(model, codec, FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe, record


def sample_cells(pipe, count: int, seed: int, steps: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for cell in cells():
        covariates = torch.tensor([list(map(float, cell))] * count)
        out[cell] = pipe(covariates, num_inference_steps=steps, generator=generator).matrices
    return out


def judge(samples: dict, truth: dict, means: dict) -> dict:
    """Per cell: `{"mmd2", "validity", "mean_error"}`; per sex: the age trend's error."""
    from diffusers_ext.evaluation.brain_network_flow import mean_error, mmd_to_truth, trend_error, validity

    per_cell = {
        f"{age},{sex}": {
            "mmd2": mmd_to_truth(samples[age, sex], truth[age, sex]),
            "validity": float(validity(samples[age, sex]).float().mean()),
            "mean_error": mean_error(samples[age, sex], means[age, sex]),
        }
        for age, sex in cells()
    }
    trend = {
        str(sex): trend_error(samples[AGES[0], sex], samples[AGES[-1], sex], means[AGES[0], sex], means[AGES[-1], sex])
        for sex in SEXES
    }
    return {"cells": per_cell, "trend_error": trend}


def nearest(matrices: torch.Tensor, references: torch.Tensor) -> list[float]:
    """For each of `matrices`, the Frobenius distance to the nearest of `references`."""
    from diffusers_ext.evaluation.brain_network_flow import upper_triangle

    a, b = upper_triangle(matrices), upper_triangle(references)
    return (torch.cdist(a, b) * 2**0.5).min(1).values.tolist()


def summarise(results: dict) -> dict:
    """The summary and its computed targets, from the recorded per-unit judgements (the run and the rebuild)."""
    from diffusers_ext.evaluation.brain_network_flow import codec_against_raw

    test, seeds = results["test"], [str(s) for s in results["settings"]["seeds"]]
    names = [f"{age},{sex}" for age, sex in cells()]

    def units(method, key):
        return [test[method][s]["cells"][c][key] for s in seeds for c in names]

    def trend_units(method):
        return [test[method][s]["trend_error"][str(sex)] for s in seeds for sex in SEXES]

    compared = codec_against_raw(
        units,
        trend_units,
        "MMD^2 to fresh truth: raw flow minus codec flow, minus 2 paired SE",
        "age-trend error: raw flow minus codec flow, minus 2 paired SE",
    )
    methods, targets = compared["methods"], compared["targets"]
    headroom = results["headroom"]
    sanity = {
        "raw_flow_validity_below_1": methods["raw_flow"]["validity"]["mean"] < 1.0,
        "second_truth_draw_mmd2_below_codec_flow": headroom["second_truth_mmd2"]
        < methods["codec_flow"]["mmd2"]["mean"],
        "covariate_blind_truth_mmd2_above_second_draw": headroom["pooled_truth_mmd2"] > headroom["second_truth_mmd2"],
    }
    return {
        "methods": methods,
        "comparisons": compared["comparisons"],
        "difference_se": DIFFERENCE_SE,
        "targets": targets,
        "sanity": sanity,
    }


def targets_from_results(results: dict) -> list[dict]:
    return summarise(results)["targets"]


def report_sections(results: dict) -> list[str]:
    s = results["summary"]
    lines = [
        "## Test (seeds " + ", ".join(map(str, results["settings"]["seeds"])) + ")",
        "",
        "| method | learning rate (validation) | valid samples | MMD^2 to truth | conditional-mean error | age-trend error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in METHODS:
        row = s["methods"][m]
        lines.append(
            f"| {LABELS[m]} | {results['validation'][m]['chosen']['candidate']:g} | {row['validity']['mean']:.3f} | "
            f"{row['mmd2']['mean']:.4f} (SE {row['mmd2']['sem']:.4f}) | {row['mean_error']['mean']:.3f} | "
            f"{row['trend_error']['mean']:.3f} |"
        )
    c = s["comparisons"]
    h = results["headroom"]
    lines += [
        "",
        f"Raw minus codec flow (paired): MMD^2 {c['mmd2']['difference']:+.4f} (SE {c['mmd2']['sem']:.4f}), "
        f"conditional-mean error {c['mean_error']['difference']:+.3f} (SE {c['mean_error']['sem']:.3f}), age-trend "
        f"error {c['trend_error']['difference']:+.3f} (SE {c['trend_error']['sem']:.3f}). {s['difference_se']}.",
        "",
        "## Headroom",
        "",
        f"MMD^2 of a second truth draw (the floor): {h['second_truth_mmd2']:.4f}; of the covariate-blind pooled truth: "
        f"{h['pooled_truth_mmd2']:.4f}.",
        "",
        "## Real HCP individuals (sanity)",
        "",
        "Frobenius distance of each real single-subject Schaefer-100 matrix to the nearest codec-flow sample (test "
        "seed " + str(results["settings"]["seeds"][0]) + ", all cells) and to the nearest world draw; the real "
        f"individuals' distances to the group mean: {', '.join(f'{d:.2f}' for d in results['real']['to_group_mean'])}.",
        "",
        "| subject | nearest sample | nearest world draw |",
        "| --- | --- | --- |",
    ]
    for name, a, b in zip(results["real"]["subjects"], results["real"]["to_samples"], results["real"]["to_world"]):
        lines.append(f"| {name} | {a:.2f} | {b:.2f} |")
    lines += ["", "## Sanity", "", *[f"- {k}: {v}" for k, v in s["sanity"].items()]]
    return lines


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]["methods"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), dpi=100)
    for ax, key, label in zip(
        axes, ("validity", "mmd2", "trend_error"), ("valid samples", "MMD^2 to truth", "age-trend error")
    ):
        ax.bar([LABELS[m] for m in METHODS], [s[m][key]["mean"] for m in METHODS],
               yerr=[2 * s[m][key]["sem"] for m in METHODS])  # fmt: skip
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(results: dict, stem: str) -> None:
    from diffusers_ext.evaluation.reporting import write_results

    s = results["settings"]
    write_results(
        stem,
        results,
        "Brain-network flow: the correlation codec against the raw upper triangle, on a world with a known law",
        report_sections(results),
        settings_line=(
            f"Schaefer-{s['num_regions']} world; {s['num_train_subjects']} training subjects per seed; both methods: "
            f"hidden {s['hidden_size']} x {s['num_layers']} blocks, {s['train_steps']} steps of batch {s['batch_size']}, "
            f"learning rate from {s['learning_rates']} on validation seed {s['validation_seed']}; "
            f"{s['samples_per_cell']} samples and {s['truth_draws']} truth draws per cell of ages {list(AGES)} x sexes "
            f"{list(SEXES)}; {s['inference_steps']} Euler steps; one CPU thread."
        ),
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import choose_on_validation, command, rebuild_results

    stem = os.path.splitext(args.output)[0]
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, stem)
        return results
    torch.set_num_threads(1)
    from diffusers_ext.data.brain_networks import (
        ConnectivityWorld,
        load_group_connectivity,
        load_individual_connectivity,
    )
    from diffusers_ext.evaluation.brain_network_flow import mmd_to_truth

    started = time.perf_counter()
    world = ConnectivityWorld(load_group_connectivity("schaefer", args.num_regions))
    means = true_means(world, args.mean_draws)
    validation_truth = truth_draws(world, args.truth_draws, 10_000)
    validation = {}
    for method in METHODS:

        def measure(learning_rate, split, method=method):
            pipe, record = train_pipeline(method, world, args.validation_seed, learning_rate, args)
            samples = sample_cells(pipe, args.samples_per_cell, 10_000 + args.validation_seed, args.inference_steps)
            judged = judge(samples, validation_truth, means)
            mmd = sum(c["mmd2"] for c in judged["cells"].values()) / len(judged["cells"])
            return {"mean_mmd2": mmd, "final_loss": record["final_loss"], **judged}

        validation[method] = choose_on_validation(
            args.learning_rates, measure, score=lambda m: m["mean_mmd2"], maximize=False, names=str, test=False
        )
        print(f"{method}: chose {validation[method]['chosen']['candidate']} ({time.perf_counter() - started:.0f} s)")
    test = {m: {} for m in METHODS}
    real_samples = None
    for seed in args.seeds:
        truth = truth_draws(world, args.truth_draws, 20_000 + seed)
        for method in METHODS:
            pipe, record = train_pipeline(method, world, seed, validation[method]["chosen"]["candidate"], args)
            samples = sample_cells(pipe, args.samples_per_cell, 1000 + seed, args.inference_steps)
            test[method][str(seed)] = {"final_loss": record["final_loss"], **judge(samples, truth, means)}
            if method == "codec_flow" and seed == args.seeds[0]:
                real_samples = torch.cat(list(samples.values()))
        print(f"seed {seed} done ({time.perf_counter() - started:.0f} s)")
    second, pooled_draws = truth_draws(world, args.truth_draws, 30_000), truth_draws(world, args.truth_draws, 40_000)
    reference = truth_draws(world, args.truth_draws, 20_000 + args.seeds[0])
    pooled = torch.cat(list(pooled_draws.values()))
    pick = torch.randperm(len(pooled), generator=torch.Generator().manual_seed(0))[: args.truth_draws]
    headroom = {
        "second_truth_mmd2": sum(mmd_to_truth(second[c], reference[c]) for c in cells()) / len(cells()),
        "pooled_truth_mmd2": sum(mmd_to_truth(pooled[pick], reference[c]) for c in cells()) / len(cells()),
    }
    individuals = load_individual_connectivity("schaefer", args.num_regions)
    real = torch.from_numpy(np.stack(list(individuals.values())))
    world_draws = torch.cat(list(reference.values()))
    group = torch.as_tensor(load_group_connectivity("schaefer", args.num_regions))
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "validation": validation,
        "test": test,
        "headroom": headroom,
        "real": {
            "subjects": list(individuals),
            "to_samples": nearest(real, real_samples),
            "to_world": nearest(real, world_draws),
            "to_group_mean": nearest(real, group[None]),
        },
    }
    results["summary"] = summarise(results)
    results["seconds"] = time.perf_counter() - started
    write_report(results, stem)
    return results


if __name__ == "__main__":
    main()
