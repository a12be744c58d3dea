#!/usr/bin/env python
"""GRPO learning, then GRPO vs E2PO where groups collapse, on the digits-sd3 zoo model.

    python benchmarks/e2po/e2po.py

Two parts, one invocation, one results file:

- `learn`: does `DiffusionGRPOTrainer` learn? A reward with headroom and a clear signal (minus the distance of an
  image's mean brightness from `--brightness_target`; the zoo model draws 0.31), `--prompts_per_step` prompts x
  `--num_generations` images per step, `--learn_steps` steps, `--num_iterations` optimizer steps per rollout (so the
  clipped ratio clips), every seed of `--seeds`. Evaluation: deterministic Euler samples from `--eval_samples` fixed
  test noises, with the evaluation's standard error.
- `regime`: GRPO vs E2PO where E2PO should help: a binary, prompt-dependent reward (1 if the zoo digit classifier
  gives the prompted digit a probability of at least tau), hard prompts only, groups that share their initial noise
  (`init_same_noise`, DanceGRPO) so that the in-group spread comes from the SDE noise alone. tau, the hard prompts,
  the SDE noise level, the group size and E2PO's scale cap are chosen on validation noises and seeds (rollouts of
  the untrained model; the choices favour neither method, see `validate`), then both methods train on the same
  prompts, seeds and budget and are evaluated once per checkpoint on fixed test noises.

The judge (the zoo `digits-classifier`, trained separately on real digits; its held-out accuracy is in its model
card) is the reward of the regime part; the learn part's reward is an exact pixel statistic. Writes
`benchmarks/e2po/results/e2po.json`, `e2po.md` and `e2po.png`.
"""

import argparse
import json
import math
import os
import tempfile
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEST_SEED, VALIDATION_SEED = 10_000, 20_000


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=["learn", "regime"], choices=["learn", "regime"])
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds (each part, each method)."
    )
    parser.add_argument("--learn_steps", type=int, default=100, help="GRPO steps of the learn part.")
    parser.add_argument("--regime_steps", type=int, default=60, help="Steps of each method in the regime part.")
    parser.add_argument("--images_per_step", type=int, default=80, help="Images generated per training step.")
    parser.add_argument("--num_generations", type=int, default=8, help="Group size of the learn part.")
    parser.add_argument("--num_inference_steps", type=int, default=3, help="Denoising steps (rollouts and eval).")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="AdamW learning rate of the LoRA.")
    parser.add_argument("--lora_rank", type=int, default=4, help="LoRA rank (alpha = 2 x rank).")
    parser.add_argument("--num_iterations", type=int, default=2, help="Optimizer steps per generated batch.")
    parser.add_argument("--epsilon", type=float, default=1e-3, help="Ratio clip range.")
    parser.add_argument("--noise_level", type=float, default=0.7, help="SDE noise level of the learn part.")
    parser.add_argument("--brightness_target", type=float, default=0.45, help="Learn part: wanted mean brightness.")
    parser.add_argument("--eval_every", type=int, default=10, help="Evaluate every N steps.")
    parser.add_argument("--eval_samples", type=int, default=500, help="Fixed test noises per evaluation (>= 500).")
    # Validation grids of the regime part
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.9, 0.99, 0.999, 0.9999])
    parser.add_argument("--num_hard_prompts", type=int, default=3, help="Regime part: the hardest digits kept.")
    parser.add_argument("--start_accuracy", type=float, nargs=2, default=[0.3, 0.6], help="Wanted start range.")
    parser.add_argument("--noise_levels", type=float, nargs="+", default=[0.2, 0.35, 0.5, 0.7], help="Noise levels.")
    parser.add_argument(
        "--collapse_at_least", type=float, default=0.3, help="Regime: GRPO's step-0 frac_reward_zero_std wanted."
    )
    parser.add_argument("--group_sizes", type=int, nargs="+", default=[8, 16], help="Validated group sizes.")
    parser.add_argument(
        "--max_scales", type=float, nargs="+", default=[0.005, 0.01, 0.02, 0.05, 0.1], help="E2PO caps."
    )
    parser.add_argument(
        "--e2po_max_reward_drop", type=float, default=0.1, help="Reward E2PO's perturbations may cost."
    )
    parser.add_argument(
        "--e2po_target_std", type=float, default=0.2, help="E2PO: grow the scale at or below this std."
    )
    parser.add_argument("--validation_samples", type=int, default=100, help="Validation samples per digit.")
    parser.add_argument("--workers", type=int, default=2, help="Training runs in parallel (1 thread each).")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where e2po.json/.md/.png go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in ("learn_steps", "regime_steps"):
        if getattr(args, name) % args.eval_every:
            parser.error(f"--{name} {getattr(args, name)} must be a multiple of --eval_every {args.eval_every}.")
    if args.images_per_step % args.num_generations or any(args.images_per_step % g for g in args.group_sizes):
        parser.error("--images_per_step must be a multiple of --num_generations and of every --group_sizes entry.")
    return args


