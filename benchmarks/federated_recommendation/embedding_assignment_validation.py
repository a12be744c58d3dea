#!/usr/bin/env python
"""Choose ours' embedding assignment on validation only: `"best_scoring"` against `"random_half"`.

    python benchmarks/federated_recommendation/embedding_assignment_validation.py

For each rule, at the validation settings of `federated_recommendation.py` (its validation training seed, rounds,
clients and ours' grid of learning rates x K):

- **MovieLens-100K, clean**: ours' validation grid and its chosen cell by validation HR@10 (`choose`).
- **Multi-taste world**: the same choice by validation HR@10, then the worst-taste coverage (`taste_coverage`, the
  benchmark's list length and taste tops) of the chosen cell retrained at the validation seed. Coverage compares the
  recommendations with the world's true tastes, built from the training items alone; no test item is scored.
  Diagnostics of that trainer: the coverage of the clients' own stored embeddings (no denoiser), the share of a
  client's positives in its largest group and the groups' taste purity (`assignment_diagnostics`).

Measures nothing on the test items. Its targets are the adoption rule, fixed before the run: `best_scoring` becomes
the default only if it is at least as good as `random_half` on every one of the three validation measures. Writes
`results/embedding_assignment_validation.json` and `.md` (a development record; the benchmark's record is
`federated_recommendation.json`); `--from_results` rebuilds the report from the JSON.
"""

import argparse
import os
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))


@torch.no_grad()
def own_embedding_scores(trainer) -> np.ndarray:
    """`(clients, items)`: each client's own stored embeddings' scores, averaged (no denoiser): what the denoiser's
    draws could reach at best."""
    return np.stack(
        [torch.sigmoid(trainer.item_model.scores(s["embeddings"])).mean(0).numpy() for s in trainer.client_states]
    )


@torch.no_grad()
def assignment_diagnostics(trainer, world) -> dict:
    """How the trained clients' embeddings split their positives, under the rule they were trained with: the mean
    share of a client's positives fitted by its largest group, and the taste purity (each positive labelled with the
    user's true taste most likely to draw it; per client, the share of an embedding's positives from its dominant
    taste, over all assignments), beside the purity of a single group of all positives (the dominant taste's
    share)."""
    largest, purity, single = [], [], []
    for client, user in enumerate(trainer.split.users):
        masks = trainer.positive_masks(client, trainer.item_model).numpy()
        labels = world.taste_probabilities(int(user))[:, trainer.split.train[client]].argmax(0)
        counts = np.stack([np.bincount(labels[mask], minlength=labels.max() + 1) for mask in masks])
        largest.append(masks.sum(1).max() / masks.shape[1])
        purity.append(counts.max(1).sum() / counts.sum())
        single.append(np.bincount(labels).max() / len(labels))
    return {
        "world_largest_group_share": float(np.mean(largest)),
        "world_taste_purity": float(np.mean(purity)),
        "world_single_group_taste_purity": float(np.mean(single)),
    }


