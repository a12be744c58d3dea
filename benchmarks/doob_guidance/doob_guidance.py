#!/usr/bin/env python
"""Doob h-transform guidance against unguided, DPS cost guidance, per-step projection and rejection sampling on
Navigation2D test maps, at the same budget of model evaluations per plan.

    python benchmarks/doob_guidance/doob_guidance.py

Writes `benchmarks/doob_guidance/results/doob_guidance.json`, `.md` and `.png`. Every method gets a budget of `--budget_factor`
times `--num_inference_steps` model evaluations per plan (a backward pass counts like a forward); a method whose one
plan costs less draws as many candidates as the budget pays for and keeps the first collision-free one (rejection on
top). Every method's setting (the Doob estimator, its last-jump prior, scale and gradient clipping; DPS's temperature
and gradient clipping; projection's margin; 12 settings each) is chosen on validation maps, then the frozen choices
run on unseen test maps with `--seeds`. The maps come from every family in `--families` (`navigation2d.TEST_MAP_FAMILIES`:
scattered discs, a wall with a gap, a slalom, a boulder; `--num_validation_maps` / `--num_test_maps` of each), the
settings are chosen on all families at once, and the results are reported per family. The judge is exact
(segment-circle distances, goal distance, path length against grid A* with shortcutting). Methods are compared
paired: every method plans the same maps with the same seeds, so a difference's standard error is that of the
per-(map, seed) differences (`protocol.paired_difference`).
"""

