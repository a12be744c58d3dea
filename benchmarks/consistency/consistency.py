#!/usr/bin/env python
"""Measure consistency training with AYT's manifold feature distance (MFD) against pseudo-Huber, L2 and an
LPIPS-like distance on scikit-learn's 8x8 digits: 1- and 2-step Fréchet distance against training steps.

    python benchmarks/consistency/consistency.py

In one process, on the same data, seeds and budget:

1. The MFD feature network is trained fresh with `training/train_augmentation_regressor.py` (its held-out R^2 is
   recorded); a second judge classifier is trained here (another size and seed than the zoo classifier) and used by
   no loss.
2. Every arm trains the same tiny `UNet2DModel` from scratch with easy consistency training (same ECT curriculum,
   optimiser, EMA, learning rate, steps and batch; one learning rate set a priori for all arms, tuned for none):
   `pseudo_huber`, `l2`, `mfd` (normalised-gradient update with the augmentation regressor's features) and
   `lpips_like` (the same update with the zoo classifier's unit-normalised activations: an LPIPS stand-in, labelled
   so; the zoo classifier is also judge 1, so judge 2 is the fair judge of that arm).
3. Every `--eval_every` steps the EMA weights are sampled with diffusers' `ConsistencyModelPipeline` +
   `CMStochasticIterativeScheduler` (1 and 2 steps) and judged by Fréchet distance to real held-out digits in
   each judge's feature space. The held-out digits are split into a validation half and a test half (different
   sampling seeds too): the Fréchet threshold (pseudo-Huber's final mean 1-step validation FD) is fixed on
   validation, and steps to reach it are read on the test curves.
4. Small-batch sensitivity: the same runs at batch `--small_batch` (1/8 of `--batch`) for pseudo-Huber and MFD.

Writes `benchmarks/consistency/results/consistency.json`, `consistency.md` and `consistency.png`.
"""

import argparse
import copy
import json
import math
import os
import tempfile
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
MAIN_ARMS = ("pseudo_huber", "l2", "mfd", "lpips_like")
SMALL_BATCH_ARMS = ("pseudo_huber", "mfd")
JUDGES = ("zoo_classifier", "judge2")
COLORS = {"pseudo_huber": "tab:blue", "l2": "tab:orange", "mfd": "tab:green", "lpips_like": "tab:red"}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="Optimizer steps per run (the budget).")
    parser.add_argument("--batch", type=int, default=32, help="Batch size of the main comparison.")
    parser.add_argument("--small_batch", type=int, default=4, help="Batch size of the sensitivity runs (0: skip).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds of every arm.")
    parser.add_argument("--eval_every", type=int, default=50, help="Evaluate every N steps.")
    parser.add_argument("--num_samples", type=int, default=300, help="Generated digits per evaluation.")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="Adam learning rate of every arm.")
    parser.add_argument("--num_stages", type=int, default=4, help="ECT stages.")
    parser.add_argument("--regressor_steps", type=int, default=800, help="Training steps of the MFD network.")
    parser.add_argument("--judge_steps", type=int, default=800, help="Training steps of the second judge.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where consistency.json/.md/.png go.")
    parser.add_argument(
        "--from_denoiser_steps",
        type=int,
        default=0,
        help="If > 0: every arm starts from one shared denoiser pretrained this many steps (ECT's r = 0 stage, "
        "pseudo-Huber) and tunes with stage_offset 1, as the paper tunes a pretrained model; results go to "
        "consistency_from_denoiser.json/.md/.png. 0: from scratch (consistency.json).",
    )
    parser.add_argument(
        "--zoo_only",
        action="store_true",
        help="Only measure the zoo's digits-cm (1- and 2-step FD, both judges) into consistency_zoo.json.",
    )
    add_from_results_argument(parser)
    return parser.parse_args(argv)


def build_unet():
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        norm_num_groups=8,
    )


def train_feature_network(steps: int, folder: str) -> float:
    """Run the shipped training script of the augmentation regressor; return its held-out R^2."""
    from diffusers_ext.evaluation.reporting import run_training_script

    argv = ["--output_dir", folder, "--max_train_steps", str(steps), "--report_to", "none"]
    log = run_training_script(
        REPO,
        "train_augmentation_regressor",
        [*argv, "--checkpointing_steps", str(steps)],
        env={"OMP_NUM_THREADS": "1"},
    )
    line = [x for x in log.splitlines() if "held-out R^2" in x][-1]
    return float(line.rsplit(" ", 1)[-1])


