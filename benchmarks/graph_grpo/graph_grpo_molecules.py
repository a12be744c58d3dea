#!/usr/bin/env python
"""Graph-GRPO on molecules: QED maximisation with a fixed oracle-call budget, against best-of-N sampling and a graph
GA (refinement alone), all from one discrete graph flow model pretrained on small MOSES molecules.

    python benchmarks/graph_grpo/graph_grpo_molecules.py

Writes `benchmarks/graph_grpo/results/graph_grpo_molecules.json`, `.md` and `.png`. Needs RDKit and the `molsets` wheel
(`pip install rdkit` and `pip install --no-deps molsets==0.3.1`).

1. Pretraining: `training/train_graph_flow.py --dataset_name moses` on the MOSES training molecules with at most 16
   heavy atoms (7 atom types, kekulized bonds; the command is recorded, the folder cached under
   `benchmarks/.cache/graph_grpo_molecules/`, keyed by its settings).
2. Methods, each with the same oracle budget (`--budget` calls of `qed_reward`; every proposed graph is one call,
   valid or not, new or not; the PMO protocol counts only new valid molecules, so a sampler wasting calls on
   invalid or repeated graphs is penalised here and not there) and `--batch_size` proposals per round:
   - best-of-N: samples of the pretrained model, `--batch_size` at a time;
   - graph GA (refinement alone, no gradient): a first round of samples, then every round re-noises each of the
     `--ga_parents` best distinct molecules found so far to time `1 - noise_fraction` and regenerates
     `--batch_size / --ga_parents` children from it with the pretrained model;
   - Graph-GRPO: `GraphGRPOTrainer` with the QED reward, `--batch_size` fresh rollouts per step in groups of
     `--num_generations` (shared start), plus refinement groups (`--refine_top_k` best of the step re-noised and
     regenerated `--num_generations` times), the last `--train_max_steps` CTMC steps trained; every graph the
     trainer scores is an oracle call, and the run stops after the step that reaches the budget (calls past it are
     not counted).
3. Validation, the same tuning budget for each method (three runs on the validation seed, scored by AUC): best-of-N
   chooses its CTMC step count (`--bon_steps`), the GA its noise fraction (`--ga_noise_fractions`), Graph-GRPO its
   learning rate (`--learning_rates`). Test, once: the frozen choice of each method on every seed of `--seeds`.
4. Measures per run: the AUC of the top-10 curve (after each oracle call, the mean QED of the 10 best distinct valid
   molecules found so far, missing ones counted 0; the area under it over the budget, divided by the budget, so it
   lies in [0, 1]), the top-10 mean and the best QED at the budget, and the validity, uniqueness and novelty
   (against the training molecules) of all proposals. Mean ± standard error over seeds.

Targets (computed): the test bed leaves headroom (best-of-N's top-10 AUC <= 0.9; QED's maximum is about 0.948), and
Graph-GRPO's AUC exceeds each baseline's by more than 2 standard errors of the difference. The paper's PMO results
(ZINC250k pretraining, 10,000 oracle calls, 23 oracles) are not comparable to these numbers. One CPU thread.
"""

