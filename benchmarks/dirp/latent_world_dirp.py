#!/usr/bin/env python
"""DIRP on the latent text-to-image zoo model: do protections hurt a DreamBooth-style mimic, and does DIRP repair it?

    python benchmarks/dirp/latent_world_dirp.py

On `mosaic-t2i` (VAE 32x32x3 -> 8x8x4, cross-attention UNet, CLIP text encoder). A concept the model has not seen
is a mosaic "subject" (a fixed arrangement of shapes, drawn at random positions and sizes) captioned with a colour
word the model never trained on (`diffusers_ext.data.mosaic_subjects`): `tower` ("a cyan square") is the validation
concept, `rocket` ("a magenta triangle") the test concept. The mimic fine-tunes the UNet on `--num_images` pictures
of the subject with its caption and samples the caption; its samples are scored by the Fréchet distance (FD) to
held-out renders of the subject in the features of the mosaic world's independent feature network
(`diffusers_ext.evaluation.mosaic.MosaicFeatureNet`, trained here on ordinary mosaic renders with the same settings
and seed as in `benchmarks/unlearning/latent_world_unlearning.py`, so both benchmarks judge with the same network).

Protocol:
1. Validation concept: every protection at every budget (prompt-conditioned PGD); a mimic (seed 0) on the clean and
   on each protected set; the protection raising the FD most (mean ratio over budgets) is the one purifiers face.
   Each purifier tries the same number of settings (`SETTINGS`) on that protection at every budget; the setting with
   the best mean PSNR to the clean images is frozen.
2. Test concept, evaluated once with the frozen choices: PSNR of every purifier at every budget; inversion
   amplification of every protection; mimics (every seed) on clean, protected (both budgets) and purified (largest
   budget) sets; the other protections' mimics at seed 0 (headroom of each).

Writes `benchmarks/dirp/results/latent_world_dirp.json`, `.md` and `.png` (exposes `add_arguments` / `run` for
`benchmarks/mosaic/latent_world.py`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "latent_world_dirp"
TITLE = "DIRP on the latent text-to-image model (mosaic-t2i)"
PURIFIERS = ("jpeg", "noise", "diffpure", "gridpure", "impress", "dirp")
# Every purifier gets three settings on the validation concept (the same tuning budget).
# Sample grids of the last `run` (clean / protected / DIRP-purified mimics, seed 0), for the plot.
LAST_GRIDS: dict = {}
SETTINGS = {
    "jpeg": [{"quality": q} for q in (25, 50, 75)],
    "noise": [{"sigma": s} for s in (0.02, 0.05, 0.1)],
    "diffpure": [{"t_star": t} for t in (50, 100, 200)],
    "gridpure": [{"t_star": t} for t in (50, 100, 200)],
    "impress": [{"perceptual_budget": b} for b in (0.03, 0.06, 0.12)],
    # DIRP's three: how far up the schedule the inversion goes, and the hinge's budget
    "dirp": [
        {"inversion_strength": 0.1, "perceptual_budget": 0.06},
        {"inversion_strength": 0.2, "perceptual_budget": 0.06},
        {"inversion_strength": 0.2, "perceptual_budget": 0.12},
    ],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dirp")
    group.add_argument("--dirp_seeds", type=int, nargs="+", default=[0, 1], help="Mimic seeds on the test concept.")
    group.add_argument("--dirp_validation_subject", default="tower", help="Subject for every choice.")
    group.add_argument("--dirp_test_subject", default="rocket", help="Subject evaluated once.")
    group.add_argument("--dirp_num_images", type=int, default=12, help="Pictures of the subject the mimic sees.")
    group.add_argument("--dirp_num_reference", type=int, default=128, help="Held-out renders the FD compares to.")
    group.add_argument("--dirp_num_samples", type=int, default=96, help="Mimic samples scored.")
    group.add_argument("--dirp_budgets", type=int, nargs="+", default=[8, 16], help="L-inf budgets, 1/255 units.")
    group.add_argument(
        "--dirp_protections",
        nargs="+",
        default=["advdm", "mist", "photoguard", "glaze"],
        help="Protections (names of evaluation.dirp.protections.PROTECTIONS).",
    )
    group.add_argument("--dirp_pgd_steps", type=int, default=20, help="PGD steps of each protection.")
    group.add_argument("--dirp_mimic_steps", type=int, default=100, help="Mimic fine-tuning steps.")
    group.add_argument("--dirp_mimic_lr", type=float, default=1e-3, help="Mimic learning rate.")
    group.add_argument("--dirp_mimic_rank", type=int, default=0, help="LoRA rank of the mimic; 0: full fine-tune.")
    group.add_argument("--dirp_sample_steps", type=int, default=15, help="DDIM steps of the mimic's samples.")
    group.add_argument("--dirp_guidance", type=float, default=1.0, help="Guidance of the mimic's samples.")
    group.add_argument("--dirp_iterations", type=int, default=20, help="DIRP's and IMPRESS's Adam iterations.")
    group.add_argument("--dirp_learning_rate", type=float, default=0.01, help="DIRP's and IMPRESS's learning rate.")
    group.add_argument("--dirp_inversion_steps", type=int, default=2, help="DIRP's K.")
    group.add_argument("--dirp_feature_steps", type=int, default=800, help="Training steps of the FD's CNN.")
    group.add_argument("--dirp_output_dir", default=RESULTS, help="Where the results files go (main() only).")


def _psnr(x: torch.Tensor, clean: torch.Tensor) -> float:
    mse = (x.clamp(-1, 1) - clean).pow(2).flatten(1).mean(1).clamp_min(1e-12)
    return float((10 * torch.log10(4.0 / mse)).mean())


def _purify(name: str, setting: dict, pipe, images: torch.Tensor, args, seed: int) -> torch.Tensor:
    from diffusers_ext.evaluation.dirp import purifiers

    generator = torch.Generator().manual_seed(seed)
    if name == "jpeg":
        return purifiers.jpeg(images, **setting)
    if name == "noise":
        return purifiers.gaussian_noise(images, generator=generator, **setting)
    if name == "diffpure":
        return purifiers.diffpure(pipe, images, num_steps=5, generator=generator, **setting)
    if name == "gridpure":
        # tiles of the model's native size: here the whole 32x32 image (iterated DiffPure blended with the input)
        return purifiers.gridpure(pipe, images, num_steps=5, generator=generator, **setting)
    schedule = {"num_inversion_steps": 0}
    if name == "dirp":
        schedule = {"num_inversion_steps": args.dirp_inversion_steps}
    out = pipe(
        images,
        num_iterations=args.dirp_iterations,
        learning_rate=args.dirp_learning_rate,
        perceptual="l2",
        gradient_checkpointing=False,
        output_type="pt",
        **schedule,
        **setting,
    )
    return out.images * 2 - 1


def run(args: argparse.Namespace) -> dict:
    from diffusers import StableDiffusionPipeline

    from diffusers_ext import DIRPPipeline, zoo
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.data.mosaic_subjects import SUBJECTS, subject_images
    from diffusers_ext.evaluation.dirp.latent_mimicry import mimic_frechet, sample_mimic
    from diffusers_ext.evaluation.dirp.latent_protections import inversion_amplification, protect_for_prompt
    from diffusers_ext.evaluation.mosaic import train_feature_net
    from diffusers_ext.evaluation.protocol import mean_spread
    from diffusers_ext.metrics import frechet_distance

    for name in (args.dirp_validation_subject, args.dirp_test_subject):
        if name not in SUBJECTS:
            raise ValueError(f"subject {name!r} is not one of {sorted(SUBJECTS)}.")
    if args.dirp_validation_subject == args.dirp_test_subject:
        raise ValueError("the validation and test subjects must differ.")
    torch.set_num_threads(1)
    start = time.time()
    sd = StableDiffusionPipeline.from_pretrained(zoo.path("mosaic-t2i"), torch_dtype=torch.float32)
    sd.set_progress_bar_config(disable=True)
    pipe = DIRPPipeline(
        unet=sd.unet, scheduler=sd.scheduler, vae=sd.vae, text_encoder=sd.text_encoder, tokenizer=sd.tokenizer
    )
    pipe.set_progress_bar_config(disable=True)
    feature_net, feature_report = train_feature_net(MosaicConfig(), steps=args.dirp_feature_steps)
    feature_accuracy, label_accuracy = feature_report.exact_accuracy, feature_report.label_accuracy
    budgets = sorted(args.dirp_budgets)
    top = budgets[-1]
    rank = args.dirp_mimic_rank or None

    def log(message):
        print(f"[{time.time() - start:7.1f}s] {message}", flush=True)

    def fd(samples, reference):
        return frechet_distance(feature_net.features(samples).double(), feature_net.features(reference).double())

    def mimic(images, subject, reference, seed):
        distance, samples = mimic_frechet(
            sd,
            feature_net,
            images,
            subject.caption,
            reference,
            num_steps=args.dirp_mimic_steps,
            num_samples=args.dirp_num_samples,
            seed=seed,
            rank=rank,
            learning_rate=args.dirp_mimic_lr,
            sample_kwargs={"guidance_scale": args.dirp_guidance, "num_inference_steps": args.dirp_sample_steps},
        )
        return distance, samples

    def concept(name):
        subject = SUBJECTS[name]
        clean = subject_images(subject, args.dirp_num_images, seed=0)
        reference = subject_images(subject, args.dirp_num_reference, seed=1)
        protected = {}
        for method in args.dirp_protections:
            for budget in budgets:
                protected[method, budget] = protect_for_prompt(
                    pipe,
                    clean,
                    method,
                    subject.caption,
                    eps=budget / 255,
                    num_steps=args.dirp_pgd_steps,
                    generator=torch.Generator().manual_seed(0),
                )
        log(f"{name}: protected {len(protected)} sets")
        return subject, clean, reference, protected

    # ------------------------------------------------------------------------------------------- validation
    v_subject, v_clean, v_reference, v_protected = concept(args.dirp_validation_subject)
    v_clean_fd, _ = mimic(v_clean, v_subject, v_reference, 0)
    v_protection = {}
    for (method, budget), images in v_protected.items():
        v_protection.setdefault(method, {})[str(budget)] = {
            "fd": mimic(images, v_subject, v_reference, 0)[0],
            "psnr": _psnr(images, v_clean),
        }
        v_protection[method][str(budget)]["fd_ratio"] = v_protection[method][str(budget)]["fd"] / v_clean_fd
        log(f"validation {method}@{budget}: {v_protection[method][str(budget)]}")
    chosen = max(v_protection, key=lambda m: np.mean([v_protection[m][str(b)]["fd_ratio"] for b in budgets]))
    tuning = {}
    frozen = {}
    for purifier in PURIFIERS:
        rows = []
        for setting in SETTINGS[purifier]:
            psnrs = {
                str(b): _psnr(_purify(purifier, setting, pipe, v_protected[chosen, b], args, 0), v_clean)
                for b in budgets
            }
            rows.append({"setting": setting, "psnr": psnrs, "mean_psnr": float(np.mean(list(psnrs.values())))})
        frozen[purifier] = max(rows, key=lambda r: r["mean_psnr"])["setting"]
        tuning[purifier] = rows
        log(f"tuned {purifier}: {frozen[purifier]} ({[round(r['mean_psnr'], 2) for r in rows]})")

    # ------------------------------------------------------------------------------------------------- test
    t_subject, t_clean, t_reference, t_protected = concept(args.dirp_test_subject)
    amplification = {
        f"{method}@{budget}": inversion_amplification(pipe, t_clean, images, prompt="")
        for (method, budget), images in t_protected.items()
    }
    purified = {
        (purifier, b): _purify(purifier, frozen[purifier], pipe, t_protected[chosen, b], args, 1)
        for purifier in PURIFIERS
        for b in budgets
    }
    psnr = {
        str(b): {
            "protected": _psnr(t_protected[chosen, b], t_clean),
            **{p: _psnr(purified[p, b], t_clean) for p in PURIFIERS},
        }
        for b in budgets
    }
    log(f"test PSNR {psnr}")
    fds = {"clean": [], **{f"{chosen}@{b}": [] for b in budgets}, **{f"{p}@{top}": [] for p in PURIFIERS}}
    grids = {}
    for seed in args.dirp_seeds:
        distance, samples = mimic(t_clean, t_subject, t_reference, seed)
        fds["clean"].append(distance)
        if seed == args.dirp_seeds[0]:
            grids["clean"] = samples[:8]
        for b in budgets:
            distance, samples = mimic(t_protected[chosen, b], t_subject, t_reference, seed)
            fds[f"{chosen}@{b}"].append(distance)
            if seed == args.dirp_seeds[0] and b == top:
                grids["protected"] = samples[:8]
        for p in PURIFIERS:
            distance, samples = mimic(purified[p, top], t_subject, t_reference, seed)
            fds[f"{p}@{top}"].append(distance)
            if seed == args.dirp_seeds[0] and p == "dirp":
                grids["dirp"] = samples[:8]
        log(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in fds.items()))
    ratios = {
        key: mean_spread([v / c for v, c in zip(values, fds["clean"])])
        for key, values in fds.items()
        if key != "clean"
    }
    headroom = {}
    for method in args.dirp_protections:
        for b in budgets:
            key = f"{method}@{b}"
            if key in ratios:
                headroom[key] = ratios[key]["values"][0]
            else:
                distance = mimic(t_protected[method, b], t_subject, t_reference, args.dirp_seeds[0])[0]
                headroom[key] = distance / fds["clean"][0]
    log(f"headroom {headroom}")
    LAST_GRIDS.clear()
    LAST_GRIDS.update(grids)

    # --------------------------------------------------------------------------------------------- summary
    real_floor = fd(subject_images(t_subject, args.dirp_num_samples, seed=2), t_reference)
    base_fd = fd(
        sample_mimic(
            sd,
            sd.unet,
            t_subject.caption,
            args.dirp_num_samples,
            guidance_scale=args.dirp_guidance,
            num_inference_steps=args.dirp_sample_steps,
        ),
        t_reference,
    )
    max_linf = max(float((x - t_clean).abs().max()) * 127.5 for x in t_protected.values())
    sanity = {
        "feature_net_exact_match_on_real_renders": feature_accuracy,
        "feature_net_label_accuracy_on_real_renders": label_accuracy,
        "fd_real_renders_vs_reference": real_floor,
        "fd_untuned_model_vs_reference": base_fd,
        "clean_mimic_learns_the_subject": bool(np.mean(fds["clean"]) < base_fd),
        "max_perturbation_linf_in_255_units": max_linf,
        "perturbations_within_budget": bool(max_linf <= top + 1e-3),
        "purifier_settings_tried": {p: len(SETTINGS[p]) for p in PURIFIERS},
        "same_tuning_budget": len({len(SETTINGS[p]) for p in PURIFIERS}) == 1,
        "test_concept_unseen_in_tuning": args.dirp_validation_subject != args.dirp_test_subject,
    }
    summary = {
        "protection_facing_purifiers": chosen,
        "clean_fd": mean_spread(fds["clean"]),
        "fd": {k: mean_spread(v) for k, v in fds.items()},
        "fd_ratio": ratios,
        "headroom_fd_ratio_seed0": headroom,
        "psnr": psnr,
        "inversion_amplification": amplification,
        "frozen_settings": frozen,
        "sanity": sanity,
    }
    settings = {k: v for k, v in vars(args).items() if k.startswith("dirp_") and k != "dirp_output_dir"}
    settings["tuning_settings"] = SETTINGS
    results = {
        "settings": settings,
        "validation": {"clean_fd": v_clean_fd, "protections": v_protection, "tuning": tuning},
        "summary": summary,
        "wall_seconds": time.time() - start,
    }
    summary["targets"] = targets_from_results(results)
    return results


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded FD ratios and PSNRs (the measuring run, `--from_results`, and the
    part's rebuild in `benchmarks/mosaic/latent_world.py`)."""
    from diffusers_ext.evaluation.protocol import target

    s = results["summary"]
    budgets = sorted(results["settings"]["dirp_budgets"])
    top, chosen, ratios, psnr = budgets[-1], s["protection_facing_purifiers"], s["fd_ratio"], s["psnr"]
    others = [p for p in PURIFIERS if p != "dirp"]
    targets = [
        target(f"protected ({chosen}, {top}/255) FD / clean FD", ratios[f"{chosen}@{top}"]["mean"], 1.25, ">="),
        target(f"DIRP-purified ({top}/255) FD / clean FD", ratios[f"dirp@{top}"]["mean"], 1.10, "<="),
    ]
    for b in budgets:
        best_other = max(psnr[str(b)][p] for p in others)
        targets.append(
            target(f"DIRP PSNR - best baseline PSNR at {b}/255 (dB)", psnr[str(b)]["dirp"] - best_other, 0.0)
        )
    return targets


