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

Measures nothing on the test items. Writes `results/embedding_assignment_validation.json` (a development record: no
targets; the benchmark's record is `federated_recommendation.json`).
"""

import argparse
import json
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


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", nargs="+", default=["random_half", "best_scoring"], help="Rules compared.")
    parser.add_argument(
        "--output", default=os.path.join(HERE, "results", "embedding_assignment_validation.json"), help="JSON path."
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {"command": command(__file__, argv, omit=("--output",)), "rules": compare(args.rules)}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    return results


if __name__ == "__main__":
    main()
