#!/usr/bin/env python
"""SPADE against MLP gradient ascent, EA on an MLP, EA on a deep-ensemble LCB, the best offline designs, and its own
ablations (no calibration, no support, neither), on offline black-box tasks with exact oracles.

    python benchmarks/spade/spade.py

Writes `benchmarks/spade/results/spade.json`, `.md` and `.png`. Three task families (`diffusers_ext.data.offline_bbo`): a
TF-Bind-like 8-mer task (every sequence scored exactly), an Ehrlich function (optimum 1.0) and 20-dimensional
continuous functions. Every surrogate (the baselines' MLPs and SPADE's) trains for the same number of mini-batches
(default: the reference's 100 epochs). Each method gets the same tuning budget: six settings of its own two main knobs
(`grids`), measured on the family's validation task (another task seed; Ackley for the continuous family), the best
frozen; then every method runs once per seed on unseen test tasks (the continuous family's are Rosenbrock and
Styblinski-Tang, alternating). The ablations use SPADE's frozen setting. Each run proposes `--num_candidates` designs; the oracle scores them and
the Design-Bench numbers are the normalised 100th and 50th percentile. Everything runs on one CPU thread.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FAMILIES = ("tfbind8", "ehrlich", "continuous")
BASELINES = ("best_of_offline", "mlp_gradient_ascent", "mlp_ea", "ensemble_lcb")
ABLATIONS = ("spade_no_support", "spade_no_calibration", "spade_neither")
METHODS = (*BASELINES, "spade", *ABLATIONS)
CONTINUOUS_TEST = ("rosenbrock", "styblinski_tang")
EHRLICH = {"seq_len": 16, "num_states": 8, "num_motifs": 2, "motif_length": 4, "quantization": 4}
ENSEMBLE_SIZE = 5


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES, help="Task families.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="Test task and model seeds.")
    parser.add_argument("--validation_seed", type=int, default=100, help="Task seed of each validation task.")
    parser.add_argument("--offline_size", type=int, default=1000, help="Offline points per task.")
    parser.add_argument("--continuous_dim", type=int, default=20, help="Dimension of the continuous functions.")
    parser.add_argument("--reference_size", type=int, default=1_000_000, help="Uniform points fixing y_min.")
    parser.add_argument("--num_candidates", type=int, default=128, help="Designs each method proposes.")
    parser.add_argument(
        "--train_steps",
        type=int,
        default=1600,
        help="Mini-batches (64) of every surrogate (1600: the reference's 100 epochs of 1000 points).",
    )
    parser.add_argument("--hidden_size", type=int, default=128, help="SPADE's hidden width H.")
    parser.add_argument("--mlp_hidden_size", type=int, default=256, help="The baselines' MLP width.")
    parser.add_argument("--num_samples", type=int, default=32, help="SPADE's Monte-Carlo samples per design.")
    parser.add_argument("--num_inference_steps", type=int, default=10, help="SPADE's DDIM steps.")
    parser.add_argument("--num_generations", type=int, default=30, help="EA generations (every EA method).")
    parser.add_argument("--output_dir", default=RESULTS, help="Where spade.json/.md/.png go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.from_results is None and len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    for name in ("offline_size", "num_candidates", "train_steps", "num_generations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.num_candidates > args.offline_size:
        parser.error(f"--num_candidates ({args.num_candidates}) must be <= --offline_size ({args.offline_size}).")
    return args


def make_task(args, family: str, split: str, seed: int):
    """The family's validation task (`split="validation"`) or its test task of `seed`."""
    from diffusers_ext.data.offline_bbo import ContinuousTask, EhrlichTask, TFBindLikeTask

    task_seed = args.validation_seed if split == "validation" else seed
    if family == "tfbind8":
        return TFBindLikeTask(seed=task_seed, offline_size=args.offline_size, subset_seed=task_seed)
    if family == "ehrlich":
        return EhrlichTask(
            **EHRLICH, seed=task_seed, num_samples=4 * args.offline_size, offline_size=args.offline_size
        )
    function = "ackley" if split == "validation" else CONTINUOUS_TEST[seed % len(CONTINUOUS_TEST)]
    return ContinuousTask(
        function,
        dim=args.continuous_dim,
        seed=task_seed,
        num_samples=2 * args.offline_size,
        reference_size=args.reference_size,
    )


