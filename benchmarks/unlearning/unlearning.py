#!/usr/bin/env python
"""Constrained unlearning on the digits zoo DDPM: primal-dual reverse KL against ESD with the same retain term.

    python benchmarks/unlearning/unlearning.py

The measurement protocol of benchmarks/README.md, in one invocation:

- Concept unlearning forgets one digit class at a time (`--forget_classes`, default 3 and 8). Reverse KL is tried
  at `--level_factors` times its calibrated level and ESD *with the same retain term* at as many negative-guidance
  strengths (`--esd_guidance`): the same tuning budget. On the validation split (validation sampling noise, the
  validation half of the held-out digits) each method's level is chosen by one rule: the lowest retained Fréchet
  distance among the levels whose forgotten rate is at most `--forget_rate_threshold` (matched forgetting), else
  the level that forgets most. The test split (fresh sampling noise, the other half of the held-out digits) is
  then evaluated once, for the chosen levels only. ESD as published (no retain term) and the forward-KL and
  likelihood formulations are reported beside them (`--formulation_classes`), not as targets.
- Two judges: the zoo `ConvImageClassifier` and a pixel MLP trained here by scikit-learn (another architecture and
  training procedure); each judge's accuracy on the real held-out halves is under `summary.sanity`.
- Data unlearning forgets 64 fixed random training images: forward KL at the membership-parity level (the
  pretrained model's denoising loss on the validation half of the held-out digits) against SISS as published,
  SISS with the same retain term, NegGrad+ and a retain-only fine-tune; parity is measured on the test half.

Every run of every seed happens in this process on the same pretrained weights. Mean ± sample std over seeds, the
standard error of the mean (`sem`) and, for rates, the binomial standard error of the pooled samples are reported.
Finished runs (weights and measurements) are cached under `--cache_dir`, keyed by a hash of every run setting and
of the code and weights (`run_cache_key`), only so that an interrupted invocation can continue; the results file
records how many runs came from the cache (`summary.resumed_runs`).
Writes `benchmarks/unlearning/results/unlearning.json`, `unlearning.md` and `unlearning.png`.
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
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JUDGES = ("zoo", "mlp")
JUDGE_NAMES = {"zoo": "zoo classifier", "mlp": "pixel-MLP judge"}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=str, default=None, help="Pipeline folder (default: the zoo digits-ddpm).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training and sampling seeds.")
    parser.add_argument(
        "--forget_classes", type=int, nargs="+", default=[3, 8], help="Classes forgotten, one at a time."
    )
    parser.add_argument(
        "--formulation_classes",
        type=int,
        nargs="*",
        default=[3],
        help="Forgotten classes that also get the forward-KL and likelihood runs and ESD as published (reported).",
    )
    parser.add_argument("--max_steps", type=int, default=80, help="Unlearning steps of every run.")
    parser.add_argument("--batch_size", type=int, default=16, help="Forget (and retain) samples per step.")
    parser.add_argument("--learning_rate", type=float, default=1e-4, help="AdamW learning rate of every run.")
    parser.add_argument(
        "--level_factors", type=float, nargs="+", default=[1.0, 1.5], help="Reverse-KL levels (x calibrated)."
    )
    parser.add_argument(
        "--esd_guidance", type=float, nargs="+", default=[1.0, 2.0], help="ESD+retain negative guidance levels."
    )
    parser.add_argument("--published_esd_guidance", type=float, default=2.0, help="ESD as published: its eta.")
    parser.add_argument("--retain_weight", type=float, default=10.0, help="Retain-term weight of the concept runs.")
    parser.add_argument("--dual_rate", type=float, default=0.02, help="Concept dual step, as a multiple of 1/|b|.")
    parser.add_argument(
        "--forget_rate_threshold", type=float, default=0.02, help="Matched forgetting: the forgotten-rate bound."
    )
    parser.add_argument("--forget_size", type=int, default=64, help="Training images forgotten (data unlearning).")
    parser.add_argument("--data_retain_weight", type=float, default=1.0, help="Retain weight of the data runs.")
    parser.add_argument("--samples_per_class", type=int, default=40, help="Evaluation samples per retained class.")
    parser.add_argument("--forget_samples", type=int, default=120, help="Evaluation samples of the forgotten class.")
    parser.add_argument("--num_inference_steps", type=int, default=10, help="DDIM steps of evaluation sampling.")
    parser.add_argument("--membership_draws", type=int, default=16, help="(t, noise) draws per membership loss.")
    parser.add_argument("--judge_hidden", type=int, default=64, help="Hidden units of the pixel-MLP judge.")
    parser.add_argument("--parts", nargs="+", default=["concept", "data"], choices=["concept", "data"])
    parser.add_argument(
        "--workers",
        type=int,
        default=6,
        help="Processes (1 thread each), one job (seed x forgotten class or data part) at a time; 1: in this process.",
    )
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where unlearning.json/.md/.png go.")
    parser.add_argument(
        "--cache_dir",
        type=str,
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "unlearning"),
        help="Per-run cache keyed by a hash of every run setting, the code and the weights, so an interrupted run "
        "continues (default: benchmarks/.cache/unlearning, ignored by git).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for c in args.forget_classes + args.formulation_classes:
        if not 0 <= c <= 9:
            parser.error(f"--forget_classes/--formulation_classes must be digits 0-9, got {c}.")
    if not set(args.formulation_classes) <= set(args.forget_classes):
        parser.error(f"--formulation_classes {args.formulation_classes} must be among --forget_classes.")
    if args.forget_size < 2:
        parser.error(f"--forget_size must be >= 2, got {args.forget_size}.")
    if len(args.level_factors) != len(args.esd_guidance):
        parser.error(
            f"the baseline gets the same tuning budget: give as many --esd_guidance levels ({args.esd_guidance}) as "
            f"--level_factors ({args.level_factors})."
        )
    return args


# ----------------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------------


def concept_runs(args, forget_class):
    """(name, family, config overrides, level factor) of every concept run of one forgotten class."""
    retain = {"retain_weight": args.retain_weight}
    runs = [
        (f"reverse_kl x{f:g}", "reverse_kl", {"constraint": "reverse_kl", "lambda_max": 0.75, **retain}, f)
        for f in args.level_factors
    ]
    runs += [
        (f"esd+retain eta={e:g}", "esd+retain", {"baseline": "esd", "esd_negative_guidance": e, **retain}, None)
        for e in args.esd_guidance
    ]
    if forget_class in args.formulation_classes:
        eta = args.published_esd_guidance
        runs.append(
            (f"esd eta={eta:g}", "esd", {"baseline": "esd", "esd_negative_guidance": eta, "retain_weight": 0.0}, None)
        )
        runs.append(("forward_kl", "forward_kl", {"constraint": "forward_kl", "lambda_max": 0.5, **retain}, 1.0))
        runs.append(("likelihood", "likelihood", {"constraint": "likelihood", "lambda_max": 3.0, **retain}, 1.0))
    return runs


def data_runs(args):
    retain = {"retain_weight": args.data_retain_weight}
    return [
        ("forward_kl", {"constraint": "forward_kl", **retain}),
        ("siss", {"baseline": "siss"}),
        ("siss+retain", {"baseline": "siss", "siss_retain_weight": args.data_retain_weight}),
        ("neggrad_plus", {"baseline": "neggrad_plus", "neggrad_weight": 0.5, **retain}),
        ("retain_only", {"baseline": "retain_only", **retain}),
    ]


def load_model(args):
    from diffusers_ext import load_pipeline, zoo

    pipe = load_pipeline(args.model) if args.model else zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _trainer(pipe, config_kwargs, **kwargs):
    from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer

    config = ConstrainedUnlearningConfig(**config_kwargs, save_strategy="no", disable_tqdm=True)
    return ConstrainedUnlearningTrainer(_with_unet(pipe, copy.deepcopy(pipe.unet)), config, **kwargs)


def _with_unet(pipe, unet):
    clone = copy.copy(pipe)
    clone.register_modules(unet=unet.eval())
    return clone


class Bench:
    """What one job (one seed and one part: a forgotten class, or the data part) shares: model, judges, real halves,
    and its own cache file."""

    def __init__(self, args, seed, part):
        from diffusers_ext import zoo
        from diffusers_ext.data.digits import load_digits_images
        from diffusers_ext.evaluation.unlearning import heldout_halves, train_pixel_mlp_judge

        self.args = args
        self.pipe = load_model(args)
        train_images, train_labels = load_digits_images("train", resolution=8)
        self.judges = {
            "zoo": zoo.load("digits-classifier"),
            "mlp": train_pixel_mlp_judge(train_images, train_labels, args.judge_hidden, seed=0),
        }
        self.real = heldout_halves(resolution=8)
        self.store = run_cache(args)
        self.cache_name = f"runs-seed{seed}-{part}"
        self.cache = self.store.load(self.cache_name) or {}
        self.resumed = 0

    def save(self):
        self.store.save(self.cache_name, self.cache)

    def weights_path(self, key):
        return self.store.path(key.replace("/", "__").replace(" ", "_") + ".safetensors")

    def sanity(self):
        from diffusers_ext.metrics import classifier_predictions

        out = {}
        for judge, model in self.judges.items():
            for split, (images, labels) in self.real.items():
                predictions, _ = classifier_predictions(model, images)
                out[f"{judge} judge accuracy on real {split} digits"] = float(
                    (predictions.cpu() == labels).double().mean()
                )
        return out

    def evaluate(self, unet, forget, split, seed):
        """Sample `samples_per_class` of every retained class and `forget_samples` of each forgotten class with the
        split's sampling seed and judge them with both judges against the split's real half."""
        from diffusers_ext.evaluation.unlearning import judge_samples, sample_labels

        args = self.args
        counts = [args.forget_samples if c in forget else args.samples_per_class for c in range(10)]
        labels = torch.arange(10).repeat_interleave(torch.tensor(counts))
        offset = {"validation": 100_003, "test": 200_003}[split]
        images = sample_labels(_with_unet(self.pipe, unet), labels, args.num_inference_steps, offset + seed)
        return {j: judge_samples(model, images, labels, self.real[split], forget) for j, model in self.judges.items()}

    def load_unet(self, key):
        from safetensors.torch import load_file

        if "/pretrained/" in key:
            return self.pipe.unet
        unet = copy.deepcopy(self.pipe.unet)
        unet.load_state_dict(load_file(self.weights_path(key)))
        return unet

    def run(self, key, make_trainer, configure=None):
        """Train (or load from the cache) one run; return `(unet, record)`."""
        from safetensors.torch import save_file

        if key in self.cache and os.path.isfile(self.weights_path(key)):
            self.resumed += 1
            return self.load_unet(key), self.cache[key]
        start, cpu = time.perf_counter(), time.process_time()
        trainer = make_trainer()
        record = configure(trainer) if configure else {}
        trainer.train()
        unet = trainer.unlearned_unet()
        record.update(
            final_lambda=trainer.lambda_ if trainer.args.baseline is None else None,
            final_guidance_strength=trainer.guidance_strength() if trainer.objective.guidance else None,
            stop_reason=trainer.stop_reason,
            steps=trainer.global_step,
            train_seconds=time.perf_counter() - start,
            train_cpu_seconds=time.process_time() - cpu,
            lambda_trajectory=[h.get("lambda") for h in trainer.history],
            constraint_trajectory=[h["constraint_estimate"] for h in trainer.history],
        )
        save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, self.weights_path(key))
        self.cache[key] = record
        self.save()
        return unet, record


# ----------------------------------------------------------------------------------------------------------------
# Concept unlearning
# ----------------------------------------------------------------------------------------------------------------


def train_concept(bench, forget_class, seed):
    """One seed: the pretrained model and every level of every method on the validation split."""
    args = bench.args
    key = f"concept/{forget_class}/pretrained/{seed}"
    if "validation" not in bench.cache.setdefault(key, {}):
        bench.cache[key]["validation"] = bench.evaluate(bench.pipe.unet, [forget_class], "validation", seed)
        bench.save()
    base = {
        "forget_classes": [forget_class],
        "max_steps": args.max_steps,
        "seed": seed,
        "learning_rate": args.learning_rate,
        "stop_patience": args.max_steps,
        "per_device_train_batch_size": args.batch_size,
    }
    for name, family, overrides, factor in concept_runs(args, forget_class):
        key = f"concept/{forget_class}/{name}/{seed}"

        auto = (
            {}
            if factor is None
            else {
                "constraint_level": "auto",
                "constraint_level_factor": factor if family != "likelihood" else 1.0,
                "dual_learning_rate": "auto",
                "dual_learning_rate_scale": args.dual_rate,
            }
        )

        def configure(trainer, factor=factor, family=family, name=name):
            level = trainer.constraint_level if factor is not None else None  # "auto": calibrated x factor
            return {"name": name, "family": family, "seed": seed, "level": level}

        unet, record = bench.run(key, lambda c={**base, **overrides, **auto}: _trainer(bench.pipe, c), configure)
        if "validation" not in record:
            cpu = time.process_time()
            record["validation"] = bench.evaluate(unet, [forget_class], "validation", seed)
            record["cpu_seconds"] = record["train_cpu_seconds"] + time.process_time() - cpu
            bench.save()
        v = record["validation"]["zoo"]
        print(
            f"[{key}] validation: forgotten {v['forgotten_rate']:.3f} retained FD {v['retained_frechet']:.3f}"
            f" ({record['train_seconds']:.0f} s)",
            flush=True,
        )


def choices_of(args, cache, forget_class):
    """The validation choice of every method family of one forgotten class (all seeds' validation runs)."""
    families = {}
    for name, family, _, _ in concept_runs(args, forget_class):
        families.setdefault(family, []).append(name)
    return {family: choose_level(args, cache, forget_class, names) for family, names in families.items()}


def test_keys(args, choices, seed):
    """The runs of one seed evaluated on the test split: the pretrained model and each family's chosen level."""
    keys = []
    for forget_class, class_choices in choices.items():
        keys.append(f"concept/{forget_class}/pretrained/{seed}")
        keys += [f"concept/{forget_class}/{c['chosen']}/{seed}" for c in class_choices.values()]
    return keys


def test_concept(bench, keys, seed):
    """The test split, once, for the frozen choices."""
    for key in keys:
        record = bench.cache[key]
        if "test" not in record:
            forget_class = int(key.split("/")[1])
            record["test"] = bench.evaluate(bench.load_unet(key), [forget_class], "test", seed)
            bench.save()


def choose_level(args, cache, forget_class, names):
    """The validation choice of one method family: the lowest mean retained FD (zoo judge) among its levels whose
    mean forgotten rate is <= the threshold; else the level with the lowest forgotten rate."""
    table = {}
    for name in names:
        runs = [cache[f"concept/{forget_class}/{name}/{s}"]["validation"]["zoo"] for s in args.seeds]
        table[name] = {
            "forgotten_rate": float(np.mean([r["forgotten_rate"] for r in runs])),
            "retained_frechet": float(np.mean([r["retained_frechet"] for r in runs])),
        }
    within = [n for n in names if table[n]["forgotten_rate"] <= args.forget_rate_threshold]
    if within:
        chosen = min(within, key=lambda n: table[n]["retained_frechet"])
        rule = f"lowest validation retained FD among levels forgetting to <= {args.forget_rate_threshold:g}"
    else:
        chosen = min(names, key=lambda n: (table[n]["forgotten_rate"], table[n]["retained_frechet"]))
        rule = f"no level forgot to <= {args.forget_rate_threshold:g} on validation: the level forgetting most"
    return {"chosen": chosen, "rule": rule, "validation": table}


# ----------------------------------------------------------------------------------------------------------------
# Data unlearning
# ----------------------------------------------------------------------------------------------------------------


def data_split(args):
    from diffusers_ext.data.digits import load_digits_images

    images, labels = load_digits_images("train", resolution=8)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1234))
    forget, retain = order[: args.forget_size], order[args.forget_size :]
    return (images[forget], labels[forget]), (images[retain], labels[retain])


