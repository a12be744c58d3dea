#!/usr/bin/env python
"""GRPO vs E2PO on the SD3-format mosaic model, with the GenEval-style judge reward on held-out prompts.

    python benchmarks/e2po/mosaic_e2po.py --model_path diffusers_ext/zoo/mosaic-sd3-64

The condition the world's RL headroom met (`benchmarks/mosaic/results/mosaic_rl_headroom.md`): on the tasks the model has
not mastered on validation (count, pair, relation), its held-out reward is 0.685, room both ways. The reward is
`MosaicJudgeReward` (1 when the exact mosaic judge passes every skill check of the prompt). Both methods train a LoRA
(`DiffusionGRPOTrainer`, `E2POTrainer`) from the same start, on the same train-split prompts, with the same images
per step and steps, for every seed of `--seeds`; the held-out reward (the pipeline's own ODE sampler, fixed noise) is
measured every `--eval_every` steps on test prompts.

Protocol: each method gets `--validation_steps`-step runs of its own grid, judged by the held-out reward on
validation prompts (the mosaic stream with seed 1000; test prompts: seed 2000), same number of runs each: GRPO its
learning rate, E2PO (at GRPO's chosen learning rate) its perturbation scale cap and number of directions. The frozen
choices are then trained for `--max_steps` with every seed and judged on test. The headroom's choices are taken as
given (disclosed): the tasks and the guidance scale (chosen there on validation), and GRPO's group size, prompts per
step, rollout steps and LoRA rank (its fixed settings).

Targets: E2PO's `frac_reward_zero_std` over the run <= 0.5x GRPO's (mean over seeds); steps for E2PO to reach GRPO's
final held-out reward <= 0.8x GRPO's steps (mean curves over seeds); E2PO's final held-out reward >= GRPO's within
2 standard errors (a difference beyond +2 SE is a win, within 2 SE a tie, below -2 SE a loss; the SE combines the
seeds' spread of both methods). Finished runs are cached under `benchmarks/.cache/mosaic_e2po/` (keyed by every
setting and the code), so an interrupted invocation resumes. Writes `benchmarks/e2po/results/mosaic_e2po.{json,md}`.
"""

import argparse
import math
import os
import tempfile
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "mosaic_e2po"
SPLIT_SEEDS = {"validation": 1000, "test": 2000}
ALGORITHMS = ("grpo", "e2po")