import argparse
import json
import math
import os
import tempfile
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
CACHE = os.path.join(HERE, ".cache", "graph_grpo_molecules")
METHODS = ("best_of_n", "graph_ga", "graph_grpo")
LABELS = {"best_of_n": "best-of-N", "graph_ga": "graph GA (refinement alone)", "graph_grpo": "Graph-GRPO"}
QED_MAX = 0.948  # QED's maximum (about 0.9484, Bickerton et al.'s desirability functions)
CURVE_EVERY = 25  # the recorded top-10 curve keeps every 25th call
CODE = [
    "benchmarks/graph_grpo/graph_grpo_molecules.py",
    "training/train_graph_flow.py",
    "diffusers_ext/trainers/graph_grpo_trainer.py",
    "diffusers_ext/trainers/graph_grpo_config.py",
    "diffusers_ext/schedulers/scheduling_graph_discrete_flow.py",
    "diffusers_ext/models/graph_transformer.py",
    "diffusers_ext/pipelines/graph_flow/pipeline_graph_flow.py",
    "diffusers_ext/data/graphs.py",
    "diffusers_ext/data/molecules.py",
    "diffusers_ext/rewards/molecules.py",
]


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=1000, help="Oracle calls per run (PMO uses 10,000).")
    parser.add_argument("--top_k", type=int, default=10, help="The curve's k (PMO's top-10).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Test seeds.")
    parser.add_argument("--validation_seed", type=int, default=100, help="Seed of the validation runs.")
    parser.add_argument("--batch_size", type=int, default=32, help="Proposals per round (every method).")
    parser.add_argument("--num_inference_steps", type=int, default=50, help="CTMC steps (GA and GRPO).")
    parser.add_argument("--max_heavy_atoms", type=int, default=16, help="MOSES molecules up to this size.")
    parser.add_argument("--num_train_molecules", type=int, default=0, help="Pretraining molecules (0: all).")
    parser.add_argument("--pretrain_steps", type=int, default=12000, help="Pretraining optimizer steps.")
    parser.add_argument("--pretrain_batch_size", type=int, default=32, help="Pretraining molecules per step.")
    parser.add_argument("--node_dim", type=int, default=64, help="Model node width.")
    parser.add_argument("--edge_dim", type=int, default=32, help="Model edge width.")
    parser.add_argument("--num_layers", type=int, default=4, help="Model layers.")
    parser.add_argument("--bon_steps", type=int, nargs="+", default=[25, 50, 100], help="Best-of-N's grid.")
    parser.add_argument(
        "--ga_noise_fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="The GA's grid."
    )
    parser.add_argument("--ga_parents", type=int, default=4, help="GA parents per round.")
    parser.add_argument(
        "--learning_rates", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3], help="Graph-GRPO's grid."
    )
    parser.add_argument("--num_generations", type=int, default=8, help="Graph-GRPO group size.")
    parser.add_argument("--refine_top_k", type=int, default=2, help="Graph-GRPO refinement parents per step.")
    parser.add_argument("--refine_noise_fraction", type=float, default=0.25, help="Graph-GRPO refinement noise.")
    parser.add_argument("--train_max_steps", type=int, default=25, help="Graph-GRPO trains the last N CTMC steps.")
    parser.add_argument("--beta", type=float, default=0.005, help="Graph-GRPO KL weight (the reference's).")
    parser.add_argument("--output_dir", default=RESULTS, help="Where graph_grpo_molecules.json/.md/.png go.")
    parser.add_argument("--cache_dir", default=CACHE, help="Cache of the pretrained model and finished runs.")
    parser.add_argument("--no_cache", action="store_true", help="Recompute every run (the cache is still written).")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.from_results is None and len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    for name in ("budget", "top_k", "batch_size", "num_inference_steps", "pretrain_steps", "ga_parents"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.batch_size % args.ga_parents:
        parser.error(f"--ga_parents ({args.ga_parents}) must divide --batch_size ({args.batch_size}).")
    if args.batch_size % args.num_generations or args.batch_size % 2:
        parser.error(
            f"--batch_size ({args.batch_size}) must be even and a multiple of --num_generations ({args.num_generations})."
        )
    if not 1 <= args.train_max_steps <= args.num_inference_steps:
        parser.error(f"--train_max_steps must lie in [1, {args.num_inference_steps}], got {args.train_max_steps}.")
    for fraction in (*args.ga_noise_fractions, args.refine_noise_fraction):
        if not 0 < fraction < 1:
            parser.error(f"noise fractions must lie in (0, 1), got {fraction}.")
    if args.validation_seed in args.seeds:
        parser.error(f"--validation_seed {args.validation_seed} must not be a test seed {args.seeds}.")
    return args


# ----------------------------------------------------------------------------------------------------------------
# The oracle and the top-k curve
# ----------------------------------------------------------------------------------------------------------------


class QEDOracle:
    """`qed_reward` as an oracle that records every call in order: the canonical SMILES (`None` if invalid) and the
    score of each graph it is asked about. It has the reward-function signature `f(graphs, **columns)`."""

    __name__ = "qed"

    def __init__(self):
        self.smiles: list = []
        self.scores: list[float] = []

    def __call__(self, graphs, **columns) -> list[float]:
        from diffusers_ext.data.molecules import graph_to_smiles
        from diffusers_ext.rewards.molecules import qed_reward

        scores = qed_reward(graphs)
        self.smiles += [graph_to_smiles(g) for g in graphs]
        self.scores += scores
        return scores

    def __len__(self) -> int:
        return len(self.scores)


def top_k_curve(scores, keys, k: int, budget: int) -> list[float]:
    """After each oracle call `c = 1 .. budget`, the mean score of the `k` best distinct molecules (by `keys`;
    `None` keys, invalid molecules, are skipped) among calls `1 .. c`, missing ones counted 0. A run with fewer
    than `budget` calls keeps its last value (as PMO extends a run that stopped early)."""
    if len(scores) != len(keys):
        raise ValueError(f"`scores` ({len(scores)}) and `keys` ({len(keys)}) must have the same length.")
    if not isinstance(k, int) or k < 1 or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"`k` and `budget` must be ints >= 1, got {k!r} and {budget!r}.")
    best: dict = {}
    curve, value = [], 0.0
    for c in range(budget):
        if c < len(scores) and keys[c] is not None:
            key, score = keys[c], float(scores[c])
            if score > best.get(key, -math.inf):
                best[key] = score
                value = sum(sorted(best.values(), reverse=True)[:k]) / k
        curve.append(value)
    return curve