def run_data(bench, seed):
    """One seed: the pretrained model's membership losses (validation half: the forward-KL level; test half:
    parity), then each method once, measured on the test half."""
    from diffusers_ext.evaluation.unlearning import denoising_losses, membership_summary

    args = bench.args
    forget, retain = data_split(args)

    def losses(unet, data, seed):
        return denoising_losses(unet, bench.pipe.scheduler, *data, num_draws=args.membership_draws, seed=seed)

    def measure(unet, seed):
        out = membership_summary(losses(unet, forget, seed), losses(unet, bench.real["test"], seed))
        out["test"] = bench.evaluate(unet, [], "test", seed)
        return out

    key = f"data/pretrained/{seed}"
    if "test" not in bench.cache.setdefault(key, {}):
        bench.cache[key] = {
            "validation_heldout_loss": float(losses(bench.pipe.unet, bench.real["validation"], seed).mean()),
            **measure(bench.pipe.unet, seed),
        }
        bench.save()
    pretrained = bench.cache[key]
    base = {
        "max_steps": args.max_steps,
        "seed": seed,
        "learning_rate": args.learning_rate,
        "stop_patience": args.max_steps,
        "per_device_train_batch_size": args.batch_size,
    }
    for name, overrides in data_runs(args):
        key = f"data/{name}/{seed}"
        config = {**base, **overrides}
        if name == "forward_kl":  # membership parity, calibrated on the validation half only
            config["constraint_level"] = pretrained["validation_heldout_loss"]
            config["dual_learning_rate"] = 0.3 / pretrained["validation_heldout_loss"]
        unet, record = bench.run(
            key,
            lambda c=config: _trainer(bench.pipe, c, forget_dataset=forget, retain_dataset=retain),
            lambda trainer, c=config, name=name, seed=seed: {
                "name": name,
                "seed": seed,
                "level": c.get("constraint_level"),
            },
        )
        if "test" not in record:
            cpu = time.process_time()
            record.update(measure(unet, seed))
            record["cpu_seconds"] = record["train_cpu_seconds"] + time.process_time() - cpu
            bench.save()
        print(
            f"[{key}] forget loss {record['forget_loss']:.4f} held-out {record['heldout_loss_mean']:.4f} "
            f"± {record['heldout_loss_std']:.4f} FD {record['test']['zoo']['retained_frechet']:.3f}",
            flush=True,
        )


