#!/usr/bin/env python
"""DIRP against five purification baselines, each tuned on a validation class, then tested once on another class.

    python benchmarks/dirp/dirp.py

On the zoo digits DDPM (pixel space, 8x8), in one process:

1. Validation: `--num_validation_images` digits of `--validation_class` are protected with the
   `--validation_protections` at every budget. Every purifier, DIRP included, is run at each of the settings of its
   grid (`diffusers_ext.evaluation.dirp.purifiers.TUNING_GRIDS`, the same number of settings for each) and its
   setting with the best mean PSNR to the clean images is frozen.
2. Test, once: `--num_images` digits of `--target_class` are protected with every protection at every budget and
   purified by every purifier at its frozen setting. Judges independent of DIRP's objective: PSNR and SSIM to the
   clean images (DIRP never sees them). DIRP's own objective, the DDIM-inversion reconstruction error, is reported,
   not judged.
3. Downstream, at the largest budget, on `--downstream_protection`: a mimic fine-tunes the zoo DDPM on the clean,
   the protected, DIRP's and the best validation baseline's images (`--downstream_baselines all`: every baseline's),
   with `--downstream_seeds`; the Fréchet distance of its samples to unseen real digits of the class is measured in
   the zoo classifier's features (a separately trained model that DIRP does not optimise against). The headroom check (does the protection hurt the mimic at all) comes first.

Memory: the CPU peak of one purification (with and without gradient checkpointing) against one denoiser
forward+backward at the same batch. `--pretrained_model_name_or_path DIR --image_dir DIR` runs validation (the first
half of the images) and test (the rest) on a real pipeline folder, without the digits-only downstream test.

Writes `benchmarks/dirp/results/dirp.json`, `dirp.md` and `dirp.png` (or `<run_name>.*`).
"""

import argparse
import json
import os
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
TITLE = "DIRP against purification baselines, each tuned on validation"
PURIFIER_ORDER = ("jpeg", "noise", "diffpure", "gridpure", "impress", "dirp")
BASELINES = PURIFIER_ORDER[:-1]
FD_RATIO_LIMIT = 1.25


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained_model_name_or_path", default=None, help="Pipeline folder (default: zoo digits).")
    parser.add_argument("--image_dir", default=None, help="Folder of clean images (needed with a pipeline folder).")
    parser.add_argument("--resolution", type=int, default=512, help="Image side for --image_dir images.")
    parser.add_argument("--prompt", default="", help="Prompt of a text-conditioned pipeline during inversion.")
    parser.add_argument("--validation_class", type=int, default=5, help="Digit class the purifiers are tuned on.")
    parser.add_argument("--target_class", type=int, default=3, help="Digit class of the test set.")
    parser.add_argument("--num_validation_images", type=int, default=6, help="Validation images.")
    parser.add_argument("--num_images", type=int, default=16, help="Test images protected and purified.")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16], help="L-inf budgets, in 1/255 units.")
    parser.add_argument("--protections", nargs="+", default=None, help="Test protections (default: all).")
    parser.add_argument("--validation_protections", nargs="+", default=["advdm", "aspl"], help="Tuning protections.")
    parser.add_argument("--pgd_steps", type=int, default=100, help="PGD steps of each protection.")
    parser.add_argument("--pgd_step_size", type=float, default=1.0, help="PGD step, in 1/255 units.")
    parser.add_argument("--num_inversion_steps", type=int, default=5, help="DIRP's K (not tuned).")
    parser.add_argument("--inversion_strength", type=float, default=0.5, help="DIRP's partial inversion (not tuned).")
    parser.add_argument("--perceptual", default="ssim", help="DIRP's and IMPRESS's perceptual distance.")
    parser.add_argument("--batch_size", type=int, default=64, help="Images per purifier call (cells batched).")
    parser.add_argument("--max_iterations", type=int, default=None, help="Cap on the grids' Adam iterations (smoke).")
    parser.add_argument("--downstream_protection", default="aspl", help="Protection of the mimicry test.")
    parser.add_argument(
        "--downstream_baselines",
        default="best",
        choices=["best", "all"],
        help="Baselines mimicked: the one with the best validation PSNR, or all.",
    )
    parser.add_argument("--downstream_steps", type=int, default=150, help="Mimic fine-tuning steps.")
    parser.add_argument("--downstream_samples", type=int, default=200, help="Mimic samples scored.")
    parser.add_argument("--downstream_seeds", type=int, nargs="+", default=[0, 1, 2], help="Mimic seeds.")
    parser.add_argument("--skip_downstream", action="store_true", help="Skip the mimicry test (digits only).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the image choice, protections and purifiers.")
    parser.add_argument(
        "--run_name", default=None, help="Results file stem (default: dirp; with --from_results, that file's stem)."
    )
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.run_name is None:
        args.run_name = os.path.splitext(os.path.basename(args.from_results))[0] if args.from_results else "dirp"
    if (args.pretrained_model_name_or_path is None) != (args.image_dir is None):
        parser.error("--pretrained_model_name_or_path and --image_dir go together.")
    if args.batch_size < 1:
        parser.error(f"--batch_size must be positive, got {args.batch_size}.")
    if any(b <= 0 for b in args.budgets):
        parser.error(f"--budgets must be positive, got {args.budgets}.")
    if args.validation_class == args.target_class:
        parser.error(f"--validation_class and --target_class must differ, both are {args.target_class}.")
    return args


