#!/usr/bin/env python
"""Constrained unlearning on the digits zoo DDPM: the three primal-dual constraints against ESD, SISS, NegGrad+.

    python benchmarks/unlearning.py --seeds 0 1 2

Concept unlearning forgets one digit class (default 3): each method is judged by the zoo classifier on samples of
every class (forgotten rate, accuracy of every retained class against the pretrained model, retained Fréchet
distance to the held-out digits). Data unlearning forgets a fixed random subset of training images: the forgotten
examples' denoising loss against held-out non-members (membership parity) and the Fréchet distance of all classes
against the pretrained model's. Constraint levels are calibrated on the pretrained model (`calibrate_level`: the
constraint read on the retained classes; the held-out loss for data unlearning) and scaled by `--level_factors`.

Every run of a seed happens in this one process on the same pretrained weights, seeds and evaluation noise.
Writes `benchmarks/results/unlearning.json`, `unlearning.md` and `unlearning.png`; each finished run is also
cached in `--cache_dir`, so an interrupted benchmark continues where it stopped. The cache file is keyed by a hash
of every setting that changes a run and of the code and weights that produce it (`run_cache_key`), so a changed
setting or file never reuses a stale run. `summary.targets` is the computed list of docs/benchmarks.md.
"""

import argparse
import copy
import json
import os
import sys
import time

import numpy as np
import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=str, default=None, help="Pipeline folder (default: the zoo digits-ddpm).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training and sampling seeds.")
    parser.add_argument("--forget_class", type=int, default=3, help="The digit class forgotten (concept).")
    parser.add_argument("--max_steps", type=int, default=150, help="Unlearning steps of every run.")
    parser.add_argument("--learning_rate", type=float, default=1e-4, help="AdamW learning rate of every run.")
    parser.add_argument(
        "--level_factors",
        type=float,
        nargs="+",
        default=[1.0, 0.5],
        help="Reverse-KL levels as multiples of the calibrated level (the first is the headline).",
    )
    parser.add_argument(
        "--retain_weight", type=float, default=10.0, help="Retain-term weight of the concept runs (not plain ESD)."
    )
    parser.add_argument("--esd_guidance", type=float, nargs="+", default=[2.0], help="ESD negative guidance eta.")
    parser.add_argument(
        "--dual_rate", type=float, default=0.02, help="Concept dual step size, as a multiple of 1 / |level|."
    )
    parser.add_argument("--forget_size", type=int, default=64, help="Training images forgotten (data unlearning).")
    parser.add_argument("--samples_per_class", type=int, default=100, help="Evaluation samples per class.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps of evaluation sampling.")
    parser.add_argument("--membership_draws", type=int, default=32, help="(t, noise) draws per membership loss.")
    parser.add_argument("--parts", nargs="+", default=["concept", "data"], choices=["concept", "data"])
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where unlearning.json/.md/.png go.")
    parser.add_argument(
        "--cache_dir",
        type=str,
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "unlearning"),
        help="Per-run cache keyed by a hash of every run setting, the code and the weights: finished runs are not "
        "repeated (default: benchmarks/.cache/unlearning, ignored by git).",
    )
    parser.add_argument("--report_only", action="store_true", help="Only aggregate the cached runs.")
    parser.add_argument(
        "--only", nargs="+", default=None, help="Run only these run names (e.g. 'reverse_kl x1' siss); others wait."
    )
    args = parser.parse_args(argv)
    if not 0 <= args.forget_class <= 9:
        parser.error(f"--forget_class must be a digit 0-9, got {args.forget_class}.")
    if args.forget_size < 2:
        parser.error(f"--forget_size must be >= 2, got {args.forget_size}.")
    return args


def concept_methods(args):
    """(name, method key, config overrides, level factor) of every concept run."""
    retain = {"retain_weight": args.retain_weight}
    runs = [
        (f"reverse_kl x{f:g}", "reverse_kl", {"constraint": "reverse_kl", "lambda_max": 0.75, **retain}, f)
        for f in args.level_factors
    ]
    runs.append(("likelihood", "likelihood", {"constraint": "likelihood", "lambda_max": 3.0, **retain}, 1.0))
    runs.append(("forward_kl", "forward_kl", {"constraint": "forward_kl", "lambda_max": 0.5, **retain}, 1.0))
    for eta in args.esd_guidance:  # ESD as published (no retain term), and with our retain term
        runs.append((f"esd eta={eta:g}", "esd", {"baseline": "esd", "esd_negative_guidance": eta,
                                                 "retain_weight": 0.0}, None))  # fmt: skip
        runs.append((f"esd+retain eta={eta:g}", "esd", {"baseline": "esd", "esd_negative_guidance": eta, **retain},
                     None))  # fmt: skip
    return runs