# ----------------------------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------------------------

# Arguments that only select which runs happen (each is cached under its seed) or where files go; every other
# argument changes what a run computes.
NOT_RUN_SETTINGS = ("seeds", "parts", "workers", "output_dir", "cache_dir", "from_results")


def run_cache(args):
    """The per-run cache (`reporting.ResultCache`), keyed by every run setting, this script, the unlearning trainer,
    evaluation and sampling code, and the weights of the model and the judge."""
    from diffusers_ext.evaluation.reporting import ResultCache

    package = os.path.join(ROOT, "diffusers_ext")
    code = [
        os.path.abspath(__file__),
        os.path.join(package, "trainers"),
        os.path.join(package, "evaluation"),
        os.path.join(package, "pipelines"),
        os.path.join(package, "models"),
        os.path.join(package, "metrics"),
        os.path.join(package, "data"),
    ]
    weights = []
    for folder in (
        args.model or os.path.join(package, "zoo", "digits-ddpm"),
        os.path.join(package, "zoo", "digits-classifier"),
    ):
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            weights += [os.path.join(root, n) for n in sorted(names) if n.endswith((".json", ".safetensors", ".bin"))]
    settings = {k: v for k, v in vars(args).items() if k not in NOT_RUN_SETTINGS}
    return ResultCache(args.cache_dir, settings, code + weights)