def generator(seed):
    return torch.Generator().manual_seed(seed)


def load_images(args, pipe):
    """`(validation, test, reference)`: clean images `(N, C, H, W)` in [-1, 1]; `reference` is the rest of the test
    class (the downstream test's real digits), or None for an image folder."""
    if args.image_dir is None:
        from diffusers_ext.data.digits import load_digits_images

        images, labels = load_digits_images("all", resolution=8)

        def shuffled(c):
            chosen = images[labels == c]
            return chosen[torch.randperm(len(chosen), generator=generator(args.seed))]

        test = shuffled(args.target_class)
        return (
            shuffled(args.validation_class)[: args.num_validation_images],
            test[: args.num_images],
            test[args.num_images :],
        )
    import PIL.Image

    files = sorted(f for f in os.listdir(args.image_dir) if f.lower().endswith((".png", ".jpg", ".jpeg", ".webp")))
    if len(files) < 2:
        raise ValueError(f"--image_dir {args.image_dir!r} needs at least 2 images (validation and test).")
    images = pipe.preprocess(
        [
            PIL.Image.open(os.path.join(args.image_dir, f)).convert("RGB").resize((args.resolution, args.resolution))
            for f in files
        ]
    )
    half = len(images) // 2
    return images[:half][: args.num_validation_images], images[half:][: args.num_images], None


def grids(args):
    from diffusers_ext.evaluation.dirp.purifiers import TUNING_GRIDS

    capped = {}
    for name in PURIFIER_ORDER:
        capped[name] = [dict(s) for s in TUNING_GRIDS[name]]
        for setting in capped[name]:
            if args.max_iterations is not None and "num_iterations" in setting:
                setting["num_iterations"] = min(setting["num_iterations"], args.max_iterations)
    return capped


def run_purifier(args, pipe, images, name, setting):
    from diffusers_ext.evaluation.dirp.purifiers import purify

    return purify(
        pipe,
        images,
        name,
        setting,
        generator=generator(args.seed + 1),
        num_inversion_steps=args.num_inversion_steps,
        inversion_strength=args.inversion_strength,
        perceptual=args.perceptual,
        prompt=args.prompt,
    ).to(images.device)


def protect_set(args, pipe, clean, method, budget):
    from diffusers_ext.evaluation.dirp.protections import protect

    return protect(
        pipe,
        clean,
        method,
        eps=budget / 255,
        num_steps=args.pgd_steps,
        step_size=args.pgd_step_size / 255,
        generator=generator(args.seed),
    )


