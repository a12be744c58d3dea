#!/usr/bin/env python
"""Measure EpiDiff (uncertainty-steered diffusion forecasts) against its baselines on Boston ILI and a simulator.

    python benchmarks/epidiff/epidiff.py

Tasks: the Boston ED influenza-like-illness rates (14 neighbourhoods, 436 weeks; the `areafluforecast` wheel's data,
`diffusers_ext.data.epidemics.load_boston_ili`) at horizons 7 and 14 weeks from 14 weeks of history, and a
metapopulation SIRS simulator (`simulate_metapopulation_sir`) at horizon 7, whose true predictive distribution is
drawn from its state (`simulate_forward`, the oracle). Windows are split 60/20/20 by time.

Methods, all on the same windows and the same seeds:

- **unguided**: the `SpatioTemporalDenoiser` (trained per seed with a DDPM schedule) sampled by DDIM;
- **mechanistic**: the leak-free SI/SIR forecast alone (`mechanistic_forecast`; its variant and fit length chosen on
  validation), its predictive distribution a gamma with its mean and variance;
- **constant sigma**: DDIM steered towards the mechanistic mean with one `sigma = (sigma_min + sigma_max) / 2`;
- **EpiDiff**: steered with the per-point `sigma` of the mechanistic variance (bounds fitted on training windows).

Every choice (the mechanistic settings; each steered method's `guidance_scale` from the same grid) is made on the
validation windows by CRPS averaged over seeds; the test windows are measured once with the frozen choices. Targets
compare methods on test MAE and CRPS by paired per-window differences (mean over seeds) and their standard error
over windows. Sanity: the mechanistic forecast's test inputs end at each forecast origin (a scrambled future
changes nothing). Boston's missing weeks (7 % of cells) are filled per window from its own past only, and only
observed targets are scored (`chronological_windows(observed=)`). Writes `benchmarks/epidiff/results/epidiff.json`, `.md` and `.png`.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("unguided", "mechanistic", "constant_sigma", "epidiff")
TASKS = ("boston_h7", "boston_h14", "simulator_h7")
MIN_Z = 2.0


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds (>= 3).")
    parser.add_argument("--history", type=int, default=14, help="History steps.")
    parser.add_argument("--train_steps", type=int, default=2000, help="Denoiser training steps per seed.")
    parser.add_argument("--batch_size", type=int, default=8, help="Training windows per batch.")
    parser.add_argument("--hidden_size", type=int, default=32, help="Denoiser width.")
    parser.add_argument("--num_layers", type=int, default=2, help="Denoiser blocks.")
    parser.add_argument(
        "--num_samples", type=int, default=32, help="Forecast draws per window (the 90% interval needs > 8)."
    )
    parser.add_argument("--num_inference_steps", type=int, default=10, help="DDIM steps.")
    parser.add_argument("--eval_stride", type=int, default=3, help="Steps between evaluated forecast origins.")
    parser.add_argument(
        "--guidance_scales",
        type=float,
        nargs="+",
        default=[0.001, 0.003, 0.01, 0.03, 0.1, 1.0, 10.0],
        help="Validation grid of guidance_scale, the same for both steered methods (the first committed run used "
        "0.1, 1 and 10; at 0.1 a point with sigma <= 0.55 is already pulled all the way to the mechanistic mean in the "
        "first DDIM steps, so 0.001-0.03 give weaker steering).",
    )
    parser.add_argument(
        "--reporting_shares",
        type=float,
        nargs="+",
        default=[1.0, 0.5, 0.25, 0.1],
        help="Validation grid of the reported share of infections for the SIR variant: its population is "
        "`share * N` (reports of a share rho of the infections of N people follow an SIR on rho * N in report "
        "units). The first committed run used 1 only.",
    )
    parser.add_argument("--sigma_min", type=float, default=0.1, help="Smallest sigma (standardised units).")
    parser.add_argument("--sigma_max", type=float, default=1.0, help="Largest sigma.")
    parser.add_argument("--sim_nodes", type=int, default=10, help="Regions of the simulator.")
    parser.add_argument("--sim_steps", type=int, default=300, help="Steps of the simulator.")
    parser.add_argument(
        "--output",
        type=str,
        default=None,
        help="Results stem (default: results/epidiff; with --from_results, that file's own stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.output is None:
        args.output = os.path.splitext(args.from_results)[0] if args.from_results else os.path.join(RESULTS, "epidiff")
    return args


def load_task(task: str, args):
    from diffusers_ext.data.epidemics import load_boston_ili, simulate_metapopulation_sir

    horizon = int(task.rsplit("_h", 1)[1])
    series = (
        load_boston_ili()
        if task.startswith("boston")
        else simulate_metapopulation_sir(num_nodes=args.sim_nodes, num_steps=args.sim_steps, seed=0)
    )
    return series, horizon


def subsample(windows, stride: int):
    return windows.select(slice(None, None, stride))


def mechanistic_on(windows, horizon, config):
    from diffusers_ext import mechanistic_forecast

    past = windows.past
    result = mechanistic_forecast(past.reshape(-1, past.shape[-1]), horizon, config)
    shape = past.shape[:2] + (horizon,)
    return result.mean.reshape(shape), result.variance.reshape(shape)


def scores_of(samples, windows, target=None):
    """Per-window scores of `samples` against the windows' observed targets (`target` overrides their values)."""
    from diffusers_ext.evaluation.epidiff import window_scores

    return window_scores(samples, windows.future if target is None else target, observed=windows.future_observed)