class Judges:
    """Features of both judges and the real reference statistics of the validation and test halves."""

    def __init__(self, zoo_classifier, judge2, validation: torch.Tensor, test: torch.Tensor):
        from diffusers_ext.metrics import classifier_predictions

        self.models = {"zoo_classifier": zoo_classifier, "judge2": judge2}
        self.features = classifier_predictions
        self.real = {
            (judge, split): classifier_predictions(model, images)[1]
            for judge, model in self.models.items()
            for split, images in (("validation", validation), ("test", test))
        }

    def fd(self, images: torch.Tensor, split: str) -> dict[str, float]:
        from diffusers_ext.metrics import frechet_distance

        return {
            judge: frechet_distance(self.features(model, images)[1], self.real[(judge, split)])
            for judge, model in self.models.items()
        }


def pretrain_denoiser(args, train_images) -> dict:
    """The shared starting point of `--from_denoiser_steps`: ECT's denoising stage alone (r = 0, pseudo-Huber)."""
    from diffusers_ext.losses.consistency import consistency_model_output, consistency_training_loss

    torch.manual_seed(12_345)
    unet = build_unet()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(12_345)
    for _ in range(args.from_denoiser_steps):
        clean = train_images[torch.randint(0, len(train_images), (args.batch,), generator=generator)]
        t = (torch.randn(args.batch, generator=generator) * 2.0 - 1.1).exp().clamp(0.004, 80.0)
        noise = torch.randn(clean.shape, generator=generator)
        prediction = consistency_model_output(unet, clean + t[:, None, None, None] * noise, t)
        loss = consistency_training_loss(prediction, clean, t, torch.zeros_like(t), "pseudo_huber").mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in unet.state_dict().items()}


def train_run(arm: str, seed: int, batch: int, args, train_images, distances, judges, init_state=None) -> dict:
    """One consistency-training run; returns its FD curves (per split, sampling steps and judge) and its time."""
    from diffusers import CMStochasticIterativeScheduler, ConsistencyModelPipeline, UNet2DModel
    from diffusers.training_utils import EMAModel

    from diffusers_ext.evaluation.consistency import sample_consistency_model
    from diffusers_ext.losses.consistency import (
        EasyConsistencySchedule,
        consistency_model_output,
        consistency_training_loss,
    )

    torch.manual_seed(seed)
    unet = build_unet()
    if init_state is not None:
        unet.load_state_dict(init_state)
    ema = EMAModel(
        unet.parameters(),
        decay=0.999,
        use_ema_warmup=True,
        inv_gamma=1.0,
        power=0.75,
        model_cls=UNet2DModel,
        model_config=unet.config,
    )
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=0.0)
    # From a denoiser, skip ECT's denoising stage (stage_offset 1): every stage is consistency tuning.
    schedule = EasyConsistencySchedule(
        total_steps=args.steps, num_stages=args.num_stages, stage_offset=1 if init_state is not None else 0
    )
    loss_type, distance = {
        "pseudo_huber": ("pseudo_huber", None),
        "l2": ("l2", None),
        "mfd": ("normalized_gradient", distances["mfd"]),
        "lpips_like": ("normalized_gradient", distances["lpips_like"]),
    }[arm]
    generator = torch.Generator().manual_seed(10_000 + seed)
    curves = {split: {n: {j: [] for j in JUDGES} for n in ("1", "2")} for split in ("validation", "test")}
    eval_steps, losses = [], []
    start = time.perf_counter()
    train_time = 0.0
    for step in range(args.steps):
        tick = time.perf_counter()
        clean = train_images[torch.randint(0, len(train_images), (batch,), generator=generator)]
        t, r = schedule.sample(batch, step, generator)
        noise = torch.randn(clean.shape, generator=generator)
        target = clean.clone()
        noisy_r = r > 0
        if noisy_r.any():
            with torch.no_grad():
                target[noisy_r] = consistency_model_output(
                    unet, clean[noisy_r] + r[noisy_r, None, None, None] * noise[noisy_r], r[noisy_r]
                )
        prediction = consistency_model_output(unet, clean + t[:, None, None, None] * noise, t)
        loss = consistency_training_loss(prediction, target, t, r, loss_type, distance=distance).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.step(unet.parameters())
        losses.append(loss.item())
        train_time += time.perf_counter() - tick
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model = copy.deepcopy(unet)
            ema.copy_to(model.parameters())
            pipe = ConsistencyModelPipeline(unet=model.eval(), scheduler=CMStochasticIterativeScheduler())
            pipe.set_progress_bar_config(disable=True)
            eval_steps.append(step + 1)
            for split, sample_seed in (("validation", 1_000 + seed), ("test", 2_000 + seed)):
                for n in ("1", "2"):
                    images = sample_consistency_model(pipe, args.num_samples, int(n), sample_seed)
                    for judge, value in judges.fd(images, split).items():
                        curves[split][n][judge].append(value)
    return {
        "arm": arm,
        "seed": seed,
        "batch": batch,
        "eval_steps": eval_steps,
        "curves": curves,
        "final_loss_mean_last_50": float(np.mean(losses[-50:])),
        "train_seconds": train_time,
        "total_seconds": time.perf_counter() - start,
    }