import argparse
import functools
import json
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("unguided", "rejection", "dps", "projection", "doob")
# The map families (diffusers_ext.data.navigation2d.TEST_MAP_FAMILIES, repeated here so --help needs no torch import).
FAMILIES = ("discs", "wall", "slalom", "boulder")


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained_model_name_or_path", default=None, help="Planner folder (default: the zoo's).")
    parser.add_argument(
        "--num_validation_maps", type=int, default=12, help="Maps of each family the settings are chosen on."
    )
    parser.add_argument("--num_test_maps", type=int, default=32, help="Unseen test maps of each family.")
    parser.add_argument(
        "--families",
        nargs="+",
        default=list(FAMILIES),
        choices=FAMILIES,
        help="Test map families (navigation2d.TEST_MAP_FAMILIES), each in validation and test.",
    )
    parser.add_argument(
        "--num_obstacles", type=int, default=3, help="Discs per map of the 'discs' family (across the straight line)."
    )
    parser.add_argument("--samples_per_map", type=int, default=8, help="Plans per map and seed.")
    parser.add_argument("--num_inference_steps", type=int, default=20, help="DDPM steps of every sampler.")
    parser.add_argument("--budget_factor", type=float, default=2.0, help="Budget per plan, in units of steps.")
    parser.add_argument("--num_rollouts", type=int, default=16, help="Doob MC / path-integral rollouts.")
    parser.add_argument("--reference_rollouts", type=int, default=128, help="Rollouts of the bound's reference.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Sampling seeds of the test split.")
    parser.add_argument("--output_dir", default=RESULTS, help="Where the results' .json/.md/.png go.")
    parser.add_argument(
        "--results_name",
        default=None,
        help="Stem of the results files (another map setting, another name; default doob_guidance, with "
        "--from_results that file's stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.results_name is None:
        args.results_name = (
            os.path.splitext(os.path.basename(args.from_results))[0] if args.from_results else "doob_guidance"
        )
    if len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    if not args.results_name.replace("_", "").replace("-", "").isalnum():
        parser.error(
            f"--results_name must be a plain file stem (letters, digits, _ and -), got {args.results_name!r}."
        )
    return args


def maps(count: int, seed: int, num_obstacles: int, families=("discs",)) -> list[dict]:
    """`count` maps of each family, family after family; family `f` draws from its own generator seeded
    `seed + 1000 * FAMILIES.index(f)` (so the discs maps are the first releases' and adding a family changes none)."""
    from diffusers_ext.data import navigation2d as nav

    if FAMILIES != nav.TEST_MAP_FAMILIES:
        raise RuntimeError(f"FAMILIES {FAMILIES} differs from navigation2d's {nav.TEST_MAP_FAMILIES}.")
    out = []
    for family in families:
        generator = torch.Generator().manual_seed(seed + 1000 * FAMILIES.index(family))
        for _ in range(count):
            start, goal, obstacles = nav.make_test_map(generator, num_obstacles, family=family)
            out.append(
                {
                    "family": family,
                    "start": start,
                    "goal": goal,
                    "obstacles": obstacles,
                    "shortest": nav.shortest_path_length(start, goal, obstacles),
                }
            )
    return out


@functools.lru_cache(maxsize=1)
def demonstration_prior() -> tuple[float, torch.Tensor]:
    """`navigation2d.demonstration_statistics()`, computed once per process (every Doob run reads it)."""
    from diffusers_ext.data import navigation2d as nav

    return nav.demonstration_statistics()


def grids(args, data_std: float) -> dict:
    """Each method's validation grid (a list of settings dicts). Doob, DPS and projection get 12 settings each."""
    doob = [
        {"estimator": "mc", "prior": prior, "scale": scale, "max_grad_norm": clip}
        for prior in ("std", "covariance")
        for scale in (1.0, 2.0)
        for clip in (None, 10.0)
    ]
    doob += [
        {"estimator": "path_integral", "jacobian": "identity", "prior": prior, "scale": 1.0, "max_grad_norm": 10.0}
        for prior in ("std", "covariance")
    ]
    doob += [
        {
            "estimator": "path_integral",
            "jacobian": "model",
            "prior": "covariance",
            "scale": 1.0,
            "max_grad_norm": 10.0,
        },
        {"estimator": "tweedie", "prior": "std", "scale": 1.0, "max_grad_norm": 10.0, "temperature": 0.1},
    ]
    dps = [{"temperature": t, "max_grad_norm": None} for t in (0.01, 0.03, 0.1, 0.3)]
    dps += [{"temperature": t, "max_grad_norm": clip} for t in (0.1, 1.0) for clip in (3.0, 10.0, 30.0, 100.0)]
    margins = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2)
    return {
        "unguided": [{}],
        "rejection": [{}],
        "dps": dps,
        "projection": [{"margin": m} for m in margins],
        "doob": [{"temperature": 0.05, **d, "data_std": data_std} for d in doob],
    }


def run_method(pipe, args, method: str, setting: dict, world: dict, seed: int, compute_bound: bool = False) -> dict:
    """One map, one seed: `samples_per_map` plans of `method` at the budget; the judge's verdicts."""
    from diffusers_ext import DoobGuidance
    from diffusers_ext.data import navigation2d as nav
    from diffusers_ext.evaluation.doob_guidance import (
        judge,
        model_evaluations_per_candidate,
        plan_with_budget,
        projection_guidance,
    )
    from diffusers_ext.pipelines.doob_guidance.guidance import guided_sample

    n, steps = args.samples_per_map, args.num_inference_steps
    budget = args.budget_factor * steps
    constraint = pipe.constraint(world["obstacles"], margin=0.02)
    start, goal = world["start"].expand(n, 2), world["goal"].expand(n, 2)
    record = {"bound": None, "kl": None}
    guidance = None
    if method == "dps":
        guidance = DoobGuidance(
            cost=constraint.cost,
            temperature=setting["temperature"],
            estimator="tweedie",
            max_grad_norm=setting.get("max_grad_norm"),
        )
    elif method == "doob":
        prior = {"data_std": setting["data_std"]}
        if setting.get("prior") == "covariance":
            prior = {"data_covariance": demonstration_prior()[1]}
        guidance = DoobGuidance(
            constraint=constraint.satisfied,
            cost=constraint.cost,
            temperature=setting["temperature"],
            estimator=setting["estimator"],
            num_rollouts=args.num_rollouts,
            rollout_steps=1,
            scale=setting["scale"],
            max_grad_norm=setting.get("max_grad_norm"),
            jacobian=setting.get("jacobian", "identity"),
            compute_bound=compute_bound,
            reference_rollouts=args.reference_rollouts,
            **prior,
        )
    cost = model_evaluations_per_candidate(method, setting, steps)
    generator = torch.Generator().manual_seed(1000 * seed + 17)
    first = {}

    def plan_once(i):
        if method == "projection":
            model_fn = projection_guidance(pipe, world["obstacles"], setting["margin"])
            x = guided_sample(
                model_fn,
                pipe.scheduler,
                (n, 2, pipe.unet.config.sample_size),
                steps,
                conditioning=pipe.endpoint_conditioning(start, goal),
                generator=generator,
            )
            return x.transpose(1, 2)
        out = pipe(start, goal, world["obstacles"], n, steps, guidance=guidance, generator=generator)
        if i == 0 and guidance is not None:
            first["bound"], first["kl"] = out.satisfaction_lower_bound, out.kl_estimate
            first["evaluations"] = out.num_model_evaluations
        return out.trajectories

    def satisfied(plans):
        return ~nav.collides(plans, world["obstacles"])

    if method == "unguided":
        plans, _, outputs = plan_with_budget(plan_once, budget, budget, satisfied)  # one candidate
    else:
        plans, _, outputs = plan_with_budget(plan_once, cost, budget, satisfied)
    verdict = judge(plans, world["goal"], world["obstacles"], world["shortest"])
    single = judge(outputs[0], world["goal"], world["obstacles"], world["shortest"])
    record.update(first)
    record.update(
        {
            "satisfied": verdict["satisfied"],
            "length_ratio": verdict["length_ratio"],
            "jerk": verdict["jerk"],
            "single_candidate_satisfied": single["satisfied"],
            "candidates_drawn": len(outputs),
            "cost_per_candidate": cost,
        }
    )
    return record


DIFFERENCE_SE = (
    "paired: every method plans the same test maps with the same seeds, so a difference's standard error is that of "
    "the per-(map, seed) differences of satisfaction rates (protocol.paired_difference)"
)


def rate(records, key="satisfied") -> float:
    values = [v for r in records for v in r[key]]
    return sum(values) / len(values)


def unit_rates(records) -> list[float]:
    """Each record's (one map, one seed) satisfaction rate over its plans: the unit two methods are paired on."""
    return [sum(r["satisfied"]) / len(r["satisfied"]) for r in records]


def method_summary(records) -> dict:
    from diffusers_ext.evaluation.protocol import binomial_standard_error

    count = sum(len(r["satisfied"]) for r in records)
    overall = rate(records)
    ratios = [x for r in records for x, ok in zip(r["length_ratio"], r["satisfied"]) if ok]
    return {
        "satisfaction": overall,
        "standard_error": binomial_standard_error(overall, count),
        "single_candidate_satisfaction": rate(records, "single_candidate_satisfied"),
        "length_ratio_of_satisfied": sum(ratios) / len(ratios) if ratios else float("nan"),
        "plans": count,
    }


def summarise(results) -> dict:
    """The summary and its computed targets, from the recorded test records (the run and `--from_results`).

    The comparisons are paired (`DIFFERENCE_SE`): over the (test map, seed) units of every family, the difference of
    Doob's and the other method's satisfaction rates on the same unit."""
    from diffusers_ext.evaluation.protocol import mean_spread, paired_difference, target

    test, seeds = results["test"], results["settings"]["seeds"]
    families = results["test_families"]
    family_names = list(dict.fromkeys(families))

    def records_of(method, family=None):
        return [r for s in seeds for r, f in zip(test[method][str(s)], families) if family is None or f == family]

    methods, per_family = {}, {f: {} for f in family_names}
    for method in METHODS:
        methods[method] = method_summary(records_of(method))
        methods[method]["per_seed"] = mean_spread([rate(test[method][str(s)]) for s in seeds])
        for family in family_names:
            per_family[family][method] = method_summary(records_of(method, family))
    doob = methods["doob"]
    comparisons, targets = {}, []
    for method in ("unguided", "dps", "projection", "rejection"):
        difference = paired_difference(unit_rates(records_of("doob")), unit_rates(records_of(method)))
        comparisons[method] = {k: v for k, v in difference.items() if k != "values"}
        comparisons[method]["per_family"] = {
            f: {
                k: v
                for k, v in paired_difference(
                    unit_rates(records_of("doob", f)), unit_rates(records_of(method, f))
                ).items()
                if k != "values"
            }
            for f in family_names
        }
        targets.append(
            target(
                f"doob satisfaction above {method}: difference minus 2 paired SE",
                difference["difference"] - 2 * difference["sem"],
                0.0,
            )
        )
    targets.append(
        target("doob path length / shortest feasible (satisfied plans)", doob["length_ratio_of_satisfied"], 1.15, "<=")
    )
    settings = [r for s in seeds for r in test["doob_bound"][str(s)]]
    valid = [rate([r], "single_candidate_satisfied") >= r["bound"] for r in settings]
    targets.append(target("bound valid: share of test settings with rate >= bound", sum(valid) / len(valid), 0.95))
    bounds = [r["bound"] for r in settings]
    sanity = {
        "unguided_single_satisfaction_below_1": methods["unguided"]["single_candidate_satisfaction"] < 1.0,
        "every_test_map_has_a_feasible_path": all(math.isfinite(m) for m in results["test_shortest"]),
        "guided_candidates_within_their_cost": all(
            r["evaluations"] <= r["cost_per_candidate"]
            for method in ("dps", "doob")
            for s in seeds
            for r in test[method][str(s)]
        ),
    }
    return {
        "methods": methods,
        "per_family": per_family,
        "comparisons": comparisons,
        "difference_se": DIFFERENCE_SE,
        "choices": {m: results["validation"][m]["chosen"] for m in METHODS},
        "bound": {
            "mean_bound": sum(bounds) / len(bounds),
            "mean_observed_rate": sum(rate([r], "single_candidate_satisfied") for r in settings) / len(settings),
            "settings": len(settings),
            "valid_settings": sum(valid),
        },
        "targets": targets,
        "sanity": sanity,
    }


def report_sections(results) -> list[str]:
    s = results["summary"]
    lines = [
        "## Test maps",
        "",
        "| method | setting (validation) | satisfied | SE | single candidate | length ratio |",
    ]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for m in METHODS:
        row = s["methods"][m]
        lines.append(
            f"| {m} | {json.dumps(s['choices'][m]['candidate'])} | {row['satisfaction']:.3f} | "
            f"{row['standard_error']:.3f} | {row['single_candidate_satisfaction']:.3f} | "
            f"{row['length_ratio_of_satisfied']:.3f} |"
        )
    families = list(s["per_family"])
    lines += [
        "",
        "## Per family (test maps)",
        "",
        "Collision-free plans by map family; the last columns are Doob minus the method, in paired SEs.",
        "",
        "| family | " + " | ".join(METHODS) + " | " + " | ".join(f"doob - {m} (z)" for m in s["comparisons"]) + " |",
        "| --- | " + " | ".join("---" for _ in METHODS) + " | " + " | ".join("---" for _ in s["comparisons"]) + " |",
    ]
    for family in families:
        cells = [f"{s['per_family'][family][m]['satisfaction']:.3f}" for m in METHODS]
        cells += [f"{c['per_family'][family]['z']:+.1f}" for c in s["comparisons"].values()]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines += ["", f"Standard errors: {s['difference_se']}."]
    b = s["bound"]
    lines += [
        "",
        "## The bound",
        "",
        f"Mean Pinsker lower bound {b['mean_bound']:.3f} against a mean observed single-candidate satisfaction "
        f"{b['mean_observed_rate']:.3f}; valid on {b['valid_settings']} of {b['settings']} test settings (map x seed).",
        "",
        "## Sanity",
        "",
        *[f"- {k}: {v}" for k, v in s["sanity"].items()],
    ]
    return lines


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_family = results["summary"]["per_family"]
    groups = ["all", *per_family]
    width = 0.8 / len(METHODS)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups), 3.5), dpi=100)
    for i, method in enumerate(METHODS):
        rows = [results["summary"]["methods"][method], *(per_family[f][method] for f in per_family)]
        ax.bar(
            [g + (i - (len(METHODS) - 1) / 2) * width for g in range(len(groups))],
            [row["satisfaction"] for row in rows],
            width,
            yerr=[2 * row["standard_error"] for row in rows],
            label=method,
        )
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("collision-free plans (test, ±2 SE)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=len(METHODS), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded test records (`summarise`'s, for the run and `--from_results`)."""
    return summarise(results)["targets"]


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    s = results["settings"]
    write_results(
        stem,
        results,
        "Doob h-transform guidance on Navigation2D (reconstructed), each method tuned on validation maps",
        report_sections(results),
        settings_line=(
            f"{s['num_test_maps']} test maps x {s['samples_per_map']} plans x seeds {s['seeds']}; "
            f"{s['num_validation_maps']} validation maps, of each family in {s['families']}; "
            f"{s['num_inference_steps']} DDPM steps; budget "
            f"{s['budget_factor']:g} x steps model evaluations per plan; {s['num_rollouts']} rollouts; one CPU thread."
        ),
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import choose_on_validation, command, rebuild_results

    stem = os.path.join(args.output_dir, args.results_name)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, stem)
        return results
    torch.set_num_threads(1)
    from diffusers_ext import DoobGuidedPlannerPipeline, zoo

    if args.pretrained_model_name_or_path is None:
        pipe = zoo.load("navigation-planner")
    else:
        pipe = DoobGuidedPlannerPipeline.from_pretrained(args.pretrained_model_name_or_path, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    started = time.perf_counter()
    data_std = demonstration_prior()[0]
    validation_maps = maps(args.num_validation_maps, 10_000, args.num_obstacles, args.families)
    test_maps = maps(args.num_test_maps, 20_000, args.num_obstacles, args.families)
    grid = grids(args, data_std)

    def measure(method):
        def inner(setting, split):
            records = [run_method(pipe, args, method, setting, w, seed=99) for w in validation_maps]
            per_family = {
                f: rate([r for r, w in zip(records, validation_maps) if w["family"] == f]) for f in args.families
            }
            return {
                "satisfaction": rate(records),
                "single": rate(records, "single_candidate_satisfied"),
                "per_family": per_family,
            }

        return inner

    validation = {}
    for method in METHODS:
        validation[method] = choose_on_validation(
            grid[method], measure(method), score=lambda m: m["satisfaction"], names=json.dumps, test=False
        )
        print(f"{method}: chose {validation[method]['chosen']} ({time.perf_counter() - started:.0f} s)", flush=True)
    test = {m: {} for m in [*METHODS, "doob_bound"]}
    for seed in args.seeds:
        for method in METHODS:
            setting = validation[method]["chosen"]["candidate"]
            test[method][str(seed)] = [
                run_method(pipe, args, method, setting, w, seed, compute_bound=(method == "doob")) for w in test_maps
            ]
        test["doob_bound"][str(seed)] = test["doob"][str(seed)]
        print(f"seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)
    results = {
        "command": command(__file__, argv, omit=("--output_dir",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
        "data_std": data_std,
        "validation": validation,
        "test": {k: v for k, v in test.items() if k != "doob_bound"},
        "test_shortest": [w["shortest"] for w in test_maps],
        "test_families": [w["family"] for w in test_maps],
    }
    results["test"]["doob_bound"] = test["doob"]
    results["summary"] = summarise(results)
    results["seconds"] = time.perf_counter() - started
    write_report(results, stem)
    print(json.dumps(results["summary"]["targets"], indent=1))
    return results


if __name__ == "__main__":
    main()
