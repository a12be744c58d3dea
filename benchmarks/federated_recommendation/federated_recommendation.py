#!/usr/bin/env python
"""Measure federated recommendation with diffusion-generated user embeddings against single-embedding clients.

    python benchmarks/federated_recommendation/federated_recommendation.py

Two test beds, PFedRec's protocol (one client per user, leave-one-out by timestamp, 99 sampled negatives per
held-out item, HR@10 and NDCG@10, latent size 32, FedAvg of the shared side):

- **MovieLens-100K** (the `recbole` wheel's copy, `load_movielens_100k`), clean and with ambiguous feedback: a share p
  of each client's training positives flipped to random items it never interacted with (`flip_training_positives`;
  the held-out items are never touched). Per method and p: HR@10 / NDCG@10 on the test items, and ranking stability,
  Kendall's tau of each user's top-50 (training items excluded) between consecutive rounds (the last
  `--stability_rounds` pairs) and between two training seeds (every pair of the seeds).
- **MultiTasteWorld** (users mixing 2-3 known tastes): coverage of each true taste's top-10 items by a user's 30
  best-scored items, for the user's worst covered taste (`taste_coverage`).

Methods (`FederatedRecommendationTrainer`): `distributional` (ours: K embeddings drawn by the federated denoiser per
user, scores averaged), and the single-embedding baselines `fedmf`, `fedncf` and `pfedrec`.

Protocol: the split is fixed (its negatives drawn with seed 0), and so is each flip level's corruption (seed 0); the
training seeds change initialisation, client sampling, local negatives and the draws. Every method chooses on the
validation items (the second-latest interaction of each user; never the test item), with validation runs at their
own training seed, over a grid of the same size: the baselines over `--learning_rates`, ours over
`--distributional_learning_rates` x `--denoiser_learning_rates` x `--sample_counts` (its sampling setting, K); the
score is HR@10. The choice is made separately on each test bed and flip level. The test items are scored once,
with the frozen choices, at 3 training seeds. Comparisons are paired over users (each user's metric averaged over the seeds first), against the
best single-embedding baseline on the test bed (the highest test mean: the strictest comparison). The centralised
reference (the same model trained on pooled data) is a labelled ceiling on clean data, its learning rate chosen on
validation from `--centralised_learning_rates`. Writes `benchmarks/federated_recommendation/results/
federated_recommendation.json`, `.md` and `.png`.
"""

import argparse
import dataclasses
import os
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
OURS = "distributional"
BASELINES = ("fedmf", "fedncf", "pfedrec")
METHODS = (OURS, *BASELINES)
MIN_Z = 2.0
CLEAN_MARGIN = 0.01  # "within 1 point" of HR@10
VALIDATION_SEED = 100  # the validation runs' training seed, apart from the test seeds