def mean_curve(runs, split, n, judge):
    return np.mean([run["curves"][split][n][judge] for run in runs], axis=0)


def steps_to_threshold(eval_steps, curve, threshold):
    """First evaluated step whose FD is <= threshold, or None if the budget never reaches it."""
    for step, value in zip(eval_steps, curve):
        if value <= threshold:
            return int(step)
    return None


def summarise_group(runs_by_arm: dict, judge: str) -> dict:
    """Curves, final FDs and steps-to-threshold of one batch-size group under one judge."""
    eval_steps = next(iter(runs_by_arm.values()))[0]["eval_steps"]
    budget = eval_steps[-1]
    out = {"fd_vs_steps": {}, "final_one_step_fd": {}, "final_two_step_fd": {}}
    for arm, runs in runs_by_arm.items():
        out["fd_vs_steps"][arm] = {
            f"{n}_step": {
                "steps": eval_steps,
                "test_mean": mean_curve(runs, "test", n, judge).tolist(),
                "test_std": np.std([r["curves"]["test"][n][judge] for r in runs], axis=0, ddof=1).tolist()
                if len(runs) > 1
                else None,
                "validation_mean": mean_curve(runs, "validation", n, judge).tolist(),
            }
            for n in ("1", "2")
        }
        for n, key in (("1", "final_one_step_fd"), ("2", "final_two_step_fd")):
            finals = [r["curves"]["test"][n][judge][-1] for r in runs]
            out[key][arm] = {
                "mean": float(np.mean(finals)),
                "std": float(np.std(finals, ddof=1)) if len(finals) > 1 else None,
                "sem": float(np.std(finals, ddof=1) / math.sqrt(len(finals))) if len(finals) > 1 else None,
                "per_seed": finals,
            }
    # Threshold fixed on validation: what the pseudo-Huber baseline reaches at the end of the budget (1 step).
    threshold = float(mean_curve(runs_by_arm["pseudo_huber"], "validation", "1", judge)[-1])
    out["threshold"] = {"value": threshold, "rule": "mean final 1-step validation FD of pseudo_huber"}
    out["steps_to_threshold"] = {}
    for arm, runs in runs_by_arm.items():
        mean_steps = steps_to_threshold(eval_steps, mean_curve(runs, "test", "1", judge), threshold)
        per_seed = [steps_to_threshold(eval_steps, r["curves"]["test"]["1"][judge], threshold) for r in runs]
        out["steps_to_threshold"][arm] = {"mean_curve": mean_steps, "per_seed": per_seed}
    ratios = {}
    base = out["steps_to_threshold"]["pseudo_huber"]["mean_curve"]
    for arm in runs_by_arm:
        steps = out["steps_to_threshold"][arm]["mean_curve"]
        # Not reaching the threshold within the budget counts as needing more than the budget.
        ratios[arm] = {
            "ratio": None if steps is None or base is None else steps / base,
            "bound": (
                f"< {steps / budget:.3g} (pseudo_huber did not reach it in {budget} steps)"
                if base is None and steps is not None
                else (f"> {budget / base:.3g} (not reached in {budget} steps)" if steps is None and base else None)
            ),
        }
    out["steps_to_threshold_ratio_vs_pseudo_huber"] = ratios
    return out