def _rl_headroom():
    """`benchmarks/mosaic/mosaic_rl_headroom.py` (benchmarks/ is not a package): its prompt records and held-out reward."""
    from diffusers_ext.evaluation.reporting import load_script

    return load_script(os.path.join(ROOT, "benchmarks", "mosaic", "mosaic_rl_headroom.py"))


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument
    from diffusers_ext.utils import check_positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", default=None, help="A StableDiffusion3Pipeline folder of the mosaic world.")
    parser.add_argument(
        "--tasks", nargs="+", default=["count", "pair", "relation"], help="Reward tasks (the headroom's choice)."
    )
    parser.add_argument("--guidance_scale", type=float, default=3.0, help="Guidance (the headroom's choice).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds of the test runs.")
    parser.add_argument("--max_steps", type=int, default=40, help="Steps of every test run.")
    parser.add_argument("--eval_every", type=int, default=10, help="Held-out evaluation every N steps.")
    parser.add_argument("--validation_steps", type=int, default=20, help="Steps of every validation run.")
    parser.add_argument("--eval_prompts", type=int, default=100, help="Held-out prompts per evaluation.")
    parser.add_argument("--prompts_per_step", type=int, default=4, help="Groups per step.")
    parser.add_argument("--num_generations", type=int, default=8, help="Images per group.")
    parser.add_argument("--rollout_steps", type=int, default=10, help="Denoising steps of each rollout.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="ODE steps of the held-out evaluation.")
    parser.add_argument("--lora_rank", type=int, default=8)
    parser.add_argument(
        "--learning_rates", type=float, nargs="+", default=[1.5e-4, 3e-4, 6e-4, 1.2e-3], help="GRPO's grid."
    )
    parser.add_argument(
        "--e2po_max_scales", type=float, nargs="+", default=[0.1, 0.4], help="E2PO's scale caps (grid)."
    )
    parser.add_argument("--e2po_directions", type=int, nargs="+", default=[1, 3], help="E2PO's directions (grid).")
    parser.add_argument("--e2po_anchors", type=int, default=2, help="Unperturbed members of every E2PO group.")
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument("--max_sequence_length", type=int, default=8, help="T5 tokens the model was trained with.")
    parser.add_argument("--cache_dir", default=os.path.join(ROOT, "benchmarks", ".cache", NAME))
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in (
        "max_steps",
        "eval_every",
        "validation_steps",
        "eval_prompts",
        "prompts_per_step",
        "num_generations",
        "rollout_steps",
        "num_inference_steps",
        "lora_rank",
        "batch_size",
        "max_sequence_length",
    ):
        check_positive_int(name, getattr(args, name))
    if args.max_steps % args.eval_every:
        parser.error(f"--max_steps {args.max_steps} must be a multiple of --eval_every {args.eval_every}.")
    if args.guidance_scale < 1:
        parser.error(f"--guidance_scale must be >= 1, got {args.guidance_scale}.")
    if any(lr <= 0 for lr in args.learning_rates) or any(s <= 0 for s in args.e2po_max_scales):
        parser.error(
            f"--learning_rates and --e2po_max_scales must be > 0, got {args.learning_rates}, {args.e2po_max_scales}."
        )
    members = args.num_generations - args.e2po_anchors
    bad = [d for d in args.e2po_directions if d < 1 or members % (2 * d)]
    if args.e2po_anchors < 0 or bad:
        parser.error(
            f"--e2po_directions {bad} do not divide the {members} perturbed members of a group "
            f"(--num_generations {args.num_generations} minus --e2po_anchors {args.e2po_anchors}) into +/- pairs."
        )
    if len(args.learning_rates) != len(args.e2po_max_scales) * len(args.e2po_directions):
        parser.error(
            f"the methods' validation budgets differ: {len(args.learning_rates)} GRPO settings against "
            f"{len(args.e2po_max_scales)} x {len(args.e2po_directions)} E2PO settings."
        )
    if args.from_results is None:
        if args.model_path is None:
            parser.error("--model_path is required (a StableDiffusion3Pipeline folder of the mosaic world).")
        if not os.path.isfile(os.path.join(args.model_path, "model_index.json")):
            parser.error(f"--model_path {args.model_path!r} is not a pipeline folder (no model_index.json).")
    return args


class Bench:
    """The prompts, the reward and the evaluation shared by every run."""

    def __init__(self, args):
        from diffusers_ext.data.mosaic import MosaicConfig
        from diffusers_ext.rewards import mosaic_reward_rows

        self.args, self.headroom = args, _rl_headroom()
        self.pipe = self.load()
        self.config = MosaicConfig(resolution=self.pipe.vae.config.sample_size)
        records = self.headroom._records_of_tasks
        self.eval_records = {
            split: records(self.config, args.tasks, args.eval_prompts, seed, "test")
            for split, seed in SPLIT_SEEDS.items()
        }
        self.train_rows = mosaic_reward_rows(records(self.config, args.tasks, 2000, 0, "train"))

    def load(self):
        from diffusers_ext.loading import load_pipeline

        pipe = load_pipeline(self.args.model_path).to(torch.float32)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def held_out(self, pipe, split: str) -> dict:
        """Mean judge reward of `pipe`'s ODE samples on `split`'s prompts, with its binomial standard error."""
        from diffusers_ext.evaluation.protocol import binomial_standard_error

        out = self.headroom.held_out_reward(
            pipe, self.config, self.eval_records[split], self.args.guidance_scale, self.args
        )
        out["standard_error"] = binomial_standard_error(out["mean"], out["n"])
        return out

    def trainer(self, algorithm: str, setting: dict, seed: int, output_dir: str):
        """`(trainer, ode_scheduler)`: a fresh copy of the model under `algorithm`'s trainer, and the pipeline's own
        sampler (the trainer swaps in its SDE sampler for rollouts)."""
        from peft import LoraConfig

        from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer, E2POConfig, E2POTrainer
        from diffusers_ext.evaluation.mosaic import MosaicEvaluator
        from diffusers_ext.rewards import MosaicJudgeReward

        args = self.args
        common = {
            "output_dir": output_dir,
            "max_steps": setting["steps"],
            "num_generations": args.num_generations,
            "per_device_train_batch_size": args.num_generations * args.prompts_per_step,
            "num_inference_steps": args.rollout_steps,
            "guidance_scale": args.guidance_scale,
            "height": self.config.resolution,
            "width": self.config.resolution,
            "max_sequence_length": args.max_sequence_length,
            "learning_rate": setting["learning_rate"],
            "save_strategy": "no",
            "report_to": "none",
            "disable_tqdm": True,
            "seed": seed,
        }
        if algorithm == "grpo":
            config, trainer_class = DiffusionGRPOConfig(**common), DiffusionGRPOTrainer
        else:
            config = E2POConfig(
                e2po_num_anchors=args.e2po_anchors,
                e2po_num_directions=setting["directions"],
                e2po_init_scale=setting["max_scale"] / 2,
                e2po_min_scale=min(0.02, setting["max_scale"] / 2),
                e2po_max_scale=setting["max_scale"],
                **common,
            )
            trainer_class = E2POTrainer
        lora = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, init_lora_weights="gaussian")
        reward = MosaicJudgeReward(MosaicEvaluator(self.config))
        pipe = self.load()
        ode_scheduler = pipe.scheduler
        trainer = trainer_class(pipe, [reward], config, train_dataset=self.train_rows, peft_config=lora)
        return trainer, ode_scheduler

    def run(self, algorithm: str, setting: dict, seed: int, split: str, eval_steps: list[int]) -> dict:
        """Train one run; the held-out reward on `split` at every step of `eval_steps` (after that many steps)."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as output_dir:
            trainer, ode_scheduler = self.trainer(algorithm, setting, seed, output_dir)
            evals = []
            for step in eval_steps:
                trainer.train(step)
                sde_scheduler = trainer.pipeline.scheduler
                trainer.pipeline.scheduler = ode_scheduler  # held-out rewards use the ODE sampler
                evals.append(self.held_out(trainer.pipeline, split))
                trainer.pipeline.scheduler = sde_scheduler
                print(
                    f"  {algorithm} {setting} seed {seed} step {trainer.global_step}: held-out "
                    f"{evals[-1]['mean']:.3f} ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
            history = trainer.history
        keys = ("reward", "reward_std", "frac_reward_zero_std", "e2po/scale", "e2po/reward_drop")
        return {
            "algorithm": algorithm,
            "setting": setting,
            "seed": seed,
            "eval_steps": eval_steps,
            "eval": evals,
            "train": {key: [log[key] for log in history] for key in keys if history and key in history[0]},
            "seconds": time.perf_counter() - start,
        }


def grids(args) -> dict[str, list[dict]]:
    """Each method's validation grid (equal sizes; E2PO's learning rate is filled in with GRPO's choice)."""
    return {
        "grpo": [{"learning_rate": lr} for lr in args.learning_rates],
        "e2po": [{"max_scale": s, "directions": d} for s in args.e2po_max_scales for d in args.e2po_directions],
    }


