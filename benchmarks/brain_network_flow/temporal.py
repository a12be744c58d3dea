#!/usr/bin/env python
"""The temporal variant on a real trajectory: the brain-network flow conditioned on a time index, trained on the
sliding-window connectivity of ONE subject's one resting-state run, judged on held-out stretches of the same run,
against the raw upper-triangle flow given the same chance.

    python benchmarks/brain_network_flow/temporal.py

What it shows: that the piece works on a real trajectory (every sample valid, samples near the held-out windows of
their time, the drift of connectivity over the run followed). It is one subject and one run of 652 volumes: no claim
about a population, and the time index is the position in this run, not an age.

Data: `load_sliding_window_connectivity` (`diffusers_ext.data.brain_network_trajectory`): the `brainspace` wheel's fsaverage5 run
cut into 100 k-means regions of the pial surface (seed 0), confounds regressed, z-scored; correlation matrices of
40-volume windows every 2 volumes, shrunk by 0.1 towards the identity; time = window start / (652 - 40).

Split, and the autocorrelation of overlapping windows: the run's volumes are cut into 8 contiguous segments of 81-82
volumes, and only the windows lying entirely inside one segment are kept (21 per segment), so no two windows of
different segments share a volume. Segments 0, 1, 4 and 7 train both methods; segments 2 and 5 are the validation
split, 3 and 6 the test split (both interior, so judging interpolates in time, never extrapolates beyond the run).
The windows of one held-out segment are still autocorrelated with each other (they overlap), so a segment is one
unit of the standard errors, never its windows; the units are (training seed, held-out segment).

Methods: the same `BrainNetworkFlowModel` (time as its one covariate), steps, batch and seeds; only the coordinates
differ: `CorrelationMatrixCodec` or the raw strict upper triangle (`RawUpperTriangleCodec`). Each method's learning
rate is chosen from the same grid on a validation training seed by the mean MMD^2 over the validation segments; the
frozen choice then trains on the test seeds and is judged once on the test segments. Judges, on the upper triangles
in correlation units: validity; unbiased MMD^2 between the samples drawn at a segment's window times and the
segment's real windows (Gaussian kernels at 0.5, 1, 2 x the median distance between the training windows: a held-out
segment's own windows overlap, so their median distance understates the run's spread); the segment-mean error
(the samples' mean matrix against the real windows' mean); the time-trend error (the change of the mean matrix from
the earlier to the later held-out segment, against the real change). References without training: the training
windows pooled (time-blind) and the windows of the nearest training segment (persistence), judged the same way.
Writes `benchmarks/brain_network_flow/results/temporal.json`, `.md` and `.png`.
"""