def summary_of(scores, points):
    from diffusers_ext.evaluation.epidiff import summarize_scores

    return summarize_scores(scores, points)


def leak_sanity(series, windows, config, horizon, used_mean, fractions=(0.6, 0.2, 0.2)):
    """Whether the inputs and the mechanistic forecasts the benchmark uses on the test windows see only the past.

    For every evaluated test window, every cell of the panel from its origin on (values and whether they were
    observed) is replaced by noise and the windows are cut again. `inputs_end_at_origin`: the window's history is
    unchanged (so no input, a filled missing cell included, depends on the origin or later).
    `max_change_when_future_scrambled`: for five of those windows, the mechanistic forecast on the recut history
    against `used_mean` (the forecast the benchmark scored); 0 when leak-free."""
    from diffusers_ext import mechanistic_forecast
    from diffusers_ext.data.epidemics import chronological_windows

    rng = np.random.default_rng(0)
    checked = set(np.linspace(0, len(windows.origins) - 1, 5).astype(int).tolist())
    ends_at_origin, changes = True, []
    for index, origin in enumerate(windows.origins.tolist()):
        values, observed = series.values.copy(), series.observed.copy()
        values[origin:] = rng.uniform(0, 10 * values.max(), values[origin:].shape)
        observed[origin:] = rng.random(observed[origin:].shape) < 0.5
        recut = chronological_windows(values, windows.history, horizon, fractions, observed=observed)["test"]
        past = recut.past[list(recut.origins).index(origin)]
        ends_at_origin &= bool(np.array_equal(past, windows.past[index]))
        if index in checked:
            scrambled = mechanistic_forecast(past, horizon, config).mean
            changes.append(float(np.abs(used_mean[index] - scrambled).max()))
    return {"max_change_when_future_scrambled": max(changes), "inputs_end_at_origin": bool(ends_at_origin)}