def top_k_auc(scores, keys, k: int, budget: int) -> float:
    """The area under [`top_k_curve`] over `budget` calls, divided by `budget` (in [0, 1] for scores in [0, 1])."""
    return sum(top_k_curve(scores, keys, k, budget)) / budget


def measure(oracle: QEDOracle, args, train: set, seconds: float) -> dict:
    from diffusers_ext.data.molecules import smiles_metrics

    scores, smiles = oracle.scores[: args.budget], oracle.smiles[: args.budget]
    curve = top_k_curve(scores, smiles, args.top_k, args.budget)
    best = sorted({s: q for s, q in zip(smiles, scores) if s is not None}.items(), key=lambda x: -x[1])
    return {
        "auc_top10": sum(curve) / args.budget,
        "top10": curve[-1],
        "top1": best[0][1] if best else 0.0,
        **smiles_metrics(smiles, train),
        "calls": len(scores),
        "seconds": seconds,
        "curve": curve[CURVE_EVERY - 1 :: CURVE_EVERY],
        "best_molecules": [[s, q] for s, q in best[:5]],
    }


# ----------------------------------------------------------------------------------------------------------------
# Pretraining
# ----------------------------------------------------------------------------------------------------------------


def run_script(name: str, argv: list[str]) -> None:
    """Run `training/<name>.py argv` as a user would (`reporting.run_training_script`)."""
    from diffusers_ext.evaluation.reporting import run_training_script

    run_training_script(REPO, name, argv)


def pretrain_argv(args, output_dir: str) -> list[str]:
    return [
        "--output_dir", output_dir, "--dataset_name", "moses", "--max_heavy_atoms", str(args.max_heavy_atoms),
        "--num_train_molecules", str(args.num_train_molecules), "--max_train_steps", str(args.pretrain_steps),
        "--train_batch_size", str(args.pretrain_batch_size), "--node_dim", str(args.node_dim),
        "--edge_dim", str(args.edge_dim), "--num_layers", str(args.num_layers),
        "--checkpointing_steps", "1000", "--checkpoints_total_limit", "1", "--logging_steps", "500",
        "--num_eval_graphs", "64",
    ]  # fmt: skip