import argparse
import os
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("codec_flow", "raw_flow")
LABELS = {"codec_flow": "flow in the correlation codec", "raw_flow": "flow on the raw upper triangle"}
REFERENCES = {"pooled_training": "training windows pooled (time-blind)", "nearest_segment": "nearest training segment"}
NUM_SEGMENTS = 8
ROLES = {"train": (0, 1, 4, 7), "validation": (2, 5), "test": (3, 6)}
DIFFERENCE_SE = (
    "paired: both methods train on the same windows with the same seeds and are judged against the same held-out "
    "windows, so each difference's standard error is that of the per-unit differences (protocol.paired_difference); "
    "a unit is a (seed, held-out segment) for MMD^2 and the segment-mean error, a seed for the trend"
)


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_regions", type=int, default=100, help="Regions of the fsaverage5 parcellation.")
    parser.add_argument("--window", type=int, default=40, help="Volumes per sliding window.")
    parser.add_argument("--window_step", type=int, default=2, help="Volumes between window starts.")
    parser.add_argument("--shrinkage", type=float, default=0.1, help="Weight of the identity in each window's matrix.")
    parser.add_argument("--train_steps", type=int, default=1000, help="Optimizer steps of both methods.")
    parser.add_argument("--batch_size", type=int, default=64, help="Training batch of both methods.")
    parser.add_argument("--hidden_size", type=int, default=256, help="Width of both velocity models.")
    parser.add_argument("--num_layers", type=int, default=3, help="Blocks of both velocity models.")
    parser.add_argument(
        "--learning_rates", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4, 3e-4], help="Validation grid (both)."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Test training seeds (>= 3).")
    parser.add_argument("--validation_seed", type=int, default=100, help="Training seed of the validation runs.")
    parser.add_argument("--samples_per_window", type=int, default=4, help="Samples drawn at each held-out time.")
    parser.add_argument("--inference_steps", type=int, default=50, help="Euler steps of both samplers.")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "temporal.json"))
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    for name in ("train_steps", "batch_size", "samples_per_window", "inference_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    return args


def segment_windows(num_volumes: int, window: int, step: int) -> np.ndarray:
    """`(num_windows,)` int: the segment (of `NUM_SEGMENTS` contiguous, near-equal stretches of the run's volumes)
    holding each sliding window entirely, -1 for a window that straddles two segments (dropped)."""
    from diffusers_ext.data.brain_network_trajectory import sliding_window_starts

    bounds = np.linspace(0, num_volumes, NUM_SEGMENTS + 1).round().astype(int)
    starts = sliding_window_starts(num_volumes, window, step)
    first = np.searchsorted(bounds, starts, side="right") - 1
    last = np.searchsorted(bounds, starts + window - 1, side="right") - 1
    return np.where(first == last, first, -1)


def load_trajectory(args) -> dict:
    """The windows and times of each segment: `{segment: (matrices (w, n, n), times (w,))}`."""
    from diffusers_ext.data.brain_network_trajectory import load_sliding_window_connectivity, run_num_volumes

    matrices, times = load_sliding_window_connectivity(
        args.num_regions, args.window, args.window_step, args.shrinkage, seed=0
    )
    segments = segment_windows(run_num_volumes(), args.window, args.window_step)
    if len(segments) != len(matrices):
        raise RuntimeError(f"{len(segments)} segment labels for {len(matrices)} windows.")
    out = {}
    for segment in range(NUM_SEGMENTS):
        keep = torch.from_numpy(segments == segment)
        if int(keep.sum()) < 2:
            raise ValueError(
                f"segment {segment} holds {int(keep.sum())} whole windows; --window {args.window} is too long for "
                f"{NUM_SEGMENTS} segments of the run."
            )
        out[segment] = (matrices[keep], times[keep])
    return out


def train_pipeline(method: str, data: dict, seed: int, learning_rate: float, args):
    """Train `method` on the training segments' windows with training seed `seed`; its pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import BrainNetworkFlowModel, BrainNetworkFlowPipeline, CorrelationMatrixCodec
    from diffusers_ext.evaluation.brain_network_flow import RawUpperTriangleCodec
    from diffusers_ext.evaluation.manifold_flow import train_velocity_model

    matrices = torch.cat([data[s][0] for s in ROLES["train"]])
    times = torch.cat([data[s][1] for s in ROLES["train"]]).float()[:, None]
    n = matrices.shape[1]
    codec = CorrelationMatrixCodec(n) if method == "codec_flow" else RawUpperTriangleCodec(n)
    codec.fit(matrices)
    torch.manual_seed(seed)
    model = BrainNetworkFlowModel(codec.num_features, 1, hidden_size=args.hidden_size, num_layers=args.num_layers)
    record = train_velocity_model(
        model,
        codec.encode(matrices).float(),
        args.train_steps,
        learning_rate,
        batch_size=args.batch_size,
        seed=seed,
        covariates=times,
    )
    pipe = BrainNetworkFlowPipeline(model, codec, FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe, record


def sample_segments(pipe, data: dict, segments, count: int, seed: int, steps: int) -> dict:
    """`{segment: (len(windows) * count, n, n)}`: `count` samples at each held-out window's time."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for segment in segments:
        times = data[segment][1].float().repeat_interleave(count)[:, None]
        out[segment] = pipe(times, num_inference_steps=steps, generator=generator).matrices
    return out


def judge_bandwidth(data: dict) -> float:
    """The judges' kernel bandwidth: the median distance between the training windows' upper triangles."""
    from diffusers_ext.evaluation.brain_network_flow import upper_triangle
    from diffusers_ext.metrics.sample_distances import median_bandwidth

    return median_bandwidth(upper_triangle(torch.cat([data[s][0] for s in ROLES["train"]])))


def judge(samples: dict, data: dict, segments) -> dict:
    """Per held-out segment: `{"mmd2", "validity", "mean_error", "global_connectivity"}`; and the trend error from
    the first held-out segment to the last."""
    from diffusers_ext.evaluation.brain_network_flow import mean_error, mmd_to_truth, trend_error, validity

    bandwidth = judge_bandwidth(data)
    per_segment = {
        str(s): {
            "mmd2": mmd_to_truth(samples[s], data[s][0], bandwidth=bandwidth),
            "validity": float(validity(samples[s]).float().mean()),
            "mean_error": mean_error(samples[s], data[s][0].mean(0)),
            "global_connectivity": global_connectivity(samples[s]).mean().item(),
        }
        for s in segments
    }
    early, late = segments[0], segments[-1]
    trend = trend_error(samples[early], samples[late], data[early][0].mean(0), data[late][0].mean(0))
    return {"segments": per_segment, "trend_error": trend}


def global_connectivity(matrices: torch.Tensor) -> torch.Tensor:
    """`(batch,)`: each matrix's mean off-diagonal entry."""
    n = matrices.shape[-1]
    return (matrices.sum((1, 2)) - torch.diagonal(matrices, dim1=1, dim2=2).sum(1)) / (n * (n - 1))


def references(data: dict, segments, count: int) -> dict:
    """The judgements of two samplers without training (the same number of samples as a method draws): the training
    windows pooled, ignoring time, and the windows of the training segment nearest in time."""
    generator = torch.Generator().manual_seed(0)
    pooled = torch.cat([data[s][0] for s in ROLES["train"]])
    out = {}
    for name in REFERENCES:
        samples = {}
        for segment in segments:
            size = len(data[segment][0]) * count
            if name == "pooled_training":
                source = pooled
            else:
                nearest = min(ROLES["train"], key=lambda s: (abs(s - segment), s))
                source = data[nearest][0]
            samples[segment] = source[torch.randint(0, len(source), (size,), generator=generator)]
        out[name] = judge(samples, data, segments)
    return out


def summarise(results: dict) -> dict:
    """The summary and its computed targets, from the recorded per-unit judgements (the run and the rebuild)."""
    from diffusers_ext.evaluation.brain_network_flow import codec_against_raw

    test, seeds = results["test"], [str(s) for s in results["settings"]["seeds"]]
    names = [str(s) for s in ROLES["test"]]

    def units(method, key):
        return [test[method][s]["segments"][c][key] for s in seeds for c in names]

    def trend_units(method):
        return [test[method][s]["trend_error"] for s in seeds]

    compared = codec_against_raw(
        units,
        trend_units,
        "MMD^2 to the held-out windows: raw flow minus codec flow, minus 2 paired SE",
        "time-trend error: raw flow minus codec flow, minus 2 paired SE",
    )
    methods, targets = compared["methods"], compared["targets"]
    ref = results["references"]

    def ref_mmd(name):
        return sum(v["mmd2"] for v in ref[name]["segments"].values()) / len(ref[name]["segments"])

    sanity = {
        "raw_flow_validity_below_1": methods["raw_flow"]["validity"]["mean"] < 1.0,
        "time_matters_nearest_segment_mmd2_below_pooled": ref_mmd("nearest_segment") < ref_mmd("pooled_training"),
        "codec_flow_mmd2_below_time_blind_pooled": methods["codec_flow"]["mmd2"]["mean"] < ref_mmd("pooled_training"),
    }
    return {
        "methods": methods,
        "references": {name: {"mmd2": ref_mmd(name), "trend_error": ref[name]["trend_error"]} for name in REFERENCES},
        "comparisons": compared["comparisons"],
        "difference_se": DIFFERENCE_SE,
        "targets": targets,
        "sanity": sanity,
    }


def targets_from_results(results: dict) -> list[dict]:
    return summarise(results)["targets"]


def report_sections(results: dict) -> list[str]:
    s = results["summary"]
    d = results["data"]
    lines = [
        "**One subject, one run.** Everything here comes from the single resting-state run the `brainspace` wheel "
        "ships (sub-010188, 652 volumes on fsaverage5): it shows the piece working on a real trajectory, not a "
        "population claim.",
        "",
        f"Windows per segment: {d['windows_per_segment']}; training segments {list(ROLES['train'])} "
        f"({d['train_windows']} windows), validation {list(ROLES['validation'])}, test {list(ROLES['test'])}. "
        f"Judges' kernel bandwidth (median distance between training windows): {d['judge_bandwidth']:.2f}.",
        "",
        "## Test (seeds " + ", ".join(map(str, results["settings"]["seeds"])) + ", held-out segments "
        f"{', '.join(map(str, ROLES['test']))})",
        "",
        "| method | learning rate (validation) | valid samples | MMD^2 to held-out windows | segment-mean error | "
        "time-trend error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in METHODS:
        row = s["methods"][m]
        lines.append(
            f"| {LABELS[m]} | {results['validation'][m]['chosen']['candidate']:g} | {row['validity']['mean']:.3f} | "
            f"{row['mmd2']['mean']:.4f} (SE {row['mmd2']['sem']:.4f}) | {row['mean_error']['mean']:.3f} | "
            f"{row['trend_error']['mean']:.3f} (SE {row['trend_error']['sem']:.3f}) |"
        )
    for name, label in REFERENCES.items():
        ref = results["references"][name]
        mean_err = sum(v["mean_error"] for v in ref["segments"].values()) / len(ref["segments"])
        lines.append(
            f"| reference: {label} | - | 1.000 | {s['references'][name]['mmd2']:.4f} | {mean_err:.3f} | "
            f"{ref['trend_error']:.3f} |"
        )
    c = s["comparisons"]
    real = results["data"]["global_connectivity"]
    lines += [
        "",
        f"Raw minus codec flow (paired): MMD^2 {c['mmd2']['difference']:+.4f} (SE {c['mmd2']['sem']:.4f}), "
        f"segment-mean error {c['mean_error']['difference']:+.3f} (SE {c['mean_error']['sem']:.3f}), time-trend "
        f"error {c['trend_error']['difference']:+.3f} (SE {c['trend_error']['sem']:.3f}). {s['difference_se']}.",
        "",
        "## Global connectivity of the held-out segments",
        "",
        "Mean off-diagonal correlation, real windows against samples (mean over test seeds):",
        "",
        "| segment | real | " + " | ".join(LABELS[m] for m in METHODS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in METHODS) + " |",
    ]
    seeds = [str(x) for x in results["settings"]["seeds"]]
    for segment in ROLES["test"]:
        values = [
            sum(results["test"][m][x]["segments"][str(segment)]["global_connectivity"] for x in seeds) / len(seeds)
            for m in METHODS
        ]
        lines.append(f"| {segment} | {real[str(segment)]:.3f} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines += ["", "## Sanity", "", *[f"- {k}: {v}" for k, v in s["sanity"].items()]]
    return lines


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]["methods"]
    trace = results["data"]["trace"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), dpi=100)
    ax = axes[0]
    ax.plot(trace["times"], trace["real"], color="black", lw=1, label="real windows")
    for m, color in zip(METHODS, ("tab:blue", "tab:orange")):
        ax.scatter(trace["times_held_out"], trace[m], s=6, color=color, label=LABELS[m] + " (seed 0)")
    for segment in ROLES["test"]:
        ax.axvspan(*results["data"]["segment_times"][str(segment)], color="grey", alpha=0.2)
    ax.set_xlabel("time in the run", fontsize=8)
    ax.set_title("global connectivity (test segments shaded)", fontsize=9)
    ax.legend(fontsize=6)
    for ax, key, label in zip(axes[1:], ("mmd2", "trend_error"), ("MMD^2 to held-out windows", "time-trend error")):
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
        "Brain-network flow, temporal variant: one subject's sliding-window trajectory (codec against raw upper "
        "triangle)",
        report_sections(results),
        settings_line=(
            f"{s['num_regions']} k-means regions of fsaverage5; windows of {s['window']} volumes every "
            f"{s['window_step']}, shrinkage {s['shrinkage']}; both methods: hidden {s['hidden_size']} x "
            f"{s['num_layers']} blocks, {s['train_steps']} steps of batch {s['batch_size']}, learning rate from "
            f"{s['learning_rates']} on validation seed {s['validation_seed']}; {s['samples_per_window']} samples per "
            f"held-out window; {s['inference_steps']} Euler steps; one CPU thread."
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
    started = time.perf_counter()
    data = load_trajectory(args)
    validation_segments, test_segments = ROLES["validation"], ROLES["test"]
    validation = {}
    for method in METHODS:

        def measure(learning_rate, split, method=method):
            pipe, record = train_pipeline(method, data, args.validation_seed, learning_rate, args)
            samples = sample_segments(
                pipe,
                data,
                validation_segments,
                args.samples_per_window,
                10_000 + args.validation_seed,
                args.inference_steps,
            )
            judged = judge(samples, data, validation_segments)
            mmd = sum(c["mmd2"] for c in judged["segments"].values()) / len(judged["segments"])
            return {"mean_mmd2": mmd, "final_loss": record["final_loss"], **judged}

        validation[method] = choose_on_validation(
            args.learning_rates, measure, score=lambda m: m["mean_mmd2"], maximize=False, names=str, test=False
        )
        print(f"{method}: chose {validation[method]['chosen']['candidate']} ({time.perf_counter() - started:.0f} s)")
    test = {m: {} for m in METHODS}
    trace = {}
    for seed in args.seeds:
        for method in METHODS:
            pipe, record = train_pipeline(method, data, seed, validation[method]["chosen"]["candidate"], args)
            samples = sample_segments(
                pipe, data, test_segments, args.samples_per_window, 1000 + seed, args.inference_steps
            )
            test[method][str(seed)] = {"final_loss": record["final_loss"], **judge(samples, data, test_segments)}
            if seed == args.seeds[0]:
                trace[method] = torch.cat(
                    [global_connectivity(samples[s]).view(-1, args.samples_per_window).mean(1) for s in test_segments]
                ).tolist()
        print(f"seed {seed} done ({time.perf_counter() - started:.0f} s)")
    all_segments = range(NUM_SEGMENTS)
    trace["times"] = torch.cat([data[s][1] for s in all_segments]).tolist()
    trace["real"] = torch.cat([global_connectivity(data[s][0]) for s in all_segments]).tolist()
    trace["times_held_out"] = torch.cat([data[s][1] for s in test_segments]).tolist()
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "data": {
            "subject": "sub-010188 (one subject, one run)",
            "windows_per_segment": {str(s): len(data[s][0]) for s in all_segments},
            "train_windows": sum(len(data[s][0]) for s in ROLES["train"]),
            "judge_bandwidth": judge_bandwidth(data),
            "segment_times": {str(s): [float(data[s][1][0]), float(data[s][1][-1])] for s in all_segments},
            "global_connectivity": {str(s): float(global_connectivity(data[s][0]).mean()) for s in all_segments},
            "trace": trace,
        },
        "validation": validation,
        "test": test,
        "references": references(data, test_segments, args.samples_per_window),
    }
    results["summary"] = summarise(results)
    results["seconds"] = time.perf_counter() - started
    write_report(results, stem)
    return results


if __name__ == "__main__":
    main()
