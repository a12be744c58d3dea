#!/usr/bin/env python
"""Measure the zoo: the digits classifier and DDPM, or the `graph-flow-tree16` discrete graph flow model.

    python benchmarks/zoo/zoo.py                              # digits
    python benchmarks/zoo/zoo.py --entry graph-flow-tree16    # the tree-16 graph model

Digits (the default) writes `benchmarks/zoo/results/zoo.json`, `zoo.md` and `zoo.png`: classifier held-out accuracy,
DDPM conditional accuracy and Fréchet distances. Every setting runs in this one process on the same seeds: the DDPM
with and without classifier-free guidance, and the real-data references (two disjoint halves of the real digits;
train vs held-out) that put its Fréchet distance in scale.

`--entry graph-flow-tree16` writes `benchmarks/zoo/results/zoo_graph_flow_tree16.json` and `.md` (its own run, so the
digits measurements are not run again): validity, uniqueness, novelty (against the regenerated training split) and
V.U.N. of `--graph_num_samples` samples at `--graph_num_inference_steps` CTMC steps for each of `--graph_seeds`
(generator seed 1000 + seed, the test generators of `benchmarks/graph_grpo/graph_grpo.py`), and the degree / clustering /
spectral MMDs to the test split with their ratios to train-vs-test, all measured as `benchmarks/graph_grpo/graph_grpo.py`
measures its pretrained model. The entry is that benchmark's pretrained tree-16 model (the same training command, the
same seed), so the one target is that it reproduces the pretrained V.U.N. recorded in
`benchmarks/graph_grpo/results/graph_grpo.json` (the difference within 2 standard errors); one CPU thread.

`--from_results PATH` measures nothing: it rebuilds either file's targets from its recorded measurements (the entry
from the file's recorded settings) and writes it again under its own stem.
"""

