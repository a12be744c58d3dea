#!/usr/bin/env python
"""Headroom of the SD3-format mosaic model for RL: can GRPO / E2PO find anything to improve on it?

    python benchmarks/mosaic/mosaic_rl_headroom.py --model_path diffusers_ext/zoo/mosaic-sd3-64

Measures a `StableDiffusion3Pipeline`-format mosaic model (`training/train_text_to_image_sd3.py --resolution 64`)
with the exact mosaic judge (`diffusers_ext.evaluation.mosaic.MosaicEvaluator`), before any RL method is measured on
it:

- **Capability.** Test prompts of every mosaic task, judged per task, the guidance scale chosen on validation
  prompts. Targets (as for the UNet twin, `benchmarks/mosaic/mosaic_headroom.py`): single >= 0.9, count >= 0.6,
  relation >= 0.4.
- **RL.** The reward is GenEval-style (`diffusers_ext.rewards.MosaicJudgeReward`: 1 when the judge passes every
  skill check of the prompt). Its prompts are those of the tasks the model has not mastered: the tasks whose
  validation accuracy (capability part, chosen guidance) is below `--saturated_accuracy`, so the prompt set is fixed
  before any test prompt is seen. Targets: the model's mean reward on held-out (test) prompts of those tasks lies in
  [0.3, 0.7] (room both ways), and a short `DiffusionGRPOTrainer` run (LoRA, train-split prompts) shows the group
  reward std collapsing: the fraction of zero-std groups over the run's last third is at least 0.3, and higher than
  over its first third (a weak sampler's all-failure groups are zero-std from the start; that is not a collapse).
  The held-out reward after the run is reported beside them.

Protocol: validation prompts are the mosaic test split's stream with seed 1000, test prompts seed 2000, GRPO's
prompts the train split; the GRPO run's settings are fixed in advance (its arguments below), not tuned.
"""

import argparse
import os

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "mosaic_rl_headroom"
SPLIT_SEEDS = {"validation": 1000, "test": 2000}
CAPABILITY_TARGETS = {"single": 0.9, "count": 0.6, "relation": 0.4}
REWARD_RANGE = (0.3, 0.7)
ZERO_STD_MIN = 0.3


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument
    from diffusers_ext.utils import check_positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", default=None, help="A StableDiffusion3Pipeline folder of the mosaic world.")
    parser.add_argument("--capability_prompts", type=int, default=400, help="Test prompts of the capability part.")
    parser.add_argument("--validation_fraction", type=float, default=0.5, help="Validation prompts, as a fraction.")
    parser.add_argument("--guidance_grid", type=float, nargs="+", default=[3.0, 5.0, 7.5])
    parser.add_argument("--num_inference_steps", type=int, default=25)
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument("--max_sequence_length", type=int, default=8, help="T5 tokens the model was trained with.")
    parser.add_argument(
        "--saturated_accuracy",
        type=float,
        default=0.9,
        help="Tasks at or above this validation accuracy are left out of the RL prompts.",
    )
    parser.add_argument("--rl_prompts", type=int, default=200, help="Held-out prompts the reward is measured on.")
    parser.add_argument("--grpo_steps", type=int, default=40, help="Steps of the short GRPO run.")
    parser.add_argument("--prompts_per_step", type=int, default=4, help="Groups per GRPO step.")
    parser.add_argument("--num_generations", type=int, default=8, help="Images per group.")
    parser.add_argument("--rollout_steps", type=int, default=10, help="Denoising steps of each GRPO rollout.")
    parser.add_argument("--learning_rate", type=float, default=3e-4, help="GRPO's LoRA learning rate.")
    parser.add_argument("--lora_rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", default=["capability", "rl"], choices=["capability", "rl"])
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in (
        "capability_prompts",
        "num_inference_steps",
        "batch_size",
        "max_sequence_length",
        "rl_prompts",
        "grpo_steps",
        "prompts_per_step",
        "num_generations",
        "rollout_steps",
        "lora_rank",
    ):
        check_positive_int(name, getattr(args, name))
    if args.num_generations < 2:
        parser.error(
            f"--num_generations must be >= 2 (a group needs two images for a std), got {args.num_generations}."
        )
    if not 0 < args.validation_fraction <= 1:
        parser.error(f"--validation_fraction must be in (0, 1], got {args.validation_fraction}.")
    if not 0 < args.saturated_accuracy <= 1:
        parser.error(f"--saturated_accuracy must be in (0, 1], got {args.saturated_accuracy}.")
    if any(g < 1 for g in args.guidance_grid):
        parser.error(f"--guidance_grid values must be >= 1, got {args.guidance_grid}.")
    if "rl" in args.parts and "capability" not in args.parts:
        parser.error("--parts rl needs the capability part (its validation run chooses the guidance and the tasks).")
    if args.from_results is None:
        if args.model_path is None:
            parser.error("--model_path is required (a StableDiffusion3Pipeline folder of the mosaic world).")
        if not os.path.isfile(os.path.join(args.model_path, "model_index.json")):
            parser.error(f"--model_path {args.model_path!r} is not a pipeline folder (no model_index.json).")
    return args


