#!/usr/bin/env python
"""Mimicry headroom of a mosaic text-to-image world: does a LoRA mimic learn an unseen subject, and do protections
stop it?

    python benchmarks/mosaic/mosaic_mimicry_headroom.py --model_path PIPELINE_FOLDER

What DIRP repairs must exist before DIRP is measured. On a `StableDiffusionPipeline`-format mosaic model (the 64x64
world of `training/train_text_to_image_from_scratch.py --resolution 64`):

- **Subjects.** A mosaic "subject" (`diffusers_ext.data.mosaic_subjects`: a fixed arrangement of shapes, redrawn at
  random positions and sizes) captioned with a colour word the model never trained on. The validation subject makes
  every choice; the test subject is measured once.
- **Mimic.** DreamBooth-style LoRA fine-tuning on `--num_images` pictures of the subject, all with its caption
  (`evaluation.dirp.latent_mimicry.mimic_frechet`: adapters on the UNet's attention projections, no caption dropout),
  then samples of the caption. Its rank, steps and learning rate (`--mimic_configs`) are chosen on the validation
  subject: the lowest clean-mimic FD, the mimic an attacker would keep.
- **Judge.** The Fréchet distance (FD) of the samples to held-out renders of the subject, in the features of
  `evaluation.mosaic.MosaicFeatureNet`, trained here on real mosaic renders at the model's resolution: not the UNet,
  the VAE or the text encoder that protections work through.
- **Protections.** Every protection of the pack (`evaluation.dirp.protections.PROTECTIONS`, prompt-conditioned PGD
  at `--budget`/255). The one that raises the validation mimic's FD most is the "strongest"; only it is run on test.

Targets (test subject, `--seeds` mimics, mean over seeds): clean mimic FD <= 0.5x the untuned model's FD (the mimic
learns the subject), and the strongest protection's mimic FD >= 1.5x the clean mimic's (protections have an effect
for a purifier to undo).

Writes `benchmarks/mosaic/results/mosaic_mimicry_headroom.{json,md}`.
"""

import argparse
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "mosaic_mimicry_headroom"
LEARNS_MAX = 0.5  # clean mimic FD / untuned FD
PROTECTS_MIN = 1.5  # protected mimic FD / clean mimic FD


def parse_args(argv=None):
    from diffusers_ext.evaluation.dirp.protections import PROTECTIONS
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", default=None, help="A StableDiffusionPipeline folder of the mosaic world.")
    parser.add_argument("--validation_subject", default="tower", help="Subject of every choice.")
    parser.add_argument("--test_subject", default="rocket", help="Subject measured once.")
    parser.add_argument("--num_images", type=int, default=12, help="Pictures of the subject the mimic sees.")
    parser.add_argument("--num_reference", type=int, default=128, help="Held-out renders the FD compares to.")
    parser.add_argument("--num_samples", type=int, default=96, help="Samples scored per mimic.")
    parser.add_argument("--budget", type=int, default=16, help="L-inf budget of the protections, in 1/255.")
    parser.add_argument("--protections", nargs="+", default=list(PROTECTIONS), choices=PROTECTIONS)
    parser.add_argument("--pgd_steps", type=int, default=40, help="PGD steps of each protection.")
    parser.add_argument(
        "--mimic_configs",
        nargs="+",
        default=["8,150,0.003", "32,400,0.003", "32,400,0.01"],
        help="Mimic settings `rank,steps,learning_rate` tried on the validation subject.",
    )
    parser.add_argument("--sample_steps", type=int, default=15, help="DDIM steps of the samples.")
    parser.add_argument("--guidance_scale", type=float, default=1.0, help="Guidance of the samples.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Mimic seeds on the test subject.")
    parser.add_argument("--feature_steps", type=int, default=800, help="Training steps of the FD's feature network.")
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.data.mosaic_subjects import SUBJECTS
    from diffusers_ext.utils import check_positive_int

    try:
        for name in ("num_images", "num_reference", "num_samples", "budget", "pgd_steps"):
            check_positive_int(name, getattr(args, name))
        args.mimic_configs = [_mimic_config(text) for text in args.mimic_configs]
    except ValueError as error:
        parser.error(str(error))
    for name in ("validation_subject", "test_subject"):
        if getattr(args, name) not in SUBJECTS:
            parser.error(f"--{name} must be one of {sorted(SUBJECTS)}, got {getattr(args, name)!r}.")
    if args.validation_subject == args.test_subject:
        parser.error(f"--validation_subject and --test_subject must differ, both are {args.test_subject!r}.")
    if args.from_results is None:
        if args.model_path is None:
            parser.error("--model_path is required (a StableDiffusionPipeline folder of the mosaic world).")
        if not os.path.isfile(os.path.join(args.model_path, "model_index.json")):
            parser.error(f"--model_path {args.model_path!r} is not a pipeline folder (no model_index.json).")
    return args