def cache_for(args):
    from diffusers_ext.evaluation.reporting import ResultCache

    settings = {k: v for k, v in vars(args).items() if k not in ("cache_dir", "output_dir", "from_results", "seeds")}
    package = os.path.join(ROOT, "diffusers_ext")
    code = [
        os.path.abspath(__file__),
        os.path.join(ROOT, "benchmarks", "mosaic", "mosaic_rl_headroom.py"),
        os.path.join(package, "trainers"),
        os.path.join(package, "rewards"),
        os.path.join(package, "evaluation", "mosaic.py"),
        os.path.join(package, "data", "mosaic.py"),
        args.model_path,
    ]
    return ResultCache(args.cache_dir, settings, code)


def cached_run(bench, cache, algorithm, setting, seed, split, eval_steps) -> dict:
    key = "_".join([split, algorithm, str(seed), *(f"{k}{v}" for k, v in sorted(setting.items()))])
    result = cache.load(key)
    if result is None:
        result = cache.save(key, bench.run(algorithm, setting, seed, split, eval_steps))
    return result


def measure(args) -> dict:
    torch.set_num_threads(1)
    bench = Bench(args)
    cache = cache_for(args)
    start_reward = {split: bench.held_out(bench.pipe, split) for split in SPLIT_SEEDS}
    print(f"start: validation {start_reward['validation']['mean']:.3f}, test {start_reward['test']['mean']:.3f}")
    validation, chosen = {}, {}
    grid = grids(args)
    val_steps = [args.validation_steps]
    for algorithm in ALGORITHMS:
        shared = {"steps": args.validation_steps}
        if algorithm == "e2po":
            shared["learning_rate"] = chosen["grpo"]["learning_rate"]
        settings = [dict(s, **shared) for s in grid[algorithm]]
        validation[algorithm] = [
            cached_run(bench, cache, algorithm, s, args.seeds[0], "validation", val_steps) for s in settings
        ]
        best = max(range(len(settings)), key=lambda i: (validation[algorithm][i]["eval"][-1]["mean"], -i))
        chosen[algorithm] = {k: v for k, v in settings[best].items() if k != "steps"}
        print(f"{algorithm}: chosen {chosen[algorithm]} on validation", flush=True)
    eval_steps = list(range(args.eval_every, args.max_steps + 1, args.eval_every))
    test = {
        algorithm: [
            cached_run(
                bench, cache, algorithm, dict(chosen[algorithm], steps=args.max_steps), seed, "test", eval_steps
            )
            for seed in args.seeds
        ]
        for algorithm in ALGORITHMS
    }
    return {"start": start_reward, "validation": validation, "chosen": chosen, "test": test}