def run_cache_key(args) -> str:
    """The key of [`run_cache`] (`protocol.settings_code_hash` of the run settings, code and weights)."""
    return run_cache(args).key


def cache_path(args, seed, part):
    """The cache file of one job's records."""
    return os.path.join(run_cache(args).folder, f"runs-seed{seed}-{part}.json")


# ----------------------------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------------------------


def spread(values):
    from diffusers_ext.evaluation.protocol import mean_spread

    values = [v for v in values if v is not None]
    return mean_spread(values) if values else None


def rate_entry(records, split, judge):
    """Forgotten rate over seeds: mean ± spread and the binomial standard error of the pooled samples."""
    from diffusers_ext.evaluation.protocol import binomial_standard_error

    rates = [r[split][judge]["forgotten_rate"] for r in records]
    counts = [r[split][judge]["forgotten_count"] for r in records]
    entry = spread(rates)
    pooled = float(np.dot(rates, counts) / sum(counts))
    entry["binomial_se"] = binomial_standard_error(pooled, int(sum(counts)))
    return entry


def accuracy_drop(records, pretrained, split, judge, forget_class):
    """The largest drop of a retained class's accuracy (pooled over seeds) below the pretrained model's, with the
    binomial standard error of that difference, and the mean drop over retained classes."""
    mine = np.mean([r[split][judge]["per_class_accuracy"] for r in records], axis=0)
    theirs = np.mean([r[split][judge]["per_class_accuracy"] for r in pretrained], axis=0)
    retained = [c for c in range(10) if c != forget_class]
    drops = {c: float(theirs[c] - mine[c]) for c in retained}
    worst = max(drops, key=drops.get)
    n = sum(r[split][judge]["per_class_count"][worst] for r in records)
    se = float(np.sqrt(mine[worst] * (1 - mine[worst]) / n + theirs[worst] * (1 - theirs[worst]) / n))
    return {"max": max(0.0, drops[worst]), "class": worst, "se": se, "mean": float(np.mean(list(drops.values())))}