def digit_rows(labels=range(10)):
    return [{"prompt": f"a handwritten digit {DIGIT_NAMES[label]}", "label": label} for label in labels]


def quiet():
    torch.set_num_threads(1)
    import transformers
    from diffusers.utils import logging as diffusers_logging

    transformers.logging.set_verbosity_error()
    diffusers_logging.set_verbosity_error()


# ----------------------------------------------------------------------------------------------------------------
# Rewards (plain callables, `f(prompts, images, **columns)`)
# ----------------------------------------------------------------------------------------------------------------


class ThresholdedDigitReward:
    """1 if the classifier gives the prompted digit (column `label`) a probability of at least `threshold`, else 0."""

    def __init__(self, classifier, threshold: float):
        self.classifier, self.threshold = classifier, threshold
        self.__name__ = f"digit_prob_ge_{threshold:g}"

    def __call__(self, prompts, images, label, **kwargs):
        from diffusers_ext.rewards.classifier import _class_probabilities

        probabilities = _class_probabilities(self.classifier, images)
        chosen = probabilities.gather(1, torch.as_tensor(label)[:, None]).squeeze(1)
        return (chosen >= self.threshold).float().tolist()


def digit_probabilities(classifier, images, labels) -> torch.Tensor:
    from diffusers_ext.rewards.classifier import _class_probabilities

    return _class_probabilities(classifier, images).gather(1, torch.as_tensor(labels)[:, None]).squeeze(1)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation: deterministic Euler sampling from fixed noises
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def euler_images(pipe_or_trainer, rows, per_row: int, num_inference_steps: int, seed: int) -> torch.Tensor:
    """`(len(rows) * per_row, 3, 8, 8)` images of the clean prompts from fixed noises (seed + row index)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    if isinstance(pipe_or_trainer, StableDiffusion3Pipeline):
        pipe = pipe_or_trainer
    else:
        trainer = pipe_or_trainer
        components = dict(trainer.pipeline.components)
        config = {
            k: v
            for k, v in trainer.pipeline.scheduler.config.items()
            if k not in ("noise_level", "sde_type", "sde_window")
        }
        components["scheduler"] = FlowMatchEulerDiscreteScheduler.from_config(config)
        components["transformer"] = trainer.unwrapped_transformer
        pipe = StableDiffusion3Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    was_training = pipe.transformer.training
    pipe.transformer.eval()
    images = []
    for index, row in enumerate(rows):
        images.append(
            pipe(
                [row["prompt"]] * per_row,
                height=8,
                width=8,
                num_inference_steps=num_inference_steps,
                guidance_scale=1.0,
                max_sequence_length=8,
                generator=torch.Generator().manual_seed(seed + index),
                output_type="pt",
            ).images
        )
    pipe.transformer.train(was_training)
    return torch.cat(images)


def evaluate(part: str, model, settings: dict, classifier) -> dict:
    """Mean reward (and its standard error) on the part's fixed test noises; for `learn` also the digit accuracy."""
    from diffusers_ext.rewards import BrightnessReward

    rows = settings["eval_rows"]
    per_row = math.ceil(settings["eval_samples"] / len(rows))
    images = euler_images(model, rows, per_row, settings["num_inference_steps"], TEST_SEED)
    labels = [row["label"] for row in rows for _ in range(per_row)]
    probabilities = digit_probabilities(classifier, images, labels)
    if part == "learn":
        rewards = torch.tensor(BrightnessReward(settings["brightness_target"])(None, images))
    else:
        rewards = (probabilities >= settings["threshold"]).float()
    from diffusers_ext.rewards.classifier import _class_probabilities

    accuracy = (_class_probabilities(classifier, images).argmax(1) == torch.as_tensor(labels)).float().mean()
    return {
        "reward": rewards.mean().item(),
        "standard_error": (rewards.std() / math.sqrt(len(rewards))).item(),
        "n": len(rewards),
        "digit_accuracy": accuracy.item(),
    }


