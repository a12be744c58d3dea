"""Choose the parameter diffusion model of the certified-transfer benchmark on VALIDATION episodes only.

    python benchmarks/certified_transfer/certified_transfer_model_selection.py --model_dirs run-a run-b ...

For each trained folder (`training/train_parameter_diffusion.py` outputs) it draws a class of `--num_hypotheses`
adapters and measures, on the benchmark's validation episodes at `--shots` shots: the query accuracy of the adapter
picked by support risk (what the benchmark's STEEL row measures), the mean query accuracy of single draws, and how far
the draws sit from the folder's upstream adapters (standardised nearest-neighbour distance and norm: memorisation and
over-dispersion checks). The frozen backbone is measured on the same episodes, and for every distinct set of upstream
adapters among the folders (folders may differ in how many upstream tasks they were trained on) the upstream class and
the Gaussian-fit class of that set: the references a model trained on that set must beat. With `--class_sizes`
it also measures how the picked query accuracy grows with `|Theta|`: each model's class, the first `|Theta|` of
the upstream adapters (the tasks are drawn independently, so a prefix is a random subset) and a Gaussian-fit class,
at every size. The benchmark's test episodes are never built.
"""

import argparse
import json
import os
import sys

import torch
from certified_transfer import build_episodes, class_risks, query_errors
from diffusers import DDIMScheduler
from safetensors.torch import load_file