def judge(images, clean):
    """Per-image PSNR (dB) and SSIM to the clean images, both `(N,)` numpy arrays."""
    from diffusers_ext.metrics import peak_signal_noise_ratio
    from diffusers_ext.pipelines.dirp.perceptual import ssim_distance

    psnr = peak_signal_noise_ratio(images, clean, data_range=2.0).flatten().cpu().numpy()
    ssim = (1 - ssim_distance(images, clean)).flatten().detach().cpu().numpy()
    return psnr.astype(float), ssim.astype(float)


def purify_cells(args, pipe, cells, name, setting):
    """Purify every cell's images `{key: (N, C, H, W)}` at once, in batches of `--batch_size` (each image is purified
    independently: DIRP's and IMPRESS's objectives are sums of per-image terms), and split them back."""
    images = torch.cat(list(cells.values()))
    out = torch.cat([run_purifier(args, pipe, chunk, name, setting) for chunk in images.split(args.batch_size)]).split(
        [len(v) for v in cells.values()]
    )
    return dict(zip(cells, out))


def validate(args, pipe, clean):
    """Run every purifier's grid on the validation cells; the best mean PSNR to clean is each one's frozen choice."""
    cells = {
        f"{m}@{b}": protect_set(args, pipe, clean, m, b) for b in args.budgets for m in args.validation_protections
    }
    record = {"none": {key: float(judge(p, clean)[0].mean()) for key, p in cells.items()}, "grids": {}, "choice": {}}
    for name, grid in grids(args).items():
        rows = []
        for setting in grid:
            start = time.perf_counter()
            outputs = purify_cells(args, pipe, cells, name, setting)
            per_cell = {key: judge(images, clean) for key, images in outputs.items()}
            rows.append(
                {
                    "setting": setting,
                    "psnr": float(np.mean([v[0].mean() for v in per_cell.values()])),
                    "ssim": float(np.mean([v[1].mean() for v in per_cell.values()])),
                    "psnr_per_cell": {key: float(v[0].mean()) for key, v in per_cell.items()},
                    "seconds": time.perf_counter() - start,
                }
            )
            print(f"validation {name} {setting}: psnr {rows[-1]['psnr']:.2f}", flush=True)
        best = max(range(len(rows)), key=lambda i: rows[i]["psnr"])
        record["grids"][name] = rows
        record["choice"][name] = rows[best]["setting"]
    return record


def run_test_split(args, pipe, clean, choice, protections):
    """The frozen choices on every (protection, budget) cell of the test set; per-image judges kept for the summary."""
    from diffusers_ext.evaluation.dirp.protections import protection_loss
    from diffusers_ext.evaluation.protocol import mean_spread

    def recon(images):
        return float(
            pipe.reconstruction_error(images, args.num_inversion_steps, args.inversion_strength, args.prompt).mean()
        )

    keys = [(method, budget) for budget in args.budgets for method in protections]
    protected = {f"{m}@{b}": protect_set(args, pipe, clean, m, b) for m, b in keys}
    outputs = {key: {"none": images} for key, images in protected.items()}
    seconds = {}
    for name in PURIFIER_ORDER:
        start = time.perf_counter()
        for key, images in purify_cells(args, pipe, protected, name, choice[name]).items():
            outputs[key][name] = images
        seconds[name] = time.perf_counter() - start
        print(f"test {name} done ({seconds[name]:.0f} s)", flush=True)
    grid, per_image, kept = {}, {}, {}
    for method, budget in keys:
        key = f"{method}@{budget}"
        grid[key], per_image[key] = {}, {}
        for name, images in outputs[key].items():
            psnr, ssim = judge(images, clean)
            per_image[key][name] = (psnr, ssim)
            loss = protection_loss(pipe, method, images, clean, generator(args.seed + 99))
            grid[key][name] = {
                "psnr": mean_spread(psnr.tolist())["mean"],
                "psnr_sem": mean_spread(psnr.tolist())["sem"],
                "ssim": float(ssim.mean()),
                "recon_error": recon(images),
                "protection_loss": float(loss.mean()),
            }
        grid[key]["clean_protection_loss"] = float(
            protection_loss(pipe, method, clean, clean, generator(args.seed + 99)).mean()
        )
        if budget == max(args.budgets) and method == args.downstream_protection:
            kept = {name: images.cpu() for name, images in outputs[key].items()}
        print(f"test {key}: " + ", ".join(f"{k} {per_image[key][k][0].mean():.2f}" for k in outputs[key]), flush=True)
    return grid, per_image, kept, seconds