def grids() -> dict:
    """Each method's validation grid: six settings of its own two main knobs (best_of_offline has none).

    Every grid holds the same number of settings (the same tuning budget). The EA methods share the search's mutation
    std as one knob; gradient ascent tunes its step size and number of steps, the MLP EA its step size and crossover
    rate, and the LCB methods (the ensemble, SPADE) beta.
    """
    return {
        "best_of_offline": [{}],
        "mlp_gradient_ascent": [{"learning_rate": lr, "num_steps": n} for n in (50, 200) for lr in (0.01, 0.05, 0.2)],
        "mlp_ea": [{"mutation_std": s, "crossover_rate": c} for c in (0.3, 0.6) for s in (0.06, 0.12, 0.24)],
        "ensemble_lcb": [{"beta": b, "mutation_std": s} for s in (0.12, 0.24) for b in (0.0, 0.1, 1.0)],
        "spade": [{"beta": b, "mutation_std": s} for s in (0.12, 0.24) for b in (0.0, 0.1, 1.0)],
    }


def ea_overrides(setting: dict) -> dict:
    """The [`EAConfig`] fields a validation setting sets (`mutation_std`, `crossover_rate`); the rest is the method's
    own knob."""
    return {k: setting[k] for k in ("mutation_std", "crossover_rate") if k in setting}


class Runner:
    """Trains each surrogate of a task once and proposes candidates for any method and setting."""

    def __init__(self, args, task, seed: int, workdir: str):
        self.args, self.task, self.seed, self.workdir = args, task, seed, workdir
        self.models, self.train_seconds = {}, {}

    def ea(self, **overrides):
        from diffusers_ext.pipelines.spade.search import EAConfig

        size = self.args.num_candidates
        return EAConfig(
            population_size=size, elite_size=size // 2, num_generations=self.args.num_generations, **overrides
        )

    def surrogate(self, name: str):
        from diffusers_ext.evaluation.spade import fit_regressor, train_spade

        if name not in self.models:
            args, task, started = self.args, self.task, time.perf_counter()
            fit = {"hidden_size": args.mlp_hidden_size, "num_steps": args.train_steps}
            if name == "mlp":
                model = fit_regressor(task.offline_x, task.offline_y, seed=self.seed, **fit)
            elif name == "ensemble":
                model = [
                    fit_regressor(task.offline_x, task.offline_y, seed=1000 * self.seed + 1 + k, **fit)
                    for k in range(ENSEMBLE_SIZE)
                ]
            else:
                model, _ = train_spade(
                    task,
                    name,
                    hidden_size=args.hidden_size,
                    max_steps=args.train_steps,
                    seed=self.seed,
                    output_dir=os.path.join(self.workdir, name),
                )
            self.models[name], self.train_seconds[name] = model, time.perf_counter() - started
        return self.models[name]

    def propose(self, method: str, setting: dict) -> tuple[np.ndarray, float]:
        """The candidates of `method` at `setting`, and the seconds the search took (training excluded)."""
        from diffusers_ext.evaluation import spade as ev

        args, task = self.args, self.task
        model = (
            None
            if method == "best_of_offline"
            else self.surrogate(
                {"mlp_gradient_ascent": "mlp", "mlp_ea": "mlp", "ensemble_lcb": "ensemble"}.get(method, method)
            )
        )
        started = time.perf_counter()
        if method == "best_of_offline":
            x = ev.best_of_offline(task, args.num_candidates)
        elif method == "mlp_gradient_ascent":
            x = ev.gradient_ascent(model, task, args.num_candidates, setting["learning_rate"], setting["num_steps"])
        elif method == "mlp_ea":
            x = ev.regressor_search([model], task, self.ea(**ea_overrides(setting)), seed=self.seed)
        elif method == "ensemble_lcb":
            x = ev.regressor_search(
                model, task, self.ea(**ea_overrides(setting)), beta=setting["beta"], seed=self.seed
            )
        else:
            x = ev.spade_search(
                model,
                task,
                self.ea(**ea_overrides(setting)),
                beta=setting["beta"],
                num_samples=args.num_samples,
                num_inference_steps=args.num_inference_steps,
                seed=self.seed,
            )
        return x, time.perf_counter() - started

    def measure(self, method: str, setting: dict) -> dict:
        x, seconds = self.propose(method, setting)
        scores = self.task.score_candidates(x)
        return {**scores, "search_seconds": seconds}