def pretrain(args) -> tuple[str, dict]:
    """The pretrained pipeline folder (trained here unless the cache holds one made with the same settings)."""
    folder = os.path.join(args.cache_dir, f"pretrain-moses{args.max_heavy_atoms}")
    inside = os.path.abspath(folder).startswith(REPO + os.sep)
    argv = pretrain_argv(args, os.path.relpath(folder, REPO) if inside else folder)
    settings = {"argv": argv[2:]}
    recorded = os.path.join(folder, "benchmark_settings.json")
    shown = "python training/train_graph_flow.py --output_dir " + os.path.basename(folder) + " " + " ".join(argv[2:])
    if not args.no_cache and os.path.isfile(os.path.join(folder, "model_index.json")) and os.path.isfile(recorded):
        with open(recorded, encoding="utf-8") as f:
            if json.load(f) == settings:
                return folder, {"command": shown, "cached": True}
    start = time.perf_counter()
    run_script("train_graph_flow", argv)
    with open(recorded, "w", encoding="utf-8") as f:
        json.dump(settings, f)
    return folder, {"command": shown, "cached": False, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------------------------------


def load_pipeline(folder: str):
    from diffusers_ext import GraphFlowPipeline

    pipe = GraphFlowPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def best_of_n(args, folder: str, seed: int, steps: int) -> QEDOracle:
    """Sample the pretrained model `--batch_size` graphs at a time until the budget is spent."""
    pipe, oracle = load_pipeline(folder), QEDOracle()
    generator = torch.Generator().manual_seed(seed)
    while len(oracle) < args.budget:
        count = min(args.batch_size, args.budget - len(oracle))
        oracle(pipe(num_graphs=count, num_inference_steps=steps, generator=generator).graphs)
    return oracle


@torch.no_grad()
def regenerate(pipe, graphs: list, noise_fraction: float, steps: int, generator) -> list:
    """Re-noise every graph to the first grid time `>= 1 - noise_fraction` (`add_noise`) and run the pretrained
    model's CTMC from there to the end (the refinement step of Graph-GRPO, without training)."""
    from diffusers_ext.data.graphs import dense_to_graphs, graphs_to_dense

    scheduler, model = pipe.scheduler, pipe.model
    X1, E1, mask = graphs_to_dense(graphs)
    scheduler.set_timesteps(steps)
    grid = scheduler.time_grid
    start = int(torch.searchsorted(grid[:-1].contiguous(), torch.tensor(1 - noise_fraction).to(grid)))
    start = min(start, steps - 1)
    X, E = scheduler.add_noise(X1, E1, grid[start].expand(len(graphs)), mask, generator)
    for t in scheduler.timesteps[start:]:
        out = model(X, E, t.expand(len(graphs)), mask)
        step = scheduler.step(out.node_logits, out.edge_logits, t, X, E, mask, generator)
        X, E = step.prev_node_classes, step.prev_edge_classes
    return dense_to_graphs(X, E, mask)


def graph_ga(args, folder: str, seed: int, noise_fraction: float) -> QEDOracle:
    """A first round of samples, then rounds of children regenerated from the best distinct molecules so far."""
    from diffusers_ext.data.molecules import smiles_to_graph

    pipe, oracle = load_pipeline(folder), QEDOracle()
    generator = torch.Generator().manual_seed(seed)
    oracle(pipe(num_graphs=args.batch_size, num_inference_steps=args.num_inference_steps, generator=generator).graphs)
    children = args.batch_size // args.ga_parents
    while len(oracle) < args.budget:
        best: dict = {}
        for smiles, score in zip(oracle.smiles, oracle.scores):
            if smiles is not None and score > best.get(smiles, -1.0):
                best[smiles] = score
        parents = sorted(best, key=lambda s: -best[s])[: args.ga_parents]
        if not parents:  # nothing valid yet: sample afresh
            graphs = pipe(
                num_graphs=args.batch_size, num_inference_steps=args.num_inference_steps, generator=generator
            )
            oracle(graphs.graphs)
            continue
        graphs = [smiles_to_graph(s) for s in parents for _ in range(children)]
        oracle(
            regenerate(pipe, graphs, noise_fraction, args.num_inference_steps, generator)[: args.budget - len(oracle)]
        )
    return oracle


def graph_grpo(args, folder: str, seed: int, learning_rate: float) -> tuple[QEDOracle, dict]:
    """`GraphGRPOTrainer` with the QED oracle as its reward, for the steps the budget allows."""
    from diffusers_ext import GraphGRPOConfig, GraphGRPOTrainer

    pipe, oracle = load_pipeline(folder), QEDOracle()
    per_step = args.batch_size + args.refine_top_k * args.num_generations
    with tempfile.TemporaryDirectory() as output_dir:
        config = GraphGRPOConfig(
            output_dir=output_dir,
            seed=seed,
            max_steps=math.ceil(args.budget / per_step),
            learning_rate=learning_rate,
            num_generations=args.num_generations,
            generation_batch_size=args.batch_size,
            per_device_train_batch_size=args.batch_size // 2,
            gradient_accumulation_steps=1,
            num_inference_steps=args.num_inference_steps,
            train_max_steps=args.train_max_steps,
            refine_top_k=args.refine_top_k,
            refine_noise_fraction=args.refine_noise_fraction,
            beta=args.beta,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        trainer = GraphGRPOTrainer(pipe, oracle, args=config)
        history = trainer.train()
    record = {
        "steps": len(history),
        "reward_curve": [h["reward"] for h in history],
        "refine_reward_curve": [h.get("refine/reward", float("nan")) for h in history],
        "kl": [h.get("kl", 0.0) for h in history],
    }
    return oracle, record


def run_method(args, method: str, folder: str, seed: int, choice, train: set, cache) -> dict:
    """One run of `method` with hyper-parameter `choice` and `seed` (cached by settings and code)."""
    name = f"{method}-seed{seed}-{choice:g}"

    def compute():
        torch.manual_seed(seed)
        start = time.perf_counter()
        extra = {}
        if method == "best_of_n":
            oracle = best_of_n(args, folder, seed, int(choice))
        elif method == "graph_ga":
            oracle = graph_ga(args, folder, seed, float(choice))
        else:
            oracle, extra = graph_grpo(args, folder, seed, float(choice))
        return {**measure(oracle, args, train, time.perf_counter() - start), **extra}

    return cache.get_or_compute(name, compute)[0]


GRIDS = {"best_of_n": "bon_steps", "graph_ga": "ga_noise_fractions", "graph_grpo": "learning_rates"}
CHOICE_NAMES = {"best_of_n": "CTMC steps", "graph_ga": "noise fraction", "graph_grpo": "learning rate"}


def run(args) -> dict:
    from diffusers_ext.data.molecules import moses_splits
    from diffusers_ext.evaluation.protocol import mean_spread
    from diffusers_ext.evaluation.reporting import ResultCache, choose_on_validation

    torch.set_num_threads(1)
    folder, pretrain_record = pretrain(args)
    with open(os.path.join(folder, "validation_metrics.json"), encoding="utf-8") as f:
        pretrain_record["validation_metrics"] = json.load(f)
    splits = moses_splits(args.max_heavy_atoms, args.num_train_molecules or None, num_val=0, num_test=1, seed=0)
    train = set(splits["train"])
    skip = ("output_dir", "cache_dir", "no_cache", "from_results", "seeds")
    settings = {k: v for k, v in vars(args).items() if k not in skip}
    cache = ResultCache(args.cache_dir, settings, [os.path.join(REPO, p) for p in CODE], enabled=not args.no_cache)
    methods = {}
    for method in METHODS:
        choice = choose_on_validation(
            getattr(args, GRIDS[method]),
            lambda c, split, method=method: run_method(args, method, folder, args.validation_seed, c, train, cache),
            lambda m: m["auc_top10"],
            names=lambda c, method=method: f"{CHOICE_NAMES[method]}={c:g}",
            test=False,
        )
        frozen = choice["chosen"]["candidate"]
        runs = [{"seed": seed, **run_method(args, method, folder, seed, frozen, train, cache)} for seed in args.seeds]
        keys = ("auc_top10", "top10", "top1", "valid", "unique", "novel", "vun", "seconds")
        methods[method] = {
            "validation": choice,
            "choice": frozen,
            "runs": runs,
            "summary": {k: mean_spread([r[k] for r in runs]) for k in keys},
        }
    return {"pretraining": pretrain_record, "num_train_molecules": len(train), "methods": methods}


def all_targets(results: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target, unpaired_difference

    summary = {m: part["summary"] for m, part in results["methods"].items()}
    rows = [
        target("headroom: best-of-N top-10 AUC (QED max 0.948)", summary["best_of_n"]["auc_top10"]["mean"], 0.9, "<=")
    ]
    ours = summary["graph_grpo"]["auc_top10"]
    for baseline in ("best_of_n", "graph_ga"):
        theirs = summary[baseline]["auc_top10"]
        rows.append(
            target(
                f"Graph-GRPO top-10 AUC minus {LABELS[baseline]}'s, minus 2 SE",
                unpaired_difference(ours, theirs)["difference"] - 2 * unpaired_difference(ours, theirs)["sem"],
                0.0,
            )
        )
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def _ms(d: dict, digits: int = 3) -> str:
    return f"{d['mean']:.{digits}f} ± {d['sem']:.{digits}f}"


def report_sections(results: dict) -> list[str]:
    s = results["settings"]
    pre = results["pretraining"]
    metrics = ", ".join(f"{k} {v:.3f}" for k, v in pre.get("validation_metrics", {}).items())
    lines = [
        "## Setup",
        "",
        f"Pretraining: `{pre['command']}` ({results['num_train_molecules']} MOSES training molecules of at most "
        f"{s['max_heavy_atoms']} heavy atoms); its own check on 64 samples at 50 steps: {metrics}.",
        "",
        f"Every method gets {s['budget']} oracle calls (QED; every proposed graph is a call) in rounds of "
        f"{s['batch_size']}, and three validation runs (seed {s['validation_seed']}) to choose its hyper-parameter by "
        f"AUC; the frozen choice runs once on each test seed. The paper's PMO numbers (10,000 calls, ZINC250k "
        "pretraining, other oracles) are not comparable.",
        "",
        "## Test (mean ± standard error over seeds)",
        "",
        "| method | choice (validated) | top-10 AUC | top-10 at budget | best QED | valid | unique | novel | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, part in results["methods"].items():
        m = part["summary"]
        lines.append(
            f"| {LABELS[method]} | {CHOICE_NAMES[method]} {part['choice']:g} | {_ms(m['auc_top10'])} | "
            f"{_ms(m['top10'])} | {_ms(m['top1'])} | {_ms(m['valid'])} | {_ms(m['unique'])} | {_ms(m['novel'])} | "
            f"{m['seconds']['mean']:.0f} |"
        )
    lines += ["", "## Validation (AUC of the top-10 curve, validation seed)", ""]
    for method, part in results["methods"].items():
        grid = ", ".join(f"{v['name']}: {v['score']:.4f}" for v in part["validation"]["validation"])
        lines.append(f"- {LABELS[method]}: {grid}; chosen {part['validation']['chosen']['name']}.")
    lines += ["", "## Per seed", "", "| method | seed | top-10 AUC | top-10 at budget | valid | unique | novel |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for method, part in results["methods"].items():
        for r in part["runs"]:
            lines.append(
                f"| {LABELS[method]} | {r['seed']} | {r['auc_top10']:.4f} | {r['top10']:.4f} | {r['valid']:.3f} | "
                f"{r['unique']:.3f} | {r['novel']:.3f} |"
            )
    grpo = results["methods"]["graph_grpo"]["runs"]
    lines += ["", "Graph-GRPO rollout reward (mean QED of the step's fresh rollouts), first step -> last step: "]
    lines[-1] += "; ".join(
        f"seed {r['seed']}: {r['reward_curve'][0]:.3f} -> {r['reward_curve'][-1]:.3f}" for r in grpo
    )
    lines += ["", "Best molecules of the first test seed:", ""]
    for method, part in results["methods"].items():
        best = ", ".join(f"`{smiles}` ({score:.3f})" for smiles, score in part["runs"][0]["best_molecules"][:3])
        lines.append(f"- {LABELS[method]}: {best}")
    lines.append("")
    return lines


def draw(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method, part in results["methods"].items():
        curves = [r["curve"] for r in part["runs"]]
        x = [CURVE_EVERY * (i + 1) for i in range(len(curves[0]))]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(x))]
        ax.plot(x, mean, label=LABELS[method])
    ax.set_xlabel("oracle calls")
    ax.set_ylabel("mean QED of the top 10 (mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    from diffusers_ext.data.molecules import require_rdkit
    from diffusers_ext.evaluation.protocol import settings_code_hash
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.join(args.output_dir, "graph_grpo_molecules")
    if args.from_results is not None:
        results = rebuild_results(args.from_results, all_targets, rel_to=REPO)
    else:
        require_rdkit("benchmarks/graph_grpo/graph_grpo_molecules.py")
        start = time.perf_counter()
        skip = ("output_dir", "cache_dir", "no_cache", "from_results")
        settings = {k: v for k, v in vars(args).items() if k not in skip}
        results = {
            "command": command(__file__, argv, omit=("--output_dir", "--cache_dir")),
            "settings": settings,
            "code_hash": settings_code_hash(settings, [os.path.join(REPO, p) for p in CODE]),
            **run(args),
        }
        results["seconds"] = time.perf_counter() - start
        results["summary"] = {"targets": all_targets(results)}
    results["summary"]["difference_se"] = (
        "unpaired: the methods' seed-s runs share no randomness (each trains or searches on its own), so each "
        "difference's standard error is sqrt(sem_a^2 + sem_b^2) (protocol.unpaired_difference)"
    )
    s = results["settings"]
    write_results(
        stem,
        results,
        "Graph-GRPO on molecules: QED maximisation under an oracle budget (MOSES, <= 16 heavy atoms)",
        report_sections(results),
        settings_line=(
            f"Settings: {s['budget']} oracle calls per run, top-{s['top_k']} AUC, seeds {s['seeds']}, "
            f"{s['num_inference_steps']} CTMC steps, rounds of {s['batch_size']}; Graph-GRPO groups of "
            f"{s['num_generations']} (shared start), refinement top {s['refine_top_k']} at noise "
            f"{s['refine_noise_fraction']}, last {s['train_max_steps']} steps trained, beta {s['beta']}; one CPU thread."
        ),
        figures={".png": lambda path: draw(results, path)},
    )
    return results


if __name__ == "__main__":
    main()