def _mimic_config(text: str) -> dict:
    """`"rank,steps,learning_rate"` -> `{"rank", "steps", "learning_rate"}` (two positive ints, a positive float)."""
    parts = text.split(",")
    if len(parts) != 3:
        raise ValueError(f"--mimic_configs: expected `rank,steps,learning_rate`, got {text!r}.")
    rank, steps, learning_rate = int(parts[0]), int(parts[1]), float(parts[2])
    if rank < 1 or steps < 1 or not learning_rate > 0:
        raise ValueError(f"--mimic_configs: expected rank >= 1, steps >= 1, learning_rate > 0, got {text!r}.")
    return {"rank": rank, "steps": steps, "learning_rate": learning_rate}


def measure(pipe, args, log) -> dict:
    from diffusers_ext import DIRPPipeline
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.data.mosaic_subjects import SUBJECTS, subject_images
    from diffusers_ext.evaluation.dirp.latent_mimicry import mimic_frechet, sample_mimic
    from diffusers_ext.evaluation.dirp.latent_protections import protect_for_prompt
    from diffusers_ext.evaluation.mosaic import train_feature_net
    from diffusers_ext.evaluation.protocol import mean_spread
    from diffusers_ext.evaluation.reporting import choose_on_validation
    from diffusers_ext.metrics import frechet_distance

    resolution = pipe.vae.config.sample_size
    feature_net, feature_report = train_feature_net(MosaicConfig(resolution=resolution), steps=args.feature_steps)
    log(f"feature net: exact match {feature_report.exact_accuracy:.3f} on held-out real renders")
    # the protections attack the same components the mimic fine-tunes through
    attacked = DIRPPipeline(
        unet=pipe.unet,
        scheduler=pipe.scheduler,
        vae=pipe.vae,
        text_encoder=pipe.text_encoder,
        tokenizer=pipe.tokenizer,
    )
    attacked.set_progress_bar_config(disable=True)
    sample_kwargs = {"guidance_scale": args.guidance_scale, "num_inference_steps": args.sample_steps}

    def fd(samples, reference):
        return frechet_distance(feature_net.features(samples).double(), feature_net.features(reference).double())

    def subject_sets(name):
        subject = SUBJECTS[name]
        clean = subject_images(subject, args.num_images, seed=0, resolution=resolution)
        reference = subject_images(subject, args.num_reference, seed=1, resolution=resolution)
        return subject, clean, reference

    def protect(method, subject, clean):
        return protect_for_prompt(
            attacked,
            clean,
            method,
            subject.caption,
            eps=args.budget / 255,
            num_steps=args.pgd_steps,
            generator=torch.Generator().manual_seed(0),
        )

    def mimic(images, subject, reference, seed, config):
        distance, _ = mimic_frechet(
            pipe,
            feature_net,
            images,
            subject.caption,
            reference,
            num_steps=config["steps"],
            num_samples=args.num_samples,
            seed=seed,
            rank=config["rank"],
            learning_rate=config["learning_rate"],
            sample_kwargs=sample_kwargs,
        )
        return distance

    # validation: the attacker's best mimic, then the strongest protection against it
    subject, clean, reference = subject_sets(args.validation_subject)

    def clean_mimic(config, split):
        distance = mimic(clean, subject, reference, args.seeds[0], config)
        log(f"{split} clean mimic {config}: FD {distance:.2f}")
        return {"fd": distance}

    mimic_choice = choose_on_validation(
        args.mimic_configs, clean_mimic, score=lambda m: m["fd"], maximize=False, names=str, test=False
    )
    config = mimic_choice["chosen"]["candidate"]
    validation_clean = mimic_choice["chosen"]["score"]

    def protected_ratio(method, split):
        distance = mimic(protect(method, subject, clean), subject, reference, args.seeds[0], config)
        log(f"{split} {method}@{args.budget}: mimic FD {distance:.2f}")
        return {"fd": distance, "fd_ratio": distance / validation_clean}

    strongest = choose_on_validation(
        args.protections, protected_ratio, score=lambda m: m["fd_ratio"], names=str, test=False
    )
    chosen = strongest["chosen"]["candidate"]

    # test, once: the untuned model, clean mimics and the strongest protection's mimics over seeds
    subject, clean, reference = subject_sets(args.test_subject)
    untuned = fd(sample_mimic(pipe, pipe.unet, subject.caption, args.num_samples, seed=7, **sample_kwargs), reference)
    protected = protect(chosen, subject, clean)
    clean_fd = [mimic(clean, subject, reference, seed, config) for seed in args.seeds]
    protected_fd = [mimic(protected, subject, reference, seed, config) for seed in args.seeds]
    log(f"test: untuned FD {untuned:.2f}, clean mimics {clean_fd}, {chosen} mimics {protected_fd}")
    floor = fd(subject_images(subject, args.num_samples, seed=2, resolution=resolution), reference)
    return {
        "validation": {
            "subject": args.validation_subject,
            "clean_fd": validation_clean,
            "mimic": {"validation": mimic_choice["validation"], "chosen": mimic_choice["chosen"]},
            "validation": strongest["validation"],
            "chosen": strongest["chosen"],
        },
        "test": {
            "subject": args.test_subject,
            "protection": chosen,
            "untuned_fd": untuned,
            "clean_fd": mean_spread(clean_fd),
            "protected_fd": mean_spread(protected_fd),
            "clean_over_untuned": mean_spread([d / untuned for d in clean_fd]),
            "protected_over_clean": mean_spread([p / c for p, c in zip(protected_fd, clean_fd)]),
            "max_linf_255": float((protected - clean).abs().max()) * 127.5,
        },
        "sanity": {
            "feature_net_exact_match_on_real_renders": feature_report.exact_accuracy,
            "fd_real_renders_vs_reference": floor,
        },
    }