def summarise(results: dict) -> dict:
    """The summary and its computed targets, from the recorded runs (adds `sanity.headroom` to `results`)."""
    from diffusers_ext.evaluation.protocol import target

    main_runs = {
        arm: [r for r in results["runs"] if r["arm"] == arm and r["batch"] == results["config"]["batch"]]
        for arm in MAIN_ARMS
    }
    groups = {judge: summarise_group(main_runs, judge) for judge in JUDGES}
    small = {}
    if results["config"]["small_batch"]:
        small_runs = {
            arm: [r for r in results["runs"] if r["arm"] == arm and r["batch"] == results["config"]["small_batch"]]
            for arm in SMALL_BATCH_ARMS
        }
        small = {judge: summarise_group(small_runs, judge) for judge in JUDGES}
    j1 = groups["zoo_classifier"]
    ratio_entry = j1["steps_to_threshold_ratio_vs_pseudo_huber"]["mfd"]
    mfd_steps = j1["steps_to_threshold"]["mfd"]["mean_curve"]
    ph_steps = j1["steps_to_threshold"]["pseudo_huber"]["mean_curve"]
    if ratio_entry["ratio"] is not None:
        ratio_value = ratio_entry["ratio"]
    elif mfd_steps is not None and ph_steps is None:
        ratio_value = mfd_steps / results["config"]["steps"]  # an upper bound: pseudo-Huber needs > budget
    else:
        ratio_value = float("inf")
    final = {arm: j1["final_one_step_fd"][arm]["mean"] for arm in MAIN_ARMS}
    final_ratio = final["mfd"] / final["pseudo_huber"]
    j2_final = {arm: groups["judge2"]["final_one_step_fd"][arm]["mean"] for arm in MAIN_ARMS}
    targets = [
        target("mfd_steps_to_threshold_over_pseudo_huber (zoo-classifier FD, 1 step, test)", ratio_value, 0.5, "<="),
        target("mfd_final_one_step_fd_over_pseudo_huber (zoo-classifier FD, test)", final_ratio, 0.8, "<="),
        target(
            "mfd_final_one_step_fd_over_pseudo_huber (judge 2 FD, test)",
            j2_final["mfd"] / j2_final["pseudo_huber"],
            0.8,
            "<=",
        ),
    ]  # that the MFD network judges nothing is a sanity fact: `sanity.mfd_feature_network_is_a_judge`
    sanity = results["sanity"]
    best_final = min(final.values())
    sanity["headroom"] = {
        "best_arm_final_one_step_fd": best_final,
        "real_vs_real_fd_test": sanity["real_vs_real_fd"]["zoo_classifier"]["test"],
        "room_left": bool(best_final > 1.5 * sanity["real_vs_real_fd"]["zoo_classifier"]["test"]),
    }
    return {
        "fd_vs_steps": {
            arm: {
                "one_step": j1["fd_vs_steps"][arm]["1_step"],
                "two_step": j1["fd_vs_steps"][arm]["2_step"],
            }
            for arm in MAIN_ARMS
        },
        "steps_to_threshold_ratio": {
            "mfd_over_pseudo_huber": ratio_value,
            "all_arms": j1["steps_to_threshold_ratio_vs_pseudo_huber"],
            "steps": j1["steps_to_threshold"],
            "threshold": j1["threshold"],
        },
        "final_one_step_fd": final,
        "final_one_step_fd_judge2": j2_final,
        "by_judge": groups,
        "small_batch": small,
        "targets": targets,
        "sanity": sanity,
        "notes": [
            "lpips_like uses the zoo classifier's activations as its distance; the zoo classifier is also judge 1, so "
            "judge 2 (trained here, used by no loss) is the fair judge of that arm.",
            "The MFD feature network (augmentation regressor) judges nothing.",
        ],
    }


def interpolated_steps(steps, curve, level):
    """Training steps at which a decreasing FD curve first reaches `level` (linear between evaluations)."""
    if curve[0] <= level:
        return float(steps[0])  # reached at the first evaluation or earlier
    for (s0, v0), (s1, v1) in zip(zip(steps, curve), zip(steps[1:], curve[1:])):
        if v1 <= level:
            return s0 + (s1 - s0) * (v0 - level) / (v0 - v1)
    return None


def recorded_command(results: dict) -> str:
    """The results' `command`; files written before the command was recorded get the one their report printed."""
    if "command" in results:
        return results["command"]
    cfg = results["config"]
    options = (
        f" --from_denoiser_steps {cfg['from_denoiser_steps']} --steps {cfg['steps']} --num_stages "
        f"{cfg['num_stages']} --small_batch {cfg['small_batch']}"
        if cfg.get("from_denoiser_steps")
        else ""
    )
    return "python benchmarks/consistency/consistency.py" + options


