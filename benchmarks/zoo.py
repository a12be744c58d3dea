#!/usr/bin/env python
"""Measure the digits zoo: classifier held-out accuracy, DDPM conditional accuracy and Fréchet distances.

    python benchmarks/zoo.py

Writes `benchmarks/results/zoo.json`, `zoo.md` and `zoo.png`. Every setting runs in this one process on the same
seeds: the DDPM with and without classifier-free guidance, and the real-data references (two disjoint halves of
the real digits; train vs held-out) that put its Fréchet distance in scale.
"""

import argparse
import json
import os
import time

import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples_per_class", type=int, default=100, help="DDPM samples per digit class.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps.")
    parser.add_argument("--guidance_scales", type=float, nargs="+", default=[1.0, 2.0], help="CFG scales to run.")
    parser.add_argument(
        "--headline_guidance_scale",
        type=float,
        default=1.0,
        help="The guidance scale whose numbers go into the summary (must be among --guidance_scales).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of sampling and of the real-data split.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where zoo.json/.md/.png go.")
    args = parser.parse_args(argv)
    if args.headline_guidance_scale not in args.guidance_scales:
        parser.error(f"--headline_guidance_scale {args.headline_guidance_scale} is not in --guidance_scales.")
    if args.samples_per_class < 2:
        parser.error(f"--samples_per_class must be >= 2, got {args.samples_per_class}.")
    return args


def real_split_frechet_distance(classifier, seed: int) -> float:
    """Fréchet distance between two disjoint random halves of all real digits, in the classifier's features."""
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.metrics import classifier_predictions, frechet_distance

    images, _ = load_digits_images("all", resolution=classifier.config.sample_size)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    half = len(images) // 2
    _, a = classifier_predictions(classifier, images[order[:half]])
    _, b = classifier_predictions(classifier, images[order[half : 2 * half]])
    return frechet_distance(a, b)