def summarize_runs(record: dict) -> dict:
    """Mean held-out curves, the zero-std fractions and the final comparison, from the test runs."""
    from diffusers_ext.evaluation.protocol import mean_spread

    start = record["start"]["test"]["mean"]
    out = {"start_test_reward": start}
    for algorithm, runs in record["test"].items():
        steps = [0, *runs[0]["eval_steps"]]
        curve = [start] + [sum(r["eval"][i]["mean"] for r in runs) / len(runs) for i in range(len(steps) - 1)]
        zero = [sum(r["train"]["frac_reward_zero_std"]) / len(r["train"]["frac_reward_zero_std"]) for r in runs]
        out[algorithm] = {
            "steps": steps,
            "curve": curve,
            "final": mean_spread(r["eval"][-1]["mean"] for r in runs),
            "frac_reward_zero_std": mean_spread(zero),
            "train_reward": mean_spread(sum(r["train"]["reward"]) / len(r["train"]["reward"]) for r in runs),
        }
    grpo, e2po = out["grpo"], out["e2po"]
    grpo_final = grpo["curve"][-1]
    reached = next((s for s, v in zip(e2po["steps"], e2po["curve"]) if s > 0 and v >= grpo_final), None)
    out["e2po_steps_to_grpo_final"] = reached
    out["steps_ratio"] = reached / grpo["steps"][-1] if reached is not None else math.inf
    out["zero_std_ratio"] = (
        e2po["frac_reward_zero_std"]["mean"] / grpo["frac_reward_zero_std"]["mean"]
        if grpo["frac_reward_zero_std"]["mean"] > 0
        else math.nan
    )
    difference = e2po["final"]["mean"] - grpo["final"]["mean"]
    standard_error = math.sqrt(e2po["final"]["sem"] ** 2 + grpo["final"]["sem"] ** 2)
    out["final_difference"] = difference
    out["final_difference_standard_error"] = standard_error
    z = in_standard_errors(difference, standard_error)
    out["final_verdict"] = "win" if z > 2 else ("tie" if z >= -2 else "loss")
    return out


