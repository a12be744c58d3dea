#!/usr/bin/env python
"""Doob h-transform guidance on an image model: the zoo digits DDPM guided towards "the zoo digits-classifier gives
class 3 probability >= 0.9", against unguided sampling, DPS cost guidance and rejection sampling, at the same budget
of model evaluations per image.

    python benchmarks/doob_guidance/doob_guidance_digits.py

Writes `benchmarks/doob_guidance/results/doob_guidance_digits.json`, `.md` and `.png`. The base is the zoo `digits-ddpm` sampled
unconditionally (its null label) with `--num_inference_steps` DDIM steps. Every method gets `--budget_factor` times
that many model evaluations per image (a backward pass counts like a forward); a method whose one image costs less
draws as many candidates as the budget pays for and keeps the first one the guide accepts (rejection on top).
Rejection sampling chooses between keeping the first accepted candidate and the candidate the guide likes best.
Every method's setting (Doob's estimator, rollouts, last-jump prior, scale and clipping; DPS's temperature and
clipping; 8 settings each) is chosen on validation seeds by the independent judge's rate, then the frozen choices run
once on the test seeds.

The guide classifier (the zoo `digits-classifier`) defines the constraint, so it is each method's own objective and
is reported as such. Success is judged by an independent model: an RBF support-vector classifier on raw pixels,
trained here on the digits' train split, must say "3". Sample quality is the Fréchet distance to the held-out real 3s
in a principal-component space of raw pixels (and, for reference, in the guide's own features, as
`benchmarks/zoo/zoo.py` measures the zoo).
"""