def by_budget(args, per_image, protections):
    """Per budget and purifier: PSNR/SSIM averaged over protections per image, then mean and SE over images; and the
    paired PSNR difference of DIRP to the best baseline (the baseline with the highest mean)."""
    from diffusers_ext.evaluation.protocol import mean_spread

    out = {}
    for budget in args.budgets:
        row = {}
        for name in ("none", *PURIFIER_ORDER):
            psnr = np.mean([per_image[f"{m}@{budget}"][name][0] for m in protections], axis=0)
            ssim = np.mean([per_image[f"{m}@{budget}"][name][1] for m in protections], axis=0)
            row[name] = {"psnr": mean_spread(psnr.tolist()), "ssim": mean_spread(ssim.tolist())}
        best = max(BASELINES, key=lambda n: row[n]["psnr"]["mean"])
        diff = np.mean(
            [per_image[f"{m}@{budget}"]["dirp"][0] - per_image[f"{m}@{budget}"][best][0] for m in protections], axis=0
        )
        out[str(budget)] = {
            "purifiers": {n: {k: {"mean": v["mean"], "sem": v["sem"]} for k, v in r.items()} for n, r in row.items()},
            "best_baseline": best,
            "dirp_minus_best_baseline_psnr": mean_spread(diff.tolist()),
        }
    return out


def measure_memory(pipe, images):
    """Peak bytes of one DIRP iteration with/without checkpointing, and of one denoiser forward+backward."""
    from diffusers_ext.metrics import peak_memory_bytes

    device = pipe._execution_device

    def purify(checkpointing):
        return lambda: pipe(
            images,
            num_inversion_steps=5,
            inversion_strength=0.5,
            num_iterations=1,
            gradient_checkpointing=checkpointing,
            output_type="pt",
        )

    latents = pipe.encode_images(images.to(device)).detach()
    noise_fn = pipe.noise_function(len(images), device)

    def forward_backward():
        z = latents.clone().requires_grad_(True)
        noise_fn(z, torch.tensor(500)).sum().backward()

    pipe.unet.requires_grad_(False)
    reference = peak_memory_bytes(forward_backward, device)
    with_checkpointing = peak_memory_bytes(purify(True), device)
    without = peak_memory_bytes(purify(False), device)
    return {
        "batch_size": len(images),
        "num_inversion_steps": 5,
        "denoiser_forward_backward_bytes": reference,
        "dirp_checkpointed_bytes": with_checkpointing,
        "dirp_plain_bytes": without,
        "ratio_checkpointed": with_checkpointing / reference,
        "ratio_plain": without / reference,
    }


def downstream(args, ddpm, classifier, sets, reference):
    """Mimic FD and class share per set and seed; FD ratios to clean are paired by seed."""
    from diffusers_ext.evaluation.dirp.mimicry import evaluate_mimicry
    from diffusers_ext.evaluation.protocol import binomial_standard_error, mean_spread

    reports = {}
    for name, images in sets.items():
        reports[name] = [
            evaluate_mimicry(
                ddpm,
                classifier,
                images,
                args.target_class,
                num_steps=args.downstream_steps,
                num_samples=args.downstream_samples,
                reference_images=reference,
                seed=seed,
            )
            for seed in args.downstream_seeds
        ]
        print(f"downstream {name}: " + ", ".join(f"{r.frechet:.3f}" for r in reports[name]), flush=True)
    clean = [r.frechet for r in reports["clean"]]
    results = {}
    for name, rs in reports.items():
        share = float(np.mean([r.class_share for r in rs]))
        results[name] = {
            "frechet": mean_spread([r.frechet for r in rs]),
            "frechet_over_clean": mean_spread([r.frechet / c for r, c in zip(rs, clean)]),
            "class_share": share,
            "class_share_se": binomial_standard_error(share, len(rs) * args.downstream_samples),
        }
    return results