from diffusers_ext import SampleThenEvaluatePipeline
from diffusers_ext.evaluation.certified_transfer import gaussian_fit_sample, load_proxy
from diffusers_ext.evaluation.protocol import target
from diffusers_ext.evaluation.reporting import (
    add_from_results_argument,
    command,
    rebuild_results,
    without_machine_paths,
    write_results,
)


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
TITLE = "Certified transfer: choosing the parameter diffusion model on validation episodes"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model_dirs", nargs="+", default=None, help="Trained SampleThenEvaluatePipeline folders (required)."
    )
    parser.add_argument("--classifier_path", default="diffusers_ext/zoo/digits-classifier", help="Frozen backbone.")
    parser.add_argument("--num_validation_episodes", type=int, default=40, help="Validation episodes.")
    parser.add_argument("--shots", type=int, default=16, help="Support examples per class.")
    parser.add_argument("--num_hypotheses", type=int, default=500, help="|Theta| of each sampled class.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps of the sampler.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the class draws.")
    parser.add_argument(
        "--class_sizes",
        type=int,
        nargs="*",
        default=[],
        help="Also report the picked query accuracy at these |Theta| (one draw of the largest, read by prefix).",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Results stem (default: results/certified_transfer_model_selection; with --from_results, that file's "
        "own stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.output is None:
        args.output = (
            os.path.splitext(args.from_results)[0]
            if args.from_results
            else os.path.join(RESULTS, "certified_transfer_model_selection")
        )
    if args.from_results:
        return args
    if args.model_dirs is None:
        parser.error("--model_dirs is required (unless --from_results).")
    for size in args.class_sizes:
        if size < 1:
            parser.error(f"--class_sizes holds {size}; expected class sizes >= 1.")
    args.class_sizes = sorted(set(args.class_sizes))
    for folder in args.model_dirs:
        if not os.path.isfile(os.path.join(folder, "upstream_adapters.safetensors")):
            parser.error(f"--model_dirs {folder!r} holds no upstream_adapters.safetensors.")
    return args


def by_size(picks: dict) -> dict:
    """`{str(size): accuracy}`: a class-size table keyed as its JSON records it."""
    return {str(size): accuracy for size, accuracy in picks.items()}


def chosen_model(models: dict) -> str:
    """The model chosen on validation: the highest picked query accuracy (the first on a tie)."""
    return max(models, key=lambda m: models[m]["picked_query_accuracy"])


def targets_from_results(results: dict) -> list[dict]:
    """The computed target, from the recorded `models`, `references` and settings (the run and `--from_results`)."""
    models, k = results["models"], results["settings"]["shots"]
    chosen = chosen_model(models)
    return [
        target(
            f"chosen model's picked query accuracy minus the frozen backbone's ({k} shots, validation)",
            models[chosen]["picked_query_accuracy"] - results["references"]["frozen_backbone"],
            1e-9,
        )
    ]


def report_sections(results: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table, from the results alone."""
    models, references, chosen = results["models"], results["references"], results["summary"]["chosen"]
    if "upstream_references" not in results:
        return _single_upstream_set_sections(models, references, chosen)
    upstream_references = results["upstream_references"]
    lines = [
        f"Chosen (highest picked query accuracy on validation): `{chosen}`.",
        "",
        "| model | upstream set | prediction | final loss | picked query acc | upstream class pick "
        "| single-draw query acc | nearest-upstream dist | draw norm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in models.items():
        lines.append(
            f"| {name} | {m['upstream_set']} | {m['prediction_type']}{' (canonical)' if m['canonical_lora'] else ''} | "
            f"{m['final_loss']:.3f} | "
            f"{m['picked_query_accuracy']:.3f} | {upstream_references[m['upstream_set']]['upstream_class_pick']:.3f} | "
            f"{m['single_draw_mean_query_accuracy']:.3f} | {m['nearest_upstream_distance_median']:.1f} | "
            f"{m['draw_norm_median']:.1f} |"
        )
    lines += [
        "",
        f"Frozen backbone on the same episodes: {references['frozen_backbone']:.3f}. References of each upstream set "
        "(the class of its adapters and a Gaussian-fit class of it, both picked by support risk; distances "
        "standardised by the first model trained on the set):",
        "",
        "| upstream set | upstream class pick | upstream single mean | Gaussian-fit class pick | Gaussian single mean "
        "| upstream nearest-neighbour dist | upstream norm |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in upstream_references.items():
        first = next(m for m in models.values() if m["upstream_set"] == name)
        lines.append(
            f"| {name} | {r['upstream_class_pick']:.3f} | {r['upstream_single_mean']:.3f} | "
            f"{r['gaussian_class_pick']:.3f} | {r['gaussian_single_mean']:.3f} | "
            f"{first['upstream_nearest_neighbour_distance_median']:.1f} | {first['upstream_norm_median']:.1f} |"
        )
    sizes = results["settings"].get("class_sizes", [])
    if sizes:
        lines += [
            "",
            f"Picked query accuracy by class size |Theta| (one draw of {max(sizes)} per class, read by prefix; the "
            "upstream prefix is the first |Theta| upstream adapters, empty where the set is smaller):",
            "",
            "| class | " + " | ".join(str(size) for size in sizes) + " |",
            "| --- | " + " | ".join("---" for _ in sizes) + " |",
        ]

        def row(label, accuracies):
            cells = [f"{accuracies[str(size)]:.3f}" if str(size) in accuracies else "" for size in sizes]
            return f"| {label} | " + " | ".join(cells) + " |"

        for name, m in models.items():
            lines.append(row(f"{name} (diffusion)", m["by_class_size"]))
        for name, r in upstream_references.items():
            lines.append(row(f"upstream prefix of {name}", r["by_class_size"]["upstream_prefix"]))
            lines.append(row(f"Gaussian fit to {name}", r["by_class_size"]["gaussian"]))
    return lines


def _single_upstream_set_sections(models: dict, references: dict, chosen: str) -> list[str]:
    """The report of a file written before the references were kept per upstream set (every model trained on one
    set; its class and Gaussian-fit references beside the frozen backbone's in `references`)."""
    lines = [
        f"Chosen (highest picked query accuracy on validation): `{chosen}`.",
        "",
        "| model | prediction | final loss | picked query acc | single-draw query acc | nearest-upstream dist "
        "| draw norm |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in models.items():
        lines.append(
            f"| {name} | {m['prediction_type']} | {m['final_loss']:.3f} | {m['picked_query_accuracy']:.3f} | "
            f"{m['single_draw_mean_query_accuracy']:.3f} | {m['nearest_upstream_distance_median']:.1f} | "
            f"{m['draw_norm_median']:.1f} |"
        )
    first = next(iter(models.values()))
    return lines + [
        "",
        f"Upstream adapters: nearest-neighbour distance {first['upstream_nearest_neighbour_distance_median']:.1f}, "
        f"norm {first['upstream_norm_median']:.1f} (standardised). References on the same episodes: "
        + ", ".join(f"{name} {value:.3f}" for name, value in references.items())
        + ".",
    ]


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json` and `.md` through the shared reporting module."""
    s = results["settings"]
    write_results(
        stem,
        results,
        TITLE,
        sections=report_sections(results),
        settings_line=f"{s['num_validation_episodes']} validation episodes, {s['shots']} shots, |Theta| = {s['num_hypotheses']}",
    )


def main(argv=None):
    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, args.output)
        return results
    torch.set_num_threads(1)
    k = args.shots
    proxy = load_proxy(args.classifier_path)
    episodes = build_episodes(proxy, "validation", args.num_validation_episodes, [k], 0)

    def mean_query_accuracy(vectors):  # (H,) query accuracy of each vector, averaged over the episodes
        risks = [proxy.risks(vectors, *e["splits"][k][1], e["classes"]) for e in episodes]
        return 1 - torch.stack(risks).mean(0)

    def picked_query_accuracy(vectors, sizes=None):
        """The picked query accuracy of the class `vectors`; with `sizes`, `{size: that of its first size members}`
        (one set of support risks for all of them)."""
        risks = class_risks(proxy, vectors, episodes, k)

        def at(size):
            return float(1 - query_errors(proxy, vectors[risks[:, :size].argmin(1)], episodes, k).mean())

        return at(len(vectors)) if sizes is None else {size: at(size) for size in sizes}

    def draw(pipe, num):
        return pipe(
            num_hypotheses=num,
            evaluate_fn=lambda h: torch.zeros(h.shape[0]),  # the draw only; risks are measured apart
            num_support=5 * k,
            generator=torch.Generator().manual_seed(args.seed),
            num_inference_steps=args.num_inference_steps,
        ).hypotheses

    largest = max(args.class_sizes, default=0)

    name_of = {folder: os.path.basename(os.path.normpath(folder)) for folder in args.model_dirs}
    upstream_sets = []  # [(name, vectors)]: each distinct upstream set, named by the first folder trained on it
    set_of = {}
    for folder in args.model_dirs:
        vectors = load_file(os.path.join(folder, "upstream_adapters.safetensors"))["vectors"]
        match = next((name for name, other in upstream_sets if torch.equal(other, vectors)), None)
        if match is None:
            match = f"{len(vectors)} adapters ({name_of[folder]})"
            upstream_sets.append((match, vectors))
        set_of[folder] = match
    references = {"frozen_backbone": float(mean_query_accuracy(torch.zeros(1, proxy.dim))[0])}
    upstream_references = {}
    for name, upstream in upstream_sets:
        gaussian = gaussian_fit_sample(upstream, args.num_hypotheses, torch.Generator().manual_seed(args.seed))
        # the whole class and its prefixes from one set of support risks
        prefixes = [size for size in args.class_sizes if size < len(upstream)]
        upstream_picks = picked_query_accuracy(upstream, prefixes + [len(upstream)])
        upstream_references[name] = {
            "num_adapters": len(upstream),
            "upstream_class_pick": upstream_picks[len(upstream)],
            "upstream_single_mean": float(mean_query_accuracy(upstream).mean()),
            "gaussian_class_pick": picked_query_accuracy(gaussian),
            "gaussian_single_mean": float(mean_query_accuracy(gaussian[:100]).mean()),
        }
        if args.class_sizes:
            generator = torch.Generator().manual_seed(args.seed)
            upstream_references[name]["by_class_size"] = {
                "upstream_prefix": {
                    str(size): upstream_picks[size] for size in args.class_sizes if size <= len(upstream)
                },
                "gaussian": by_size(
                    picked_query_accuracy(gaussian_fit_sample(upstream, largest, generator), args.class_sizes)
                ),
            }
        print(json.dumps({name: upstream_references[name]}), file=sys.stderr)
    upstream_of = dict(upstream_sets)
    models = {}
    for folder in args.model_dirs:
        upstream = upstream_of[set_of[folder]]
        pipe = SampleThenEvaluatePipeline.from_pretrained(folder)
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
        draws = draw(pipe, args.num_hypotheses)
        with open(os.path.join(folder, "training_metrics.json"), encoding="utf-8") as f:
            training = json.load(f)
        canonical = training.get("canonical_lora", False)
        # distances in the space the model was trained in (canonical LoRA factors if it was trained on them)
        trained_on = pipe.vectorizer.canonicalize_lora(upstream) if canonical else upstream
        z, z_upstream = pipe.vectorizer.standardize(draws[:200]), pipe.vectorizer.standardize(trained_on)
        between = torch.cdist(z_upstream, z_upstream)
        between.fill_diagonal_(float("inf"))
        models[name_of[folder]] = {
            "upstream_set": set_of[folder],
            "training_command": without_machine_paths(training.get("command") or ""),
            "final_loss": training["final_loss"],
            "prediction_type": pipe.scheduler.config.prediction_type,
            "canonical_lora": canonical,
            "picked_query_accuracy": picked_query_accuracy(draws),
            "single_draw_mean_query_accuracy": float(mean_query_accuracy(draws[:100]).mean()),
            "nearest_upstream_distance_median": float(torch.cdist(z, z_upstream).min(1).values.median()),
            "upstream_nearest_neighbour_distance_median": float(between.min(1).values.median()),
            "draw_norm_median": float(z.norm(dim=1).median()),
            "upstream_norm_median": float(z_upstream.norm(dim=1).median()),
        }
        if args.class_sizes:
            models[name_of[folder]]["by_class_size"] = by_size(
                picked_query_accuracy(draw(pipe, largest), args.class_sizes)
            )
        print(json.dumps({folder: models[name_of[folder]]}), file=sys.stderr)
    results = {
        "command": without_machine_paths(command(__file__, argv, omit=("--output",))),
        "settings": {
            **{k_: v for k_, v in vars(args).items() if k_ not in ("output", "model_dirs", "from_results")},
            "model_dirs": [without_machine_paths(folder) for folder in args.model_dirs],
        },
        "summary": {"chosen": chosen_model(models)},
        "references": references,
        "upstream_references": upstream_references,
        "models": models,
    }
    results["summary"] = {"targets": targets_from_results(results), **results["summary"]}
    write_report(results, args.output)


if __name__ == "__main__":
    main()