def compare(rules, argv=()) -> dict:
    from diffusers_ext.data.movielens import leave_one_out_split, load_movielens_100k
    from diffusers_ext.evaluation.federated_recommendation import taste_coverage
    from diffusers_ext.evaluation.reporting import load_script

    bench = load_script(os.path.join(HERE, "federated_recommendation.py"))
    movielens = leave_one_out_split(load_movielens_100k(), num_negatives=99, seed=0)
    record = {}
    for rule in rules:
        args = bench.parse_args([*argv, "--embedding_assignment", rule])
        started = time.time()
        ml = bench.choose(bench.OURS, movielens, args)
        world_world, world_split, tastes = bench.build_world(args)
        world = bench.choose(bench.OURS, world_split, args)
        choice = world["chosen"]["candidate"]
        trainer, _ = bench.train(bench.OURS, choice, bench.VALIDATION_SEED, world_split, args)
        worst, mean = taste_coverage(
            trainer.catalogue_scores(seed=bench.VALIDATION_SEED).numpy(), tastes, args.coverage_list
        )
        own_worst, _ = taste_coverage(own_embedding_scores(trainer), tastes, args.coverage_list)
        record[rule] = {
            "movielens_validation": ml,
            "world_validation": world,
            "world_worst_taste_coverage": float(worst.mean()),
            "world_mean_taste_coverage": float(mean.mean()),
            "world_own_embeddings_worst_taste_coverage": float(own_worst.mean()),
            **assignment_diagnostics(trainer, world_world),
            "seconds": time.time() - started,
        }
        diagnostics = ", ".join(
            f"{k} {v:.4f}" for k, v in record[rule].items() if k.startswith("world_") and isinstance(v, float)
        )
        print(
            f"{rule}: ML-100K validation HR@10 {ml['chosen']['score']:.4f} ({ml['chosen']['name']}); world validation "
            f"HR@10 {world['chosen']['score']:.4f} ({world['chosen']['name']}), worst-taste coverage "
            f"{worst.mean():.4f}, mean-taste {mean.mean():.4f}; {diagnostics} ({time.time() - started:.0f} s)",
            flush=True,
        )
    return record


# The adoption rule's measures: (label, value of one rule's record).
ADOPTION_MEASURES = (
    ("ML-100K validation HR@10 of the chosen cell", lambda rule: rule["movielens_validation"]["chosen"]["score"]),
    ("world validation HR@10 of the chosen cell", lambda rule: rule["world_validation"]["chosen"]["score"]),
    ("world worst-taste coverage", lambda rule: rule["world_worst_taste_coverage"]),
)


def targets_from_results(results: dict) -> list[dict]:
    """The adoption rule as target rows: `best_scoring` minus `random_half` >= 0 on each validation measure."""
    from diffusers_ext.evaluation.protocol import target

    rules = results["rules"]
    return [
        target(
            f"best_scoring minus random_half: {label}", value(rules["best_scoring"]) - value(rules["random_half"]), 0.0
        )
        for label, value in ADOPTION_MEASURES
    ]


def report_sections(results: dict) -> list[str]:
    """The two rules side by side (Markdown lines)."""
    rules = results["rules"]
    names = list(rules)
    rows = [*((label, value) for label, value in ADOPTION_MEASURES)]
    rows += [
        (
            "world coverage of the clients' own stored embeddings",
            lambda r: r["world_own_embeddings_worst_taste_coverage"],
        ),
        ("largest group's share of a client's positives", lambda r: r["world_largest_group_share"]),
        ("taste purity of the groups", lambda r: r["world_taste_purity"]),
        ("taste purity of one group of all positives", lambda r: r["world_single_group_taste_purity"]),
    ]
    lines = ["## The two rules on validation", "", "| measure | " + " | ".join(names) + " |"]
    lines.append("| --- | " + " | ".join("---" for _ in names) + " |")
    for label, value in rows:
        lines.append(f"| {label} | " + " | ".join(f"{value(rules[n]):.3f}" for n in names) + " |")
    return lines


def main(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument, command, rebuild_results, write_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", nargs="+", default=["random_half", "best_scoring"], help="Rules compared.")
    parser.add_argument(
        "--output", default=os.path.join(HERE, "results", "embedding_assignment_validation.json"), help="JSON path."
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    title = "Federated recommendation: ours' embedding assignment chosen on validation"
    if args.from_results:
        results = rebuild_results(
            args.from_results, targets_from_results, rel_to=os.path.dirname(os.path.dirname(HERE))
        )
        return write_results(stem, results, title, report_sections(results))
    if sorted(args.rules) != ["best_scoring", "random_half"]:
        parser.error(
            f"--rules must be random_half and best_scoring (the adoption rule compares them), got {args.rules}."
        )
    torch.set_num_threads(1)
    results = {"command": command(__file__, argv, omit=("--output",)), "rules": compare(args.rules)}
    results["summary"] = {"targets": targets_from_results(results)}
    return write_results(stem, results, title, report_sections(results))


if __name__ == "__main__":
    main()