def train_vs_heldout_frechet_distance(classifier) -> float:
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.metrics import classifier_predictions, frechet_distance

    size = classifier.config.sample_size
    _, train = classifier_predictions(classifier, load_digits_images("train", resolution=size)[0])
    _, heldout = classifier_predictions(classifier, load_digits_images("heldout", resolution=size)[0])
    return frechet_distance(train, heldout)


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    width = 0.8 / len(results["ddpm"])
    for k, run in enumerate(results["ddpm"]):
        xs = [c + (k - (len(results["ddpm"]) - 1) / 2) * width for c in range(10)]
        left.bar(xs, run["per_class_accuracy"], width, label=f"guidance {run['guidance_scale']:g}")
    left.axhline(0.9, color="#c33", linestyle="--", linewidth=1, label="target 0.9")
    left.set_xticks(range(10))
    left.set_xlabel("conditioning class")
    left.set_ylabel("classified as its class")
    left.set_ylim(0, 1.05)
    left.legend(fontsize=8, loc="lower right")
    names = [f"DDPM g={r['guidance_scale']:g}" for r in results["ddpm"]] + ["real halves", "real train/held-out"]
    values = [r["frechet_distance"] for r in results["ddpm"]]
    values += [results["real_split_frechet_distance"], results["train_vs_heldout_frechet_distance"]]
    right.bar(names, values, color=["#4a78b5"] * len(results["ddpm"]) + ["#888", "#aaa"])
    right.axhline(2 * results["real_split_frechet_distance"], color="#c33", linestyle="--", linewidth=1)
    right.set_ylabel("Fréchet distance (classifier features)")
    right.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    lines = [
        "| metric | value | target |",
        "| --- | --- | --- |",
        f"| classifier held-out accuracy ({results['heldout_size']} digits; sanity) "
        f"| {s['classifier_heldout_accuracy']:.4f} | >= 0.97 |",
        f"| DDPM conditional accuracy (DDIM {s['num_inference_steps']} steps, guidance {s['guidance_scale']:g}) "
        f"| {s['ddpm_conditional_accuracy']:.4f} ± {s['ddpm_conditional_accuracy_standard_error']:.4f} | >= 0.90 |",
        f"| DDPM Fréchet distance to held-out | {s['ddpm_frechet_distance']:.4g} "
        f"| <= {2 * s['real_split_frechet_distance']:.4g} |",
        f"| real halves Fréchet distance | {s['real_split_frechet_distance']:.4g} | (reference) |",
        "",
        "| guidance | conditional accuracy | min class accuracy | Fréchet distance | sampling seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in results["ddpm"]:
        lines.append(
            f"| {run['guidance_scale']:g} | {run['conditional_accuracy']:.4f} | {min(run['per_class_accuracy']):.4f} "
            f"| {run['frechet_distance']:.4g} | {run['seconds']:.1f} |"
        )
    return lines


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext import zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.evaluation.digits import evaluate_digits_generator
    from diffusers_ext.evaluation.protocol import binomial_standard_error, target
    from diffusers_ext.evaluation.reporting import command, write_results
    from diffusers_ext.metrics import classifier_accuracy

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    classifier = zoo.load("digits-classifier")
    pipe = zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)

    heldout_images, heldout_labels = load_digits_images("heldout", resolution=classifier.config.sample_size)
    results = {
        "command": command(__file__, argv),
        "settings": vars(args) | {"output_dir": None},
        "heldout_size": len(heldout_labels),
        "classifier_heldout_accuracy": classifier_accuracy(classifier, heldout_images, heldout_labels),
        "real_split_frechet_distance": real_split_frechet_distance(classifier, args.seed),
        "train_vs_heldout_frechet_distance": train_vs_heldout_frechet_distance(classifier),
        "ddpm": [],
    }
    for scale in args.guidance_scales:
        start = time.perf_counter()
        report = evaluate_digits_generator(
            pipe, classifier, args.samples_per_class, args.num_inference_steps, scale, args.seed
        )
        results["ddpm"].append(
            {
                "guidance_scale": scale,
                "samples_per_class": args.samples_per_class,
                "num_inference_steps": args.num_inference_steps,
                "conditional_accuracy": report.conditional_accuracy,
                "per_class_accuracy": report.per_class_accuracy.tolist(),
                "frechet_distance": report.frechet_distance,
                "seconds": time.perf_counter() - start,
            }
        )
        print(f"guidance {scale:g}: accuracy {report.conditional_accuracy:.4f}, FD {report.frechet_distance:.4g}")

    headline = next(r for r in results["ddpm"] if r["guidance_scale"] == args.headline_guidance_scale)
    results["summary"] = {
        "classifier_heldout_accuracy": results["classifier_heldout_accuracy"],
        "ddpm_conditional_accuracy": headline["conditional_accuracy"],
        "ddpm_frechet_distance": headline["frechet_distance"],
        "real_split_frechet_distance": results["real_split_frechet_distance"],
        "guidance_scale": headline["guidance_scale"],
        "num_inference_steps": args.num_inference_steps,
        "samples_per_class": args.samples_per_class,
        "ddpm_conditional_accuracy_standard_error": binomial_standard_error(
            headline["conditional_accuracy"], 10 * args.samples_per_class
        ),
        # Judged by the zoo classifier (trained separately, on the train split only) and Fréchet distances in its
        # feature space, which the DDPM never saw; the classifier's own accuracy is a sanity row, not a target.
        "targets": [
            target("DDPM conditional accuracy (zoo classifier)", headline["conditional_accuracy"], 0.90),
            target(
                "DDPM Fréchet distance to held-out / (2 x real halves' distance)",
                headline["frechet_distance"] / (2 * results["real_split_frechet_distance"]),
                1.0,
                "<=",
            ),
        ],
        "sanity": {
            "classifier_heldout_accuracy": results["classifier_heldout_accuracy"],
            "classifier_heldout_accuracy >= 0.97": results["classifier_heldout_accuracy"] >= 0.97,
            "real_split_frechet_distance": results["real_split_frechet_distance"],
            "train_vs_heldout_frechet_distance": results["train_vs_heldout_frechet_distance"],
        },
    }
    write_results(
        os.path.join(args.output_dir, "zoo"),
        results,
        "Digits zoo quality",
        report_sections(results),
        figures={".png": lambda path: write_plot(results, path)},
    )
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