DATA_METHODS = [
    ("forward_kl", {"constraint": "forward_kl"}),
    ("siss", {"baseline": "siss"}),
    ("neggrad_plus", {"baseline": "neggrad_plus", "neggrad_weight": 0.5}),
    ("retain_only", {"baseline": "retain_only"}),
]


def load_model(args):
    from diffusers_ext import load_pipeline, zoo

    pipe = load_pipeline(args.model) if args.model else zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _trainer(pipe, config_kwargs, **kwargs):
    from diffusers import DDPMScheduler

    from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer

    config = ConstrainedUnlearningConfig(**config_kwargs, save_strategy="no", disable_tqdm=True)
    scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    return ConstrainedUnlearningTrainer(
        copy.deepcopy(pipe.unet), scheduler, config, null_class_label=pipe.config.null_class_label, **kwargs
    )


def _with_unet(pipe, unet):
    clone = copy.copy(pipe)
    clone.register_modules(unet=unet.eval())
    return clone


def run_concept(args, pipe, classifier, seed, cache):
    from diffusers_ext.evaluation.unlearning import evaluate_concept_unlearning

    def evaluate(p):
        return evaluate_concept_unlearning(
            p, classifier, [args.forget_class], args.samples_per_class, args.num_inference_steps, seed=seed
        )

    key = f"concept/pretrained/{seed}"
    if key not in cache:
        start = time.perf_counter()
        report = evaluate(pipe)
        cache[key] = {
            "forgotten_rate": report.forgotten_rate,
            "per_class_accuracy": report.per_class_accuracy,
            "retained_frechet": report.retained_frechet,
            "seconds": time.perf_counter() - start,
        }
        save_cache(args, cache)
    pretrained = cache[key]
    # stop_patience = max_steps: a run never stops early here; each reports where its constraint ended
    base = {"forget_classes": [args.forget_class], "max_steps": args.max_steps, "seed": seed,
            "learning_rate": args.learning_rate, "stop_patience": args.max_steps}  # fmt: skip
    for name, method, overrides, factor in concept_methods(args):
        key = f"concept/{name}/{seed}"
        if key in cache or (args.only and name not in args.only):
            continue
        start = time.perf_counter()
        trainer = _trainer(pipe, {**base, **overrides})
        level = None
        if factor is not None:
            calibrated = trainer.calibrate_level()
            level = calibrated * factor if method != "likelihood" else calibrated
            trainer.args.constraint_level = level
            trainer.args.dual_learning_rate = args.dual_rate / max(abs(level), 1e-3)
        trainer.train()
        train_seconds = time.perf_counter() - start
        report = evaluate(_with_unet(pipe, trainer.unlearned_unet()))
        drops = [pretrained["per_class_accuracy"][c] - a for c, a in enumerate(report.per_class_accuracy)
                 if c != args.forget_class]  # fmt: skip
        cache[key] = {
            "name": name,
            "method": method,
            "seed": seed,
            "level": level,
            "forgotten_rate": report.forgotten_rate,
            "per_class_accuracy": report.per_class_accuracy,
            "max_retained_accuracy_drop": max(0.0, max(drops)),
            "retained_frechet": report.retained_frechet,
            "final_lambda": trainer.lambda_ if trainer.args.baseline is None else None,
            "final_guidance_strength": trainer.guidance_strength() if method != "forward_kl" else None,
            "stop_reason": trainer.stop_reason,
            "steps": trainer.global_step,
            "train_seconds": train_seconds,
            "seconds": time.perf_counter() - start,
            "lambda_trajectory": [h.get("lambda") for h in trainer.history],
            "constraint_trajectory": [h["constraint_estimate"] for h in trainer.history],
        }
        save_cache(args, cache)
        print(f"[{key}] forgotten {report.forgotten_rate:.3f} retained FD {report.retained_frechet:.3f} "
              f"max drop {cache[key]['max_retained_accuracy_drop']:.3f} ({cache[key]['seconds']:.0f} s)", flush=True)  # fmt: skip