import argparse
import json
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
ENTRIES = ("digits", "graph-flow-tree16")
GRAPH_ENTRY = "graph-flow-tree16"
GRAPH_STEM = "zoo_graph_flow_tree16"
GRAPH_REFERENCE = os.path.join(os.path.dirname(HERE), "graph_grpo", "results", "graph_grpo.json")


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--entry",
        choices=ENTRIES,
        default="digits",
        help="What to measure: the digits zoo (zoo.json) or graph-flow-tree16 (zoo_graph_flow_tree16.json).",
    )
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
    graph = parser.add_argument_group("graph-flow-tree16")
    graph.add_argument("--graph_seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="Sampling seeds.")
    graph.add_argument("--graph_num_samples", type=int, default=40, help="Graphs per seed.")
    graph.add_argument("--graph_num_inference_steps", type=int, default=50, help="CTMC steps.")
    add_from_results_argument(parser)
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


def digits_targets(results: dict) -> list[dict]:
    """The digits zoo's targets, from the recorded DDPM runs and the real halves' distance (the run and
    `--from_results`). Judged by the zoo classifier (trained separately, on the train split only) and Fréchet
    distances in its feature space, which the DDPM never saw; the classifier's own accuracy is a sanity row."""
    from diffusers_ext.evaluation.protocol import target

    headline = headline_run(results)
    return [
        target("DDPM conditional accuracy (zoo classifier)", headline["conditional_accuracy"], 0.90),
        target(
            "DDPM Fréchet distance to held-out / (2 x real halves' distance)",
            headline["frechet_distance"] / (2 * results["real_split_frechet_distance"]),
            1.0,
            "<=",
        ),
    ]


def headline_run(results: dict) -> dict:
    """The recorded DDPM run at the headline guidance scale."""
    return next(r for r in results["ddpm"] if r["guidance_scale"] == results["settings"]["headline_guidance_scale"])


def targets_from_results(results: dict) -> list[dict]:
    """The targets of either entry's results file (the entry named by its recorded settings; the digits file,
    written before the entry was recorded, names none)."""
    if results["settings"].get("entry", "digits") == GRAPH_ENTRY:
        return graph_targets(results)
    return digits_targets(results)


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json` and `.md` (and the digits' `.png`) through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    if results["settings"].get("entry", "digits") == GRAPH_ENTRY:
        write_results(stem, results, "Zoo: graph-flow-tree16 quality", graph_report_sections(results))
    else:
        write_results(
            stem,
            results,
            "Digits zoo quality",
            report_sections(results),
            figures={".png": lambda path: write_plot(results, path)},
        )


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


def _graph_grpo_benchmark():
    """`benchmarks/graph_grpo/graph_grpo.py` as a module: its sampling and metrics are the ones the entry is measured with."""
    from diffusers_ext.evaluation.reporting import load_script

    return load_script(os.path.join(os.path.dirname(HERE), "graph_grpo", "graph_grpo.py"), "graph_grpo_benchmark")


def graph_reference(path: str = GRAPH_REFERENCE) -> dict | None:
    """The pretrained tree-16 model's test measurements in `benchmarks/graph_grpo/results/graph_grpo.json` (`None` if absent)."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        recorded = json.load(f)
    tree = recorded.get("datasets", {}).get("tree")
    if tree is None:
        return None
    return {
        "file": os.path.relpath(path, os.path.dirname(HERE)),
        "command": tree.get("pretraining", {}).get("command"),
        "settings": {k: recorded["settings"][k] for k in ("num_nodes", "seeds", "num_samples", "num_inference_steps")},
        "pretrained": tree["summary"]["pretrained"],
    }


def graph_targets(results: dict) -> list[dict]:
    """The entry reproduces the benchmark's pretrained model: V.U.N. difference within 2 SE (in SE units)."""
    from diffusers_ext.evaluation.protocol import target

    reference = results.get("reference")
    if reference is None:
        return [target("graph-flow-tree16: |V.U.N. - graph_grpo.json pretrained| / SE", float("nan"), 2.0, "<=")]
    ours, theirs = results["summary"]["vun"], reference["pretrained"]["vun"]
    se = math.sqrt(ours["sem"] ** 2 + theirs["sem"] ** 2)
    difference = abs(ours["mean"] - theirs["mean"])
    value = 0.0 if difference == 0 else (difference / se if se > 0 else float("inf"))
    return [target("graph-flow-tree16: |V.U.N. - graph_grpo.json pretrained| / SE", value, 2.0, "<=")]


def graph_report_sections(results) -> list[str]:
    s, settings = results["summary"], results["settings"]
    reference = results.get("reference")

    def cell(part, key, digits=3):
        return f"{part[key]['mean']:.{digits}f} ± {part[key]['sem']:.{digits}f}"

    lines = [
        f"`graph-flow-tree16`: {len(settings['graph_seeds'])} seeds x {settings['graph_num_samples']} graphs of 16 "
        f"nodes at {settings['graph_num_inference_steps']} CTMC steps (generator seed 1000 + seed); mean ± standard "
        "error over the seeds. Novelty is against the regenerated training split, MMDs are to the test split.",
        "",
        "| model | valid | unique | novel | V.U.N. | degree MMD ratio | spectral MMD ratio | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| zoo `graph-flow-tree16` | {cell(s, 'valid')} | {cell(s, 'unique')} | {cell(s, 'novel')} "
        f"| {cell(s, 'vun')} | {cell(s, 'ratio_degree', 2)} | {cell(s, 'ratio_spectral', 2)} "
        f"| {results['seconds']:.0f} |",
    ]
    if reference is not None:
        p = reference["pretrained"]
        lines.append(
            f"| pretrained model of `{reference['file']}` | {cell(p, 'valid')} | {cell(p, 'unique')} "
            f"| {cell(p, 'novel')} | {cell(p, 'vun')} | {cell(p, 'ratio_degree', 2)} "
            f"| {cell(p, 'ratio_spectral', 2)} | |"
        )
    lines += [
        "",
        f"Per-seed V.U.N.: {', '.join(f'{v:.3f}' for v in s['vun']['values'])}"
        + (
            f" (the benchmark's pretrained model: {', '.join(f'{v:.3f}' for v in reference['pretrained']['vun']['values'])})"
            if reference is not None
            else ""
        )
        + ".",
        "",
        f"Rebuild: `{results['rebuild_command']}`.",
    ]
    sanity = s["sanity"]
    if sanity["per_seed_vun_identical_to_reference"] and not sanity["per_seed_spectral_mmd_identical_to_reference"]:
        lines += [
            "",
            "The samples match the benchmark's per seed (V.U.N., edges, degree and clustering MMDs), but the spectral "
            "MMD does not. The largest normalised-Laplacian eigenvalue of a tree is exactly 2, the upper end of the "
            "spectral histogram's range, and `eigvalsh` returns it as 2.0 (counted) or a rounding error above "
            "(dropped), so for trees that statistic moves with rounding (node order, library versions); which change "
            "moved it here was not traced.",
        ]
    return lines


def main_graph(args, argv=None) -> dict:
    """Measure `graph-flow-tree16` and write `zoo_graph_flow_tree16.json` / `.md`."""
    from diffusers_ext import GraphFlowPipeline, zoo
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.evaluation.protocol import mean_spread
    from diffusers_ext.evaluation.reporting import command

    torch.set_num_threads(1)
    bench = _graph_grpo_benchmark()
    pipe = zoo.load(GRAPH_ENTRY)
    assert isinstance(pipe, GraphFlowPipeline)
    pipe.set_progress_bar_config(disable=True)
    num_nodes = 16
    splits = spectre_splits("tree", num_nodes, 0)
    start = time.perf_counter()
    per_seed = []
    for seed in args.graph_seeds:
        graphs = pipe(
            num_graphs=args.graph_num_samples,
            num_nodes=num_nodes,
            num_inference_steps=args.graph_num_inference_steps,
            generator=torch.Generator().manual_seed(bench.TEST_SAMPLE_SEED_OFFSET + seed),
        ).graphs
        per_seed.append(bench.measure(graphs, splits, "tree"))
        print(f"seed {seed}: " + ", ".join(f"{k} {per_seed[-1][k]:.3f}" for k in ("valid", "unique", "novel", "vun")))
    seconds = time.perf_counter() - start
    keys = [k for k in per_seed[0] if all(k in m for m in per_seed)]
    results = {
        "command": command(__file__, argv, omit=("--output_dir",)),
        "settings": {
            "entry": GRAPH_ENTRY,
            "graph_seeds": args.graph_seeds,
            "graph_num_samples": args.graph_num_samples,
            "graph_num_inference_steps": args.graph_num_inference_steps,
            "num_nodes": num_nodes,
            "threads": 1,
        },
        "rebuild_command": "python training/train_graph_flow.py "
        + " ".join(bench.pretrain_argv(bench.parse_args([]), "tree", f"diffusers_ext/zoo/{GRAPH_ENTRY}")),
        "per_seed": per_seed,
        "seconds": seconds,
        "summary": {k: mean_spread([m[k] for m in per_seed]) for k in keys},
        "reference": graph_reference(),
    }
    reference = results["reference"]
    results["summary"]["sanity"] = {
        "same_test_generators_as_reference": reference is not None
        and reference["settings"]["seeds"] == args.graph_seeds
        and reference["settings"]["num_samples"] == args.graph_num_samples
        and reference["settings"]["num_inference_steps"] == args.graph_num_inference_steps,
        "per_seed_vun_identical_to_reference": reference is not None
        and reference["pretrained"]["vun"]["values"] == results["summary"]["vun"]["values"],
        "per_seed_spectral_mmd_identical_to_reference": reference is not None
        and reference["pretrained"]["mmd_spectral"]["values"] == results["summary"]["mmd_spectral"]["values"],
    }
    results["summary"]["targets"] = targets_from_results(results)
    write_report(results, os.path.join(args.output_dir, GRAPH_STEM))
    print(json.dumps({k: results["summary"][k] for k in ("vun", "sanity", "targets")}, indent=2))
    return results


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, os.path.join(args.output_dir, os.path.splitext(os.path.basename(args.from_results))[0]))
        return results
    if args.entry == GRAPH_ENTRY:
        return main_graph(args, argv)
    from diffusers_ext import zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.evaluation.digits import evaluate_digits_generator
    from diffusers_ext.evaluation.protocol import binomial_standard_error
    from diffusers_ext.metrics import classifier_accuracy

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    classifier = zoo.load("digits-classifier")
    pipe = zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)

    heldout_images, heldout_labels = load_digits_images("heldout", resolution=classifier.config.sample_size)
    results = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k != "from_results"} | {"output_dir": None},
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

    headline = headline_run(results)
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
        "targets": digits_targets(results),
        "sanity": {
            "classifier_heldout_accuracy": results["classifier_heldout_accuracy"],
            "classifier_heldout_accuracy >= 0.97": results["classifier_heldout_accuracy"] >= 0.97,
            "real_split_frechet_distance": results["real_split_frechet_distance"],
            "train_vs_heldout_frechet_distance": results["train_vs_heldout_frechet_distance"],
        },
    }
    write_report(results, os.path.join(args.output_dir, "zoo"))
    print(json.dumps(results["summary"], indent=2))
    return results


if __name__ == "__main__":
    main()