def concept_summary(args, cache, forget_class, choices):
    pretrained = [cache[f"concept/{forget_class}/pretrained/{s}"] for s in args.seeds]
    validation = {}
    for family, choice in choices.items():
        for name in choice["validation"]:
            records = [cache[f"concept/{forget_class}/{name}/{s}"] for s in args.seeds]
            validation[name] = {
                "family": family,
                "chosen": name == choice["chosen"],
                "level": spread([r["level"] for r in records]),
                "final_lambda": spread([r["final_lambda"] for r in records]),
                "final_guidance_strength": spread([r["final_guidance_strength"] for r in records]),
                "train_seconds": spread([r["train_seconds"] for r in records]),
                **{
                    j: {
                        "forgotten_rate": rate_entry(records, "validation", j),
                        "retained_frechet": spread([r["validation"][j]["retained_frechet"] for r in records]),
                    }
                    for j in JUDGES
                },
            }
    test = {}
    for family, choice in [("pretrained", {"chosen": "pretrained"}), *choices.items()]:
        records = (
            pretrained
            if family == "pretrained"
            else [cache[f"concept/{forget_class}/{choice['chosen']}/{s}"] for s in args.seeds]
        )
        test[family] = {
            "run": choice["chosen"],
            **{
                j: {
                    "forgotten_rate": rate_entry(records, "test", j),
                    "retained_frechet": spread([r["test"][j]["retained_frechet"] for r in records]),
                    "max_retained_accuracy_drop": accuracy_drop(records, pretrained, "test", j, forget_class),
                }
                for j in JUDGES
            },
        }
    ratios = {}
    for j in JUDGES:
        per_seed = [
            cache[f"concept/{forget_class}/{choices['reverse_kl']['chosen']}/{s}"]["test"][j]["retained_frechet"]
            / cache[f"concept/{forget_class}/{choices['esd+retain']['chosen']}/{s}"]["test"][j]["retained_frechet"]
            for s in args.seeds
        ]
        ratios[j] = spread(per_seed)
    return {
        "validation": validation,
        "choices": {f: {k: c[k] for k in ("chosen", "rule")} for f, c in choices.items()},
        "test": test,
        "reverse_kl_over_esd_retain_frechet": ratios,
    }