def data_split(args):
    from diffusers_ext.data.digits import load_digits_images

    images, labels = load_digits_images("train", resolution=8)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1234))
    forget, retain = order[: args.forget_size], order[args.forget_size :]
    heldout = load_digits_images("heldout", resolution=8)
    return (images[forget], labels[forget]), (images[retain], labels[retain]), heldout


def run_data(args, pipe, classifier, seed, cache):
    from diffusers_ext.evaluation.digits import evaluate_digits_generator
    from diffusers_ext.evaluation.unlearning import denoising_losses, membership_summary

    forget, retain, heldout = data_split(args)

    def measure(p, start):
        losses = {
            name: denoising_losses(p.unet, p.scheduler, *data, num_draws=args.membership_draws, seed=seed)
            for name, data in (("forget", forget), ("heldout", heldout))
        }
        report = evaluate_digits_generator(p, classifier, args.samples_per_class, args.num_inference_steps, seed=seed)
        return {
            **membership_summary(losses["forget"], losses["heldout"]),
            "frechet": report.frechet_distance,
            "per_class_accuracy": report.per_class_accuracy.tolist(),
            "seconds": time.perf_counter() - start,
        }

    key = f"data/pretrained/{seed}"
    if key not in cache:
        cache[key] = measure(pipe, time.perf_counter())
        save_cache(args, cache)
    pretrained = cache[key]
    base = {"max_steps": args.max_steps, "seed": seed, "learning_rate": args.learning_rate,
            "stop_patience": args.max_steps}  # fmt: skip
    for name, overrides in DATA_METHODS:
        key = f"data/{name}/{seed}"
        if key in cache or (args.only and name not in args.only):
            continue
        start = time.perf_counter()
        config = {**base, **overrides}
        if name == "forward_kl":  # membership parity: the held-out non-members' loss under the pretrained model
            config["constraint_level"] = pretrained["heldout_loss_mean"]
            config["dual_learning_rate"] = 0.3 / pretrained["heldout_loss_mean"]
        trainer = _trainer(pipe, config, forget_dataset=forget, retain_dataset=retain)
        trainer.train()
        train_seconds = time.perf_counter() - start
        result = measure(_with_unet(pipe, trainer.unlearned_unet()), start)
        cache[key] = {
            "name": name,
            "seed": seed,
            **result,
            "retained_frechet_ratio": result["frechet"] / pretrained["frechet"],
            "level": config.get("constraint_level"),
            "final_lambda": trainer.lambda_ if trainer.args.baseline is None else None,
            "stop_reason": trainer.stop_reason,
            "train_seconds": train_seconds,
            "lambda_trajectory": [h.get("lambda") for h in trainer.history],
            "constraint_trajectory": [h["constraint_estimate"] for h in trainer.history],
        }
        save_cache(args, cache)
        print(f"[{key}] forget loss {result['forget_loss']:.4f} held-out {result['heldout_loss_mean']:.4f} "
              f"± {result['heldout_loss_std']:.4f} FD ratio {cache[key]['retained_frechet_ratio']:.3f} "
              f"({result['seconds']:.0f} s)", flush=True)  # fmt: skip


# Arguments that only select which runs happen or where files go; every other argument changes what a run computes.
NOT_RUN_SETTINGS = ("seeds", "parts", "only", "report_only", "output_dir", "cache_dir")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cache_key(args) -> str:
    """Hash of every run setting, this script, the unlearning trainer, evaluation and sampling code, and the weights
    of the model and the judge (`diffusers_ext.evaluation.protocol.settings_code_hash`)."""
    from diffusers_ext.evaluation.protocol import settings_code_hash

    package = os.path.join(ROOT, "diffusers_ext")
    code = [os.path.abspath(__file__), os.path.join(package, "trainers"), os.path.join(package, "evaluation"),
            os.path.join(package, "pipelines"), os.path.join(package, "models"), os.path.join(package, "metrics")]  # fmt: skip
    weights = []
    for folder in (
        args.model or os.path.join(package, "zoo", "digits-ddpm"),
        os.path.join(package, "zoo", "digits-classifier"),
    ):
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            weights += [os.path.join(root, n) for n in sorted(names) if n.endswith((".json", ".safetensors", ".bin"))]
    settings = {k: v for k, v in vars(args).items() if k not in NOT_RUN_SETTINGS}
    return settings_code_hash(settings, code + weights)