def measure_capability(pipe, config, args) -> dict:
    from diffusers_ext.evaluation.mosaic import capability_on_validation

    return capability_on_validation(
        pipe,
        config,
        args.capability_prompts,
        args.guidance_grid,
        args.num_inference_steps,
        SPLIT_SEEDS,
        validation_fraction=args.validation_fraction,
        batch_size=args.batch_size,
        pipeline_kwargs={"max_sequence_length": args.max_sequence_length},
    )


def _records_of_tasks(config, tasks, count: int, seed: int, split: str) -> list[dict]:
    """The first `count` records of `tasks` in the mosaic stream `(seed, split)`."""
    from diffusers_ext.evaluation.mosaic import mosaic_records

    drawn = count
    while True:
        records = [r for r in mosaic_records(config, drawn, seed, split) if r["task"] in tasks]
        if len(records) >= count or drawn > 100 * count:
            return records[:count]
        drawn *= 2


def held_out_reward(pipe, config, records, guidance: float, args) -> dict:
    """Mean `MosaicJudgeReward` of the pipeline's samples (its own ODE sampler) on `records`, overall and per task."""
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator
    from diffusers_ext.rewards import MosaicJudgeReward, images_to_tensor, mosaic_reward_rows

    reward = MosaicJudgeReward(MosaicEvaluator(config))
    rows = mosaic_reward_rows(records)
    values = []
    for start in range(0, len(rows), args.batch_size):
        chunk = rows[start : start + args.batch_size]
        images = pipe(
            [r["prompt"] for r in chunk],
            height=config.resolution,
            width=config.resolution,
            num_inference_steps=args.num_inference_steps,
            guidance_scale=guidance,
            generator=torch.Generator().manual_seed(SPLIT_SEEDS["test"] * 1000 + start),
            max_sequence_length=args.max_sequence_length,
            output_type="np",
        ).images
        columns = {key: [r[key] for r in chunk] for key in ("task", "groups", "relation")}
        values += reward([r["prompt"] for r in chunk], images_to_tensor(images), **columns)
    by_task = {}
    for row, value in zip(rows, values):
        by_task.setdefault(row["task"], []).append(value)
    return {
        "mean": sum(values) / len(values),
        "n": len(values),
        "by_task": {task: sum(v) / len(v) for task, v in sorted(by_task.items())},
    }


