#!/usr/bin/env python
"""GRPO vs E2PO on the digits-sd3 zoo model: reward curves, frac_reward_zero_std, in-group std, time split.

    python benchmarks/e2po.py

Both algorithms train a LoRA of the zoo's tiny SD3 model in this one process, with the same prompts (the ten digit
prompts), the same seeds, the same sampling budget per step (prompts x group size x denoising steps) and the same
optimiser; the reward is GenEval-like: 1 if the zoo digit classifier sees the digit the prompt names, else 0. Every
`--eval_every` steps each policy is evaluated on clean prompts (no perturbation) with deterministic Euler sampling
on fixed seeds, so the reward curves compare the deployable models. Writes `benchmarks/results/e2po.json`,
`e2po.md` and `e2po.png`.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Seeds; each runs both algorithms.")
    parser.add_argument("--max_steps", type=int, default=60, help="Training steps per run.")
    parser.add_argument("--prompts_per_step", type=int, default=4, help="Prompts (groups) per step.")
    parser.add_argument("--num_generations", type=int, default=8, help="Group size G.")
    parser.add_argument("--num_inference_steps", type=int, default=6, help="Denoising steps of each rollout.")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="AdamW learning rate of the LoRA.")
    parser.add_argument("--lora_rank", type=int, default=8, help="LoRA rank.")
    parser.add_argument("--num_iterations", type=int, default=1, help="Optimizer steps per generated batch.")
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight.")
    parser.add_argument("--epsilon", type=float, default=0.2, help="Ratio clip range.")
    parser.add_argument("--e2po_num_anchors", type=int, default=2, help="E2PO anchors per group.")
    parser.add_argument("--e2po_num_directions", type=int, default=3, help="E2PO directions per group.")
    parser.add_argument("--e2po_init_scale", type=float, default=0.1, help="E2PO initial relative scale.")
    parser.add_argument("--e2po_max_scale", type=float, default=0.3, help="E2PO hard upper bound of the scale.")
    parser.add_argument("--e2po_target_std", type=float, default=0.05, help="E2PO: grow the scale below this std.")
    parser.add_argument(
        "--reward",
        type=str,
        default="correct",
        choices=["correct", "probability"],
        help="'correct': 1 if the classifier sees the prompted digit (GenEval-like); 'probability': its softmax.",
    )
    parser.add_argument("--eval_every", type=int, default=10, help="Evaluate the clean policy every N steps.")
    parser.add_argument("--eval_samples_per_prompt", type=int, default=16, help="Evaluation samples per digit.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where e2po.json/.md/.png go.")
    args = parser.parse_args(argv)
    if args.max_steps % args.eval_every:
        parser.error(f"--max_steps {args.max_steps} must be a multiple of --eval_every {args.eval_every}.")
    return args


def rows():
    return [{"prompt": f"a handwritten digit {name}", "label": label} for label, name in enumerate(DIGIT_NAMES)]


@torch.no_grad()
def evaluate(trainer, classifier, samples_per_prompt: int, num_inference_steps: int) -> float:
    """Share of clean-prompt samples (deterministic Euler sampling, fixed seeds) that show the prompted digit."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from diffusers_ext.rewards import digit_accuracy

    components = dict(trainer.pipeline.components)
    components["scheduler"] = FlowMatchEulerDiscreteScheduler.from_config(
        {
            k: v
            for k, v in trainer.pipeline.scheduler.config.items()
            if k not in ("noise_level", "sde_type", "sde_window")
        }
    )
    components["transformer"] = trainer.unwrapped_transformer
    pipe = StableDiffusion3Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    transformer = trainer.unwrapped_transformer
    was_training = transformer.training
    transformer.eval()
    hits = []
    for row in rows():
        images = pipe(
            [row["prompt"]] * samples_per_prompt,
            height=8,
            width=8,
            num_inference_steps=num_inference_steps,
            guidance_scale=1.0,
            max_sequence_length=8,
            generator=torch.Generator().manual_seed(10_000 + row["label"]),
            output_type="pt",
        ).images
        hits += digit_accuracy(classifier, images, [row["label"]] * samples_per_prompt)
    transformer.train(was_training)
    return sum(hits) / len(hits)