def data_summary(args, cache):
    pretrained = {s: cache[f"data/pretrained/{s}"] for s in args.seeds}
    out = {}
    for name in ["pretrained"] + [n for n, _ in data_runs(args)]:
        records = [cache[f"data/{name}/{s}"] for s in args.seeds]
        gaps = [abs(r["forget_loss"] - r["heldout_loss_mean"]) / r["heldout_loss_std"] for r in records]
        out[name] = {
            "forget_loss": spread([r["forget_loss"] for r in records]),
            "heldout_loss_mean": spread([r["heldout_loss_mean"] for r in records]),
            "heldout_loss_std": spread([r["heldout_loss_std"] for r in records]),
            "gap_in_heldout_spreads": spread(gaps),
            "forget_mean_z": spread([r["forget_mean_z"] for r in records]),
            "forget_within_spread": [bool(r["forget_within_spread"]) for r in records],
            "level": spread([r.get("level") for r in records]),
            "final_lambda": spread([r.get("final_lambda") for r in records]),
            **{
                j: {
                    "frechet": spread([r["test"][j]["retained_frechet"] for r in records]),
                    "frechet_ratio": spread(
                        [
                            r["test"][j]["retained_frechet"] / pretrained[s]["test"][j]["retained_frechet"]
                            for s, r in zip(args.seeds, records)
                        ]
                    ),
                }
                for j in JUDGES
            },
        }
    return out


def compute_targets(summary: dict) -> list[dict]:
    """The computed `summary.targets` rows (test split, means over seeds); a missing measurement gives `nan`, which is
    never met."""
    from diffusers_ext.evaluation.protocol import target

    nan = float("nan")
    threshold = summary.get("forget_rate_threshold", 0.02)
    rows = []
    for forget_class, part in summary.get("concept", {}).items():
        rkl = part.get("test", {}).get("reverse_kl", {})
        for j in JUDGES:
            value = rkl.get(j, {}).get("forgotten_rate", {}).get("mean", nan)
            rows.append(
                target(f"concept {forget_class}: reverse-KL forgotten rate ({JUDGE_NAMES[j]})", value, threshold, "<=")
            )
        value = rkl.get("zoo", {}).get("max_retained_accuracy_drop", {}).get("max", nan)
        rows.append(
            target(
                f"concept {forget_class}: reverse-KL max retained accuracy drop (zoo classifier)", value, 0.03, "<="
            )
        )
        for j in JUDGES:
            ratio = part.get("reverse_kl_over_esd_retain_frechet", {}).get(j) or {}
            rows.append(
                target(
                    f"concept {forget_class}: reverse-KL over ESD+retain retained Fréchet at matched forgetting "
                    f"({JUDGE_NAMES[j]})",
                    ratio.get("mean", nan),
                    0.85,
                    "<=",
                )
            )
    fu = summary.get("data", {}).get("forward_kl")
    rows.append(
        target(
            "data: forward-KL |forget loss - held-out mean| in held-out spreads",
            fu["gap_in_heldout_spreads"]["mean"] if fu else nan,
            1.0,
            "<=",
        )
    )
    for j in JUDGES:
        rows.append(
            target(
                f"data: forward-KL retained Fréchet ratio to the pretrained model ({JUDGE_NAMES[j]})",
                fu[j]["frechet_ratio"]["mean"] if fu else nan,
                1.10,
                "<=",
            )
        )
    rows.append(
        target(
            "slowest single run (training + its evaluation), CPU seconds",
            summary.get("slowest_run_cpu_seconds", nan),
            600.0,
            "<=",
        )
    )
    return rows


def summarise(args, cache, choices, bench_sanity, resumed):
    from diffusers_ext.evaluation.protocol import targets_status

    summary = {"seeds": args.seeds, "forget_rate_threshold": args.forget_rate_threshold, "concept": {}}
    for forget_class, class_choices in choices.items():
        summary["concept"][str(forget_class)] = concept_summary(args, cache, forget_class, class_choices)
    if "data" in args.parts:
        summary["data"] = data_summary(args, cache)
    cpu = [r["cpu_seconds"] for r in cache.values() if "cpu_seconds" in r]
    summary["slowest_run_cpu_seconds"] = max(cpu) if cpu else None
    sanity = dict(bench_sanity)
    for forget_class, part in summary["concept"].items():
        pre = part["test"]["pretrained"]
        for j in JUDGES:  # headroom: the pretrained model does draw the class that is to be forgotten
            sanity[f"concept {forget_class}: pretrained forgotten-class rate, test ({JUDGE_NAMES[j]})"] = pre[j][
                "forgotten_rate"
            ]["mean"]
    if "data" in summary:
        pre = summary["data"]["pretrained"]
        sanity["data: pretrained |forget loss - held-out mean| in held-out spreads (memorisation to undo)"] = pre[
            "gap_in_heldout_spreads"
        ]["mean"]
    summary["sanity"] = sanity
    summary["resumed_runs"] = resumed
    summary["targets"] = compute_targets(summary)
    summary["status"] = targets_status(summary["targets"])
    return summary


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def fmt(entry, spec=".3f", key="mean"):
    if entry is None:
        return "—"
    value = entry[key]
    std = entry.get("std")
    return f"{value:{spec}}" + (f" ± {std:{spec}}" if std else "")