def cache_path(args):
    return os.path.join(args.cache_dir, f"runs-{run_cache_key(args)[:20]}.json")


def load_cache(args):
    path = cache_path(args)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return {}


def save_cache(args, cache):
    path = cache_path(args)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(cache, f)
    os.replace(path + ".tmp", path)


def _mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values))


def aggregate(args, cache):
    """Mean and spread over seeds of every method; the summary the issue asks for."""
    results = {"concept": {}, "data": {}}
    for key, run in cache.items():
        part, name, seed = key.split("/")
        results[part].setdefault(name, []).append(run)
    concept, data = {}, {}
    for name, runs in results["concept"].items():
        entry = {"seeds": sorted(r.get("seed", -1) for r in runs), "num_seeds": len(runs)}
        for metric in ("forgotten_rate", "max_retained_accuracy_drop", "retained_frechet", "final_lambda",
                       "final_guidance_strength", "level", "train_seconds", "seconds"):  # fmt: skip
            mean, std = _mean_std([r.get(metric) for r in runs])
            if mean is not None:
                entry[metric], entry[f"{metric}_std"] = mean, std
        entry["stopped"] = sum(r.get("stop_reason") is not None for r in runs)
        concept[name] = entry
    for name, runs in results["data"].items():
        entry = {"num_seeds": len(runs)}
        for metric in ("forget_loss", "heldout_loss_mean", "heldout_loss_std", "frechet", "retained_frechet_ratio",
                       "forget_mean_z", "final_lambda", "level", "train_seconds", "seconds"):  # fmt: skip
            mean, std = _mean_std([r.get(metric) for r in runs])
            if mean is not None:
                entry[metric], entry[f"{metric}_std"] = mean, std
        entry["forget_within_spread"] = [bool(r["forget_within_spread"]) for r in runs]
        data[name] = entry

    summary = {"concept": {}, "data": {}}
    headline = f"reverse_kl x{args.level_factors[0]:g}"
    esd_name = f"esd eta={args.esd_guidance[0]:g}"
    for name, key in ((headline, "reverse_kl"), ("likelihood", "likelihood"), ("forward_kl", "forward_kl"),
                      (esd_name, "esd"), ("pretrained", "pretrained")):  # fmt: skip
        if name in concept:
            entry = concept[name]
            summary["concept"][key] = {
                "forgotten_rate": entry["forgotten_rate"],
                "max_retained_accuracy_drop": entry.get("max_retained_accuracy_drop", 0.0),
                "retained_frechet": entry["retained_frechet"],
                "num_seeds": entry["num_seeds"],
            }
    for esd_key, name in (("esd", esd_name), ("esd_retain", f"esd+retain eta={args.esd_guidance[0]:g}")):
        if name not in concept:
            continue
        esd = concept[name]
        if esd_key == "esd_retain":
            summary["concept"]["esd_retain"] = {k: esd[k] for k in ("forgotten_rate", "retained_frechet", "num_seeds")}
            summary["concept"]["esd_retain"]["max_retained_accuracy_drop"] = esd["max_retained_accuracy_drop"]
        # matched forgetting: the reverse-KL levels that forget at least as well as ESD (or reach the 2% target)
        matched = [
            (concept[n]["retained_frechet"], n)
            for n in concept
            if n.startswith("reverse_kl") and concept[n]["forgotten_rate"] <= max(esd["forgotten_rate"], 0.02)
        ]
        suffix = "" if esd_key == "esd" else "_retain"
        if matched:
            fd, chosen = min(matched)
            summary[f"reverse_kl_over_esd{suffix}_frechet"] = fd / esd["retained_frechet"]
            summary[f"reverse_kl_matched_run{suffix}"] = chosen
        else:
            summary[f"reverse_kl_over_esd{suffix}_frechet"] = None
            summary[f"reverse_kl_matched_run{suffix}"] = (
                f"no reverse_kl level reached {name}'s forgotten rate {esd['forgotten_rate']:.3f} (or 0.02)"
            )
    if "forward_kl" in data:
        fu = data["forward_kl"]
        summary["data"] = {
            "method": "forward_kl",
            "forget_loss": fu["forget_loss"],
            "heldout_loss_mean": fu["heldout_loss_mean"],
            "heldout_loss_std": fu["heldout_loss_std"],
            "retained_frechet_ratio": fu["retained_frechet_ratio"],
            "forget_within_spread": fu["forget_within_spread"],
            "num_seeds": fu["num_seeds"],
        }
        if "pretrained" in data:
            summary["data"]["pretrained_forget_loss"] = data["pretrained"]["forget_loss"]
        summary["data_baselines"] = {
            name: {
                k: data[name][k]
                for k in ("forget_loss", "heldout_loss_mean", "heldout_loss_std", "retained_frechet_ratio")
            }  # fmt: skip
            for name in data
            if name not in ("forward_kl", "pretrained")
        }
    summary["seeds"] = sorted({int(k.split("/")[2]) for k in cache})
    summary["targets"] = compute_targets(summary, concept, data)
    summary["protocol_notes"] = (
        "The matched reverse-KL level is the best of the levels tried, chosen on the evaluation samples themselves "
        "(no validation split yet); the headline ratio is against ESD with the same retain term; the ratio against "
        "ESD as published (no retain term) is reported beside it, not as a target."
    )
    return summary, concept, data