def validate(args, family: str, workdir: str) -> dict:
    """Each method's three settings on the family's validation task (seed `--validation_seed`); the best frozen."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    task = make_task(args, family, "validation", 0)
    runner = Runner(args, task, args.validation_seed, os.path.join(workdir, f"{family}-validation"))
    out = {}
    for method, grid in grids().items():
        out[method] = choose_on_validation(
            grid,
            lambda s, split, m=method: runner.measure(m, s),
            score=lambda r: r["p100"],
            names=json.dumps,
            test=False,
        )
    out["task"] = task.name
    return out


def test_seed(args, family: str, seed: int, choices: dict, workdir: str) -> dict:
    """Every method once on the family's test task of `seed`, at its frozen setting."""
    task = make_task(args, family, "test", seed)
    runner = Runner(args, task, seed, os.path.join(workdir, f"{family}-{seed}"))
    record = {"task": task.name, "offline_best": task.offline_best(), "methods": {}}
    for method in METHODS:
        setting = choices["spade" if method in ABLATIONS else method]
        record["methods"][method] = runner.measure(method, setting)
    for name, seconds in runner.train_seconds.items():
        record["methods"]["mlp_ea" if name == "mlp" else "ensemble_lcb" if name == "ensemble" else name][
            "train_seconds"
        ] = seconds
    record["methods"]["mlp_gradient_ascent"]["train_seconds"] = record["methods"]["mlp_ea"]["train_seconds"]
    return record


def paired(a: list[float], b: list[float]) -> dict:
    """Mean paired difference `a - b` over seeds (the methods of seed s share its offline data and oracle), its
    paired standard error, and the difference in SE units (`protocol.paired_difference`)."""
    from diffusers_ext.evaluation.protocol import paired_difference

    d = paired_difference(a, b)
    return {"difference": d["difference"], "sem": d["sem"], "z": d["z"]}