# ----------------------------------------------------------------------------------------------------------------
# Training runs
# ----------------------------------------------------------------------------------------------------------------


def make_trainer(part: str, algorithm: str, seed: int, settings: dict, classifier, output_dir: str, max_steps: int):
    from peft import LoraConfig

    from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer, E2POConfig, E2POTrainer, zoo
    from diffusers_ext.rewards import BrightnessReward

    G = settings["num_generations"]
    common = {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "seed": seed,
        "num_generations": G,
        "per_device_train_batch_size": settings["images_per_step"],
        "num_inference_steps": settings["num_inference_steps"],
        "guidance_scale": 1.0,
        "height": 8,
        "width": 8,
        "max_sequence_length": 8,
        "learning_rate": settings["learning_rate"],
        "epsilon": settings["epsilon"],
        "num_iterations": settings["num_iterations"],
        "noise_level": settings["noise_level"],
        "init_same_noise": settings["init_same_noise"],
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }
    if part == "learn":
        reward = BrightnessReward(settings["brightness_target"])
    else:
        reward = ThresholdedDigitReward(classifier, settings["threshold"])
    # One dataset row per group slot (prompts cycled), so every step draws every row once.
    groups, prompts = settings["images_per_step"] // G, settings["train_rows"]
    rows = [prompts[i % len(prompts)] for i in range(max(groups, len(prompts)))]
    if algorithm == "grpo":
        config, trainer_class = DiffusionGRPOConfig(**common), DiffusionGRPOTrainer
    else:
        anchors = G // 4
        config = E2POConfig(
            e2po_num_anchors=anchors,
            e2po_num_directions=3 if (G - anchors) % 6 == 0 else 1,
            e2po_init_scale=settings.get("e2po_init_scale", settings["e2po_max_scale"] / 2),
            e2po_min_scale=min(0.02, settings["e2po_max_scale"] / 2),
            e2po_max_scale=settings["e2po_max_scale"],
            e2po_target_std=settings["e2po_target_std"],
            e2po_max_reward_drop=settings["e2po_max_reward_drop"],
            **common,
        )
        trainer_class = E2POTrainer
    lora = LoraConfig(r=settings["lora_rank"], lora_alpha=2 * settings["lora_rank"], init_lora_weights="gaussian")
    return trainer_class(zoo.load("digits-sd3"), [reward], config, train_dataset=rows, peft_config=lora)