def summary_psnr(validation, name):
    """The best validation PSNR of a purifier (that of its frozen choice)."""
    return max(row["psnr"] for row in validation["grids"][name])


def judge_accuracy(classifier):
    """The zoo classifier's accuracy on the held-out real digits (all classes): the downstream judge's own check."""
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.metrics import classifier_predictions

    images, labels = load_digits_images("heldout", resolution=8)
    predictions, _ = classifier_predictions(classifier, images)
    return float((predictions.cpu() == labels).float().mean()), len(labels)


def summarise(args, validation, grid, budgets, amplification, memory, mimicry, protections, judge_check):
    """The summary's measurements and sanity checks; the targets are `targets_from_results` of the results."""
    cells = [grid[f"{p}@{b}"] for p in protections for b in args.budgets]
    summary = {
        "choice": validation["choice"],
        "validation_psnr": {n: max(r["psnr"] for r in validation["grids"][n]) for n in PURIFIER_ORDER},
        "test_by_budget": budgets,
        "recon_error_reported_not_judged": {
            "clean": amplification["clean"],
            "protected": float(np.mean([c["none"]["recon_error"] for c in cells])),
            **{n: float(np.mean([c[n]["recon_error"] for c in cells])) for n in PURIFIER_ORDER},
        },
        "inversion_amplification": amplification,
        "peak_memory_ratio": memory["ratio_checkpointed"],
        "peak_memory_ratio_without_checkpointing": memory["ratio_plain"],
    }
    sanity = {
        "protections_raise_their_objective": {
            key: bool(grid[key]["none"]["protection_loss"] > grid[key]["clean_protection_loss"]) for key in grid
        },
        "protected_psnr_to_clean_by_budget": {b: v["purifiers"]["none"]["psnr"]["mean"] for b, v in budgets.items()},
        "judges": "PSNR and SSIM to the clean images (DIRP sees only the protected ones; SSIM is also the distance of "
        "DIRP's hinge, but to its input, not to the clean image); downstream: Fréchet distance in the 128-d "
        "penultimate features of the zoo digits-classifier (ConvImageClassifier, cross-entropy on the train split), "
        "which DIRP does not optimise against (it only uses the digits-ddpm denoiser)",
        "tuning": f"{len(validation['grids']['dirp'])} settings per purifier, the best mean PSNR to clean on class "
        f"{args.validation_class} ({args.num_validation_images} images, {', '.join(args.validation_protections)} at "
        f"{', '.join(f'{b}/255' for b in args.budgets)})",
    }
    if mimicry:
        accuracy, count = judge_check
        protected = mimicry["protected"]["frechet_over_clean"]
        sanity["downstream_headroom"] = {
            "protection": f"{args.downstream_protection}@{max(args.budgets)}",
            "protected_fd_over_clean": protected,
            "protection_hurts_mimic_beyond_25pct": bool(protected["mean"] > FD_RATIO_LIMIT),
            "protection_hurts_mimic_beyond_2_se": bool(protected["mean"] - 2 * protected["sem"] > 1.0),
        }
        sanity["judge_classifier_heldout_accuracy"] = {"accuracy": accuracy, "images": count}
        summary["downstream_fd"] = {n: mimicry[n]["frechet"]["mean"] for n in mimicry}
    summary["sanity"] = sanity
    return summary