def run(algorithm: str, seed: int, args, classifier) -> dict:
    from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer, E2POConfig, E2POTrainer, zoo
    from diffusers_ext.rewards import ClassifierReward

    common = {
        "max_steps": args.max_steps,
        "seed": seed,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.prompts_per_step * args.num_generations,
        "num_inference_steps": args.num_inference_steps,
        "guidance_scale": 1.0,
        "height": 8,
        "width": 8,
        "max_sequence_length": 8,
        "learning_rate": args.learning_rate,
        "lora_rank": args.lora_rank,
        "lora_alpha": 2 * args.lora_rank,
        "beta": args.beta,
        "epsilon": args.epsilon,
        "num_iterations": args.num_iterations,
        "timestep_fraction": 1.0,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }
    with tempfile.TemporaryDirectory() as output_dir:
        if algorithm == "grpo":
            config, trainer_class = DiffusionGRPOConfig(output_dir=output_dir, **common), DiffusionGRPOTrainer
        else:
            config = E2POConfig(
                output_dir=output_dir,
                e2po_num_anchors=args.e2po_num_anchors,
                e2po_num_directions=args.e2po_num_directions,
                e2po_init_scale=args.e2po_init_scale,
                e2po_max_scale=args.e2po_max_scale,
                e2po_target_std=args.e2po_target_std,
                **common,
            )
            trainer_class = E2POTrainer
        reward = ClassifierReward(classifier, mode=args.reward)
        reward.__name__ = f"digit_{args.reward}"
        trainer = trainer_class(zoo.load("digits-sd3"), [reward], config, train_dataset=rows())
        evals = [(0, evaluate(trainer, classifier, args.eval_samples_per_prompt, args.num_inference_steps))]
        history = []
        start = time.perf_counter()
        while trainer.global_step < args.max_steps:
            trainer.args.max_steps = trainer.global_step + args.eval_every
            history = trainer.train()
            evals.append(
                (
                    trainer.global_step,
                    evaluate(trainer, classifier, args.eval_samples_per_prompt, args.num_inference_steps),
                )
            )
            print(f"{algorithm} seed {seed} step {trainer.global_step}: eval {evals[-1][1]:.3f}", flush=True)
        seconds = time.perf_counter() - start
    keys = ["reward", "reward_std", "frac_reward_zero_std", "time/step", "time/sampling", "time/reward",
            "time/backward", "time/model", "time/overhead_fraction", "e2po/scale", "e2po/anchor_reward",
            "e2po/perturbed_reward", "kl", "clip_ratio/region_mean"]  # fmt: skip
    curves = {key: [log[key] for log in history] for key in keys if key in history[0]}
    return {
        "eval_steps": [s for s, _ in evals],
        "eval_reward": [r for _, r in evals],
        "train": curves,
        "seconds": seconds,
    }


def mean(values):
    return sum(values) / len(values)


def summarise(results, args) -> dict:
    runs = results["runs"]
    seeds = args.seeds

    def final_eval(algorithm):
        return [runs[algorithm][str(s)]["eval_reward"][-1] for s in seeds]

    def mean_curve(algorithm, key=None):
        curves = [runs[algorithm][str(s)]["eval_reward"] if key is None else runs[algorithm][str(s)]["train"][key]
                  for s in seeds]  # fmt: skip
        return [mean(values) for values in zip(*curves)]

    grpo_final = mean(final_eval("grpo"))
    e2po_curve, steps = mean_curve("e2po"), runs["e2po"][str(seeds[0])]["eval_steps"]
    reached = next((step for step, value in zip(steps, e2po_curve) if value >= grpo_final and step > 0), None)
    grpo_zero = mean([mean(runs["grpo"][str(s)]["train"]["frac_reward_zero_std"]) for s in seeds])
    e2po_zero = mean([mean(runs["e2po"][str(s)]["train"]["frac_reward_zero_std"]) for s in seeds])
    time_split = {}
    for algorithm in ("grpo", "e2po"):
        train = [runs[algorithm][str(s)]["train"] for s in seeds]
        time_split[algorithm] = {
            key.split("/")[1]: mean([mean(t[key]) for t in train])
            for key in ("time/step", "time/sampling", "time/reward", "time/backward", "time/overhead_fraction")
        }
    initial = mean([runs["grpo"][str(s)]["eval_reward"][0] for s in seeds])
    return {
        "grpo_final_reward": grpo_final,
        "grpo_raised_reward": grpo_final > initial,
        "e2po_raised_reward": mean(final_eval("e2po")) > initial,
        "e2po_final_reward": mean(final_eval("e2po")),
        "grpo_final_reward_per_seed": final_eval("grpo"),
        "e2po_final_reward_per_seed": final_eval("e2po"),
        "initial_reward": initial,
        "grpo_frac_zero_std": grpo_zero,
        "e2po_frac_zero_std": e2po_zero,
        "e2po_frac_zero_std_ratio": e2po_zero / grpo_zero if grpo_zero > 0 else None,
        "e2po_steps_to_grpo_final_ratio": reached / args.max_steps if reached is not None else None,
        "e2po_steps_to_grpo_final": reached,
        "grpo_train_reward_std": mean([mean(runs["grpo"][str(s)]["train"]["reward_std"]) for s in seeds]),
        "e2po_train_reward_std": mean([mean(runs["e2po"][str(s)]["train"]["reward_std"]) for s in seeds]),
        "e2po_mean_scale": mean([mean(runs["e2po"][str(s)]["train"]["e2po/scale"]) for s in seeds]),
        "trainer_overhead_fraction": mean([time_split[a]["overhead_fraction"] for a in time_split]),
        "time_split_seconds_per_step": time_split,
        "zoo_prompt_accuracy": results["zoo_prompt_accuracy"],
        "num_seeds": len(seeds),
        "max_steps": args.max_steps,
    }