def run(job) -> dict:
    """One training run (a part, an algorithm, a seed) with evaluations every `eval_every` steps."""
    part, algorithm, seed, settings = job
    quiet()
    from diffusers_ext import zoo

    classifier = zoo.load("digits-classifier")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = make_trainer(part, algorithm, seed, settings, classifier, output_dir, settings["max_steps"])
        evals = [(0, evaluate(part, trainer, settings, classifier))]
        while trainer.global_step < settings["max_steps"]:
            trainer.train(trainer.global_step + settings["eval_every"])
            evals.append((trainer.global_step, evaluate(part, trainer, settings, classifier)))
            print(
                f"{part} {algorithm} seed {seed} step {trainer.global_step}: eval {evals[-1][1]['reward']:.4f}",
                flush=True,
            )
    keys = [
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "time/step",
        "time/sampling",
        "time/reward",
        "time/optimization",
        "time/transformer_forward",
        "time/transformer_backward",
        "time/overhead_fraction",
        "clip_ratio/region_mean",
        "e2po/scale",
        "e2po/anchor_reward",
        "e2po/perturbed_reward",
        "e2po/reward_drop",
        "e2po/frac_scale_at_max",
    ]
    history = trainer.history
    return {
        "part": part,
        "algorithm": algorithm,
        "seed": seed,
        "eval_steps": [s for s, _ in evals],
        "eval": [e for _, e in evals],
        "train": {key: [log[key] for log in history] for key in keys if key in history[0]},
        "seconds": time.perf_counter() - start,
    }


# ----------------------------------------------------------------------------------------------------------------
# Validation (regime part): every choice from validation noises and seeds, never from the test noises
# ----------------------------------------------------------------------------------------------------------------


def validate(args, classifier) -> dict:
    """Choose tau and the hard prompts, then the noise level and group size, then E2PO's scale cap.

    1. tau and hard prompts: Euler samples of the untrained model on validation noises; for each tau, the
       `num_hard_prompts` digits with the lowest accuracy; the tau whose hard-prompt accuracy is nearest the middle
       of `start_accuracy` (a binary reward with room both ways).
    2. noise level and group size: two step-0 GRPO rollout rounds per setting (validation seed); the regime is the
       one the paper targets, where groups collapse (`frac_reward_zero_std >= collapse_at_least`); among those
       settings, the one with GRPO's highest rollout reward (the baseline's best start; E2PO gets the same).
    3. E2PO's cap: the largest scale whose per-token perturbations lose at most `e2po_max_reward_drop` of reward
       against the clean prompt on the same validation noises (perturbations must not damage the prompt).
    """
    from diffusers_ext import zoo

    pipe = zoo.load("digits-sd3")
    rows = digit_rows()
    per_row = args.validation_samples
    images = euler_images(pipe, rows, per_row, args.num_inference_steps, VALIDATION_SEED)
    labels = [row["label"] for row in rows for _ in range(per_row)]
    probabilities = digit_probabilities(classifier, images, labels).view(10, per_row)
    low, high = args.start_accuracy
    sweep, chosen = [], None
    for threshold in sorted(args.thresholds):
        accuracy = (probabilities >= threshold).float().mean(dim=1)
        hard = sorted(accuracy.argsort()[: args.num_hard_prompts].tolist())
        hard_accuracy = accuracy[hard].mean().item()
        sweep.append(
            {"threshold": threshold, "per_digit": accuracy.tolist(), "hard": hard, "hard_accuracy": hard_accuracy}
        )
    chosen = min(sweep, key=lambda s: abs(s["hard_accuracy"] - (low + high) / 2))
    validation = {
        "threshold_sweep": sweep,
        "threshold": chosen["threshold"],
        "hard_digits": chosen["hard"],
        "validation_start_accuracy": chosen["hard_accuracy"],
    }
    base = base_settings(args) | {
        "threshold": chosen["threshold"],
        "train_rows": digit_rows(chosen["hard"]),
        "init_same_noise": True,
        "e2po_max_scale": max(args.max_scales),
    }

    def rollout_stats(algorithm, settings, rounds=2):
        trainer = make_trainer("regime", algorithm, VALIDATION_SEED, settings, classifier, tempfile.mkdtemp(), 1)
        stats = []
        for step in range(rounds):
            rollout = trainer.score_rollout(trainer.generate(trainer.prompt_indices(step), step))
            G = settings["num_generations"]
            grouped = rollout.rewards.view(-1, G)
            entry = {
                "reward": rollout.rewards.mean().item(),
                "frac_zero_std": (grouped.std(dim=1) <= 1e-6).float().mean().item(),
            }
            if algorithm == "e2po":
                entry["reward_drop"] = trainer.reward_drop(rollout).mean().item()
            stats.append(entry)
        return {key: sum(s[key] for s in stats) / len(stats) for key in stats[0]}

    deterministic = (probabilities[chosen["hard"]] >= chosen["threshold"]).float().mean().item()
    grid = []
    for noise_level in args.noise_levels:
        for G in args.group_sizes:
            settings = base | {"noise_level": noise_level, "num_generations": G}
            grid.append({"noise_level": noise_level, "num_generations": G, **rollout_stats("grpo", settings)})
            print(f"validation: noise {noise_level} G {G}: {grid[-1]}", flush=True)
    collapsing = [g for g in grid if g["frac_zero_std"] >= args.collapse_at_least] or grid
    best = max(collapsing, key=lambda g: (g["reward"], -g["frac_zero_std"]))
    validation.update(
        {
            "deterministic_reward": deterministic,
            "noise_group_grid": grid,
            "noise_level": best["noise_level"],
            "num_generations": best["num_generations"],
        }
    )
    scales = []
    for cap in sorted(args.max_scales):
        drop = perturbation_reward_drop(pipe, classifier, digit_rows(chosen["hard"]), cap, args, chosen["threshold"])
        scales.append({"max_scale": cap, "reward_drop": drop})
        print(f"validation: E2PO scale {cap}: reward drop {drop:.4f}", flush=True)
    allowed = [s for s in scales if s["reward_drop"] <= args.e2po_max_reward_drop]
    validation["scale_sweep"] = scales
    validation["e2po_max_scale"] = max(s["max_scale"] for s in allowed) if allowed else min(args.max_scales)
    return validation


