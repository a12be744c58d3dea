#!/usr/bin/env python
"""DIRP against five purification baselines, on images carrying seven anti-mimicry protections at two budgets.

    python benchmarks/dirp.py

On the zoo digits DDPM (pixel space, 8x8): `--num_images` training digits of `--target_class` are protected with
every protection at every budget, then purified by every purifier. Measured per (protection, budget, purifier):
PSNR and SSIM to the clean images, the DDIM-inversion reconstruction error, the protection's own objective. The
inversion amplification is measured against random sign noise of the same L-inf size. Downstream, at the largest
budget: a mimic fine-tunes the unconditional zoo DDPM on the clean, protected and DIRP-purified sets, and the zoo
classifier scores its samples (share of the class, Fréchet distance to unseen real digits of the class). Memory:
the CPU peak of one purification (with and without gradient checkpointing) against one denoiser forward+backward at
the same batch.

`--pretrained_model_name_or_path DIR --image_dir DIR` runs the same protection x purifier grid on a real (e.g. Stable
Diffusion) pipeline folder and a folder of images, without the digits-only downstream test.

Everything runs in this one process on the same images and seeds. Writes `benchmarks/results/dirp.json`, `dirp.md`
and `dirp.png` (or `dirp-<name>.*` with `--run_name`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PURIFIER_ORDER = ("jpeg", "noise", "diffpure", "gridpure", "impress", "dirp")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained_model_name_or_path", default=None, help="Pipeline folder (default: zoo digits).")
    parser.add_argument("--image_dir", default=None, help="Folder of clean images (needed with a pipeline folder).")
    parser.add_argument("--resolution", type=int, default=512, help="Image side for --image_dir images.")
    parser.add_argument("--prompt", default="", help="Prompt of a text-conditioned pipeline during inversion.")
    parser.add_argument("--target_class", type=int, default=3, help="Digit class of the protected set (digits).")
    parser.add_argument("--num_images", type=int, default=64, help="Images protected and purified.")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16], help="L-inf budgets, in 1/255 units.")
    parser.add_argument("--protections", nargs="+", default=None, help="Subset of the protections (default: all).")
    parser.add_argument("--pgd_steps", type=int, default=100, help="PGD steps of each protection.")
    parser.add_argument("--pgd_step_size", type=float, default=1.0, help="PGD step, in 1/255 units.")
    parser.add_argument("--num_inversion_steps", type=int, default=5, help="DIRP's K.")
    parser.add_argument("--inversion_strength", type=float, default=0.5, help="DIRP's partial inversion.")
    parser.add_argument("--num_iterations", type=int, default=80, help="DIRP's and IMPRESS's Adam iterations.")
    parser.add_argument("--learning_rate", type=float, default=0.003, help="DIRP's and IMPRESS's learning rate.")
    parser.add_argument("--perceptual", default="ssim", help="DIRP's and IMPRESS's perceptual distance.")
    parser.add_argument("--perceptual_budget", type=float, default=0.02, help="DIRP's and IMPRESS's hinge threshold.")
    parser.add_argument("--jpeg_quality", type=int, default=75)
    parser.add_argument("--noise_sigma", type=float, default=0.05, help="Gaussian-noise purifier, [0, 1] units.")
    parser.add_argument("--diffpure_t", type=int, default=150, help="DiffPure's and GrIDPure's t* (GrIDPure: 2/3).")
    parser.add_argument("--downstream_steps", type=int, default=500, help="Mimic fine-tuning steps.")
    parser.add_argument("--downstream_samples", type=int, default=400, help="Mimic samples scored.")
    parser.add_argument("--downstream_seeds", type=int, nargs="+", default=[0, 1], help="Mimic seeds.")
    parser.add_argument("--skip_downstream", action="store_true", help="Skip the mimicry test (digits only).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the image choice, protections and purifiers.")
    parser.add_argument("--run_name", default="dirp", help="Results file stem.")
    parser.add_argument("--output_dir", default=RESULTS)
    args = parser.parse_args(argv)
    if (args.pretrained_model_name_or_path is None) != (args.image_dir is None):
        parser.error("--pretrained_model_name_or_path and --image_dir go together.")
    if any(b <= 0 for b in args.budgets):
        parser.error(f"--budgets must be positive, got {args.budgets}.")
    return args


def load_images(args, pipe):
    """Clean images `(N, C, H, W)` in [-1, 1], the rest of the class (downstream reference) or None."""
    if args.image_dir is None:
        from diffusers_ext.data.digits import load_digits_images

        images, labels = load_digits_images("all", resolution=8)
        images = images[labels == args.target_class]
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed))
        return images[order[: args.num_images]], images[order[args.num_images :]]
    import PIL.Image

    files = sorted(f for f in os.listdir(args.image_dir) if f.lower().endswith((".png", ".jpg", ".jpeg", ".webp")))
    if not files:
        raise ValueError(f"--image_dir {args.image_dir!r} has no .png/.jpg/.jpeg/.webp images.")
    images = [
        PIL.Image.open(os.path.join(args.image_dir, f)).convert("RGB").resize((args.resolution, args.resolution))
        for f in files[: args.num_images]
    ]
    return pipe.preprocess(images), None


def generator(seed):
    return torch.Generator().manual_seed(seed)


def purify_all(args, pipe, protected, seed):
    """Every purifier's output for one protected set, and DIRP's full output."""
    from diffusers_ext.evaluation.dirp import purifiers

    shared = {
        "num_iterations": args.num_iterations,
        "learning_rate": args.learning_rate,
        "perceptual": args.perceptual,
        "perceptual_budget": args.perceptual_budget,
    }
    outputs = {
        "jpeg": purifiers.jpeg(protected, quality=args.jpeg_quality),
        "noise": purifiers.gaussian_noise(protected, sigma=args.noise_sigma, generator=generator(seed)),
        "diffpure": purifiers.diffpure(pipe, protected, t_star=args.diffpure_t, generator=generator(seed)),
        "gridpure": purifiers.gridpure(
            pipe, protected, t_star=max(1, 2 * args.diffpure_t // 3), generator=generator(seed)
        ),
        "impress": purifiers.impress(pipe, protected, **shared),
    }
    start = time.perf_counter()
    dirp = pipe(
        protected,
        prompt=args.prompt,
        num_inversion_steps=args.num_inversion_steps,
        inversion_strength=args.inversion_strength,
        gradient_checkpointing=False,  # same result, faster on a CPU; memory is measured separately
        output_type="pt",
        **shared,
    )
    outputs["dirp"] = dirp.images.to(protected.device) * 2 - 1
    return outputs, time.perf_counter() - start


def image_metrics(args, pipe, images, clean, method, seed):
    from diffusers_ext.evaluation.dirp.protections import protection_loss
    from diffusers_ext.metrics import peak_signal_noise_ratio
    from diffusers_ext.pipelines.dirp.perceptual import ssim_distance

    return {
        "psnr": float(peak_signal_noise_ratio(images, clean, data_range=2.0).mean()),
        "ssim": float(1 - ssim_distance(images, clean).mean()),
        "recon_error": float(
            pipe.reconstruction_error(
                images, args.num_inversion_steps, args.inversion_strength, prompt=args.prompt
            ).mean()
        ),
        "protection_loss": float(protection_loss(pipe, method, images, clean, generator(seed + 99)).mean()),
    }


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
    from diffusers_ext.evaluation.dirp.mimicry import evaluate_mimicry

    results = {}
    for name, images in sets.items():
        reports = [
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
        results[name] = {
            "frechet": float(np.mean([r.frechet for r in reports])),
            "frechet_per_seed": [r.frechet for r in reports],
            "class_share": float(np.mean([r.class_share for r in reports])),
        }
        print(f"downstream {name}: {results[name]}", flush=True)
    return results


def summarise(args, grid, amplification, memory, mimicry):
    from diffusers_ext.evaluation.dirp.protections import PROTECTIONS

    protections = args.protections or list(PROTECTIONS)
    cells = [grid[f"{p}@{b}"] for p in protections for b in args.budgets]
    psnr = {name: float(np.mean([c[name]["psnr"] for c in cells])) for name in ("none", *PURIFIER_ORDER)}
    psnr_by_budget = {
        str(b): {
            name: float(np.mean([grid[f"{p}@{b}"][name]["psnr"] for p in protections]))
            for name in ("none", *PURIFIER_ORDER)
        }
        for b in args.budgets
    }
    recon = {
        "clean": amplification["clean"],
        "protected": float(np.mean([c["none"]["recon_error"] for c in cells])),
        "dirp": float(np.mean([c["dirp"]["recon_error"] for c in cells])),
    }
    summary = {
        "psnr_to_clean": {"protected": psnr.pop("none"), **psnr},
        "psnr_to_clean_by_budget": psnr_by_budget,
        "recon_error": recon,
        "inversion_amplification": amplification,
        "peak_memory_ratio": memory["ratio_checkpointed"],
        "peak_memory_ratio_without_checkpointing": memory["ratio_plain"],
    }
    best_each_budget = all(
        max(by, key=lambda k: by[k] if k != "none" else -1e9) == "dirp" for by in psnr_by_budget.values()
    )
    targets = {
        "dirp_best_psnr_at_every_budget": best_each_budget,
        "dirp_recon_error_at_or_below_clean": recon["dirp"] <= recon["clean"],
        "peak_memory_at_most_2x": memory["ratio_checkpointed"] <= 2.0,
    }
    if mimicry:
        clean_fd = mimicry["clean"]["frechet"]
        protected_fd = float(np.mean([mimicry[f"{p}/protected"]["frechet"] for p in protections]))
        dirp_fd = float(np.mean([mimicry[f"{p}/dirp"]["frechet"] for p in protections]))
        summary["downstream_frechet"] = {"clean": clean_fd, "protected": protected_fd, "dirp": dirp_fd}
        summary["downstream_class_share"] = {
            "clean": mimicry["clean"]["class_share"],
            "protected": float(np.mean([mimicry[f"{p}/protected"]["class_share"] for p in protections])),
            "dirp": float(np.mean([mimicry[f"{p}/dirp"]["class_share"] for p in protections])),
        }
        targets["dirp_downstream_within_25pct_of_clean"] = dirp_fd <= 1.25 * clean_fd
        targets["protected_downstream_beyond_25pct_of_clean"] = protected_fd > 1.25 * clean_fd
    summary["targets"] = targets
    return summary


def write_markdown(results, path):
    s = results["summary"]
    lines = [
        "# DIRP against purification baselines",
        "",
        f"Command: `{results['command']}`",
        "",
        "Mean PSNR to the clean images (dB) over the protections, per L-inf budget:",
        "",
        "| budget | protected | " + " | ".join(PURIFIER_ORDER) + " |",
        "| --- " * (len(PURIFIER_ORDER) + 2) + "|",
    ]
    for budget, row in s["psnr_to_clean_by_budget"].items():
        lines.append(
            f"| {budget}/255 | {row['none']:.2f} | " + " | ".join(f"{row[k]:.2f}" for k in PURIFIER_ORDER) + " |"
        )
    lines += [
        "",
        "Per protection and budget (PSNR dB / reconstruction error x1000):",
        "",
        "| protection | protected | " + " | ".join(PURIFIER_ORDER) + " |",
        "| --- " * (len(PURIFIER_ORDER) + 2) + "|",
    ]
    for key, cell in results["grid"].items():
        row = [cell["none"], *[cell[k] for k in PURIFIER_ORDER]]
        lines.append(
            f"| {key} | " + " | ".join(f"{c['psnr']:.2f} / {1000 * c['recon_error']:.2f}" for c in row) + " |"
        )
    r, a = s["recon_error"], s["inversion_amplification"]
    lines += [
        "",
        f"Reconstruction error (x1000): clean {1000 * r['clean']:.3f}, protected {1000 * r['protected']:.3f}, "
        f"DIRP-purified {1000 * r['dirp']:.3f}.",
        "",
        "Inversion amplification (reconstruction error x1000, protected vs random sign noise of the same L-inf size): "
        + ", ".join(
            f"{b}/255: protected {1000 * a['protected'][b]:.3f} vs noise {1000 * a['random_noise'][b]:.3f}"
            for b in a["protected"]
        )
        + ".",
        "",
        f"Peak memory of one purification / one denoiser forward+backward at the same batch: "
        f"{s['peak_memory_ratio']:.2f} with gradient checkpointing, {s['peak_memory_ratio_without_checkpointing']:.2f} "
        "without.",
    ]
    if "downstream_frechet" in s:
        d, c = s["downstream_frechet"], s["downstream_class_share"]
        lines += [
            "",
            "Downstream mimicry (Fréchet distance to unseen real digits of the class, lower is better; share of "
            "samples of the class):",
            "",
            "| fine-tuned on | Fréchet | class share |",
            "| --- | --- | --- |",
            f"| clean | {d['clean']:.3f} | {c['clean']:.3f} |",
            f"| protected (mean) | {d['protected']:.3f} | {c['protected']:.3f} |",
            f"| DIRP-purified (mean) | {d['dirp']:.3f} | {c['dirp']:.3f} |",
        ]
        for key, value in results["downstream"].items():
            lines.append(f"| {key} | {value['frechet']:.3f} | {value['class_share']:.3f} |")
    lines += ["", "Targets: " + ", ".join(f"{k}: {'met' if v else 'missed'}" for k, v in s["targets"].items()), ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    panels = 2 if "downstream_frechet" in s else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), dpi=100, squeeze=False)
    names = ["none", *PURIFIER_ORDER]
    width = 0.8 / len(s["psnr_to_clean_by_budget"])
    for i, (budget, row) in enumerate(s["psnr_to_clean_by_budget"].items()):
        axes[0, 0].bar(np.arange(len(names)) + i * width, [row[n] for n in names], width, label=f"{budget}/255")
    axes[0, 0].set_xticks(np.arange(len(names)) + width / 2, ["protected", *PURIFIER_ORDER], rotation=30)
    axes[0, 0].set_ylabel("PSNR to clean (dB)")
    axes[0, 0].set_title("Purification, mean over protections")
    axes[0, 0].legend()
    if panels == 2:
        d = s["downstream_frechet"]
        axes[0, 1].bar(["clean", "protected", "DIRP"], [d["clean"], d["protected"], d["dirp"]])
        axes[0, 1].axhline(1.25 * d["clean"], color="grey", linestyle="--", label="1.25 x clean")
        axes[0, 1].set_ylabel("Fréchet distance (lower is better)")
        axes[0, 1].set_title("Mimic fine-tuned on ...")
        axes[0, 1].legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    from diffusers_ext import DIRPPipeline, zoo
    from diffusers_ext.evaluation.dirp.protections import PROTECTIONS, protect

    if args.pretrained_model_name_or_path is None:
        ddpm = zoo.load("digits-ddpm")
        pipe = DIRPPipeline(unet=ddpm.unet, scheduler=ddpm.scheduler, null_class_label=ddpm.config.null_class_label)
    else:
        ddpm = None
        pipe = DIRPPipeline.from_pretrained(args.pretrained_model_name_or_path)
        if torch.cuda.is_available():
            pipe.to("cuda")
    pipe.set_progress_bar_config(disable=True)
    protections = args.protections or list(PROTECTIONS)
    unknown = set(protections) - set(PROTECTIONS)
    if unknown:
        raise SystemExit(f"--protections: unknown {sorted(unknown)}; expected among {PROTECTIONS}.")
    clean, reference = load_images(args, pipe)
    device = pipe._execution_device
    clean = clean.to(device)
    started = time.perf_counter()

    grid, protected_sets, dirp_sets, timings = {}, {}, {}, {}
    amplification = {"protected": {}, "random_noise": {}}
    amplification["clean"] = float(
        pipe.reconstruction_error(clean, args.num_inversion_steps, args.inversion_strength, prompt=args.prompt).mean()
    )
    for budget in args.budgets:
        eps = budget / 255
        signs = torch.randint(0, 2, clean.shape, generator=generator(args.seed + 7)).to(device) * 2 - 1
        noisy = (clean + 2 * eps * signs).clamp(-1, 1)
        amplification["random_noise"][str(budget)] = float(
            pipe.reconstruction_error(noisy, args.num_inversion_steps, args.inversion_strength, args.prompt).mean()
        )
        for method in protections:
            key = f"{method}@{budget}"
            start = time.perf_counter()
            protected = protect(
                pipe,
                clean,
                method,
                eps=eps,
                num_steps=args.pgd_steps,
                step_size=args.pgd_step_size / 255,
                generator=generator(args.seed),
            )
            protect_seconds = time.perf_counter() - start
            outputs, dirp_seconds = purify_all(args, pipe, protected, args.seed)
            grid[key] = {"none": image_metrics(args, pipe, protected, clean, method, args.seed)}
            for name, images in outputs.items():
                grid[key][name] = image_metrics(args, pipe, images, clean, method, args.seed)
            timings[key] = {"protect_seconds": protect_seconds, "dirp_seconds": dirp_seconds}
            if budget == max(args.budgets):
                protected_sets[method], dirp_sets[method] = protected.cpu(), outputs["dirp"].cpu()
            print(
                f"{key}: " + ", ".join(f"{k} {v['psnr']:.2f}" for k, v in grid[key].items()),
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        amplification["protected"][str(budget)] = float(
            np.mean([grid[f"{m}@{budget}"]["none"]["recon_error"] for m in protections])
        )

    memory = measure_memory(pipe, clean[:16])
    print(f"memory: {memory}", flush=True)

    mimicry = None
    if ddpm is not None and not args.skip_downstream:
        classifier = zoo.load("digits-classifier")
        sets = {"clean": clean.cpu()}
        for method in protections:
            sets[f"{method}/protected"] = protected_sets[method]
            sets[f"{method}/dirp"] = dirp_sets[method]
        mimicry = downstream(args, ddpm, classifier, sets, reference)

    results = {
        "command": " ".join(["python", "benchmarks/dirp.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir",)},
        "summary": summarise(args, grid, amplification, memory, mimicry),
        "grid": grid,
        "memory": memory,
        "timings": timings,
        "downstream": mimicry or {},
        "seconds": time.perf_counter() - started,
    }
    os.makedirs(args.output_dir, exist_ok=True)
    stem = os.path.join(args.output_dir, args.run_name)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    write_markdown(results, stem + ".md")
    write_plot(results, stem + ".png")
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