def run_task(task: str, args) -> dict:
    from diffusers_ext import (
        EpiDiffConfig,
        EpiDiffTrainer,
        MechanisticConfig,
        build_epidiff_denoiser,
        fit_sigma_bounds,
    )
    from diffusers_ext.data.epidemics import chronological_windows
    from diffusers_ext.evaluation.epidiff import gamma_draws

    started = time.time()
    series, horizon = load_task(task, args)
    splits = chronological_windows(series.values, args.history, horizon, observed=series.observed)
    evaluated = {s: subsample(splits[s], args.eval_stride) for s in ("validation", "test")}
    points = series.num_nodes * horizon
    population = series.population if task.startswith("boston") else float(series.extra["model"].populations.mean())

    # the mechanistic baseline's own choice on validation (by CRPS of its gamma predictive)
    # variant x fit length x R0 box (the prior is centred on the box: (0.7, 1.4) centres it on R0 = 1, no growth)
    # x, for the SIR variant (the SI one never reads the population), the reported share of infections
    candidates = [
        (v, f, b, r)
        for v in ("si", "sir")
        for f in (None, 6, 4)
        for b in ((0.5, 4.0), (0.7, 1.4))
        for r in (args.reporting_shares if v == "sir" else [1.0])
    ]
    mech_validation = []
    for variant, fit_length, r0_bounds, share in candidates:
        config = MechanisticConfig(
            variant=variant, fit_length=fit_length, population=population * share, r0_bounds=r0_bounds
        )
        mean, var = mechanistic_on(evaluated["validation"], horizon, config)
        draws = gamma_draws(mean, var, args.num_samples, seed=0)
        summary = summary_of(scores_of(draws, evaluated["validation"]), points)
        row = {"variant": variant, "fit_length": fit_length, "r0_bounds": list(r0_bounds), "reporting_share": share}
        mech_validation.append({**row, **summary})
    best = min(range(len(candidates)), key=lambda i: mech_validation[i]["crps"])
    variant, fit_length, r0_bounds, share = candidates[best]
    mech_config = MechanisticConfig(
        variant=variant, fit_length=fit_length, population=population * share, r0_bounds=r0_bounds
    )
    mech_choice = {
        "variant": variant,
        "fit_length": fit_length,
        "r0_bounds": list(r0_bounds),
        "reporting_share": share,
    }
    mech = {s: mechanistic_on(evaluated[s], horizon, mech_config) for s in ("validation", "test")}
    train_mean, train_var = mechanistic_on(splits["train"], horizon, mech_config)
    bounds = fit_sigma_bounds(train_var)  # training windows only
    sanity = leak_sanity(series, evaluated["test"], mech_config, horizon, mech["test"][0])

    per_seed = []
    scratch = tempfile.mkdtemp(prefix="epidiff-benchmark-")
    for seed in args.seeds:
        config = EpiDiffConfig(
            output_dir=os.path.join(scratch, f"{task}-seed{seed}"),  # nothing is written there (no saves)
            history=args.history,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.train_steps,
            seed=seed,
            save_strategy="no",
            disable_tqdm=True,
        )
        model = build_epidiff_denoiser(config, splits["train"].windows)
        rows = [{"window": window} for window in splits["train"].windows]
        trainer = EpiDiffTrainer(model, config, train_dataset=rows, adjacency=series.adjacency)
        losses = [row["loss"] for row in trainer.train()]
        pipe = trainer.forecast_pipeline()
        pipe.set_progress_bar_config(disable=True)

        def sample(split, method, scale, seed=seed, pipe=pipe):
            mean, var = mech[split]
            kwargs = {}
            if method == "constant_sigma":
                kwargs = {"mechanistic_mean": mean, "constant_sigma": (args.sigma_min + args.sigma_max) / 2}
            elif method == "epidiff":
                kwargs = {"mechanistic_mean": mean, "mechanistic_var": var, "sigma_bounds": bounds}
            out = pipe(
                evaluated[split].past,
                series.adjacency,
                guidance_scale=scale if method != "unguided" else 0.0,
                sigma_min=args.sigma_min,
                sigma_max=args.sigma_max,
                num_samples=args.num_samples,
                num_inference_steps=args.num_inference_steps,
                generator=torch.Generator().manual_seed(1000 + seed),
                output_type="np",
                **kwargs,
            )
            return out.samples.astype(np.float64)

        runs = {"unguided": {split: sample(split, "unguided", 0.0) for split in ("validation", "test")}}
        for method in ("constant_sigma", "epidiff"):
            runs[method] = {
                f"validation@{scale}": sample("validation", method, scale) for scale in args.guidance_scales
            }
        per_seed.append(
            {"seed": seed, "final_loss": float(np.mean(losses[-20:])), "runs": runs, "pipe": pipe, "sample": sample}
        )

    # choices on validation: guidance_scale by CRPS averaged over seeds
    validation_rows, chosen = [], {}
    for method in ("constant_sigma", "epidiff"):
        rows = []
        for scale in args.guidance_scales:
            crps = [
                summary_of(scores_of(s["runs"][method][f"validation@{scale}"], evaluated["validation"]), points)[
                    "crps"
                ]
                for s in per_seed
            ]
            rows.append({"method": method, "guidance_scale": scale, "crps": float(np.mean(crps))})
        validation_rows += rows
        chosen[method] = min(rows, key=lambda r: r["crps"])["guidance_scale"]
    for s in per_seed:
        for method in ("constant_sigma", "epidiff"):
            s["runs"][method]["test"] = s["sample"]("test", method, chosen[method])

    test_windows = evaluated["test"]
    target = test_windows.future
    test_scores = {m: [] for m in METHODS}
    for s in per_seed:
        for method in ("unguided", "constant_sigma", "epidiff"):
            test_scores[method].append(scores_of(s["runs"][method]["test"], test_windows))
        draws = gamma_draws(*mech["test"], args.num_samples, seed=s["seed"])
        test_scores["mechanistic"].append(scores_of(draws, test_windows))
    summaries = {}
    for method in METHODS:
        per = [summary_of(sc, points) for sc in test_scores[method]]
        summaries[method] = {
            k: {"mean": float(np.mean([p[k] for p in per])), "values": [p[k] for p in per]} for k in per[0]
        }

    def paired(metric, better, worse):
        """Per-window difference `worse - better` of MAE or CRPS (mean over seeds): `(mean, se)`."""
        key = "abs_error" if metric == "mae" else "quantile_loss"
        # per window: MAE over its observed points, CRPS relative to its observed |y|
        scale = test_scores[better][0]["points"] if metric == "mae" else test_scores[better][0]["abs_target"]
        diff = np.mean([w[key] - b[key] for w, b in zip(test_scores[worse], test_scores[better])], axis=0)
        diff = diff[scale > 0] / scale[scale > 0]  # a window with no observed target has nothing to compare
        return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))

    comparisons = {}
    for baseline in ("unguided", "mechanistic", "constant_sigma"):
        for metric in ("mae", "crps"):
            mean, se = paired(metric, "epidiff", baseline)
            comparisons[f"{metric}_vs_{baseline}"] = {"difference": mean, "se": se, "z": mean / se if se > 0 else 0.0}

    persistence_error = np.abs(test_windows.past[..., -1:] - target)[test_windows.future_observed]
    headroom = {"persistence_mae": float(persistence_error.mean())}
    if "model" in series.extra:
        from diffusers_ext.data.epidemics import simulate_forward

        oracle = np.stack(
            [
                simulate_forward(series, int(o), horizon, args.num_samples, seed=int(o))
                for o in evaluated["test"].origins
            ]
        )
        headroom["oracle"] = summary_of(scores_of(oracle, test_windows), points)

    # the figure's data: per node and horizon, the test sigma and how far EpiDiff moved towards the mechanistic mean
    from diffusers_ext import uncertainty_to_sigma

    sigma = uncertainty_to_sigma(mech["test"][1], bounds, args.sigma_min, args.sigma_max).mean(0)
    guided = np.mean([s["runs"]["epidiff"]["test"].mean(1) for s in per_seed], 0)
    free = np.mean([s["runs"]["unguided"]["test"].mean(1) for s in per_seed], 0)
    gap = np.abs(free - mech["test"][0])
    follow = np.clip(1 - np.abs(guided - mech["test"][0]) / np.maximum(gap, 1e-6), -1, 1).mean(0)
    for s in per_seed:
        s.pop("pipe"), s.pop("sample"), s.pop("runs")
    return {
        "task": task,
        "horizon": horizon,
        "num_nodes": series.num_nodes,
        "windows": {k: int(len(v.origins)) for k, v in splits.items()},
        "evaluated_windows": {k: int(len(v.origins)) for k, v in evaluated.items()},
        "mechanistic_validation": mech_validation,
        "mechanistic_choice": mech_choice,
        "sigma_bounds_from_train": list(bounds),
        "guidance_validation": validation_rows,
        "chosen_guidance_scale": chosen,
        "test": summaries,
        "comparisons": comparisons,
        "headroom": headroom,
        "sanity": sanity,
        "seeds": per_seed,
        "figure": {"sigma": sigma.tolist(), "follow": follow.tolist(), "node_names": list(series.node_names)},
        "seconds": time.time() - started,
    }