def best_baseline_mimicked(mimicry: dict) -> str:
    """The tuned baseline whose purified images gave the mimic the lowest Fréchet distance."""
    return min((n for n in BASELINES if n in mimicry), key=lambda n: mimicry[n]["frechet"]["mean"])


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded test-by-budget PSNRs, downstream mimics and memory (the measuring run
    and `--from_results`)."""
    from diffusers_ext.evaluation.protocol import target

    budgets, mimicry = results["summary"]["test_by_budget"], results["downstream"]
    targets = [
        target(
            f"test PSNR to clean at {b}/255: DIRP minus the best tuned baseline ({budgets[str(b)]['best_baseline']}), dB",
            budgets[str(b)]["dirp_minus_best_baseline_psnr"]["mean"],
            0.0,
            ">=",
        )
        for b in results["settings"]["budgets"]
    ]
    if mimicry:
        best = best_baseline_mimicked(mimicry)
        targets += [
            target(
                "downstream FD (DIRP-purified) / FD (clean)",
                mimicry["dirp"]["frechet_over_clean"]["mean"],
                FD_RATIO_LIMIT,
                "<=",
            ),
            target(
                f"downstream FD: DIRP minus the best tuned baseline mimicked ({best})",
                mimicry["dirp"]["frechet"]["mean"] - mimicry[best]["frechet"]["mean"],
                0.0,
                "<=",
            ),
        ]
    targets.append(
        target(
            "peak memory of a checkpointed purification / one denoiser forward+backward",
            results["memory"]["ratio_checkpointed"],
            2.0,
            "<=",
        )
    )
    return targets


def _fmt_setting(setting):
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s, v = results["summary"], results["validation"]
    lines = []
    if "downstream_headroom" in s["sanity"]:
        h = s["sanity"]["downstream_headroom"]
        r = h["protected_fd_over_clean"]
        lines += [
            f"**Headroom first.** A mimic fine-tuned on the {h['protection']}-protected images reaches "
            f"{r['mean']:.3f} ± {r['sem']:.3f} (SE over {r['n']} seeds) times the Fréchet distance of one fine-tuned "
            f"on the clean images; hurts beyond 25%: {h['protection_hurts_mimic_beyond_25pct']}; beyond 2 SE: "
            f"{h['protection_hurts_mimic_beyond_2_se']}.",
            "",
        ]
    lines += ["## Validation (tuning)", "", s["sanity"]["tuning"] + ". Mean PSNR to clean (dB) per setting:", ""]
    lines += ["| purifier | setting | validation PSNR | validation SSIM | chosen |", "| --- | --- | --- | --- | --- |"]
    for name in PURIFIER_ORDER:
        for row in v["grids"][name]:
            chosen = "**yes**" if row["setting"] == v["choice"][name] else ""
            lines.append(
                f"| {name} | {_fmt_setting(row['setting'])} | {row['psnr']:.2f} | {row['ssim']:.3f} | {chosen} |"
            )
    lines.append(f"| protected (no purifier) | | {np.mean(list(v['none'].values())):.2f} | | |")
    lines += [
        "",
        "## Test (once, frozen choices)",
        "",
        "PSNR (dB) and SSIM to the clean images, averaged over the protections per image; ± is the SE over images:",
        "",
    ]
    lines += [
        "| budget | " + " | ".join(["protected", *PURIFIER_ORDER]) + " |",
        "| --- " * (len(PURIFIER_ORDER) + 2) + "|",
    ]
    for budget, row in s["test_by_budget"].items():
        cells = [row["purifiers"][n] for n in ("none", *PURIFIER_ORDER)]
        lines.append(
            f"| {budget}/255 PSNR | "
            + " | ".join(f"{c['psnr']['mean']:.2f} ± {c['psnr']['sem']:.2f}" for c in cells)
            + " |"
        )
        lines.append(f"| {budget}/255 SSIM | " + " | ".join(f"{c['ssim']['mean']:.3f}" for c in cells) + " |")
    lines += [
        "",
        "Per protection and budget (PSNR dB / DDIM-inversion reconstruction error x1000, DIRP's own objective, "
        "reported only):",
        "",
        "| cell | " + " | ".join(["protected", *PURIFIER_ORDER]) + " |",
        "| --- " * (len(PURIFIER_ORDER) + 2) + "|",
    ]
    for key, cell in results["test"].items():
        row = [cell["none"], *[cell[k] for k in PURIFIER_ORDER]]
        lines.append(
            f"| {key} | " + " | ".join(f"{c['psnr']:.2f} / {1000 * c['recon_error']:.2f}" for c in row) + " |"
        )
    r, a = s["recon_error_reported_not_judged"], s["inversion_amplification"]
    lines += [
        "",
        f"Reconstruction error x1000 (not a target): clean {1000 * r['clean']:.3f}, protected {1000 * r['protected']:.3f}, "
        + ", ".join(f"{n} {1000 * r[n]:.3f}" for n in PURIFIER_ORDER)
        + ".",
        "",
        "Inversion amplification (reconstruction error x1000, protected vs random sign noise of the same L-inf size): "
        + ", ".join(
            f"{b}/255: {1000 * a['protected'][b]:.3f} vs {1000 * a['random_noise'][b]:.3f}" for b in a["protected"]
        )
        + ".",
        "",
        f"Peak memory of one purification / one denoiser forward+backward at the same batch: "
        f"{s['peak_memory_ratio']:.2f} with gradient checkpointing, {s['peak_memory_ratio_without_checkpointing']:.2f} "
        "without.",
    ]
    if results["downstream"]:
        lines += [
            "",
            "## Downstream mimicry",
            "",
            f"Judges: {s['sanity']['judges']}. Classifier held-out accuracy: "
            f"{s['sanity']['judge_classifier_heldout_accuracy']['accuracy']:.3f}.",
            "",
            "| mimic fine-tuned on | Fréchet (mean ± SE over seeds) | / clean (paired) | class share |",
            "| --- | --- | --- | --- |",
        ]
        for name, d in results["downstream"].items():
            f, q = d["frechet"], d["frechet_over_clean"]
            lines.append(
                f"| {name} | {f['mean']:.3f} ± {f['sem']:.3f} | {q['mean']:.3f} ± {q['sem']:.3f} | {d['class_share']:.3f} |"
            )
    return lines


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    panels = 2 if results["downstream"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), dpi=100, squeeze=False)
    names = ["none", *PURIFIER_ORDER]
    width = 0.8 / len(s["test_by_budget"])
    for i, (budget, row) in enumerate(s["test_by_budget"].items()):
        means = [row["purifiers"][n]["psnr"]["mean"] for n in names]
        errors = [row["purifiers"][n]["psnr"]["sem"] for n in names]
        axes[0, 0].bar(np.arange(len(names)) + i * width, means, width, yerr=errors, label=f"{budget}/255")
    axes[0, 0].set_xticks(np.arange(len(names)) + width / 2, ["protected", *PURIFIER_ORDER], rotation=30)
    axes[0, 0].set_ylabel("test PSNR to clean (dB)")
    axes[0, 0].set_title("Purification (tuned on validation), mean over protections")
    axes[0, 0].legend()
    if panels == 2:
        d = results["downstream"]
        axes[0, 1].bar(
            list(d), [v["frechet"]["mean"] for v in d.values()], yerr=[v["frechet"]["sem"] for v in d.values()]
        )
        axes[0, 1].axhline(
            FD_RATIO_LIMIT * d["clean"]["frechet"]["mean"], color="grey", linestyle="--", label="1.25 x clean"
        )
        axes[0, 1].set_ylabel("mimic Fréchet distance (lower is better)")
        axes[0, 1].set_title(f"Mimic fine-tuned on {s['sanity']['downstream_headroom']['protection']} images ...")
        axes[0, 1].tick_params(axis="x", rotation=30)
        axes[0, 1].legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        stem,
        results,
        TITLE,
        report_sections(results),
        figures={".png": lambda path: write_plot(results, path)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    stem = os.path.join(args.output_dir, args.run_name)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, stem)
        return results
    torch.set_num_threads(1)
    from diffusers_ext import DIRPPipeline, zoo
    from diffusers_ext.evaluation.dirp.protections import PROTECTIONS

    protections = args.protections or list(PROTECTIONS)
    for flag, chosen in (("--protections", protections), ("--validation_protections", args.validation_protections)):
        unknown = set(chosen) - set(PROTECTIONS)
        if unknown:
            raise SystemExit(f"{flag}: unknown {sorted(unknown)}; expected among {PROTECTIONS}.")
    if args.pretrained_model_name_or_path is None:
        ddpm = zoo.load("digits-ddpm")
        pipe = DIRPPipeline(unet=ddpm.unet, scheduler=ddpm.scheduler, null_class_label=ddpm.config.null_class_label)
    else:
        ddpm = None
        pipe = DIRPPipeline.from_pretrained(args.pretrained_model_name_or_path)
        if torch.cuda.is_available():
            pipe.to("cuda")
    run_downstream = ddpm is not None and not args.skip_downstream
    if run_downstream and args.downstream_protection not in protections:
        raise SystemExit(f"--downstream_protection {args.downstream_protection!r} must be among {protections}.")
    pipe.set_progress_bar_config(disable=True)
    validation_clean, clean, reference = load_images(args, pipe)
    device = pipe._execution_device
    validation_clean, clean = validation_clean.to(device), clean.to(device)
    started = time.perf_counter()

    validation = validate(args, pipe, validation_clean)
    print(f"frozen choices: {validation['choice']} ({time.perf_counter() - started:.0f} s)", flush=True)
    grid, per_image, kept, seconds = run_test_split(args, pipe, clean, validation["choice"], protections)
    budgets = by_budget(args, per_image, protections)

    amplification = {"protected": {}, "random_noise": {}}
    amplification["clean"] = float(
        pipe.reconstruction_error(clean, args.num_inversion_steps, args.inversion_strength, prompt=args.prompt).mean()
    )
    for budget in args.budgets:
        signs = torch.randint(0, 2, clean.shape, generator=generator(args.seed + 7)).to(device) * 2 - 1
        noisy = (clean + 2 * budget / 255 * signs).clamp(-1, 1)
        amplification["random_noise"][str(budget)] = float(
            pipe.reconstruction_error(noisy, args.num_inversion_steps, args.inversion_strength, args.prompt).mean()
        )
        amplification["protected"][str(budget)] = float(
            np.mean([grid[f"{m}@{budget}"]["none"]["recon_error"] for m in protections])
        )
    memory = measure_memory(pipe, clean[:16])
    print(f"memory: {memory} ({time.perf_counter() - started:.0f} s)", flush=True)

    mimicry, judge_check = None, None
    if run_downstream:
        classifier = zoo.load("digits-classifier")
        judge_check = judge_accuracy(classifier)
        baselines = list(BASELINES)
        if args.downstream_baselines == "best":
            baselines = [max(BASELINES, key=lambda n: summary_psnr(validation, n))]
        sets = {"clean": clean.cpu(), "protected": kept["none"], **{n: kept[n] for n in [*baselines, "dirp"]}}
        mimicry = downstream(args, ddpm, classifier, sets, reference)

    results = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
        "summary": summarise(
            args, validation, grid, budgets, amplification, memory, mimicry, protections, judge_check
        ),
        "validation": validation,
        "test": grid,
        "memory": memory,
        "test_seconds_per_purifier": seconds,
        "downstream": mimicry or {},
        "seconds": time.perf_counter() - started,
    }
    results["summary"]["targets"] = targets_from_results(results)
    write_report(results, stem)
    print(json.dumps({k: results["summary"][k] for k in ("choice", "targets")}, indent=2))
    return results


if __name__ == "__main__":
    main()