def parse_args(argv=None):
    from diffusers_ext import FederatedRecommendationConfig
    from diffusers_ext.evaluation.reporting import add_from_results_argument
    from diffusers_ext.trainers.federated_recommendation_config import EMBEDDING_ASSIGNMENTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Test training seeds (>= 3).")
    parser.add_argument("--num_rounds", type=int, default=100, help="Federated rounds (PFedRec's 100).")
    parser.add_argument("--clients_per_round", type=int, default=64, help="Clients sampled per round.")
    parser.add_argument(
        "--learning_rates",
        type=float,
        nargs="+",
        default=[5.0, 10.0, 15.0, 20.0, 30.0, 40.0],
        help="The baselines' validation grid (SGD step of the local updates). FedAvg averages each item's update over "
        "every sampled client, most of which never touch it, so the useful steps are large (the default 0.05 barely "
        "moves from the initialisation in 100 rounds).",
    )
    parser.add_argument(
        "--distributional_learning_rates",
        type=float,
        nargs="+",
        default=[15.0, 30.0, 40.0],
        help="Ours' learning rates; with --denoiser_learning_rates and --sample_counts its grid has as many cells as "
        "the baselines'.",
    )
    parser.add_argument(
        "--denoiser_learning_rates",
        type=float,
        nargs="+",
        default=[0.03],
        help="Ours' Adam step of the denoiser (each round FedAvg averages one step of every sampled client, so the "
        "default 1e-3 leaves it nearly untrained after 100 rounds: validation HR@10 0.331 against 0.401 with 0.03 at "
        "learning rate 30 in the timing runs).",
    )
    parser.add_argument(
        "--sample_counts", type=int, nargs="+", default=[8, 32], help="Ours' sampling setting: embeddings drawn (K)."
    )
    parser.add_argument(
        "--embedding_assignment",
        choices=EMBEDDING_ASSIGNMENTS,
        default=FederatedRecommendationConfig.embedding_assignment,
        help="Which positives fit each of ours' client embeddings (the config's default; chosen on validation: "
        "embedding_assignment_validation.py).",
    )
    parser.add_argument("--flip_fractions", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    parser.add_argument("--stability_k", type=int, default=50, help="Length of the top lists of Kendall's tau.")
    parser.add_argument(
        "--stability_rounds", type=int, default=5, help="Consecutive-round pairs at the end of training compared."
    )
    parser.add_argument("--centralised_epochs", type=int, default=5, help="Passes over the pooled data (ceiling).")
    parser.add_argument(
        "--centralised_learning_rates",
        type=float,
        nargs="+",
        default=[0.2, 0.5],
        help="The ceiling's validation grid (sequential SGD takes far smaller steps than FedAvg).",
    )
    parser.add_argument("--world_users", type=int, default=200, help="Users of the multi-taste world.")
    parser.add_argument("--world_items", type=int, default=500, help="Items of the multi-taste world.")
    parser.add_argument("--coverage_list", type=int, default=30, help="Recommendation list length for coverage.")
    parser.add_argument("--taste_top", type=int, default=10, help="Top items of each true taste to cover.")
    parser.add_argument(
        "--output",
        type=str,
        default=None,
        help="Results stem (default: results/federated_recommendation; with --from_results, that file's own stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.output is None:
        args.output = (
            os.path.splitext(args.from_results)[0]
            if args.from_results
            else os.path.join(RESULTS, "federated_recommendation")
        )
    if not args.from_results:
        ours = len(args.distributional_learning_rates) * len(args.denoiser_learning_rates) * len(args.sample_counts)
        if ours != len(args.learning_rates):
            parser.error(
                f"every method's validation grid must have the same size: the baselines' has "
                f"{len(args.learning_rates)} cells, ours {ours} (learning rates x denoiser learning rates x sample "
                f"counts)."
            )
        if len(args.seeds) < 3:
            parser.error("--seeds: the protocol needs >= 3 seeds.")
    return args


def grid_of(method: str, args) -> list[dict]:
    """The method's validation grid (the same number of cells for every method)."""
    if method == OURS:
        return [
            {"learning_rate": lr, "denoiser_learning_rate": dlr, "num_samples": k}
            for lr in args.distributional_learning_rates
            for dlr in args.denoiser_learning_rates
            for k in args.sample_counts
        ]
    return [{"learning_rate": lr} for lr in args.learning_rates]


def config_of(method: str, choice: dict, seed: int, args, **overrides):
    from diffusers_ext import FederatedRecommendationConfig

    options = {"num_rounds": args.num_rounds, "clients_per_round": args.clients_per_round, **choice, **overrides}
    if method == OURS:
        options.setdefault("embedding_assignment", args.embedding_assignment)
    return FederatedRecommendationConfig(output_dir="unused", method=method, seed=seed, **options)  # nothing saved


def train(method: str, choice: dict, seed: int, split, args, **overrides):
    from diffusers_ext import FederatedRecommendationTrainer

    started = time.time()
    trainer = FederatedRecommendationTrainer(config_of(method, choice, seed, args, **overrides), split)
    trainer.train()
    return trainer, time.time() - started


def choose(method: str, split, args) -> dict:
    """The method's choice on the validation items (`choose_on_validation`, the test split left for later): ours
    trains once per pair of learning rates and is scored at each sample count (K only changes the sampling)."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    trained = {}

    def measure(choice, split_name):
        training = {k: v for k, v in choice.items() if k != "num_samples"}
        key = tuple(sorted(training.items()))
        if key not in trained:
            trained[key] = train(method, training, VALIDATION_SEED, split, args)
        trainer, seconds = trained[key]
        if "num_samples" in choice:
            trainer.config = dataclasses.replace(trainer.config, num_samples=choice["num_samples"])
        return {**trainer.evaluate(split_name, seed=VALIDATION_SEED), "train_seconds": seconds}

    return choose_on_validation(
        grid_of(method, args),
        measure,
        score=lambda m: m["hr@10"],
        names=lambda c: ", ".join(f"{k}={v}" for k, v in c.items()),
        test=False,
    )


def exclusion(split) -> list:
    return [np.asarray(items) for items in split.train]


def test_run(method: str, choice: dict, seed: int, split, args) -> dict:
    """One test run: train `num_rounds - stability_rounds` rounds, then each of the last `stability_rounds` rounds
    followed by the catalogue's scores (tau of each user's top-k against the round before); then the test items."""
    from diffusers_ext import FederatedRecommendationTrainer
    from diffusers_ext.evaluation.federated_recommendation import top_k_kendall_tau
    from diffusers_ext.trainers.federated_recommendation_trainer import hit_rate_and_ndcg

    started = time.time()
    trainer = FederatedRecommendationTrainer(config_of(method, choice, seed, args), split)
    trainer.train(args.num_rounds - args.stability_rounds)
    previous = trainer.catalogue_scores(seed=seed).numpy()
    taus = []
    for _ in range(args.stability_rounds):
        trainer.train(1)
        current = trainer.catalogue_scores(seed=seed).numpy()
        taus.append(top_k_kendall_tau(previous, current, args.stability_k, exclude=exclusion(split)))
        previous = current
    hits, ndcg = hit_rate_and_ndcg(trainer.candidate_scores("test", seed=seed), 10)
    run = {
        "hits": hits.numpy(),
        "ndcg": ndcg.numpy(),
        "round_tau": np.mean(taus, axis=0),
        "final_scores": previous,
        "seconds": time.time() - started,
    }
    if method == OURS:  # diagnostic: the clients' own stored embeddings, averaged, instead of the denoiser's draws
        run["own_embeddings_hits"] = own_embedding_hits(trainer)
    return run


@torch.no_grad()
def own_embedding_hits(trainer) -> np.ndarray:
    """HR@10 per user of the distributional clients' own K stored embeddings (their scores averaged): what a perfect
    denoiser could draw at most, separating the denoiser's error from the embeddings' quality."""
    from diffusers_ext.trainers.federated_recommendation_trainer import hit_rate_and_ndcg

    candidates = torch.as_tensor(trainer.split.test, dtype=torch.long)
    rows = [
        torch.sigmoid(
            trainer.item_model.scores(state["embeddings"], candidates[c][None].expand(len(state["embeddings"]), -1))
        ).mean(0)
        for c, state in enumerate(trainer.client_states)
    ]
    return hit_rate_and_ndcg(torch.stack(rows), 10)[0].numpy()


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Paired difference over users `a - b` (each a per-user vector, already averaged over seeds)."""
    from diffusers_ext.evaluation.protocol import paired_difference

    result = paired_difference(a.tolist(), b.tolist())
    result.pop("values")
    return result


def summarise(runs: list, key: str) -> dict:
    """Mean over seeds of a per-user metric: the seeds' spread (`mean_spread` of the per-seed means) and the
    per-user standard error of the seed-averaged vector."""
    from diffusers_ext.evaluation.protocol import mean_spread

    per_user = np.mean([run[key] for run in runs], axis=0)
    spread = mean_spread([float(np.mean(run[key])) for run in runs])
    spread["user_sem"] = float(per_user.std(ddof=1) / np.sqrt(len(per_user)))
    return spread


def seed_tau(runs: list, split, args) -> np.ndarray:
    """Per user, Kendall's tau of the final top-k between every pair of seeds, averaged over the pairs."""
    from diffusers_ext.evaluation.federated_recommendation import top_k_kendall_tau

    pairs = [(i, j) for i in range(len(runs)) for j in range(i + 1, len(runs))]
    return np.mean(
        [
            top_k_kendall_tau(runs[i]["final_scores"], runs[j]["final_scores"], args.stability_k, exclusion(split))
            for i, j in pairs
        ],
        axis=0,
    )


def popularity_hit_rate(split) -> float:
    """HR@10 of ranking the candidates by their training popularity (no personalisation): the floor a recommender
    must beat."""
    counts = np.bincount(np.concatenate(split.train), minlength=split.num_items).astype(np.float64)
    scores = counts[split.test]
    rank = (scores[:, 1:] >= scores[:, :1]).sum(1)
    return float((rank < 10).mean())


def run_level(split, fraction: float, args) -> dict:
    """One flip level of MovieLens-100K: the choices on validation, the test runs and their comparisons."""
    from diffusers_ext.evaluation.federated_recommendation import flip_training_positives

    started = time.time()
    data = flip_training_positives(split, fraction, seed=0)
    flipped = int(sum(int((a != b).sum()) for a, b in zip(split.train, data.train)))
    validation = {method: choose(method, data, args) for method in METHODS}
    per_user, test = {}, {}
    for method in METHODS:
        choice = validation[method]["chosen"]["candidate"]
        runs = [test_run(method, choice, seed, data, args) for seed in args.seeds]
        row = {
            "hr@10": summarise(runs, "hits"),
            "ndcg@10": summarise(runs, "ndcg"),
            "round_tau": summarise(runs, "round_tau"),
            "run_seconds": [run["seconds"] for run in runs],
        }
        between = seed_tau(runs, data, args)
        row["seed_tau"] = {
            "mean": float(between.mean()),
            "user_sem": float(between.std(ddof=1) / np.sqrt(len(between))),
        }
        per_user[method] = {
            "hr@10": np.mean([run["hits"] for run in runs], axis=0),
            "round_tau": np.mean([run["round_tau"] for run in runs], axis=0),
            "seed_tau": between,
        }
        if method == OURS:
            row["own_embeddings_hr@10"] = summarise(runs, "own_embeddings_hits")
        test[method] = row
    comparisons = {}
    for metric, pick in (("hr@10", "mean"), ("round_tau", "mean"), ("seed_tau", "mean")):
        best = max(BASELINES, key=lambda m: test[m][metric][pick])
        comparisons[metric] = {"baseline": best, **paired(per_user[OURS][metric], per_user[best][metric])}
    return {
        "flip_fraction": fraction,
        "flipped_positives": flipped,
        "validation": validation,
        "test": test,
        "comparisons": comparisons,
        "popularity_hr@10": popularity_hit_rate(data),
        "seconds": time.time() - started,
    }


def run_centralised(split, args) -> dict:
    """The ceiling on clean data: ours on pooled data (every client each epoch, sequential SGD: the denoiser takes
    one Adam step per client, nothing averaged, at the default step), its learning rate chosen on validation, one
    seed."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    started = time.time()
    trained = {}

    def measure(lr, split_name):
        if lr not in trained:
            trained[lr] = train(
                OURS, {"learning_rate": lr}, VALIDATION_SEED, split, args, centralised=True,
                num_rounds=args.centralised_epochs,
            )[0]  # fmt: skip
        return trained[lr].evaluate(split_name, seed=VALIDATION_SEED)

    record = choose_on_validation(args.centralised_learning_rates, measure, score=lambda m: m["hr@10"])
    record["method"] = OURS
    record["epochs"] = args.centralised_epochs
    record["seconds"] = time.time() - started
    return record


def run_movielens(args) -> dict:
    from diffusers_ext.data.movielens import leave_one_out_split, load_movielens_100k

    split = leave_one_out_split(load_movielens_100k(), num_negatives=99, seed=0)
    levels = [run_level(split, fraction, args) for fraction in args.flip_fractions]
    return {
        "users": len(split.train),
        "items": split.num_items,
        "skipped_users": len(split.skipped),
        "training_positives": int(sum(len(t) for t in split.train)),
        "levels": levels,
        "centralised": run_centralised(split, args),
    }


def build_world(args) -> tuple:
    """The multi-taste world, its fixed split and each user's true tastes' top items: `(world, split, tastes)`."""
    from diffusers_ext.data.movielens import MultiTasteWorld, leave_one_out_split

    world = MultiTasteWorld(num_users=args.world_users, num_items=args.world_items, seed=0)
    split = leave_one_out_split(world.interactions, num_negatives=99, seed=0)
    return world, split, [world.top_items(int(user), args.taste_top) for user in split.users]


def run_world(args) -> dict:
    """The multi-taste world: the same choices on validation (by HR@10: a deployment has no taste truth), then the
    worst-taste coverage of each method at the test seeds, against the true mixture's own coverage (headroom)."""
    from diffusers_ext.evaluation.federated_recommendation import taste_coverage

    started = time.time()
    world, split, tastes = build_world(args)
    mixture = np.stack(
        [world.weights[int(u)] @ world.taste_probabilities(int(u)) for u in split.users]
    )  # the true interaction distribution: the headroom
    oracle_worst, _ = taste_coverage(mixture, tastes, args.coverage_list)
    validation, test, per_user = {}, {}, {}
    for method in METHODS:
        validation[method] = choose(method, split, args)
        choice = validation[method]["chosen"]["candidate"]
        worst, mean, hits = [], [], []
        for seed in args.seeds:
            trainer, _ = train(method, choice, seed, split, args)
            scores = trainer.catalogue_scores(seed=seed).numpy()
            w, m = taste_coverage(scores, tastes, args.coverage_list)
            worst.append(w), mean.append(m), hits.append(trainer.evaluate("test", seed=seed)["hr@10"])
        per_user[method] = np.mean(worst, axis=0)
        test[method] = {
            "worst_taste_coverage": {
                "mean": float(per_user[method].mean()),
                "per_seed": [float(w.mean()) for w in worst],
            },
            "mean_taste_coverage": float(np.mean(mean)),
            "hr@10": hits,
        }
    best = max(BASELINES, key=lambda m: test[m]["worst_taste_coverage"]["mean"])
    return {
        "users": len(split.train),
        "items": split.num_items,
        "validation": validation,
        "test": test,
        "comparison": {"baseline": best, **paired(per_user[OURS], per_user[best])},
        "oracle_worst_taste_coverage": float(oracle_worst.mean()),
        "seconds": time.time() - started,
    }


def level_at(results: dict, fraction: float) -> dict:
    for level in results["movielens"]["levels"]:
        if abs(level["flip_fraction"] - fraction) < 1e-9:
            return level
    raise ValueError(f"the results hold no flip level {fraction}.")


def targets_of(results: dict) -> list:
    from diffusers_ext.evaluation.protocol import target

    world = results["world"]["comparison"]
    rows = [
        target(
            f"multi-taste world: worst-taste coverage above the best baseline ({world['baseline']}), paired z over users",
            world["z"],
            MIN_Z,
        )
    ]
    for fraction in (0.2, 0.3):
        c = level_at(results, fraction)["comparisons"]["hr@10"]
        rows.append(
            target(
                f"ML-100K p={fraction:g}: HR@10 above the best baseline ({c['baseline']}), paired z over users",
                c["z"],
                MIN_Z,
            )
        )
    clean = level_at(results, 0.0)["comparisons"]
    for metric, what in (("round_tau", "between consecutive rounds"), ("seed_tau", "between seeds")):
        c = clean[metric]
        rows.append(
            target(
                f"ML-100K clean: top-50 Kendall tau {what} above the most stable baseline ({c['baseline']}), paired z",
                c["z"],
                MIN_Z,
            )
        )
    c = clean["hr@10"]
    rows.append(
        target(
            f"ML-100K clean: HR@10 within 1 point of the best baseline ({c['baseline']}): difference",
            c["difference"],
            -CLEAN_MARGIN,
        )
    )
    return rows


def sections_of(results: dict) -> list:
    ml = results["movielens"]
    lines = [
        f"## MovieLens-100K ({ml['users']} users, {ml['items']} items, {ml['training_positives']} training positives; "
        f"{ml['skipped_users']} users skipped by the split)",
        "",
        "Test HR@10 / NDCG@10 (mean over seeds; +- the seeds' standard error) and ranking stability (Kendall tau of "
        "each user's top-50, training items excluded; mean over users). Validation choices per method in the last "
        "column.",
        "",
        "| p | method | HR@10 | NDCG@10 | tau (rounds) | tau (seeds) | choice (validation HR@10) | 100-round run (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in ml["levels"]:
        for method in METHODS:
            t, v = level["test"][method], level["validation"][method]["chosen"]
            lines.append(
                f"| {level['flip_fraction']:g} | {method} | {t['hr@10']['mean']:.4f} +- {t['hr@10']['sem']:.4f} | "
                f"{t['ndcg@10']['mean']:.4f} +- {t['ndcg@10']['sem']:.4f} | {t['round_tau']['mean']:.3f} | "
                f"{t['seed_tau']['mean']:.3f} | {v['name']} ({v['score']:.3f}) | {np.mean(t['run_seconds']):.0f} |"
            )
    lines += [
        "",
        "Ours against the best baseline at each p (paired over users, each user's value averaged over the seeds):",
        "",
        "| p | metric | baseline | difference | SE | z |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for level in ml["levels"]:
        for metric, c in level["comparisons"].items():
            lines.append(
                f"| {level['flip_fraction']:g} | {metric} | {c['baseline']} | {c['difference']:+.4f} | {c['sem']:.4f} | "
                f"{c['z']:.2f} |"
            )
    lines += ["", "Headroom and diagnostics:", ""]
    for level in ml["levels"]:
        own = level["test"][OURS]["own_embeddings_hr@10"]["mean"]
        lines.append(
            f"- p={level['flip_fraction']:g} ({level['flipped_positives']} positives flipped): popularity HR@10 "
            f"{level['popularity_hr@10']:.4f}; ours scored with its clients' own K stored embeddings instead of the "
            f"denoiser's draws: HR@10 {own:.4f}."
        )
    c = ml["centralised"]
    lines += [
        f"- Ceiling (labelled upper reference, not a competitor): `{c['method']}` trained on the pooled data, "
        f"{c['epochs']} epochs, learning rate {c['chosen']['candidate']} chosen on validation: test HR@10 "
        f"{c['test']['hr@10']:.4f}, NDCG@10 {c['test']['ndcg@10']:.4f} (one seed).",
        "",
    ]
    w = results["world"]
    lines += [
        f"## Multi-taste world ({w['users']} users, {w['items']} items, 2-3 tastes each)",
        "",
        f"Coverage of each true taste's top-{results['settings']['taste_top']} items by the user's "
        f"{results['settings']['coverage_list']} best-scored items (the worst covered taste, and the mean over tastes); "
        f"the true mixture's own worst-taste coverage (headroom): {w['oracle_worst_taste_coverage']:.3f}.",
        "",
        "| method | worst-taste coverage | per seed | mean-taste coverage | test HR@10 per seed | choice |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        t = w["test"][method]
        lines.append(
            f"| {method} | {t['worst_taste_coverage']['mean']:.3f} | "
            f"{', '.join(f'{x:.3f}' for x in t['worst_taste_coverage']['per_seed'])} | {t['mean_taste_coverage']:.3f} | "
            f"{', '.join(f'{x:.3f}' for x in t['hr@10'])} | {w['validation'][method]['chosen']['name']} |"
        )
    c = w["comparison"]
    lines += [
        "",
        f"Ours - {c['baseline']} (worst-taste coverage, paired over users): {c['difference']:+.4f} (SE {c['sem']:.4f}, "
        f"z {c['z']:.2f}).",
        "",
    ]
    return lines


def draw_figure(results: dict):
    def draw(path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        levels = results["movielens"]["levels"]
        fractions = [100 * level["flip_fraction"] for level in levels]
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for method in METHODS:
            for ax, metric in zip(axes[:2], ("hr@10", "round_tau")):
                means = [level["test"][method][metric]["mean"] for level in levels]
                errors = [level["test"][method][metric]["user_sem"] for level in levels]
                ax.errorbar(fractions, means, yerr=errors, marker="o", capsize=3, label=method)
        ceiling = results["movielens"]["centralised"]["test"]["hr@10"]
        axes[0].axhline(ceiling, color="grey", linestyle="--", label="centralised ceiling (clean)")
        axes[0].set(xlabel="flipped training positives (%)", ylabel="test HR@10", title="ML-100K: HR@10 against p")
        axes[1].set(xlabel="flipped training positives (%)", ylabel="Kendall tau, top-50",
                    title="ML-100K: stability between rounds")  # fmt: skip
        world = results["world"]["test"]
        axes[2].bar(list(METHODS), [world[m]["worst_taste_coverage"]["mean"] for m in METHODS])
        axes[2].axhline(results["world"]["oracle_worst_taste_coverage"], color="grey", linestyle="--", label="truth")
        axes[2].set(ylabel="worst-taste coverage", title="Multi-taste world")
        for ax in axes:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    return draw


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    s = results["settings"]
    write_results(
        stem,
        results,
        "Federated recommendation: diffusion-generated user embeddings vs single-embedding clients",
        sections=sections_of(results),
        settings_line=(
            f"Test seeds {s['seeds']} (validation runs at seed {VALIDATION_SEED}); {s['num_rounds']} rounds of "
            f"{s['clients_per_round']} clients; baselines' learning rates {s['learning_rates']}; ours' learning rates "
            f"{s['distributional_learning_rates']} x denoiser's {s['denoiser_learning_rates']} x K {s['sample_counts']}; flip levels {s['flip_fractions']}; "
            f"stability over the last {s['stability_rounds']} round pairs, top-{s['stability_k']}; ours' embedding "
            f"assignment {s.get('embedding_assignment', 'random_half')}."
        ),
        figures={".png": draw_figure(results)},
    )


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.evaluation.protocol import targets_status
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    if args.from_results:
        results = rebuild_results(args.from_results, targets_of, rel_to=REPO)
        write_report(results, args.output)
        return results
    torch.set_num_threads(1)
    started = time.time()
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "pairing": "paired over users: each user's metric averaged over the test seeds, then ours minus the best "
        "baseline's per user (protocol.paired_difference); seed spreads reported beside",
    }
    results["world"] = run_world(args)
    results["movielens"] = run_movielens(args)
    results["seconds"] = time.time() - started
    results["summary"] = {"targets": targets_of(results)}
    results["summary"]["sanity"] = {
        "flipped_positives": {
            f"{lv['flip_fraction']:g}": lv["flipped_positives"] for lv in results["movielens"]["levels"]
        },
        "popularity_hr@10": {
            f"{lv['flip_fraction']:g}": lv["popularity_hr@10"] for lv in results["movielens"]["levels"]
        },
        "world_oracle_worst_taste_coverage": results["world"]["oracle_worst_taste_coverage"],
    }
    write_report(results, args.output)
    print(targets_status(results["summary"]["targets"]))
    return results


if __name__ == "__main__":
    main()