def mimicry_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    test = summary["test"]
    return [
        target(
            f"mimic learns the subject: clean mimic FD / untuned FD (test, {test['subject']})",
            test["clean_over_untuned"]["mean"],
            LEARNS_MAX,
            "<=",
        ),
        target(
            f"strongest protection ({test['protection']}) raises the mimic's FD: protected / clean (test)",
            test["protected_over_clean"]["mean"],
            PROTECTS_MIN,
        ),
    ]


def report_sections(results: dict) -> list[str]:
    summary, settings = results["summary"], results["settings"]
    validation, test = summary["validation"], summary["test"]
    mimic = validation["mimic"]["chosen"]["candidate"]
    lines = [
        "## Validation: the mimic and the strongest protection",
        "",
        f"Subject {validation['subject']!r}, seed {settings['seeds'][0]}. Clean mimic FD per setting: "
        + ", ".join(f"{row['name']} {row['score']:.2f}" for row in validation["mimic"]["validation"])
        + f". Chosen: LoRA rank {mimic['rank']}, {mimic['steps']} steps, learning rate {mimic['learning_rate']}. "
        f"Protections at {settings['budget']}/255, {settings['pgd_steps']} PGD steps, against that mimic:",
        "",
        "| protection | mimic FD | / clean |",
        "| --- | --- | --- |",
    ]
    for row in validation["validation"]:
        lines.append(f"| {row['name']} | {row['measurement']['fd']:.2f} | {row['measurement']['fd_ratio']:.2f} |")
    clean, protected = test["clean_fd"], test["protected_fd"]
    lines += [
        "",
        "## Test",
        "",
        f"Subject {test['subject']!r}, seeds {settings['seeds']} (mean ± standard error). Untuned model FD "
        f"{test['untuned_fd']:.2f}; clean mimic FD {clean['mean']:.2f} ± {clean['sem']:.2f}; {test['protection']} "
        f"mimic FD {protected['mean']:.2f} ± {protected['sem']:.2f} (L-inf {test['max_linf_255']:.1f}/255). Real "
        f"renders against the reference: FD {summary['sanity']['fd_real_renders_vs_reference']:.2f}; the feature "
        f"network names {summary['sanity']['feature_net_exact_match_on_real_renders']:.3f} of held-out real scenes "
        "exactly.",
        "",
    ]
    return lines


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, NAME)
    title = "Mimicry headroom of the mosaic text-to-image world"
    if args.from_results is not None:
        results = rebuild_results(args.from_results, lambda r: mimicry_targets(r["summary"]), rel_to=ROOT)
        return write_results(stem, results, title, report_sections(results))

    from diffusers_ext.loading import load_pipeline

    start = time.time()

    def log(message):
        print(f"[{time.time() - start:7.1f}s] {message}", flush=True)

    torch.manual_seed(0)
    pipe = load_pipeline(args.model_path).to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    summary = measure(pipe, args, log)
    summary["targets"] = mimicry_targets(summary)
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "model_path")}
    results = {
        "command": command(__file__, omit=("--output_dir", "--model_path")),
        "settings": settings,
        "model": {"resolution": pipe.vae.config.sample_size, "seconds": round(time.time() - start, 1)},
        "summary": summary,
    }
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