def settings_line(results) -> str:
    s, settings = results["summary"], results["settings"]
    return (
        f"Seeds {s['seeds']}; {settings['max_steps']} steps per run (batch {settings['batch_size']} + "
        f"{settings['batch_size']}); evaluation: {settings['samples_per_class']} samples per retained class and "
        f"{settings['forget_samples']} of the forgotten class per seed, {settings['num_inference_steps']} DDIM "
        f"steps; mean ± std over seeds. Runs resumed from the cache: {s['resumed_runs']}."
    )


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    lines = ["## Sanity", "", "| check | value |", "| --- | --- |"]
    lines += [f"| {k} | {v:.3f} |" for k, v in s["sanity"].items()]
    for forget_class, part in s["concept"].items():
        lines += [
            "",
            f"## Concept unlearning: class {forget_class}",
            "",
            "### Validation (every level; the choice)",
            "",
            "| run | level | final λ | η | forgotten (zoo) | retained FD (zoo) | forgotten (MLP) | "
            "retained FD (MLP) | chosen |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, row in part["validation"].items():
            lines.append(
                f"| {name} | {fmt(row['level'], '.3g')} | {fmt(row['final_lambda'])} | "
                f"{fmt(row['final_guidance_strength'], '.2f')} | {fmt(row['zoo']['forgotten_rate'])} | "
                f"{fmt(row['zoo']['retained_frechet'])} | {fmt(row['mlp']['forgotten_rate'])} | "
                f"{fmt(row['mlp']['retained_frechet'])} | {'**yes**' if row['chosen'] else ''} |"
            )
        lines += [""] + [f"- {family}: {c['chosen']} ({c['rule']})" for family, c in part["choices"].items()]
        lines += [
            "",
            "### Test (once, chosen levels)",
            "",
            "| method | run | forgotten (zoo) ± binomial SE | max retained acc. drop (zoo) | retained FD (zoo) | "
            "forgotten (MLP) | max retained acc. drop (MLP) | retained FD (MLP) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for family, row in part["test"].items():
            cells = []
            for j in JUDGES:
                rate = row[j]["forgotten_rate"]
                drop = row[j]["max_retained_accuracy_drop"]
                cells += [
                    f"{rate['mean']:.3f} ± {rate['binomial_se']:.3f}" if j == "zoo" else fmt(rate),
                    f"{drop['max']:.3f} (class {drop['class']}, SE {drop['se']:.3f})",
                    fmt(row[j]["retained_frechet"]),
                ]
            lines.append(f"| {family} | {row['run']} | " + " | ".join(cells) + " |")
        for j in JUDGES:
            ratio = part["reverse_kl_over_esd_retain_frechet"][j]
            lines.append(
                f"\nReverse KL over ESD+retain, retained FD at matched forgetting ({JUDGE_NAMES[j]}): "
                f"{fmt(ratio)} (SE {ratio['sem']:.3f}; per seed {[round(v, 3) for v in ratio['values']]})."
            )
    if "data" in s:
        lines += [
            "",
            "## Data unlearning (test half of the held-out digits)",
            "",
            "| method | forget loss | held-out loss (spread) | gap in spreads | z of forget mean | "
            "FD ratio (zoo) | FD ratio (MLP) | final λ |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, row in s["data"].items():
            lines.append(
                f"| {name} | {fmt(row['forget_loss'], '.4f')} | {fmt(row['heldout_loss_mean'], '.4f')} "
                f"({row['heldout_loss_std']['mean']:.4f}) | {fmt(row['gap_in_heldout_spreads'], '.2f')} | "
                f"{fmt(row['forget_mean_z'], '.1f')} | {fmt(row['zoo']['frechet_ratio'])} | "
                f"{fmt(row['mlp']['frechet_ratio'])} | {fmt(row['final_lambda'])} |"
            )
    return lines


def write_plot(results, cache, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5), dpi=100)
    colors = {
        "reverse_kl": "#1f77b4",
        "likelihood": "#2ca02c",
        "forward_kl": "#9467bd",
        "esd": "#d62728",
        "esd+retain": "#ff7f0e",
        "pretrained": "#555",
    }
    markers = ["o", "s", "^", "D"]
    for i, (forget_class, part) in enumerate(s["concept"].items()):
        for name, row in part["validation"].items():
            rate, fd = row["zoo"]["forgotten_rate"], row["zoo"]["retained_frechet"]
            left.errorbar(
                rate["mean"],
                fd["mean"],
                xerr=rate["std"],
                yerr=fd["std"],
                fmt=markers[i % 4],
                color=colors.get(row["family"], "k"),
                mfc="none" if not row["chosen"] else None,
                label=f"{forget_class}: {name}",
            )
    left.axvline(s["forget_rate_threshold"], color="#c33", linestyle="--", linewidth=1)
    left.set_xlabel("validation forgotten rate (zoo classifier)")
    left.set_yscale("log")
    left.set_ylabel("validation retained Fréchet distance (log)")
    left.set_title("Concept: every level on validation (filled: chosen)")
    left.legend(fontsize=6, ncol=2)
    for key, run in sorted(cache.items()):
        lam = run.get("lambda_trajectory")
        if not lam or lam[0] is None:
            continue
        parts = key.split("/")
        family = run.get("family", "forward_kl")
        middle.plot(
            lam,
            color=colors.get(family, "k"),
            alpha=0.5,
            linestyle="-" if parts[0] == "concept" else ":",
            label="/".join(parts[:-1]) if parts[-1] == str(s["seeds"][0]) else None,
        )
    middle.set_xlabel("step")
    middle.set_ylabel("λ")
    middle.set_title("Dual variable (dotted: data unlearning)")
    middle.legend(fontsize=6)
    if "data" in s:
        names = list(s["data"])
        xs = np.arange(len(names))
        right.bar(xs - 0.2, [s["data"][n]["forget_loss"]["mean"] for n in names], 0.4, label="forgotten examples")
        right.bar(
            xs + 0.2,
            [s["data"][n]["heldout_loss_mean"]["mean"] for n in names],
            0.4,
            color="#aaa",
            yerr=[s["data"][n]["heldout_loss_std"]["mean"] for n in names],
            label="held-out non-members, test half (± spread)",
        )
        right.set_xticks(xs, names, fontsize=7)
        right.set_ylabel("denoising loss")
        right.set_title("Data: membership parity")
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def worker(argv, seed, part, phase, choices=None):
    """One job in its own process: one seed and one part (a forgotten class, or "data"). Phase "train": every run of
    the part on validation (the data part is measured on its test half directly: it makes no choice); phase "test":
    the class's frozen choices on the test split. Returns `(cache, resumed runs, judge sanity)`."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    bench = Bench(args, seed, part)
    if phase == "train" and part == "data":
        run_data(bench, seed)
    elif phase == "train":
        train_concept(bench, int(part), seed)
    else:
        test_concept(bench, test_keys(args, {int(part): choices[int(part)]}, seed), seed)
    return bench.cache, bench.resumed, bench.sanity()


def map_jobs(args, argv, phase, choices=None):
    """Run `worker` for every (part, seed), `--workers` processes at a time (in this process for one worker); the
    longest parts are submitted first."""
    parts = [str(c) for c in sorted(args.forget_classes, key=lambda c: -len(concept_runs(args, c)))]
    if phase == "train" and "data" in args.parts:
        parts = (parts if "concept" in args.parts else []) + ["data"]
    elif phase == "train" and "concept" not in args.parts:
        parts = []
    from diffusers_ext.evaluation.reporting import run_jobs

    jobs = [(argv, seed, part, phase, choices) for part in parts for seed in args.seeds]
    return run_jobs(worker, jobs, args.workers)


def write_report(results, output_dir):
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        os.path.join(output_dir, "unlearning"),
        results,
        "Constrained unlearning on the digits DDPM",
        report_sections(results),
        settings_line(results),
        figures={".png": lambda path: write_plot(results, results["runs"], path)},
    )


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: compute_targets(r["summary"]), rel_to=ROOT)
        write_report(results, args.output_dir)
        return
    start = time.perf_counter()
    cache_key = run_cache_key(args)  # of the code as it was when this invocation started
    resumed = 0
    results = map_jobs(args, argv, "train")
    cache = {k: v for r in results for k, v in r[0].items()}
    resumed += sum(r[1] for r in results)
    choices = {}
    if "concept" in args.parts:
        choices = {c: choices_of(args, cache, c) for c in args.forget_classes}
        results = map_jobs(args, argv, "test", choices)
        cache = {k: v for r in results for k, v in r[0].items()} | {
            k: v for k, v in cache.items() if k.startswith("data/")
        }
    summary = summarise(args, cache, choices, results[0][2], resumed)
    results = {
        "summary": summary,
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k not in NOT_RUN_SETTINGS},
        "cache_key": cache_key,
        "wall_seconds": time.perf_counter() - start,
        "runs": cache,
    }
    write_report(results, args.output_dir)
    print(json.dumps({k: summary[k] for k in ("targets", "sanity", "status")}, indent=2))


if __name__ == "__main__":
    main()