def compute_targets(summary: dict, concept: dict, data: dict) -> list[dict]:
    """The computed `summary.targets` rows; a missing measurement gives `nan`, which is never met."""
    from diffusers_ext.evaluation.protocol import target

    nan = float("nan")
    rkl = summary["concept"].get("reverse_kl", {})
    ratio = summary.get("reverse_kl_over_esd_retain_frechet")
    rows = [
        target("concept: reverse-KL forgotten rate", rkl.get("forgotten_rate", nan), 0.02, "<="),
        target(
            "concept: reverse-KL max retained accuracy drop", rkl.get("max_retained_accuracy_drop", nan), 0.03, "<="
        ),
        target(
            "concept: reverse-KL over ESD with the same retain term, retained Fréchet at matched forgetting",
            nan if ratio is None else ratio,
            0.85,
            "<=",
        ),
    ]
    fu = summary.get("data", {})
    if fu:
        gap = abs(fu["forget_loss"] - fu["heldout_loss_mean"]) / max(fu["heldout_loss_std"], 1e-12)
        rows.append(target("data: |forget loss - held-out mean| in held-out spreads", gap, 1.0, "<="))
        ratio = fu["retained_frechet_ratio"]
        rows.append(target("data: retained Fréchet ratio to the pretrained model", ratio, 1.10, "<="))
    else:
        rows.append(target("data: |forget loss - held-out mean| in held-out spreads", nan, 1.0, "<="))
        rows.append(target("data: retained Fréchet ratio to the pretrained model", nan, 1.10, "<="))
    slowest = max([e.get("seconds", nan) for e in list(concept.values()) + list(data.values())] or [nan])
    rows.append(target("slowest single run, seconds", slowest, 600.0, "<="))
    return rows