def measure_rl(pipe, config, capability: dict, args) -> dict:
    import tempfile

    from peft import LoraConfig

    from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator
    from diffusers_ext.rewards import MosaicJudgeReward, mosaic_reward_rows

    guidance = capability["chosen"]["candidate"]
    chosen = next(v for v in capability["validation"] if v["candidate"] == guidance)["measurement"]
    tasks = sorted(t for t, accuracy in chosen["by_task"].items() if accuracy < args.saturated_accuracy)
    if not tasks:
        return {"tasks": [], "guidance_scale": guidance, "note": "every task is saturated on validation"}
    held_out = _records_of_tasks(config, tasks, args.rl_prompts, SPLIT_SEEDS["test"], "test")
    before = held_out_reward(pipe, config, held_out, guidance, args)

    train_rows = mosaic_reward_rows(_records_of_tasks(config, tasks, 2000, args.seed, "train"))
    with tempfile.TemporaryDirectory() as output_dir:
        grpo_config = DiffusionGRPOConfig(
            output_dir=output_dir,
            max_steps=args.grpo_steps,
            num_generations=args.num_generations,
            per_device_train_batch_size=args.num_generations * args.prompts_per_step,
            num_inference_steps=args.rollout_steps,
            guidance_scale=guidance,
            height=config.resolution,
            width=config.resolution,
            max_sequence_length=args.max_sequence_length,
            learning_rate=args.learning_rate,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=args.seed,
        )
        lora = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, init_lora_weights="gaussian")
        ode_scheduler = pipe.scheduler  # the trainer swaps in its SDE sampler; held-out rewards use the ODE one
        trainer = DiffusionGRPOTrainer(
            pipe, [MosaicJudgeReward(MosaicEvaluator(config))], grpo_config, train_dataset=train_rows, peft_config=lora
        )
        history = trainer.train()
        trainer.pipeline.scheduler = ode_scheduler
        after = held_out_reward(trainer.pipeline, config, held_out, guidance, args)
    zero_std = [log["frac_reward_zero_std"] for log in history]
    rewards = [log["reward"] for log in history]
    third = max(1, len(history) // 3)
    return {
        "tasks": tasks,
        "guidance_scale": guidance,
        "held_out_reward_before": before,
        "held_out_reward_after": after,
        "grpo": {
            "reward": rewards,
            "frac_reward_zero_std": zero_std,
            "first_third_zero_std": sum(zero_std[:third]) / third,
            "last_third_zero_std": sum(zero_std[-third:]) / third,
            "first_third_reward": sum(rewards[:third]) / third,
            "last_third_reward": sum(rewards[-third:]) / third,
        },
    }


def headroom_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    targets = []
    capability = summary.get("capability")
    if capability:
        by_task = capability["test"]["by_task"]
        for task, threshold in CAPABILITY_TARGETS.items():
            targets.append(target(f"capability: {task} (test)", by_task.get(task, float("nan")), threshold))
    rl = summary.get("rl")
    if rl:
        before = rl.get("held_out_reward_before", {}).get("mean", float("nan"))
        targets += [
            target("rl: held-out reward of the base model, lower end (test)", before, REWARD_RANGE[0], ">="),
            target("rl: held-out reward of the base model, upper end (test)", before, REWARD_RANGE[1], "<="),
            target(
                "rl: zero-std group fraction, last third of the GRPO run",
                rl.get("grpo", {}).get("last_third_zero_std", float("nan")),
                ZERO_STD_MIN,
            ),
            # "rises": groups whose rewards agree must become more common as the policy trains, not be a start-up
            # state (all-failure groups of a weak sampler are zero-std too)
            target(
                "rl: zero-std group fraction rises (last third minus first third)",
                rl.get("grpo", {}).get("last_third_zero_std", float("nan"))
                - rl.get("grpo", {}).get("first_third_zero_std", float("nan")),
                0.0,
                ">=",
            ),
        ]
    return targets


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = []
    capability = summary.get("capability")
    if capability:
        test = capability["test"]
        tasks = ", ".join(f"{task} {value:.2f}" for task, value in test["by_task"].items())
        lines += [
            "## Capability",
            "",
            f"Guidance {capability['chosen']['candidate']:g} (chosen on validation); test accuracy per task: {tasks} "
            f"({test['n']} prompts).",
            "",
        ]
    rl = summary.get("rl")
    if rl and rl.get("tasks"):
        grpo = rl["grpo"]
        before, after = rl["held_out_reward_before"], rl["held_out_reward_after"]
        lines += [
            "## RL",
            "",
            f"Reward prompts: the unsaturated tasks on validation ({', '.join(rl['tasks'])}), guidance "
            f"{rl['guidance_scale']:g}. Held-out reward {before['mean']:.3f} before and {after['mean']:.3f} after "
            f"{len(grpo['reward'])} GRPO steps ({before['n']} test prompts). Zero-std group fraction: first third "
            f"{grpo['first_third_zero_std']:.2f}, last third {grpo['last_third_zero_std']:.2f}; mean training reward "
            f"first third {grpo['first_third_reward']:.3f}, last third {grpo['last_third_reward']:.3f}.",
            "",
        ]
    elif rl:
        lines += ["## RL", "", f"Not run: {rl['note']}.", ""]
    return lines


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, NAME)
    title = "RL headroom of the SD3-format mosaic model"
    if args.from_results is not None:
        import json

        # the first committed run predates the "rises" row; its zero-std row is checked again as one of the two
        zero_std = "rl: zero-std group fraction, last third of the GRPO run"
        rises = "rl: zero-std group fraction rises (last third minus first third)"
        with open(args.from_results, encoding="utf-8") as f:
            recorded = [row["name"] for row in json.load(f)["summary"]["targets"]]
        replaced = {zero_std: [zero_std, rises]} if zero_std in recorded and rises not in recorded else None
        results = rebuild_results(
            args.from_results, lambda r: headroom_targets(r["summary"]), rel_to=ROOT, replaced=replaced
        )
        return write_results(stem, results, title, report_sections(results))

    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.loading import load_pipeline

    torch.manual_seed(args.seed)
    pipe = load_pipeline(args.model_path).to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    config = MosaicConfig(resolution=pipe.vae.config.sample_size)
    summary = {"capability": measure_capability(pipe, config, args)}
    if "rl" in args.parts:
        summary["rl"] = measure_rl(pipe, config, summary["capability"], args)
    summary["targets"] = headroom_targets(summary)
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "model_path")}
    results = {
        "command": command(__file__, omit=("--output_dir", "--model_path")),
        "settings": settings,
        "model": {
            "resolution": config.resolution,
            "transformer_parameters": sum(p.numel() for p in pipe.transformer.parameters()),
        },
        "summary": summary,
    }
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