def summarise(results: dict) -> dict:
    """Per-family statistics, the targets and the sanity checks, from the recorded test runs only."""
    from diffusers_ext.evaluation.protocol import mean_spread, target

    seeds = results["settings"]["seeds"]
    families, wins, orders, run_seconds = {}, 0, 0, []
    for family in results["settings"]["families"]:
        runs = [results["test"][family][str(s)] for s in seeds]
        stats = {m: {k: mean_spread([r["methods"][m][k] for r in runs]) for k in ("p100", "p50")} for m in METHODS}
        best_baseline = max(BASELINES, key=lambda m: (stats[m]["p100"]["mean"], -BASELINES.index(m)))
        p100 = {m: [r["methods"][m]["p100"] for r in runs] for m in METHODS}
        versus = paired(p100["spade"], p100[best_baseline])
        win = versus["z"] > 2.0
        means = {m: stats[m]["p100"]["mean"] for m in ("spade", "spade_no_support", "spade_no_calibration")}
        order = means["spade"] >= means["spade_no_support"] >= means["spade_no_calibration"]
        wins, orders = wins + int(win), orders + int(order)
        run_seconds += [r["methods"]["spade"]["train_seconds"] + r["methods"]["spade"]["search_seconds"] for r in runs]
        best_found = max(max(r["methods"][m]["p100"] for m in METHODS) for r in runs)
        families[family] = {
            "tasks": [r["task"] for r in runs],
            "headroom": {
                "offline_best": mean_spread([r["offline_best"] for r in runs]),
                "oracle_optimum": 1.0,
                "best_found_by_any_method": best_found,
            },
            "methods": stats,
            "best_baseline": best_baseline,
            "spade_vs_best_baseline": versus,
            "spade_wins": win,
            "ablation_order_holds": order,
            "ablations_vs_spade": {m: paired(p100["spade"], p100[m]) for m in ABLATIONS},
        }
    n = len(results["settings"]["families"])
    run_seconds = sorted(run_seconds)
    median_seconds = run_seconds[len(run_seconds) // 2]
    targets = [
        target(f"families (of {n}) where SPADE's p100 beats the best baseline by > 2 paired SE", wins, 2),
        target(f"families (of {n}) where p100 order spade >= no-support >= no-calibration holds", orders, 2),
        target("seconds of one full SPADE run (train + search, median, one thread)", median_seconds, 300.0, "<="),
    ]
    sanity = {f"{f}_headroom_above_0.1": 1.0 - families[f]["headroom"]["offline_best"]["mean"] > 0.1 for f in families}
    sanity["candidates_per_run"] = results["settings"]["num_candidates"]
    return {"families": families, "targets": targets, "sanity": sanity, "spade_run_seconds": run_seconds}


def report_sections(results: dict) -> list[str]:
    s = results["summary"]
    lines = [
        "## Headroom (test tasks, normalised scores)",
        "",
        "| family | offline best (mean ± SE) | oracle optimum | best p100 found by any method |",
        "| --- | --- | --- | --- |",
    ]
    for family, f in s["families"].items():
        h = f["headroom"]
        lines.append(
            f"| {family} | {h['offline_best']['mean']:.3f} ± {h['offline_best']['sem']:.3f} | "
            f"{h['oracle_optimum']:.1f} | {h['best_found_by_any_method']:.3f} |"
        )
    for family, f in s["families"].items():
        val = results["validation"][family]
        lines += [
            "",
            f"## {family}: test tasks {', '.join(sorted(set(f['tasks'])))} (validation on {val['task']})",
            "",
            "| method | setting (validation) | p100 (mean ± SE) | p50 (mean ± SE) |",
            "| --- | --- | --- | --- |",
        ]
        for m in METHODS:
            setting = val["spade" if m in ABLATIONS else m]["chosen"]["candidate"]
            row = f["methods"][m]
            lines.append(
                f"| {m} | {json.dumps(setting)} | {row['p100']['mean']:.3f} ± {row['p100']['sem']:.3f} | "
                f"{row['p50']['mean']:.3f} ± {row['p50']['sem']:.3f} |"
            )
        v = f["spade_vs_best_baseline"]
        lines += [
            "",
            f"SPADE − best baseline ({f['best_baseline']}): {v['difference']:+.3f} ± {v['sem']:.3f} (paired SE, "
            f"{v['z']:+.2f} SE); win: {f['spade_wins']}; ablation order holds: {f['ablation_order_holds']}.",
        ]
    lines += ["", "## Sanity", "", *[f"- {k}: {v}" for k, v in s["sanity"].items()]]
    return lines


def write_plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = results["summary"]["families"]
    fig, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 3.8), dpi=100, squeeze=False)
    for ax, (family, f) in zip(axes[0], families.items()):
        means = [f["methods"][m]["p100"]["mean"] for m in METHODS]
        errors = [2 * f["methods"][m]["p100"]["sem"] for m in METHODS]
        colours = ["tab:grey"] * len(BASELINES) + ["tab:red"] + ["tab:orange"] * len(ABLATIONS)
        ax.bar(range(len(METHODS)), means, yerr=errors, color=colours)
        ax.axhline(f["headroom"]["offline_best"]["mean"], color="black", lw=0.8, ls="--", label="offline best")
        ax.set_xticks(range(len(METHODS)), [m.replace("spade_", "-").replace("_", " ") for m in METHODS], rotation=60)
        ax.set_title(family)
        ax.set_ylabel("normalised p100 (test, ±2 SE)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(results: dict, output_dir: str) -> None:
    from diffusers_ext.evaluation.reporting import write_results

    results["summary"]["difference_se"] = (
        "paired: every method of seed s runs on that seed's offline data and oracle, so each difference's standard "
        "error is that of the per-seed differences (protocol.paired_difference)"
    )
    s = results["settings"]
    write_results(
        os.path.join(output_dir, "spade"),
        results,
        "SPADE on offline black-box tasks with exact oracles, every method tuned on a validation task",
        report_sections(results),
        settings_line=(
            f"Seeds {s['seeds']}; {s['offline_size']} offline points per task; {s['num_candidates']} candidates; "
            f"surrogates trained {s['train_steps']} mini-batches of 64; SPADE H={s['hidden_size']}, "
            f"{s['num_samples']} samples x {s['num_inference_steps']} DDIM steps; EA {s['num_generations']} "
            "generations; one CPU thread."
        ),
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    if args.from_results is not None:
        results = rebuild_results(args.from_results, lambda r: summarise(r)["targets"])
        results["summary"] = {**summarise(results), "targets": results["summary"]["targets"]}
        write(results, args.output_dir)
        return results
    started = time.perf_counter()
    results = {
        "command": command(__file__, argv, omit=("--output_dir",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
        "validation": {},
        "test": {},
    }
    with tempfile.TemporaryDirectory() as workdir:
        for family in args.families:
            validation = validate(args, family, workdir)
            results["validation"][family] = validation
            choices = {m: validation[m]["chosen"]["candidate"] for m in grids()}
            print(f"{family}: chose {choices} ({time.perf_counter() - started:.0f} s)", flush=True)
            results["test"][family] = {}
            for seed in args.seeds:
                results["test"][family][str(seed)] = test_seed(args, family, seed, choices, workdir)
                print(f"{family} seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)
    results["summary"] = summarise(results)
    results["seconds"] = time.perf_counter() - started
    write(results, args.output_dir)
    print(json.dumps(results["summary"]["targets"], indent=1))
    return results


if __name__ == "__main__":
    main()
