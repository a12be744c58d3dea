"""Choose the parameter diffusion model of the certified-transfer benchmark on VALIDATION episodes only.

    python benchmarks/certified_transfer_model_selection.py --model_dirs run-a run-b ...

For each trained folder (`training/train_parameter_diffusion.py` outputs sharing one set of upstream adapters) it
draws a class of `--num_hypotheses` adapters and measures, on the benchmark's validation episodes at `--shots`
shots: the query accuracy of the adapter picked by support risk (what the benchmark's STEEL row measures), the mean
query accuracy of single draws, and how far the draws sit from the upstream adapters (standardised nearest-neighbour
distance and norm: memorisation and over-dispersion checks). The frozen backbone, the upstream class and the
Gaussian-fit class are measured on the same episodes as references. The benchmark's test episodes are never built.
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
from diffusers_ext.evaluation.reporting import command, without_machine_paths, write_results


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dirs", nargs="+", required=True, help="Trained SampleThenEvaluatePipeline folders.")
    parser.add_argument("--classifier_path", default="diffusers_ext/zoo/digits-classifier", help="Frozen backbone.")
    parser.add_argument("--num_validation_episodes", type=int, default=40, help="Validation episodes.")
    parser.add_argument("--shots", type=int, default=16, help="Support examples per class.")
    parser.add_argument("--num_hypotheses", type=int, default=500, help="|Theta| of each sampled class.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps of the sampler.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the class draws.")
    parser.add_argument(
        "--output", default="benchmarks/results/certified_transfer_model_selection", help="Results stem."
    )
    args = parser.parse_args(argv)
    for folder in args.model_dirs:
        if not os.path.isfile(os.path.join(folder, "upstream_adapters.safetensors")):
            parser.error(f"--model_dirs {folder!r} holds no upstream_adapters.safetensors.")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    k = args.shots
    proxy = load_proxy(args.classifier_path)
    episodes = build_episodes(proxy, "validation", args.num_validation_episodes, [k], 0)

    def mean_query_accuracy(vectors):  # (H,) query accuracy of each vector, averaged over the episodes
        risks = [proxy.risks(vectors, *e["splits"][k][1], e["classes"]) for e in episodes]
        return 1 - torch.stack(risks).mean(0)

    def picked_query_accuracy(vectors):
        index = class_risks(proxy, vectors, episodes, k).argmin(1)
        return float(1 - query_errors(proxy, vectors[index], episodes, k).mean())

    upstream = load_file(os.path.join(args.model_dirs[0], "upstream_adapters.safetensors"))["vectors"]
    gaussian = gaussian_fit_sample(upstream, args.num_hypotheses, torch.Generator().manual_seed(args.seed))
    references = {
        "frozen_backbone": float(mean_query_accuracy(torch.zeros(1, proxy.dim))[0]),
        "upstream_class_pick": picked_query_accuracy(upstream),
        "upstream_single_mean": float(mean_query_accuracy(upstream).mean()),
        "gaussian_class_pick": picked_query_accuracy(gaussian),
        "gaussian_single_mean": float(mean_query_accuracy(gaussian[:100]).mean()),
    }
    models = {}
    for folder in args.model_dirs:
        other = load_file(os.path.join(folder, "upstream_adapters.safetensors"))["vectors"]
        if not torch.equal(other, upstream):
            raise ValueError(f"{folder!r} was trained on other upstream adapters than {args.model_dirs[0]!r}.")
        pipe = SampleThenEvaluatePipeline.from_pretrained(folder)
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
        out = pipe(
            num_hypotheses=args.num_hypotheses,
            evaluate_fn=lambda h: torch.zeros(h.shape[0]),  # the draw only; risks are measured below
            num_support=5 * k,
            generator=torch.Generator().manual_seed(args.seed),
            num_inference_steps=args.num_inference_steps,
        )
        draws = out.hypotheses
        z, z_upstream = pipe.vectorizer.standardize(draws[:200]), pipe.vectorizer.standardize(upstream)
        between = torch.cdist(z_upstream, z_upstream)
        between.fill_diagonal_(float("inf"))
        with open(os.path.join(folder, "training_metrics.json"), encoding="utf-8") as f:
            training = json.load(f)
        models[os.path.basename(os.path.normpath(folder))] = {
            "training_command": without_machine_paths(training.get("command") or ""),
            "final_loss": training["final_loss"],
            "prediction_type": pipe.scheduler.config.prediction_type,
            "picked_query_accuracy": picked_query_accuracy(draws),
            "single_draw_mean_query_accuracy": float(mean_query_accuracy(draws[:100]).mean()),
            "nearest_upstream_distance_median": float(torch.cdist(z, z_upstream).min(1).values.median()),
            "upstream_nearest_neighbour_distance_median": float(between.min(1).values.median()),
            "draw_norm_median": float(z.norm(dim=1).median()),
            "upstream_norm_median": float(z_upstream.norm(dim=1).median()),
        }
        print(json.dumps({folder: models[os.path.basename(os.path.normpath(folder))]}), file=sys.stderr)
    chosen = max(models, key=lambda m: models[m]["picked_query_accuracy"])
    targets = [
        target(
            f"chosen model's picked query accuracy minus the frozen backbone's ({k} shots, validation)",
            models[chosen]["picked_query_accuracy"] - references["frozen_backbone"],
            1e-9,
        )
    ]
    results = {
        "command": without_machine_paths(command(__file__, omit=("--output",))),
        "settings": {
            **{k_: v for k_, v in vars(args).items() if k_ not in ("output", "model_dirs")},
            "model_dirs": [without_machine_paths(folder) for folder in args.model_dirs],
        },
        "summary": {"targets": targets, "chosen": chosen},
        "references": references,
        "models": models,
    }
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
    lines += [
        "",
        f"Upstream adapters: nearest-neighbour distance {first['upstream_nearest_neighbour_distance_median']:.1f}, "
        f"norm {first['upstream_norm_median']:.1f} (standardised). References on the same episodes: "
        + ", ".join(f"{name} {value:.3f}" for name, value in references.items())
        + ".",
    ]
    write_results(
        args.output,
        results,
        "Certified transfer: choosing the parameter diffusion model on validation episodes",
        sections=lines,
        settings_line=f"{args.num_validation_episodes} validation episodes, {k} shots, |Theta| = {args.num_hypotheses}",
    )


if __name__ == "__main__":
    main()