import argparse
import json
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("unguided", "rejection", "dps", "doob")
TARGET_CLASS = 3
MIN_PROBABILITY = 0.9


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained_model_name_or_path", default=None, help="DDPM folder (default: the zoo's).")
    parser.add_argument("--num_inference_steps", type=int, default=20, help="DDIM steps of every sampler.")
    parser.add_argument("--budget_factor", type=float, default=2.0, help="Budget per image, in units of steps.")
    parser.add_argument("--batch_size", type=int, default=64, help="Images per pipeline call (one test setting).")
    parser.add_argument("--validation_batches", type=int, default=1, help="Batches per validation seed.")
    parser.add_argument(
        "--validation_seeds", type=int, nargs="+", default=[100, 101], help="Seeds the settings are chosen on."
    )
    parser.add_argument("--test_batches", type=int, default=2, help="Batches per test seed.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Sampling seeds of the test split.")
    parser.add_argument("--reference_rollouts", type=int, default=128, help="Rollouts of the bound's reference.")
    parser.add_argument("--output_dir", default=RESULTS, help="Where the results' .json/.md/.png go.")
    parser.add_argument(
        "--results_name",
        default=None,
        help="Stem of the results files (default doob_guidance_digits; with --from_results, that file's stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.results_name is None:
        args.results_name = (
            os.path.splitext(os.path.basename(args.from_results))[0] if args.from_results else "doob_guidance_digits"
        )
    if len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    if set(args.seeds) & set(args.validation_seeds):
        parser.error(f"--seeds {args.seeds} and --validation_seeds {args.validation_seeds} must be disjoint.")
    for name in ("num_inference_steps", "batch_size", "validation_batches", "test_batches", "reference_rollouts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not args.budget_factor >= 1.0:
        parser.error(f"--budget_factor must be >= 1 (one unguided image), got {args.budget_factor}.")
    if not args.results_name.replace("_", "").replace("-", "").isalnum():
        parser.error(
            f"--results_name must be a plain file stem (letters, digits, _ and -), got {args.results_name!r}."
        )
    return args


def grids() -> dict:
    """Each method's validation grid (a list of settings dicts): 8 settings for Doob and for DPS."""
    doob = [
        {"estimator": "mc", "num_rollouts": m, "data_std": 1.0, "scale": s, "max_grad_norm": None}
        for m, s in ((16, 2.0), (16, 4.0), (16, 8.0), (64, 4.0), (64, 8.0))
    ]
    doob += [
        {"estimator": "path_integral", "jacobian": "identity", "num_rollouts": m, "data_std": d, "scale": 1.0}
        | {"max_grad_norm": 10.0}
        for m, d in ((16, 0.3), (64, 1.0))
    ]
    doob += [
        {"estimator": "path_integral", "jacobian": "model", "num_rollouts": 16, "data_std": 0.3, "scale": 1.0}
        | {"max_grad_norm": 10.0}
    ]
    dps = [{"temperature": t, "max_grad_norm": clip} for t in (0.1, 1.0) for clip in (1.0, 3.0, 10.0, 30.0)]
    return {
        "unguided": [{}],
        "rejection": [{"selection": "accept_first"}, {"selection": "best_of"}],
        "dps": dps,
        "doob": [{"temperature": 0.1, **d} for d in doob],
    }


def make_guidance(method: str, setting: dict, constraint, compute_bound: bool, reference_rollouts: int):
    from diffusers_ext import DoobGuidance

    if method == "dps":
        return DoobGuidance(
            cost=constraint.cost,
            temperature=setting["temperature"],
            estimator="tweedie",
            max_grad_norm=setting["max_grad_norm"],
        )
    if method == "doob":
        return DoobGuidance(
            constraint=constraint.satisfied,
            cost=constraint.cost,
            temperature=setting["temperature"],
            estimator=setting["estimator"],
            num_rollouts=setting["num_rollouts"],
            rollout_steps=1,
            scale=setting["scale"],
            data_std=setting["data_std"],
            max_grad_norm=setting["max_grad_norm"],
            jacobian=setting.get("jacobian", "identity"),
            compute_bound=compute_bound,
            reference_rollouts=reference_rollouts,
        )
    return None


def run_method(pipe, constraint, judge, args, method, setting, seed, batch, compute_bound=False) -> dict:
    """One seed and batch: `batch_size` images of `method` at the budget; the guide's and the judge's verdicts."""
    from diffusers_ext.evaluation.doob_guidance import model_evaluations_per_candidate, plan_with_budget

    steps = args.num_inference_steps
    budget = args.budget_factor * steps
    cost = model_evaluations_per_candidate(method, setting, steps)
    generator = torch.Generator().manual_seed(1000 * seed + 17 + batch)
    threshold = math.log(MIN_PROBABILITY)
    record = {"bound": None, "kl": None}

    def draw(i):
        guidance = make_guidance(method, setting, constraint, compute_bound and i == 0, args.reference_rollouts)
        images = pipe(
            batch_size=args.batch_size,
            num_inference_steps=steps,
            generator=generator,
            output_type="pt",
            guidance=guidance,
        ).images
        if i == 0 and guidance is not None:
            record["evaluations"] = guidance.num_model_evaluations / args.batch_size
            record["bound"], record["kl"] = guidance.satisfaction_lower_bound(), guidance.kl_estimate
        return images * 2 - 1

    @torch.no_grad()
    def log_probability(images):
        return constraint.log_probability(images)

    # the unguided method gets one candidate; the others as many as the budget pays for
    chosen, _, candidates = plan_with_budget(
        draw,
        budget if method == "unguided" else cost,
        budget,
        lambda images: log_probability(images) >= threshold,
        score=log_probability if setting.get("selection") == "best_of" else None,
    )
    with torch.no_grad():
        guide = (constraint.log_probability(chosen) >= threshold).tolist()
    record.update(
        {
            "guide_satisfied": guide,
            "judge_satisfied": (judge.predict(chosen) == TARGET_CLASS).tolist(),
            "single_guide_satisfied": (log_probability(candidates[0]) >= threshold).tolist(),
            "single_judge_satisfied": (judge.predict(candidates[0]) == TARGET_CLASS).tolist(),
            "candidates_drawn": len(candidates),
            "cost_per_candidate": cost,
        }
    )
    return record, chosen


def rate(records, key="judge_satisfied") -> float:
    values = [v for r in records for v in r[key]]
    return sum(values) / len(values)


def doob_above(methods: dict, other: str) -> float:
    """(Doob's judge rate - `other`'s) / the SE of the difference (binomial, independent samples)."""
    doob, base = methods["doob"], methods[other]
    se = math.sqrt(doob["standard_error"] ** 2 + base["standard_error"] ** 2)
    if se > 0:
        return (doob["judge_satisfaction"] - base["judge_satisfaction"]) / se
    return math.inf if doob["judge_satisfaction"] > base["judge_satisfaction"] else -math.inf


def summarise(results) -> dict:
    """The summary and its computed targets, from the recorded test records (the run and `--from_results`)."""
    from diffusers_ext.evaluation.protocol import binomial_standard_error, mean_spread, target

    test, seeds = results["test"], results["settings"]["seeds"]
    methods = {}
    for method in METHODS:
        records = [r for s in seeds for r in test[method][str(s)]]
        count = sum(len(r["judge_satisfied"]) for r in records)
        judged = rate(records)
        methods[method] = {
            "judge_satisfaction": judged,
            "standard_error": binomial_standard_error(judged, count),
            "per_seed": mean_spread(rate(test[method][str(s)]) for s in seeds),
            "guide_satisfaction": rate(records, "guide_satisfied"),
            "single_candidate_judge_satisfaction": rate(records, "single_judge_satisfied"),
            "single_candidate_guide_satisfaction": rate(records, "single_guide_satisfied"),
            "candidates_per_image": sum(r["candidates_drawn"] for r in records) / len(records),
            "frechet_distance_pixel_pca": results["quality"][method]["pixel_pca"],
            "frechet_distance_guide_features": results["quality"][method]["guide_features"],
            "images": count,
        }
    targets = [
        target(f"doob judge satisfaction above {other} (difference / SE)", doob_above(methods, other), 2.0)
        for other in ("unguided", "dps", "rejection")
    ]
    settings = [r for s in seeds for r in test["doob"][str(s)]]
    valid = [rate([r], "single_guide_satisfied") >= r["bound"] for r in settings]
    targets.append(target("bound valid: share of test settings with rate >= bound", sum(valid) / len(valid), 0.95))
    bounds = [r["bound"] for r in settings]
    sanity = {
        "headroom_unguided_judge_rate_below_0.5": methods["unguided"]["judge_satisfaction"] < 0.5,
        "judge_heldout_accuracy_at_least_0.95": results["judge"]["heldout_accuracy"] >= 0.95,
        "guided_candidates_within_their_cost": all(
            r["evaluations"] <= r["cost_per_candidate"]
            for method in ("dps", "doob")
            for s in seeds
            for r in test[method][str(s)]
        ),
    }
    return {
        "methods": methods,
        "choices": {m: results["validation"][m]["chosen"] for m in METHODS},
        "bound": {
            "mean_bound": sum(bounds) / len(bounds),
            "mean_observed_guide_rate": sum(rate([r], "single_guide_satisfied") for r in settings) / len(settings),
            "mean_observed_judge_rate": sum(rate([r], "single_judge_satisfied") for r in settings) / len(settings),
            "mean_kl": sum(r["kl"] for r in settings) / len(settings),
            "settings": len(settings),
            "valid_settings": sum(valid),
        },
        "targets": targets,
        "sanity": sanity,
    }


def report_sections(results) -> list[str]:
    s = results["summary"]
    q = results["quality"]
    lines = [
        "## Test seeds",
        "",
        "Judge: an RBF SVC on raw pixels (held-out accuracy "
        f"{results['judge']['heldout_accuracy']:.3f} on {results['judge']['heldout_size']} real digits) says 3. "
        "Guide: the zoo digits-classifier gives 3 probability >= 0.9 (each method's own objective, not a judge). "
        "Fréchet distances to the held-out real 3s: in raw-pixel PCA features (16 components of the train split) and "
        "in the guide's features (not independent).",
        "",
        "| method | setting (validation) | judge: 3 | SE | per-seed spread (std) | guide objective | "
        "single candidate (judge / guide) | candidates | FD pixel PCA | FD guide features |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in METHODS:
        row = s["methods"][m]
        lines.append(
            f"| {m} | {json.dumps(s['choices'][m]['candidate'])} | {row['judge_satisfaction']:.3f} | "
            f"{row['standard_error']:.3f} | {row['per_seed']['std']:.3f} | {row['guide_satisfaction']:.3f} | "
            f"{row['single_candidate_judge_satisfaction']:.3f} / {row['single_candidate_guide_satisfaction']:.3f} | "
            f"{row['candidates_per_image']:.2f} | {row['frechet_distance_pixel_pca']:.3f} | "
            f"{row['frechet_distance_guide_features']:.3f} |"
        )
    lines.append(
        f"| real train 3s (reference) | - | - | - | - | - | - | - | {q['real_train_threes']['pixel_pca']:.3f} | "
        f"{q['real_train_threes']['guide_features']:.3f} |"
    )
    b = s["bound"]
    lines += [
        "",
        "## The bound",
        "",
        f"Mean Pinsker lower bound {b['mean_bound']:.3f} (mean Girsanov KL estimate {b['mean_kl']:.3g}) against a mean "
        f"observed single-candidate guide-constraint rate {b['mean_observed_guide_rate']:.3f} (judge: "
        f"{b['mean_observed_judge_rate']:.3f}); valid on {b['valid_settings']} of {b['settings']} test settings "
        "(seed x batch).",
        "",
        "## Validation",
        "",
        "| method | setting | judge: 3 | guide objective |",
        "| --- | --- | --- | --- |",
    ]
    for m in METHODS:
        for row in results["validation"][m]["validation"]:
            lines.append(
                f"| {m} | {row['name']} | {row['measurement']['judge']:.3f} | {row['measurement']['guide']:.3f} |"
            )
    lines += ["", "## Sanity", "", *[f"- {k}: {v}" for k, v in s["sanity"].items()]]
    return lines


def write_plot(results, path, images):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]["methods"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100, gridspec_kw={"width_ratios": [1, 1.3]})
    axes[1].axis("off")
    x = range(len(METHODS))
    judged = [s[m]["judge_satisfaction"] for m in METHODS]
    errors = [2 * s[m]["standard_error"] for m in METHODS]
    axes[0].bar([i - 0.2 for i in x], judged, 0.4, yerr=errors, capsize=3, label="judge (SVC) says 3, ±2 SE")
    axes[0].bar([i + 0.2 for i in x], [s[m]["guide_satisfaction"] for m in METHODS], 0.4, label="guide objective")
    axes[0].set_xticks(list(x), METHODS)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("rate on test seeds")
    axes[0].legend(fontsize=8)
    if images is not None:  # the images are not recorded: a report rebuilt with --from_results has no image panel
        rows = [images[m][:8] for m in METHODS]
        grid = torch.cat([torch.cat(list(r[:, 0]), dim=1) for r in rows], dim=0)
        axes[1].axis("on")
        axes[1].imshow(grid.numpy(), cmap="gray", vmin=-1, vmax=1)
        axes[1].set_yticks([4 + 8 * i for i in x], METHODS)
        axes[1].set_xticks([])
        axes[1].set_title("first test images")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded test records (`summarise`'s, for the run and `--from_results`)."""
    return summarise(results)["targets"]


def write_report(results: dict, stem: str, images: dict | None) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module (`images`: the first test images of each
    method, for the plot; `None` when they are not at hand, as in a rebuild)."""
    from diffusers_ext.evaluation.reporting import write_results

    s = results["settings"]
    write_results(
        stem,
        results,
        "Doob h-transform guidance on the digits DDPM (reconstructed): 'the classifier says 3 with p >= 0.9'",
        report_sections(results),
        settings_line=(
            f"seeds {s['seeds']} x {s['test_batches']} batches x {s['batch_size']} images; validation seeds "
            f"{s['validation_seeds']} x {s['validation_batches']} batches; {s['num_inference_steps']} DDIM steps from "
            f"the null label; budget {s['budget_factor']:g} x steps model evaluations per image; bound reference "
            f"{s['reference_rollouts']} rollouts; one CPU thread."
        ),
        figures={".png": lambda path: write_plot(results, path, images)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import choose_on_validation, command, rebuild_results

    stem = os.path.join(args.output_dir, args.results_name)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, stem, None)
        return results
    torch.set_num_threads(1)
    from diffusers_ext import ClassConditionalDDPMPipeline, ClassifierConstraint, zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.evaluation.doob_guidance_digits import PixelDigitJudge, PixelPCAFeatures
    from diffusers_ext.metrics import classifier_predictions, frechet_distance

    if args.pretrained_model_name_or_path is None:
        pipe = zoo.load("digits-ddpm")
    else:
        pipe = ClassConditionalDDPMPipeline.from_pretrained(args.pretrained_model_name_or_path)
    pipe.set_progress_bar_config(disable=True)
    guide = zoo.load("digits-classifier")
    constraint = ClassifierConstraint(guide, TARGET_CLASS, MIN_PROBABILITY)
    started = time.perf_counter()
    resolution = pipe.unet.config.sample_size
    judge = PixelDigitJudge(resolution=resolution)
    pca = PixelPCAFeatures(resolution=resolution)
    grid = grids()

    def measure(method):
        def inner(setting, split):
            records = [
                run_method(pipe, constraint, judge, args, method, setting, seed, batch)[0]
                for seed in args.validation_seeds
                for batch in range(args.validation_batches)
            ]
            return {"judge": rate(records), "guide": rate(records, "guide_satisfied")}

        return inner

    validation = {}
    for method in METHODS:
        validation[method] = choose_on_validation(
            grid[method], measure(method), score=lambda m: m["judge"], names=json.dumps, test=False
        )
        print(f"{method}: chose {validation[method]['chosen']} ({time.perf_counter() - started:.0f} s)", flush=True)
    test = {m: {} for m in METHODS}
    images = {m: [] for m in METHODS}
    for seed in args.seeds:
        for method in METHODS:
            setting = validation[method]["chosen"]["candidate"]
            test[method][str(seed)] = []
            for batch in range(args.test_batches):
                record, chosen = run_method(
                    pipe, constraint, judge, args, method, setting, seed, batch, compute_bound=(method == "doob")
                )
                test[method][str(seed)].append(record)
                images[method].append(chosen)
        print(f"seed {seed} done ({time.perf_counter() - started:.0f} s)", flush=True)
    images = {m: torch.cat(v) for m, v in images.items()}

    real, labels = load_digits_images("heldout", resolution=resolution)
    real_threes = real[labels == TARGET_CLASS]
    train, train_labels = load_digits_images("train", resolution=resolution)
    _, real_guide_features = classifier_predictions(guide, real_threes)

    def quality(x):
        _, features = classifier_predictions(guide, x)
        return {
            "pixel_pca": pca.frechet_distance(x, real_threes),
            "guide_features": frechet_distance(features, real_guide_features),
        }

    results = {
        "command": command(__file__, argv, omit=("--output_dir",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
        "judge": {"heldout_accuracy": judge.heldout_accuracy, "heldout_size": judge.heldout_size},
        "validation": validation,
        "test": test,
        "quality": {m: quality(images[m]) for m in METHODS}
        | {"real_train_threes": quality(train[train_labels == TARGET_CLASS])},
    }
    results["summary"] = summarise(results)
    results["seconds"] = time.perf_counter() - started
    write_report(results, stem, images)
    print(json.dumps(results["summary"]["targets"], indent=1))
    return results


if __name__ == "__main__":
    main()