def write_plot(results, path, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {"grpo": "tab:blue", "e2po": "tab:orange"}
    for algorithm in ("grpo", "e2po"):
        runs = [results["runs"][algorithm][str(s)] for s in args.seeds]
        steps = runs[0]["eval_steps"]
        curves = torch.tensor([r["eval_reward"] for r in runs])
        m = curves.mean(0)
        axes[0].plot(steps, m, color=colors[algorithm], label=algorithm.upper())
        axes[0].fill_between(steps, curves.min(0).values, curves.max(0).values, color=colors[algorithm], alpha=0.2)
        for panel, key in ((1, "frac_reward_zero_std"), (2, "reward_std")):
            c = torch.tensor([r["train"][key] for r in runs])
            x = range(1, c.shape[1] + 1)
            axes[panel].plot(x, c.mean(0), color=colors[algorithm], label=algorithm.upper())
            axes[panel].fill_between(x, c.min(0).values, c.max(0).values, color=colors[algorithm], alpha=0.2)
    axes[0].set(title="Clean-prompt accuracy (eval)", xlabel="step", ylabel="reward")
    axes[1].set(title="frac_reward_zero_std (training groups)", xlabel="step")
    axes[2].set(title="In-group reward std (training)", xlabel="step")
    for ax in axes:
        ax.legend()
    fig.suptitle(f"GRPO vs E2PO on digits-sd3, {len(args.seeds)} seeds (mean; band: min-max over seeds)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_markdown(results, path):
    s = results["summary"]
    fmt = lambda v: "n/a (never reached)" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [
        "# GRPO vs E2PO on the digits-sd3 zoo model",
        "",
        f"Command: `{results['command']}`",
        "",
        "| measure | GRPO | E2PO | target |",
        "| --- | --- | --- | --- |",
        f"| final clean-prompt reward (mean over seeds) | {fmt(s['grpo_final_reward'])} | "
        f"{fmt(s['e2po_final_reward'])} | both above the start ({fmt(s['initial_reward'])}) |",
        f"| per seed | {', '.join(f'{v:.3f}' for v in s['grpo_final_reward_per_seed'])} | "
        f"{', '.join(f'{v:.3f}' for v in s['e2po_final_reward_per_seed'])} | |",
        f"| mean frac_reward_zero_std | {fmt(s['grpo_frac_zero_std'])} | {fmt(s['e2po_frac_zero_std'])} | "
        "E2PO <= 0.5 x GRPO |",
        f"| mean in-group reward std | {fmt(s['grpo_train_reward_std'])} | {fmt(s['e2po_train_reward_std'])} | |",
        f"| E2PO steps to GRPO's final reward / GRPO's steps | | {fmt(s['e2po_steps_to_grpo_final_ratio'])} | <= 0.8 |",
        f"| trainer overhead fraction of step time | {fmt(s['time_split_seconds_per_step']['grpo']['overhead_fraction'])} "
        f"| {fmt(s['time_split_seconds_per_step']['e2po']['overhead_fraction'])} | <= 0.15 |",
        "",
        "Seconds per step (mean): "
        + "; ".join(
            f"{a.upper()}: step {t['step']:.2f}, sampling {t['sampling']:.2f}, reward {t['reward']:.3f}, "
            f"backward {t['backward']:.2f}"
            for a, t in s["time_split_seconds_per_step"].items()
        ),
        "",
        "Note: when GRPO does not raise the reward, its final reward lies below the start and the steps ratio only "
        "says when E2PO first dropped to it; read it together with `grpo_raised_reward` "
        f"({s['grpo_raised_reward']}).",
        "",
        f"Zoo model prompt-following accuracy (10 Euler steps, 30 samples per digit): {fmt(s['zoo_prompt_accuracy'])}.",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))
    from train_sd3_digits import evaluate_prompt_following

    from diffusers_ext import zoo

    classifier = zoo.load("digits-classifier")
    zoo_pipe = zoo.load("digits-sd3")
    zoo_pipe.set_progress_bar_config(disable=True)
    results = {
        "command": "python benchmarks/e2po.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "settings": vars(args) | {"output_dir": None},
        "zoo_prompt_accuracy": evaluate_prompt_following(zoo_pipe, classifier, 30, 10, 1.0, seed=0),
        "runs": {"grpo": {}, "e2po": {}},
    }
    for seed in args.seeds:
        for algorithm in ("grpo", "e2po"):
            results["runs"][algorithm][str(seed)] = run(algorithm, seed, args, classifier)
    results["summary"] = summarise(results, args)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "e2po.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    write_markdown(results, os.path.join(args.output_dir, "e2po.md"))
    write_plot(results, os.path.join(args.output_dir, "e2po.png"), args)
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