def targets_of(results: dict) -> list:
    from diffusers_ext.evaluation.protocol import target

    rows = []
    for task in results["tasks"]:
        c = task["comparisons"]
        name = task["task"]
        for baseline in ("unguided", "mechanistic"):
            for metric in ("mae", "crps"):
                rows.append(
                    target(
                        f"{name}: EpiDiff beats {baseline} on {metric} (z)", c[f"{metric}_vs_{baseline}"]["z"], MIN_Z
                    )
                )
        for metric in ("mae", "crps"):
            rows.append(
                target(
                    f"{name}: EpiDiff beats constant sigma on {metric} (difference)",
                    c[f"{metric}_vs_constant_sigma"]["difference"],
                    0.0,
                    ">=",
                )
            )
        if name.startswith("simulator"):
            coverage = task["test"]["epidiff"]["coverage_90"]["mean"]
            rows.append(target(f"{name}: EpiDiff 90% coverage >= 0.85", coverage, 0.85))
            rows.append(target(f"{name}: EpiDiff 90% coverage <= 0.95", coverage, 0.95, "<="))
    return rows


def sections_of(results: dict) -> list:
    lines = []
    for task in results["tasks"]:
        h = task["headroom"]
        lines += [f"## {task['task']} ({task['num_nodes']} nodes, horizon {task['horizon']})", ""]
        lines.append(
            f"Windows train/validation/test {task['windows']['train']}/{task['windows']['validation']}/"
            f"{task['windows']['test']} (evaluated every {results['settings']['eval_stride']}: "
            f"{task['evaluated_windows']['validation']}/{task['evaluated_windows']['test']}). Mechanistic choice on "
            f"validation: {task['mechanistic_choice']}; guidance scales chosen: {task['chosen_guidance_scale']}; "
            f"sigma bounds (log u, train windows): {[round(b, 3) for b in task['sigma_bounds_from_train']]}."
        )
        lines.append("")
        headroom = f"Headroom: persistence MAE {h['persistence_mae']:.4g}"
        if "oracle" in h:
            o = h["oracle"]
            headroom += f"; the true predictive (oracle) MAE {o['mae']:.4g}, CRPS {o['crps']:.4g}, 90% coverage {o['coverage_90']:.3f}"
        lines += [headroom + ".", ""]
        lines += ["| method | MAE | RMSE | CRPS | MIS | 90% coverage |", "| --- | --- | --- | --- | --- | --- |"]
        for method in METHODS:
            t = task["test"][method]
            lines.append(
                f"| {method} | {t['mae']['mean']:.4g} | {t['rmse']['mean']:.4g} | {t['crps']['mean']:.4g} | "
                f"{t['mis']['mean']:.4g} | {t['coverage_90']['mean']:.3f} |"
            )
        lines += [
            "",
            "| EpiDiff vs | metric | difference (baseline - EpiDiff) | SE | z |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, c in task["comparisons"].items():
            metric, baseline = key.split("_vs_")
            lines.append(f"| {baseline} | {metric} | {c['difference']:.4g} | {c['se']:.3g} | {c['z']:.2f} |")
        s = task["sanity"]
        lines += [
            "",
            f"Sanity (leak-free mechanistic forecast): inputs end at the origin: {s['inputs_end_at_origin']}; max change "
            f"when the future is scrambled: {s['max_change_when_future_scrambled']}.",
            "",
        ]
    return lines


def draw_figure(results: dict):
    def draw(path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tasks = results["tasks"]
        fig, axes = plt.subplots(2, len(tasks), figsize=(4.5 * len(tasks), 7.5), squeeze=False)
        for col, task in enumerate(tasks):
            for row, (key, title, cmap, limits) in enumerate(
                (
                    ("sigma", "mean guidance sigma (small = strong pull)", "viridis", (None, None)),
                    ("follow", "share of the gap to the mechanistic mean closed", "RdBu", (-1, 1)),
                )
            ):
                ax = axes[row, col]
                data = np.asarray(task["figure"][key])
                image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1])
                ax.set_title(f"{task['task']}: {title}", fontsize=8)
                ax.set_xlabel("horizon step")
                ax.set_ylabel("node")
                ax.set_xticks(range(data.shape[1]))
                ax.set_xticklabels(range(1, data.shape[1] + 1), fontsize=6)
                fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    return draw


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    s = results["settings"]
    write_results(
        stem,
        results,
        "EpiDiff: uncertainty-steered diffusion forecasts vs unguided, mechanistic and constant-sigma",
        sections=sections_of(results),
        settings_line=(
            f"Seeds {s['seeds']}; {s['train_steps']} training steps (batch {s['batch_size']}, hidden "
            f"{s['hidden_size']}, {s['num_layers']} blocks); {s['num_samples']} draws x {s['num_inference_steps']} DDIM "
            f"steps; sigma {s['sigma_min']}-{s['sigma_max']}; guidance grid {s['guidance_scales']}."
        ),
        figures={".png": draw_figure(results)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.protocol import targets_status
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    if args.from_results:
        results = rebuild_results(args.from_results, targets_of, rel_to=REPO)
        write_report(results, args.output)
        return results
    if len(args.seeds) < 3:
        raise SystemExit("--seeds: the protocol needs >= 3 seeds.")
    torch.set_num_threads(1)
    tasks = [run_task(task, args) for task in args.tasks]
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "tasks": tasks,
        "summary": {},
    }
    results["summary"]["targets"] = targets_of(results)
    results["summary"]["sanity"] = [{"task": t["task"], **t["sanity"]} for t in tasks]
    write_report(results, args.output)
    print(targets_status(results["summary"]["targets"]))
    return results


if __name__ == "__main__":
    main()