def write_markdown(results, path):
    s = results["summary"]
    lines = ["# Constrained unlearning on the digits DDPM", "", f"Command: `{results['command']}`", "",
             f"Seeds: {s['seeds']}. Forgotten class: {results['settings']['forget_class']}.", "",
             "## Concept unlearning", "",
             "| method | level | final lambda | eta | forgotten rate | max retained acc. drop | retained FD | seeds | train s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip

    def fmt(entry, key, spec=".3f"):
        if key not in entry or entry[key] is None:
            return "—"
        std = entry.get(f"{key}_std")
        return f"{entry[key]:{spec}}" + (f" ± {std:{spec}}" if std else "")

    for name, entry in results["concept"].items():
        lines.append(
            f"| {name} | {fmt(entry, 'level', '.3g')} | {fmt(entry, 'final_lambda')} | "
            f"{fmt(entry, 'final_guidance_strength', '.2f')} | {fmt(entry, 'forgotten_rate')} | "
            f"{fmt(entry, 'max_retained_accuracy_drop')} | {fmt(entry, 'retained_frechet')} | {entry['num_seeds']} | "
            f"{fmt(entry, 'train_seconds', '.0f')} |"
        )
    ratio, ratio_retain = s.get("reverse_kl_over_esd_frechet"), s.get("reverse_kl_over_esd_retain_frechet")
    lines += ["", f"Reverse-KL over ESD retained Fréchet distance at matched forgetting: "
              f"{'—' if ratio is None else f'{ratio:.3f}'} ({s.get('reverse_kl_matched_run')}; target <= 0.85); "
              f"over ESD with the same retain term: {'—' if ratio_retain is None else f'{ratio_retain:.3f}'} "
              f"({s.get('reverse_kl_matched_run_retain')}).",
              "", "## Data unlearning", "",
              "| method | forget loss | held-out loss | z of forget mean | FD ratio to pretrained | final lambda | seeds |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, entry in results["data"].items():
        lines.append(
            f"| {name} | {fmt(entry, 'forget_loss', '.4f')} | {fmt(entry, 'heldout_loss_mean', '.4f')} "
            f"(spread {entry.get('heldout_loss_std', float('nan')):.4f}) | {fmt(entry, 'forget_mean_z', '.1f')} | "
            f"{fmt(entry, 'retained_frechet_ratio')} | {fmt(entry, 'final_lambda')} | {entry['num_seeds']} |"
        )
    from diffusers_ext.evaluation.protocol import targets_status

    lines += ["", f"## Targets: {targets_status(s['targets'])}", "", "| target | value | threshold | met |",
              "| --- | --- | --- | --- |"]  # fmt: skip
    for row in s["targets"]:
        lines.append(f"| {row['name']} | {row['value']:.3f} | {row['comparison']} {row['threshold']:g} | "
                     f"{'yes' if row['met'] else 'no'} |")  # fmt: skip
    lines += ["", s["protocol_notes"]]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(results, cache, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4), dpi=100)
    colors = {"reverse_kl": "#1f77b4", "likelihood": "#2ca02c", "forward_kl": "#9467bd", "esd": "#d62728", "esd+retain": "#ff7f0e",
              "pretrained": "#555"}  # fmt: skip
    for name, entry in results["concept"].items():
        method = name.split()[0]
        left.errorbar(entry["forgotten_rate"], entry["retained_frechet"], xerr=entry.get("forgotten_rate_std"),
                      yerr=entry.get("retained_frechet_std"), fmt="o", color=colors.get(method, "k"), label=name)  # fmt: skip
    left.axvline(0.02, color="#c33", linestyle="--", linewidth=1)
    left.set_xlabel("forgotten rate (samples of the forgotten class still classified as it)")
    left.set_yscale("log")
    left.set_ylabel("retained Fréchet distance (log scale)")
    left.set_title("Concept unlearning: retention vs forgetting")
    left.legend(fontsize=7)
    for key, run in sorted(cache.items()):
        lam = run.get("lambda_trajectory") if isinstance(run, dict) else None
        if not lam or lam[0] is None:
            continue
        part, name, seed = key.split("/")
        method = "forward_kl" if part == "data" else name.split()[0]
        middle.plot(lam, color=colors.get(method, "k"), alpha=0.6, linestyle="-" if part == "concept" else ":",
                    label=f"{part}: {name}" if seed == "0" else None)  # fmt: skip
    middle.set_xlabel("step")
    middle.set_ylabel("lambda")
    middle.set_title("Dual variable (dotted: data unlearning)")
    middle.legend(fontsize=7)
    names = list(results["data"])
    forget = [results["data"][n]["forget_loss"] for n in names]
    held = [results["data"][n]["heldout_loss_mean"] for n in names]
    spread = [results["data"][n]["heldout_loss_std"] for n in names]
    xs = np.arange(len(names))
    right.bar(xs - 0.2, forget, 0.4, label="forgotten examples")
    right.bar(xs + 0.2, held, 0.4, yerr=spread, label="held-out non-members (± spread)", color="#aaa")
    right.set_xticks(xs, names, fontsize=8)
    right.set_ylabel("denoising loss")
    right.set_title("Data unlearning: membership parity")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cache = load_cache(args)
    if not args.report_only:
        from diffusers_ext import zoo

        pipe = load_model(args)
        classifier = zoo.load("digits-classifier")
        for seed in args.seeds:
            if "concept" in args.parts:
                run_concept(args, pipe, classifier, seed, cache)
            if "data" in args.parts:
                run_data(args, pipe, classifier, seed, cache)
    cache = {key: run for key, run in cache.items() if int(key.split("/")[2]) in args.seeds}
    summary, concept, data = aggregate(args, cache)
    results = {
        "summary": summary,
        "command": " ".join(["python", "benchmarks/unlearning.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "cache_dir")},
        "concept": concept,
        "data": data,
        "cache_key": run_cache_key(args),
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "unlearning.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    write_markdown(results, os.path.join(args.output_dir, "unlearning.md"))
    write_plot(results, cache, os.path.join(args.output_dir, "unlearning.png"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