def settings_line(results: dict) -> str:
    return (
        f"Test subject `{results['settings']['dirp_test_subject']}`, seeds {results['settings']['dirp_seeds']}; the "
        f"protection purifiers face (chosen on validation): `{results['summary']['protection_facing_purifiers']}`."
    )


def report_sections(results: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    budgets = sorted(int(b) for b in s["psnr"])
    top = budgets[-1]
    lines = [
        f"## Mimic FD / clean FD (clean FD {s['clean_fd']['mean']:.2f} +- {s['clean_fd']['std']:.2f})",
        "",
        "| set | ratio mean | std | per seed |",
        "| --- | --- | --- | --- |",
    ]
    for key, r in s["fd_ratio"].items():
        lines.append(f"| {key} | {r['mean']:.3f} | {r['std']:.3f} | {', '.join(f'{v:.3f}' for v in r['values'])} |")
    lines += [
        "",
        "## Headroom: every protection, seed 0 (FD / clean FD)",
        "",
        "| protection | " + " | ".join(f"{b}/255" for b in budgets) + " |",
        "| --- |" + " --- |" * len(budgets),
    ]
    methods = sorted({k.split("@")[0] for k in s["headroom_fd_ratio_seed0"]})
    for m in methods:
        lines.append(
            f"| {m} | " + " | ".join(f"{s['headroom_fd_ratio_seed0'][f'{m}@{b}']:.3f}" for b in budgets) + " |"
        )
    lines += [
        "",
        "## PSNR to clean (dB), test subject",
        "",
        "| set | " + " | ".join(f"{b}/255" for b in budgets) + " |",
        "| --- |" + " --- |" * len(budgets),
    ]
    for key in ["protected", *PURIFIERS]:
        lines.append(f"| {key} | " + " | ".join(f"{s['psnr'][str(b)][key]:.2f}" for b in budgets) + " |")
    lines += [
        "",
        "## Inversion amplification (reported, not a target)",
        "",
        "| protection | recon err clean | protected | same-norm noise | amplification | latent amplification |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, a in s["inversion_amplification"].items():
        lines.append(
            f"| {key} | {a['recon_error_clean']:.4f} | {a['recon_error_protected']:.4f} | {a['recon_error_noise']:.4f}"
            f" | {a['amplification']:.2f} | {a['latent_amplification']:.2f} |"
        )
    lines += ["", "## Frozen purifier settings (validation subject)", ""]
    lines += [f"- {p}: `{json.dumps(v)}`" for p, v in s["frozen_settings"].items()]
    lines += ["", "## Sanity", ""] + [f"- {k}: {v}" for k, v in s["sanity"].items()]
    lines += ["", f"Wall time: {results['wall_seconds']:.0f} s. The FD of purified sets is measured at {top}/255."]
    return lines


def write_plot(results: dict, grids: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    keys = list(s["fd_ratio"])
    axes[0].bar(
        range(len(keys)),
        [s["fd_ratio"][k]["mean"] for k in keys],
        yerr=[s["fd_ratio"][k]["std"] for k in keys],
        color="tab:blue",
    )
    axes[0].axhline(1.25, color="red", ls="--", label="1.25 (protection works)")
    axes[0].axhline(1.10, color="green", ls="--", label="1.10 (repaired)")
    axes[0].set_xticks(range(len(keys)), keys, rotation=45, ha="right", fontsize=8)
    axes[0].set_title("mimic FD / clean FD (test subject)")
    axes[0].legend(fontsize=7)
    budgets = sorted(s["psnr"], key=int)
    for i, b in enumerate(budgets):
        axes[1].bar(
            np.arange(len(PURIFIERS) + 1) + 0.4 * i,
            [s["psnr"][b][k] for k in ["protected", *PURIFIERS]],
            width=0.4,
            label=f"{b}/255",
        )
    axes[1].set_xticks(np.arange(len(PURIFIERS) + 1) + 0.2, ["protected", *PURIFIERS], rotation=45, fontsize=8)
    axes[1].set_title("PSNR to clean (dB)")
    axes[1].legend(fontsize=7)
    rows = [grids[k] for k in ("clean", "protected", "dirp") if k in grids]
    if rows:  # the samples are not recorded: a report rebuilt with --from_results has no sample panel
        tiles = torch.cat([torch.cat(list(r.clamp(-1, 1)), dim=2) for r in rows], dim=1)
        axes[2].imshow(((tiles + 1) / 2).permute(1, 2, 0).numpy(), interpolation="nearest")
        axes[2].set_title("mimic samples, rows: clean / protected / DIRP-purified", fontsize=8)
    axes[2].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(results: dict, grids: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        stem,
        results,
        TITLE,
        report_sections(results),
        settings_line(results),
        figures={".png": lambda path: write_plot(results, grids, path)},
    )


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import add_from_results_argument, command, rebuild_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    add_from_results_argument(parser)  # here, not in add_arguments: latent_world.py has its own
    args = parser.parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        stem = os.path.splitext(os.path.basename(args.from_results))[0]
        write_report(results, {}, os.path.join(args.dirp_output_dir, stem))
        return results
    results = {"command": command(__file__, argv, omit=("--dirp_output_dir",)), **run(args)}
    write_report(results, LAST_GRIDS, os.path.join(args.dirp_output_dir, NAME))
    print(json.dumps(results["summary"]["targets"], indent=2))
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