def in_standard_errors(difference: float, standard_error: float) -> float:
    """`difference / standard_error`; with no spread at all, +-inf for a difference and 0 for none."""
    if standard_error > 0:
        return difference / standard_error
    return math.copysign(math.inf, difference) if difference else 0.0


def e2po_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    return [
        target("E2PO frac_reward_zero_std / GRPO's (test runs)", summary["zero_std_ratio"], 0.5, "<="),
        target("E2PO steps to GRPO's final held-out reward / GRPO's steps", summary["steps_ratio"], 0.8, "<="),
        # met for a win or a tie: the difference is above -2 SE
        target(
            f"E2PO final held-out reward minus GRPO's, plus 2 SE ({summary['final_verdict']})",
            summary["final_difference"] + 2 * summary["final_difference_standard_error"],
            0.0,
        ),
    ]


def report_sections(results: dict) -> list[str]:
    summary, record = results["summary"], results["record"]
    lines = [
        "## Held-out reward (test prompts, mean over seeds)",
        "",
        "| method | chosen on validation | "
        + " | ".join(f"step {s}" for s in summary["grpo"]["steps"])
        + " | final (mean ± std) | frac_reward_zero_std | training reward |",
        "| --- | --- | " + " | ".join("---" for _ in summary["grpo"]["steps"]) + " | --- | --- | --- |",
    ]
    for algorithm in ALGORITHMS:
        s = summary[algorithm]
        lines.append(
            f"| {algorithm.upper()} | {record['chosen'][algorithm]} | "
            + " | ".join(f"{v:.3f}" for v in s["curve"])
            + f" | {s['final']['mean']:.3f} ± {s['final']['std']:.3f} | {s['frac_reward_zero_std']['mean']:.3f} | "
            f"{s['train_reward']['mean']:.3f} |"
        )
    lines += [
        "",
        f"Final comparison: E2PO minus GRPO {summary['final_difference']:+.3f} (SE {summary['final_difference_standard_error']:.3f}):"
        f" a {summary['final_verdict']}. E2PO reached GRPO's final curve value at step "
        f"{summary['e2po_steps_to_grpo_final']}.",
        "",
        "## Validation runs (seed of the first test run, validation prompts)",
        "",
        "| method | setting | held-out reward | frac_reward_zero_std |",
        "| --- | --- | --- | --- |",
    ]
    for algorithm in ALGORITHMS:
        for run in record["validation"][algorithm]:
            zero = run["train"]["frac_reward_zero_std"]
            lines.append(
                f"| {algorithm.upper()} | {run['setting']} | {run['eval'][-1]['mean']:.3f} | {sum(zero) / len(zero):.3f} |"
            )
    return lines + [""]


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, NAME)
    title = "GRPO vs E2PO on the SD3-format mosaic model"
    if args.from_results is not None:
        results = rebuild_results(args.from_results, lambda r: e2po_targets(r["summary"]), rel_to=ROOT)
        return write_results(stem, results, title, report_sections(results))
    record = measure(args)
    summary = summarize_runs(record)
    summary["targets"] = e2po_targets(summary)
    settings = {
        k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "model_path", "cache_dir")
    }
    results = {
        # the model's folder is recorded by name: a path would name one machine's folders
        "command": command(__file__, argv, omit=("--output_dir", "--model_path", "--cache_dir")),
        "settings": settings,
        "model": {"name": os.path.basename(os.path.normpath(args.model_path))},
        "summary": summary,
        "record": record,
    }
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