@torch.no_grad()
def perturbation_reward_drop(pipe, classifier, rows, scale, args, threshold) -> float:
    """Reward of clean prompts minus that of per-token perturbed ones (`s = scale`, a fresh direction and an
    alternating sign per sample), paired on the same validation noises (deterministic Euler)."""
    from diffusers_ext.trainers.e2po_trainer import orthonormal_directions

    per_row, drops = args.validation_samples, []
    clean = euler_images(pipe, rows, per_row, args.num_inference_steps, VALIDATION_SEED)
    labels = [row["label"] for row in rows for _ in range(per_row)]
    clean_reward = (digit_probabilities(classifier, clean, labels) >= threshold).float()
    for index, row in enumerate(rows):
        embeds, _, pooled, _ = pipe.encode_prompt(
            row["prompt"], row["prompt"], row["prompt"], do_classifier_free_guidance=False, max_sequence_length=8
        )
        generator = torch.Generator().manual_seed(VALIDATION_SEED + 500 + index)
        signs = torch.tensor([1.0, -1.0]).repeat(per_row // 2 + 1)[:per_row]
        deltas = [
            orthonormal_directions(e[0], 1, generator, per_token=True)[0]
            for e in (embeds, pooled)
            for _ in range(per_row)
        ]
        delta_embeds = torch.stack(deltas[:per_row]) * signs[:, None, None] * scale
        delta_pooled = torch.stack(deltas[per_row:]) * signs[:, None] * scale
        images = pipe(
            prompt_embeds=embeds.expand(per_row, -1, -1) + delta_embeds,
            pooled_prompt_embeds=pooled.expand(per_row, -1) + delta_pooled,
            height=8,
            width=8,
            num_inference_steps=args.num_inference_steps,
            guidance_scale=1.0,
            generator=torch.Generator().manual_seed(VALIDATION_SEED + index),
            output_type="pt",
        ).images
        reward = (digit_probabilities(classifier, images, [row["label"]] * per_row) >= threshold).float()
        drops.append(clean_reward[index * per_row : (index + 1) * per_row].mean() - reward.mean())
    return float(torch.stack(drops).mean())


def base_settings(args) -> dict:
    return {
        "images_per_step": args.images_per_step,
        "num_generations": args.num_generations,
        "num_inference_steps": args.num_inference_steps,
        "learning_rate": args.learning_rate,
        "lora_rank": args.lora_rank,
        "epsilon": args.epsilon,
        "num_iterations": args.num_iterations,
        "noise_level": args.noise_level,
        "eval_every": args.eval_every,
        "eval_samples": args.eval_samples,
        "e2po_target_std": args.e2po_target_std,
        "e2po_max_reward_drop": args.e2po_max_reward_drop,
    }


# ----------------------------------------------------------------------------------------------------------------
# Summary, targets, outputs
# ----------------------------------------------------------------------------------------------------------------


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def summarise(results) -> dict:
    """The summary and its computed targets, from the recorded runs and settings (the run and `--from_results`)."""
    from diffusers_ext.evaluation.protocol import mean_spread, target

    runs, settings = results["runs"], results["settings"]
    seeds = [str(s) for s in settings["seeds"]]
    summary, targets, sanity = {"num_seeds": len(seeds)}, [], {}
    overheads = []
    for part in runs.values():
        for algorithm in part.values():
            overheads += [mean(r["train"]["time/overhead_fraction"]) for r in algorithm.values()]
    if "learn" in runs:
        learn = runs["learn"]["grpo"]
        gains = [learn[s]["eval"][-1]["reward"] - learn[s]["eval"][0]["reward"] for s in seeds]
        errors = [max(learn[s]["eval"][0]["standard_error"], learn[s]["eval"][-1]["standard_error"]) for s in seeds]
        summary.update(
            {
                "grpo_eval_gain_per_seed": gains,
                "eval_standard_error": max(errors),
                "eval_samples": learn[seeds[0]]["eval"][0]["n"],
                "grpo_eval_start": learn[seeds[0]]["eval"][0]["reward"],
                "grpo_eval_final": mean_spread(learn[s]["eval"][-1]["reward"] for s in seeds),
                "grpo_clip_fraction": mean(mean(learn[s]["train"]["clip_ratio/region_mean"]) for s in seeds),
            }
        )
        targets.append(
            target(
                "GRPO eval gain / eval standard error, worst seed (learn)",
                min(g / e for g, e in zip(gains, errors)),
                2.0,
            )
        )
        sanity["learn_digit_accuracy_start_vs_final"] = [
            learn[seeds[0]]["eval"][0]["digit_accuracy"],
            mean(learn[s]["eval"][-1]["digit_accuracy"] for s in seeds),
        ]
        sanity["learn_clip_fraction_positive_with_num_iterations_gt_1"] = summary["grpo_clip_fraction"] > 0
        sanity["learn_start_identical_across_seeds"] = len({learn[s]["eval"][0]["reward"] for s in seeds}) == 1
    if "regime" in runs:
        regime = runs["regime"]
        steps = regime["grpo"][seeds[0]]["eval_steps"]

        def curve(algorithm):
            return [mean(regime[algorithm][s]["eval"][i]["reward"] for s in seeds) for i in range(len(steps))]

        def frac_zero(algorithm):
            return mean(mean(regime[algorithm][s]["train"]["frac_reward_zero_std"]) for s in seeds)

        grpo_curve, e2po_curve = curve("grpo"), curve("e2po")
        grpo_final = grpo_curve[-1]
        reached = next((step for step, value in zip(steps, e2po_curve) if step > 0 and value >= grpo_final), None)
        ratio_zero = frac_zero("e2po") / frac_zero("grpo") if frac_zero("grpo") > 0 else float("nan")
        steps_ratio = reached / steps[-1] if reached is not None else float("inf")
        summary.update(
            {
                "e2po_frac_zero_std_ratio": ratio_zero,
                "e2po_steps_to_grpo_final_ratio": steps_ratio if reached is not None else None,
                "regime_grpo_frac_zero_std": frac_zero("grpo"),
                "regime_e2po_frac_zero_std": frac_zero("e2po"),
                "regime_eval_curve": {"steps": steps, "grpo": grpo_curve, "e2po": e2po_curve},
                "regime_eval_standard_error": max(
                    regime[a][s]["eval"][i]["standard_error"] for a in regime for s in seeds for i in range(len(steps))
                ),
                "regime_grpo_gain_per_seed": [
                    regime["grpo"][s]["eval"][-1]["reward"] - regime["grpo"][s]["eval"][0]["reward"] for s in seeds
                ],
                "regime_e2po_gain_per_seed": [
                    regime["e2po"][s]["eval"][-1]["reward"] - regime["e2po"][s]["eval"][0]["reward"] for s in seeds
                ],
            }
        )
        summary.setdefault("eval_samples", regime["grpo"][seeds[0]]["eval"][0]["n"])
        targets.append(target("E2PO frac_reward_zero_std / GRPO's (regime)", ratio_zero, 0.5, "<="))
        targets.append(
            target("E2PO steps to GRPO's final eval reward / GRPO's steps (regime)", steps_ratio, 0.8, "<=")
        )
        drops = [mean(regime["e2po"][s]["train"]["e2po/reward_drop"]) for s in seeds]
        start = regime["grpo"][seeds[0]]["eval"][0]["reward"]
        low, high = settings["start_accuracy"]
        sanity["regime_start_eval_reward"] = start
        sanity["regime_start_in_wanted_range"] = low <= start <= high
        sanity["regime_grpo_groups_collapse"] = frac_zero("grpo") > 0
        sanity["regime_e2po_mean_reward_drop_per_seed"] = drops
        sanity["regime_e2po_reward_drop_within_allowance"] = all(d <= settings["e2po_max_reward_drop"] for d in drops)
        scale_max = results["validation"]["e2po_max_scale"]
        scales = [v for s in seeds for v in regime["e2po"][s]["train"]["e2po/scale"]]
        sanity["regime_e2po_scale_within_bounds"] = all(0 < v <= scale_max + 1e-9 for v in scales)
    summary["trainer_overhead_fraction"] = mean(overheads)
    targets.append(target("trainer overhead fraction of step time", summary["trainer_overhead_fraction"], 0.15, "<="))
    summary["targets"] = targets
    summary["sanity"] = sanity
    return summary


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, seeds = results["runs"], [str(s) for s in results["settings"]["seeds"]]
    panels = [("learn", "reward", "learn: eval reward (-|brightness - target|)")] if "learn" in runs else []
    if "regime" in runs:
        panels += [
            ("regime", "reward", "regime: eval reward (P(digit) >= tau)"),
            ("regime", "frac_reward_zero_std", "regime: frac_reward_zero_std (training)"),
            ("regime", "e2po/scale", "regime: E2PO scale s (training)"),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    colors = {"grpo": "tab:blue", "e2po": "tab:orange"}
    for ax, (part, key, title) in zip(axes[0], panels):
        for algorithm, by_seed in runs[part].items():
            if key == "reward":
                x = by_seed[seeds[0]]["eval_steps"]
                curves = torch.tensor([[e["reward"] for e in by_seed[s]["eval"]] for s in seeds])
            elif key in by_seed[seeds[0]]["train"]:
                curves = torch.tensor([by_seed[s]["train"][key] for s in seeds])
                x = list(range(1, curves.shape[1] + 1))
            else:
                continue
            ax.plot(
                x, curves.mean(0), color=colors[algorithm], label=f"{algorithm.upper()} (mean of {len(seeds)} seeds)"
            )
            ax.fill_between(x, curves.min(0).values, curves.max(0).values, color=colors[algorithm], alpha=0.2)
        if key == "reward":
            se = results["summary"].get("eval_standard_error" if part == "learn" else "regime_eval_standard_error")
            ax.set_ylabel(f"band: min-max over seeds; eval SE {se:.4f}")
        ax.set(title=title, xlabel="step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s, v = results["summary"], results.get("validation", {})
    f = lambda x: "n/a" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))  # noqa: E731
    lines = []
    if "grpo_eval_gain_per_seed" in s:
        lines += [
            "## learn (GRPO, brightness reward)",
            "",
            f"Eval reward at step 0: {f(s['grpo_eval_start'])}; final (mean over seeds): {f(s['grpo_eval_final']['mean'])}; "
            f"gain per seed: {', '.join(f(g) for g in s['grpo_eval_gain_per_seed'])}; eval standard error "
            f"{f(s['eval_standard_error'])}; mean clip fraction {f(s['grpo_clip_fraction'])}.",
            "",
        ]
    if "e2po_frac_zero_std_ratio" in s:
        c = s["regime_eval_curve"]
        lines += [
            "## regime (GRPO vs E2PO, thresholded digit reward, hard prompts, shared initial noise)",
            "",
            f"Validation: tau {v.get('threshold')}, hard digits {v.get('hard_digits')} (validation start accuracy "
            f"{f(v.get('validation_start_accuracy'))}), noise level {v.get('noise_level')}, group size "
            f"{v.get('num_generations')}, E2PO scale cap {v.get('e2po_max_scale')}.",
            "",
            "| step | " + " | ".join(str(x) for x in c["steps"]) + " |",
            "| --- | " + " | ".join("---" for _ in c["steps"]) + " |",
            "| GRPO eval | " + " | ".join(f(x) for x in c["grpo"]) + " |",
            "| E2PO eval | " + " | ".join(f(x) for x in c["e2po"]) + " |",
            "",
            f"frac_reward_zero_std: GRPO {f(s['regime_grpo_frac_zero_std'])}, E2PO {f(s['regime_e2po_frac_zero_std'])}; "
            f"eval standard error {f(s['regime_eval_standard_error'])}.",
            "",
        ]
    lines += ["Sanity: " + "; ".join(f"{k} = {json.dumps(x)}" for k, x in s["sanity"].items())]
    return lines


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets (`summarise`'s, for the run and `--from_results`)."""
    return summarise(results)["targets"]


def write_report(results: dict, output_dir: str) -> None:
    """`e2po.json`, `.md` and `.png` in `output_dir`, through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    s = results["summary"]
    write_results(
        os.path.join(output_dir, "e2po"),
        results,
        "GRPO learning and GRPO vs E2PO on the digits-sd3 zoo model",
        report_sections(results),
        settings_line=f"{s['num_seeds']} seeds, {s.get('eval_samples')} fixed test noises per evaluation.",
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import command, rebuild_results, run_jobs

    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, args.output_dir)
        return results
    quiet()
    from diffusers_ext import zoo

    classifier = zoo.load("digits-classifier")
    results = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k != "from_results"} | {"output_dir": None},
    }
    jobs = []
    if "learn" in args.parts:
        learn = base_settings(args) | {
            "part": "learn",
            "max_steps": args.learn_steps,
            "train_rows": digit_rows(),
            "eval_rows": digit_rows(),
            "brightness_target": args.brightness_target,
            "init_same_noise": False,
        }
        jobs += [("learn", "grpo", seed, learn) for seed in args.seeds]
    if "regime" in args.parts:
        start = time.perf_counter()
        validation = validate(args, classifier)
        validation["seconds"] = time.perf_counter() - start
        results["validation"] = validation
        regime = base_settings(args) | {
            "part": "regime",
            "max_steps": args.regime_steps,
            "train_rows": digit_rows(validation["hard_digits"]),
            "eval_rows": digit_rows(validation["hard_digits"]),
            "threshold": validation["threshold"],
            "init_same_noise": True,
            "noise_level": validation["noise_level"],
            "num_generations": validation["num_generations"],
            "e2po_max_scale": validation["e2po_max_scale"],
        }
        jobs += [("regime", algorithm, seed, regime) for seed in args.seeds for algorithm in ("grpo", "e2po")]
    outputs = run_jobs(run, [(job,) for job in jobs], args.workers)
    results["runs"] = {}
    for out in outputs:
        results["runs"].setdefault(out["part"], {}).setdefault(out["algorithm"], {})[str(out["seed"])] = out
    results["summary"] = summarise(results)
    write_report(results, args.output_dir)
    print(json.dumps({k: v for k, v in results["summary"].items() if k != "regime_eval_curve"}, indent=2))
    return results


if __name__ == "__main__":
    main()