def settings_line(results: dict) -> str:
    cfg = results["config"]
    return (
        f"{cfg['steps']} steps, batch {cfg['batch']}, seeds {cfg['seeds']}, {cfg['num_samples']} samples per "
        f"evaluation, tiny UNet2DModel ({results['sanity']['unet_parameters']:,} "
        + (
            "parameters) tuned from one shared denoiser (ECT's r = 0 stage) with stage_offset 1"
            if cfg.get("from_denoiser_steps")
            else "parameters) from scratch"
        )
        + ", ECT curriculum, EMA. Fréchet distance (FD) to held-out test digits; mean ± std over seeds."
    )


def report_sections(results: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s, cfg = results["summary"], results["config"]
    j = s["by_judge"]
    lines = [
        "## Headroom",
        "",
        f"Real vs real FD ({cfg['num_samples']} train digits vs the test half, as many as the generated sets): zoo classifier "
        f"{results['sanity']['real_vs_real_fd']['zoo_classifier']['test']:.2f}, judge 2 "
        f"{results['sanity']['real_vs_real_fd']['judge2']['test']:.2f}.",
    ]
    for title, group in (("Main comparison", j), ("Small batch", s["small_batch"])):
        if not group:
            continue
        lines += ["", f"## {title}", ""]
        lines += [
            "| arm | 1-step FD (zoo clf) | 2-step FD (zoo clf) | 1-step FD (judge 2) | 2-step FD (judge 2) | "
            "steps to threshold (zoo clf) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for arm in group["zoo_classifier"]["final_one_step_fd"]:
            cells = []
            for judge in JUDGES:
                for key in ("final_one_step_fd", "final_two_step_fd"):
                    e = group[judge][key][arm]
                    cells.append(f"{e['mean']:.2f} ± {e['std']:.2f}" if e["std"] is not None else f"{e['mean']:.2f}")
            steps = group["zoo_classifier"]["steps_to_threshold"][arm]["mean_curve"]
            lines.append(f"| {arm} | {' | '.join(cells)} | {steps if steps is not None else '> budget'} |")
        lines.append("")
        lines.append(
            f"Threshold (fixed on validation: pseudo-Huber's final mean 1-step validation FD, zoo classifier): "
            f"{group['zoo_classifier']['threshold']['value']:.2f}."
        )
    lines += ["", "## 1-step FD (zoo classifier, test) vs steps, main comparison", ""]
    steps = s["fd_vs_steps"]["pseudo_huber"]["one_step"]["steps"]
    lines += ["| arm | " + " | ".join(map(str, steps)) + " |", "| --- |" + " --- |" * len(steps)]
    for arm, curves in s["fd_vs_steps"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{v:.1f}" for v in curves["one_step"]["test_mean"]) + " |")
    lines += [
        "",
        "## Descriptive: steps MFD needs to reach the FD pseudo-Huber has at each step",
        "",
        "Read off the test mean curves above (linear interpolation between evaluations); not a target, since the "
        "levels come from the test curves rather than from validation.",
        "",
        "| pseudo-Huber step | its 1-step FD | MFD steps to reach it | ratio |",
        "| --- | --- | --- | --- |",
    ]
    mfd_curve = s["fd_vs_steps"]["mfd"]["one_step"]["test_mean"]
    for step, level in zip(steps, s["fd_vs_steps"]["pseudo_huber"]["one_step"]["test_mean"]):
        needed = interpolated_steps(steps, mfd_curve, level)
        if needed is None:
            cells = ("> budget", "-")
        elif mfd_curve[0] <= level:
            cells = (f"<= {steps[0]}", f"<= {steps[0] / step:.2f}")
        else:
            cells = (f"{needed:.0f}", f"{needed / step:.2f}")
        lines.append(f"| {step} | {level:.1f} | {cells[0]} | {cells[1]} |")
    lines += ["", *[f"- {n}" for n in s["notes"]]]
    return lines


TITLE = "Consistency training on 8x8 digits: MFD (AYT) vs pseudo-Huber, L2, LPIPS-like"


def write_report(results: dict, output_dir: str) -> None:
    from diffusers_ext.evaluation.reporting import write_results

    stem = "consistency_from_denoiser" if results["config"].get("from_denoiser_steps") else "consistency"
    write_results(
        os.path.join(output_dir, stem),
        results,
        TITLE,
        report_sections(results),
        settings_line(results),
        figures={".png": lambda path: write_plot(results, path)},
    )


def targets_from_results(results: dict) -> list[dict]:
    """The targets rebuilt from a results file's recorded runs (`--from_results`)."""
    return summarise(copy.deepcopy(results))["targets"]


def write_plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    panels = [("main", s["by_judge"])] + ([("small batch", s["small_batch"])] if s["small_batch"] else [])
    fig, axes = plt.subplots(len(panels), 4, figsize=(18, 4 * len(panels)), squeeze=False)
    for row, (title, group) in enumerate(panels):
        for col, (judge, n) in enumerate([(j, n) for j in JUDGES for n in ("1", "2")]):
            ax = axes[row][col]
            for arm, curves in group[judge]["fd_vs_steps"].items():
                c = curves[f"{n}_step"]
                mean = np.array(c["test_mean"])
                ax.plot(c["steps"], mean, marker="o", label=arm, color=COLORS[arm])
                if c["test_std"] is not None:
                    std = np.array(c["test_std"])
                    ax.fill_between(c["steps"], mean - std, mean + std, alpha=0.15, color=COLORS[arm])
            if n == "1":
                ax.axhline(group[judge]["threshold"]["value"], color="grey", ls="--", lw=1, label="threshold (val)")
            ax.set_yscale("log")
            ax.set_title(f"{title}: {n}-step FD, {judge}")
            ax.set_xlabel("training steps")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def is_zoo_only(results: dict) -> bool:
    """Whether a results file is the `--zoo_only` one (`consistency_zoo.json`), as its recorded command says."""
    return "--zoo_only" in results.get("command", "").split()


def validation_bar(main_path: str) -> dict:
    """Per judge, the bar the main benchmark fixed on validation before reading its test curves (pseudo-Huber's mean
    final 1-step validation FD), as recorded in the main run's results file `main_path` (`consistency.json`)."""
    if not os.path.isfile(main_path):
        raise FileNotFoundError(
            f"--zoo_only compares against the main run's validation bar; run the full benchmark first (no {main_path})."
        )
    with open(main_path, encoding="utf-8") as f:
        by_judge = json.load(f)["summary"]["by_judge"]
    return {judge: by_judge[judge]["threshold"]["value"] for judge in JUDGES}


def zoo_targets(summary: dict, bar: dict) -> list[dict]:
    """The zoo entry's targets: it trains 4x the samples of one benchmark arm (800 steps of batch 64), so its test
    1-step FD must clear the main benchmark's validation bar (`validation_bar`), per judge. For the `--zoo_only` run
    and its `--from_results` rebuild (the bar then comes from `consistency.json` beside the rebuilt file)."""
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            f"digits-cm 1-step test FD ({judge}) <= the main benchmark's validation bar",
            summary["1_step_fd_test"][judge]["mean"],
            bar[judge],
            "<=",
        )
        for judge in JUDGES
    ]


ZOO_TITLE = "The zoo's digits-cm against the main benchmark's validation bar"


def measure_zoo_model(args, argv, judges, real_vs_real) -> dict:
    """1- and 2-step FD of the zoo's `digits-cm` on the test half (3 sampling seeds), next to the real reference."""
    from diffusers_ext import zoo
    from diffusers_ext.evaluation.consistency import sample_consistency_model
    from diffusers_ext.evaluation.reporting import command

    pipe = zoo.load("digits-cm")
    pipe.set_progress_bar_config(disable=True)
    summary = {"num_samples": args.num_samples, "real_vs_real_fd_test": {j: real_vs_real[j]["test"] for j in JUDGES}}
    for n in (1, 2):
        values = [judges.fd(sample_consistency_model(pipe, args.num_samples, n, 3_000 + s), "test") for s in range(3)]
        summary[f"{n}_step_fd_test"] = {
            judge: {"mean": float(np.mean([v[judge] for v in values])), "per_seed": [v[judge] for v in values]}
            for judge in JUDGES
        }
    summary["targets"] = zoo_targets(summary, validation_bar(os.path.join(args.output_dir, "consistency.json")))
    summary["sanity"] = {
        "room_left_zoo_classifier": bool(
            summary["1_step_fd_test"]["zoo_classifier"]["mean"]
            > 1.5 * summary["real_vs_real_fd_test"]["zoo_classifier"]
        )
    }
    return {"command": command(__file__, argv), "summary": summary}


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        with open(args.from_results, encoding="utf-8") as f:
            recorded = json.load(f)
        if is_zoo_only(recorded):
            bar = validation_bar(os.path.join(os.path.dirname(os.path.abspath(args.from_results)), "consistency.json"))
            results = rebuild_results(args.from_results, lambda r: zoo_targets(r["summary"], bar), rel_to=REPO)
            write_results(os.path.join(args.output_dir, "consistency_zoo"), results, ZOO_TITLE)
            return
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        results = {"command": recorded_command(results), **results}
        write_report(results, args.output_dir)
        return
    torch.set_num_threads(1)
    from diffusers_ext import AugmentationRegressor, ManifoldFeatureDistance, zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.evaluation.consistency import ClassifierFeatureDistance, train_judge_classifier
    from diffusers_ext.metrics import classifier_accuracy, classifier_predictions, frechet_distance

    started = time.perf_counter()
    train_images, train_labels = load_digits_images("train", resolution=8)
    heldout_images, heldout_labels = load_digits_images("heldout", resolution=8)
    # Held-out digits: stratified halves, validation (choices) and test (reported once).
    order = torch.randperm(len(heldout_labels), generator=torch.Generator().manual_seed(0))
    validation_idx, test_idx = [], []
    for digit in range(10):
        members = order[heldout_labels[order] == digit].tolist()
        validation_idx += members[: len(members) // 2]
        test_idx += members[len(members) // 2 :]
    validation, test = heldout_images[validation_idx], heldout_images[test_idx]

    if not args.zoo_only:
        with tempfile.TemporaryDirectory() as folder:
            regressor_r2 = train_feature_network(args.regressor_steps, folder)
            regressor = AugmentationRegressor.from_pretrained(folder)
    zoo_classifier = zoo.load("digits-classifier")
    judge2 = train_judge_classifier(train_images, train_labels, seed=1, steps=args.judge_steps)
    judges = Judges(zoo_classifier, judge2, validation, test)
    reference = train_images[
        torch.randperm(len(train_images), generator=torch.Generator().manual_seed(1))[: args.num_samples]
    ]
    real_vs_real = {
        judge: {
            split: frechet_distance(classifier_predictions(model, reference)[1], judges.real[(judge, split)])
            for split in ("validation", "test")
        }
        for judge, model in judges.models.items()
    }
    if args.zoo_only:
        measured = measure_zoo_model(args, argv, judges, real_vs_real)
        write_results(os.path.join(args.output_dir, "consistency_zoo"), measured, ZOO_TITLE)
        print(json.dumps(measured, indent=2))
        return
    distances = {"mfd": ManifoldFeatureDistance(regressor), "lpips_like": ClassifierFeatureDistance(zoo_classifier)}
    results = {
        "command": command(__file__, argv),
        "config": {k: v for k, v in vars(args).items() if k != "from_results"} | {"output_dir": None},
        "sanity": {
            "feature_network_heldout_r2": regressor_r2,
            "zoo_classifier_heldout_accuracy": classifier_accuracy(zoo_classifier, heldout_images, heldout_labels),
            "judge2_heldout_accuracy": classifier_accuracy(judge2, heldout_images, heldout_labels),
            "real_vs_real_fd": real_vs_real,
            "validation_size": len(validation_idx),
            "test_size": len(test_idx),
            "unet_parameters": sum(p.numel() for p in build_unet().parameters()),
            "mfd_feature_network_is_a_judge": False,
        },
        "runs": [],
    }
    init_state = pretrain_denoiser(args, train_images) if args.from_denoiser_steps else None
    plan = [(arm, seed, args.batch) for arm in MAIN_ARMS for seed in args.seeds]
    if args.small_batch:
        plan += [(arm, seed, args.small_batch) for arm in SMALL_BATCH_ARMS for seed in args.seeds]
    for arm, seed, batch in plan:
        run = train_run(arm, seed, batch, args, train_images, distances, judges, init_state)
        results["runs"].append(run)
        final = run["curves"]["test"]["1"]["zoo_classifier"][-1]
        print(
            f"{arm:>13} seed {seed} batch {batch:>3}: final 1-step FD {final:.2f} ({run['total_seconds']:.0f} s)",
            flush=True,
        )
    results["summary"] = summarise(results)
    results["wall_seconds"] = time.perf_counter() - started
    write_report(results, args.output_dir)
    print(json.dumps(results["summary"]["targets"], indent=2))


if __name__ == "__main__":
    main()
