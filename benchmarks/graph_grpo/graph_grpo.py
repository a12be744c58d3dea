#!/usr/bin/env python
"""Graph-GRPO on the CPU proxies of the SPECTRE benchmark (tree-16, planar-16): a pretrained discrete graph flow
model at 50 CTMC steps before and after GRPO with the reference's reward of each dataset (tree: validity; planar: the
shaped planar reward, validity times degree / clustering / orbit likeness to the training graphs).

    python benchmarks/graph_grpo/graph_grpo.py                      # tree-16
    python benchmarks/graph_grpo/graph_grpo.py --datasets tree planar
    python benchmarks/graph_grpo/graph_grpo.py --datasets planar --output_dir planar-run        # one dataset on its own, then
    python benchmarks/graph_grpo/graph_grpo.py --merge_from tree-run/graph_grpo.json planar-run/graph_grpo.json
    python benchmarks/graph_grpo/graph_grpo.py --merge_from both-run/graph_grpo.json:tree planar-run/graph_grpo.json

Writes `benchmarks/graph_grpo/results/graph_grpo.json`, `.md` and `.png`. `--merge_from` measures nothing: it joins the dataset
sections of results files of this script run with the same settings (each dataset measured once, by one of them) and
rebuilds the report, each dataset keeping the command, code hash and seconds of the run that measured it, so a
dataset can be added or re-measured without running (and judging) the others' test split again (`PATH:tree` takes
only the named datasets of a file). Per dataset:

1. Pretraining: `training/train_graph_flow.py` on the 128 regenerated training graphs (the command is recorded; the
   folder is cached under `benchmarks/.cache/graph_grpo/`, keyed by its settings).
2. Headroom: V.U.N. of the pretrained model at 50 steps and at `--headroom_steps` steps, on the test seeds.
3. Validation: GRPO (`training/train_graph_grpo.py`; reward `tree_validity` for tree, `--planar_reward` for planar,
   by default `planar_shaped`, Graph-GRPO's planar reward) with each learning rate of `--learning_rates`,
   trained with a validation seed and scored by V.U.N. of samples from validation generator seeds; the best is
   frozen.
4. Test, once: GRPO with the frozen learning rate for every seed of `--seeds` (training seed = the seed), and each
   seed's `--num_samples` samples at 50 steps from generator seed `1000 + seed`, the same generators as the
   pretrained model's test samples. Validity, uniqueness, novelty (against the training split) and V.U.N. are
   reported separately, and the degree / clustering / spectral MMD ratios to train-vs-test (test split).

Targets (computed): the pretrained model leaves headroom (V.U.N. at 50 steps <= 0.9), GRPO raises V.U.N. by more
than 2 standard errors, and no MMD ratio gets worse by more than 2 SE. The standard errors are paired: the GRPO run of
seed s and the pretrained model's seed-s samples share their generator, so the SE is that of the per-seed differences. Everything runs on one CPU thread.
"""

import argparse
import json
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
CACHE = os.path.join(HERE, ".cache", "graph_grpo")
DATASETS = ("tree", "planar")
STATISTICS = ("degree", "clustering", "spectral")
VALIDATION_TRAIN_SEED = 100
VALIDATION_SAMPLE_SEEDS = (2000, 2001)
TEST_SAMPLE_SEED_OFFSET = 1000
CODE = [
    "training/train_graph_grpo.py",
    "training/train_graph_flow.py",
    "diffusers_ext/trainers/graph_grpo_trainer.py",
    "diffusers_ext/trainers/graph_grpo_config.py",
    "diffusers_ext/schedulers/scheduling_graph_discrete_flow.py",
    "diffusers_ext/models/graph_transformer.py",
    "diffusers_ext/pipelines/graph_flow/pipeline_graph_flow.py",
    "diffusers_ext/data/graphs.py",
    "diffusers_ext/metrics/graphs.py",
    "diffusers_ext/metrics/graph_orbits.py",
    "diffusers_ext/rewards/graphs.py",
]
PLANAR_REWARDS = ("planar_shaped", "planar_validity")
REWARD_DESCRIPTIONS = {
    "tree_validity": "1 for a tree, else 0",
    "planar_validity": "1 for a connected planar graph, else 0",
    "planar_shaped": "Graph-GRPO's planar reward: connected and planar x (1 + 0.2 (s_deg + s_clus + s_orb)) / 1.6, "
    "the similarities of the degree, clustering and orbit statistics to the training graphs'",
}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["tree"], choices=DATASETS, help="Graph families.")
    parser.add_argument("--num_nodes", type=int, default=16, help="Nodes per graph (64 in the paper).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="GRPO training seeds.")
    parser.add_argument("--num_samples", type=int, default=40, help="Test samples per seed (40 in the paper).")
    parser.add_argument("--num_inference_steps", type=int, default=50, help="CTMC steps of rollouts and tests.")
    parser.add_argument("--headroom_steps", type=int, default=500, help="CTMC steps of the headroom check.")
    parser.add_argument("--pretrain_steps", type=int, default=6000, help="Pretraining optimizer steps.")
    parser.add_argument("--pretrain_batch_size", type=int, default=32, help="Pretraining graphs per step.")
    parser.add_argument("--node_dim", type=int, default=64, help="Model node width.")
    parser.add_argument("--edge_dim", type=int, default=16, help="Model edge width.")
    parser.add_argument("--num_layers", type=int, default=4, help="Model layers.")
    parser.add_argument("--grpo_steps", type=int, default=30, help="GRPO steps (one generation round each).")
    parser.add_argument("--num_generations", type=int, default=8, help="Graphs per group (shared start).")
    parser.add_argument("--groups_per_step", type=int, default=4, help="Groups per GRPO step.")
    parser.add_argument("--beta", type=float, default=0.005, help="KL weight (the reference's).")
    parser.add_argument(
        "--updates_per_step", type=int, default=2, help="Optimizer steps per GRPO step (micro-batches of the round)."
    )
    parser.add_argument(
        "--learning_rates", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3], help="Validation grid of GRPO's lr."
    )
    parser.add_argument("--validation_samples", type=int, default=40, help="Samples per validation seed.")
    parser.add_argument(
        "--planar_reward",
        default="planar_shaped",
        choices=PLANAR_REWARDS,
        help="GRPO's reward on planar: Graph-GRPO's shaped planar reward (the reference's) or validity alone.",
    )
    parser.add_argument("--output_dir", default=RESULTS, help="Where graph_grpo.json/.md/.png go.")
    parser.add_argument("--no_cache", action="store_true", help="Recompute every run (the cache is still written).")
    parser.add_argument(
        "--merge_from",
        nargs="+",
        default=None,
        metavar="PATH",
        help="Measure nothing: join the dataset sections of these results files of this script (the same settings "
        "but --datasets and the datasets' rewards; each dataset from one file; PATH:tree,planar takes only those "
        "datasets of a file) and write them, with targets rebuilt and checked, to --output_dir.",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.merge_from is not None and args.from_results is not None:
        parser.error("--merge_from and --from_results are exclusive (both measure nothing).")
    if args.from_results is None and args.merge_from is None and len(args.seeds) < 3:
        parser.error(f"--seeds needs >= 3 seeds (the protocol), got {args.seeds}.")
    for name in ("num_nodes", "num_samples", "grpo_steps", "pretrain_steps", "groups_per_step", "headroom_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if (args.num_generations * args.groups_per_step) % args.updates_per_step:
        parser.error("--updates_per_step must divide num_generations * groups_per_step.")
    if args.num_generations < 2:
        parser.error(f"--num_generations must be >= 2, got {args.num_generations}.")
    return args


def run_script(name: str, argv: list[str]) -> None:
    """Run `training/<name>.py argv` as a user would (`reporting.run_training_script`)."""
    from diffusers_ext.evaluation.reporting import run_training_script

    run_training_script(REPO, name, argv)


# ----------------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------------


def pretrain_argv(args, dataset: str, output_dir: str) -> list[str]:
    return [
        "--output_dir", output_dir, "--dataset_name", dataset, "--num_nodes", str(args.num_nodes),
        "--max_train_steps", str(args.pretrain_steps), "--train_batch_size", str(args.pretrain_batch_size),
        "--node_dim", str(args.node_dim), "--edge_dim", str(args.edge_dim), "--num_layers", str(args.num_layers),
        "--checkpointing_steps", "1000", "--checkpoints_total_limit", "1", "--logging_steps", "500",
        "--num_eval_graphs", "40",
    ]  # fmt: skip


def pretrain(args, dataset: str) -> tuple[str, dict]:
    """The pretrained pipeline folder (trained here unless the cache holds one made with the same settings)."""
    folder = os.path.join(CACHE, f"pretrain-{dataset}{args.num_nodes}")
    argv = pretrain_argv(args, dataset, os.path.relpath(folder, REPO))
    settings = {"argv": argv[2:]}
    recorded = os.path.join(folder, "benchmark_settings.json")
    if not args.no_cache and os.path.isfile(os.path.join(folder, "model_index.json")) and os.path.isfile(recorded):
        with open(recorded, encoding="utf-8") as f:
            if json.load(f) == settings:
                return folder, {"command": "python training/train_graph_flow.py " + " ".join(argv), "cached": True}
    start = time.perf_counter()
    run_script("train_graph_flow", argv)
    with open(recorded, "w", encoding="utf-8") as f:
        json.dump(settings, f)
    return folder, {
        "command": "python training/train_graph_flow.py " + " ".join(argv),
        "cached": False,
        "seconds": time.perf_counter() - start,
    }


def reward_name(args, dataset: str) -> str:
    """The `training/train_graph_grpo.py` reward GRPO uses on `dataset`."""
    return args.planar_reward if dataset == "planar" else f"{dataset}_validity"


def section_reward(part: dict, dataset: str) -> str:
    """The reward a results section was measured with (sections written before the shaped planar reward existed
    name none: they used the validity reward, the only one then)."""
    return part.get("reward", f"{dataset}_validity")


def grpo_argv(args, dataset: str, pretrained: str, output_dir: str, seed: int, learning_rate: float) -> list[str]:
    batch = args.num_generations * args.groups_per_step
    return [
        "--pretrained_model_name_or_path", pretrained, "--output_dir", output_dir, "--dataset_name", dataset,
        "--reward_funcs", reward_name(args, dataset), "--num_nodes", str(args.num_nodes),
        "--max_train_steps", str(args.grpo_steps), "--num_generations", str(args.num_generations),
        "--train_batch_size", str(batch // args.updates_per_step), "--gradient_accumulation_steps", "1",
        "--generation_batch_size", str(batch),
        "--num_inference_steps", str(args.num_inference_steps), "--learning_rate", str(learning_rate),
        "--beta", str(args.beta), "--seed", str(seed), "--save_strategy", "no", "--num_eval_graphs", "0",
        "--disable_tqdm", "true", "--report_to", "none",
    ]  # fmt: skip


def sample(folder: str, num_graphs: int, num_nodes: int, steps: int, seed: int) -> list:
    from diffusers_ext import GraphFlowPipeline

    pipe = GraphFlowPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        num_graphs=num_graphs,
        num_nodes=num_nodes,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
    ).graphs


def measure(graphs: list, splits: dict, dataset: str) -> dict:
    """V.U.N. (against the training split), the squared MMDs to the test split (`mmd_<stat>`) and their ratios to
    train-vs-test (`ratio_<stat>`, only for statistics whose train-vs-test MMD is positive: trees have no triangles,
    so their clustering histograms are all equal and that ratio is undefined); `ratio_ratio` is the mean of the
    defined ratios."""
    from diffusers_ext.metrics.graphs import graph_mmd, vun

    out = vun(graphs, splits["train"], dataset)
    ours = graph_mmd(graphs, splits["test"], STATISTICS)
    base = graph_mmd(splits["train"], splits["test"], STATISTICS)
    out.update({f"mmd_{k}": v for k, v in ours.items()})
    ratios = {k: ours[k] / base[k] for k in STATISTICS if base[k] > 0}
    out.update({f"ratio_{k}": v for k, v in ratios.items()})
    out["ratio_ratio"] = sum(ratios.values()) / len(ratios)
    out["edges_mean"] = sum(g.number_of_edges() for g in graphs) / len(graphs)
    return out


def grpo_run(args, dataset, pretrained, seed, learning_rate, cache) -> tuple[str, dict]:
    """Train GRPO once (cached by settings and code); returns its folder and its training record."""
    name = f"grpo-{dataset}-seed{seed}-lr{learning_rate:g}"
    folder = cache.path(name + ".marker")[: -len(".marker")]
    argv = grpo_argv(args, dataset, pretrained, folder, seed, learning_rate)
    record = cache.load(name)
    if record is not None and os.path.isfile(os.path.join(folder, "model_index.json")):
        return folder, record
    start = time.perf_counter()
    run_script("train_graph_grpo", argv)
    with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    record = {
        "argv": [
            "python",
            "training/train_graph_grpo.py",
            *[os.path.relpath(a, REPO) if a.startswith("/") else a for a in argv],
        ],
        "seconds": time.perf_counter() - start,
        "reward_curve": [h["reward"] for h in history],
        "frac_reward_zero_std": [h["frac_reward_zero_std"] for h in history],
        "kl": [h.get("kl", 0.0) for h in history],
    }
    return folder, cache.save(name, record)


def run_dataset(args, dataset: str) -> dict:
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.evaluation.protocol import mean_spread
    from diffusers_ext.evaluation.reporting import ResultCache, choose_on_validation

    torch.set_num_threads(1)
    splits = spectre_splits(dataset, args.num_nodes, 0)
    pretrained, pretrain_record = pretrain(args, dataset)
    with open(os.path.join(pretrained, "validation_metrics.json"), encoding="utf-8") as f:
        pretrain_record["validation_metrics"] = json.load(f)
    # seeds are not in the key (each entry names its seeds), so a run with fewer seeds reuses the finished ones
    skip = ("output_dir", "no_cache", "from_results", "merge_from", "datasets", "seeds", "planar_reward")
    settings = {k: v for k, v in vars(args).items() if k not in skip}
    reward = reward_name(args, dataset)
    cache = ResultCache(
        CACHE,
        {**settings, "dataset": dataset, "reward": reward},
        [os.path.join(REPO, p) for p in CODE],
        enabled=not args.no_cache,
    )

    # 2. headroom, on the test seeds
    headroom = {}
    for steps in (args.num_inference_steps, args.headroom_steps):
        key = f"pretrained-{dataset}-{steps}steps-seeds{'_'.join(map(str, args.seeds))}-v2"
        per_seed, _ = cache.get_or_compute(
            key,
            lambda steps=steps: [
                measure(
                    sample(pretrained, args.num_samples, args.num_nodes, steps, TEST_SAMPLE_SEED_OFFSET + s),
                    splits,
                    dataset,
                )
                for s in args.seeds
            ],
        )
        headroom[steps] = per_seed

    # 3. validation of the learning rate (its own training seed and sample seeds)
    def validate(learning_rate, split):
        folder, record = grpo_run(args, dataset, pretrained, VALIDATION_TRAIN_SEED, learning_rate, cache)
        graphs = [
            g for s in VALIDATION_SAMPLE_SEEDS
            for g in sample(folder, args.validation_samples, args.num_nodes, args.num_inference_steps, s)
        ]  # fmt: skip
        return {**measure(graphs, splits, dataset), "train_seconds": record["seconds"]}

    choice = choose_on_validation(
        args.learning_rates, validate, lambda m: m["vun"], names=lambda lr: f"lr={lr:g}", test=False
    )
    learning_rate = choice["chosen"]["candidate"]

    # 4. test, once
    runs = []
    for seed in args.seeds:
        folder, record = grpo_run(args, dataset, pretrained, seed, learning_rate, cache)
        graphs = sample(
            folder, args.num_samples, args.num_nodes, args.num_inference_steps, TEST_SAMPLE_SEED_OFFSET + seed
        )
        runs.append({"seed": seed, **record, "test": measure(graphs, splits, dataset)})
    keys = [
        k
        for k in runs[0]["test"]
        if all(k in m for m in (*headroom[args.num_inference_steps], *headroom[args.headroom_steps]))
    ]
    summary = {
        "pretrained": {k: mean_spread([m[k] for m in headroom[args.num_inference_steps]]) for k in keys},
        f"pretrained_{args.headroom_steps}_steps": {
            k: mean_spread([m[k] for m in headroom[args.headroom_steps]]) for k in keys
        },
        "grpo": {k: mean_spread([r["test"][k] for r in runs]) for k in keys},
        "learning_rate": learning_rate,
    }
    summary["targets"] = dataset_targets(summary, dataset, args.headroom_steps)
    return {
        "reward": reward,
        "pretraining": pretrain_record,
        "headroom_per_seed": {str(k): v for k, v in headroom.items()},
        "validation": choice,
        "runs": runs,
        "summary": summary,
    }


# The GRPO run of seed s samples its test graphs with the generator seed the pretrained model's seed-s samples use,
# so the two are scored on shared randomness and their differences are paired (`protocol.paired_difference`). Files
# measured before this recorded the unpaired SE (rows "... minus 2 SE"): `rebuild` checks those rows as recorded,
# then replaces them with the paired ones.
DIFFERENCE_SE = (
    "paired: the GRPO run of seed s and the pretrained model's seed-s samples share the generator seed, so each "
    "gain's standard error is that of the per-seed differences (protocol.paired_difference)"
)
SE_LABEL = {"paired": "paired SE", "unpaired": "SE"}


def dataset_targets(summary: dict, dataset: str, headroom_steps: int, pairing: str = "paired") -> list[dict]:
    """The dataset's target rows; `pairing="unpaired"` gives the rows files recorded before the paired SE, to check
    them on a rebuild."""
    from diffusers_ext.evaluation.protocol import paired_difference, target, unpaired_difference

    def difference(after: dict, before: dict) -> dict:
        if pairing == "paired":
            return paired_difference(after["values"], before["values"])
        return unpaired_difference(after, before)

    pre, post = summary["pretrained"], summary["grpo"]
    se = SE_LABEL[pairing]
    rows = [target(f"{dataset}: headroom, pretrained V.U.N. at 50 steps", pre["vun"]["mean"], 0.9, "<=")]
    gain = difference(post["vun"], pre["vun"])
    rows.append(target(f"{dataset}: GRPO V.U.N. gain minus 2 {se}", gain["difference"] - 2 * gain["sem"], 0.0))
    for stat in (*STATISTICS, "ratio"):
        key = f"ratio_{stat}"
        label = "mean MMD ratio" if stat == "ratio" else f"{stat} MMD ratio"
        if key not in pre:  # no ratio (train-vs-test MMD is 0): the squared MMD to the test split itself
            key, label = f"mmd_{stat}", f"{stat} MMD (no ratio: train-vs-test MMD is 0)"
        increase = difference(post[key], pre[key])
        rows.append(
            target(
                f"{dataset}: {label} increase minus 2 {se}", increase["difference"] - 2 * increase["sem"], 0.0, "<="
            )
        )
    return rows


def rebuild(path: str) -> dict:
    """`reporting.rebuild_results` of a results file: its recorded rows are checked against its measurements (a file
    from before the paired SE by the unpaired rows it recorded), and the targets are then the paired ones."""
    from diffusers_ext.evaluation.reporting import rebuild_results

    recorded = _read(path) if os.path.isfile(path) else {}
    names = [row["name"] for row in recorded.get("summary", {}).get("targets", [])]
    legacy = any(name.endswith("minus 2 SE") for name in names)
    results = rebuild_results(path, lambda r: all_targets(r, "unpaired" if legacy else "paired"), rel_to=REPO)
    if legacy:
        results["summary"]["targets"] = all_targets(results)
        results["rebuilt_from_results"]["replaced_rows"] = {
            name: [name.replace("minus 2 SE", "minus 2 paired SE")] for name in names if name.endswith("minus 2 SE")
        }
    return results


def all_targets(results: dict, pairing: str = "paired") -> list[dict]:
    return [row for name in results["datasets"] for row in dataset_targets(
        results["datasets"][name]["summary"], name, results["settings"]["headroom_steps"], pairing
    )]  # fmt: skip


def measured_by(results: dict, name: str) -> dict:
    """The run that measured dataset `name` of `results`: the one a merge recorded in its section, else the file's."""
    part = results["datasets"][name]
    if "measured_by" in part:
        return part["measured_by"]
    return {key: results[key] for key in ("command", "code_hash", "seconds")}


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def split_merge_source(source: str) -> tuple[str, list[str] | None]:
    """`(path, datasets)` of a `--merge_from` entry: `PATH` (every dataset of the file, `datasets` None) or
    `PATH:NAME[,NAME...]` with names among `DATASETS` (only those)."""
    path, _, names = source.rpartition(":")
    if path and names and all(name in DATASETS for name in names.split(",")):
        return path, names.split(",")
    return source, None


def merge_results(sources: list[str]) -> dict:
    """One results dict from results files of this script run with the same settings but `datasets` (and the
    datasets' rewards, `planar_reward`, which each section records).

    Each entry is a path, or `path:tree` (`path:tree,planar`) to take only those datasets of the file. Each file's
    targets are first rebuilt from its measurements and must equal its recorded rows (`reporting.rebuild_results`); a
    dataset may come from one file only. Each dataset section keeps the `measured_by` record (`command`, `code_hash`,
    `seconds`) of the run that measured it; the merged results name the files (`merged_from`: path, sha256, the
    datasets taken), join the distinct commands with "; ", and rebuild the targets.
    """
    datasets, files, settings, first = {}, [], None, None
    for source in sources:
        path, names = split_merge_source(source)
        results = rebuild(path)
        sha256 = results.pop("rebuilt_from_results")["sha256"]
        absent = [name for name in names or () if name not in results["datasets"]]
        if absent:
            raise ValueError(f"{path}: has no dataset {absent} (it has {list(results['datasets'])}).")
        same = {k: v for k, v in results["settings"].items() if k not in ("datasets", "planar_reward")}
        if settings is None:
            settings, first = same, path
        elif same != settings:
            differ = sorted(k for k in set(same) | set(settings) if same.get(k) != settings.get(k))
            raise ValueError(
                f"{path}: settings {differ} differ from those of {first}; only runs of the same settings merge."
            )
        taken = names or list(results["datasets"])
        for name in taken:
            if name in datasets:
                raise ValueError(
                    f"{path}: dataset {name!r} is in an earlier file too; each dataset must come from one run."
                )
            datasets[name] = {**results["datasets"][name], "measured_by": measured_by(results, name)}
        inside = os.path.abspath(path).startswith(REPO + os.sep)
        # a file outside the repository is named by its folder and name only (no folder of one machine)
        file = os.path.relpath(path, REPO) if inside else os.path.join(*os.path.abspath(path).split(os.sep)[-2:])
        files.append({"file": file, "sha256": sha256, "datasets": taken, **({"only": names} if names else {})})
    runs = {json.dumps(part["measured_by"], sort_keys=True): part["measured_by"] for part in datasets.values()}
    merged = {
        "command": "; ".join(dict.fromkeys(run["command"] for run in runs.values())),
        "settings": {"datasets": list(datasets), **settings},
        "merged_from": files,
        "datasets": datasets,
        "seconds": sum(run["seconds"] for run in runs.values()),
    }
    merged["summary"] = {"targets": all_targets(merged)}
    return merged


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def _ms(d: dict) -> str:
    return f"{d['mean']:.3f} ± {d['sem']:.3f}"


def report_sections(results: dict) -> list[str]:
    headroom_steps = results["settings"]["headroom_steps"]
    lines = []
    if "merged_from" in results:
        files = " ".join(
            source["file"] + (":" + ",".join(source["only"]) if "only" in source else "")
            for source in results["merged_from"]
        )
        lines += [
            f"Merged with `python benchmarks/graph_grpo/graph_grpo.py --merge_from {files}` (measuring nothing): each dataset "
            "below was measured by the command it names.",
            "",
        ]
    for name, part in results["datasets"].items():
        s = part["summary"]
        grid = ", ".join(f"{v['name']}: V.U.N. {v['score']:.3f}" for v in part["validation"]["validation"])
        lines += [f"## {name}-{results['settings']['num_nodes']}", ""]
        if "measured_by" in part:
            run = part["measured_by"]
            lines += [
                f"Measured by `{run['command']}` (code hash `{run['code_hash'][:12]}`, {run['seconds']:.0f} s).",
                "",
            ]
        lines += [
            f"Pretraining: `{part['pretraining']['command']}`. GRPO reward: `{section_reward(part, name)}` "
            f"({REWARD_DESCRIPTIONS[section_reward(part, name)]}). GRPO learning rate frozen on validation: "
            f"{s['learning_rate']:g} ({grid}).",
            "",
            "Mean ± standard error over seeds (each 40 samples at the stated CTMC steps; novelty against the 128 "
            "training graphs; MMD ratios to train-vs-test on the 40 test graphs).",
            "",
            "| model | steps | valid | unique | novel | V.U.N. | degree ratio | clustering ratio | spectral ratio | mean ratio |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, key, steps in (
            ("pretrained", "pretrained", 50),
            ("pretrained", f"pretrained_{headroom_steps}_steps", headroom_steps),
            ("Graph-GRPO", "grpo", 50),
        ):
            m = s[key]
            cells = [_ms(m[f"ratio_{stat}"]) if f"ratio_{stat}" in m else "n/a" for stat in (*STATISTICS, "ratio")]
            lines.append(
                f"| {label} | {steps} | {_ms(m['valid'])} | {_ms(m['unique'])} | {_ms(m['novel'])} | {_ms(m['vun'])} "
                f"| {' | '.join(cells)} |"
            )
        lines += [
            "",
            "Squared MMDs to the test split (a ratio is n/a where the train-vs-test MMD is 0; the mean ratio averages "
            "the defined ones):",
            "",
            "| model | steps | degree MMD | clustering MMD | spectral MMD | edges per graph |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for label, key, steps in (
            ("pretrained", "pretrained", 50),
            ("pretrained", f"pretrained_{headroom_steps}_steps", headroom_steps),
            ("Graph-GRPO", "grpo", 50),
        ):
            m = s[key]
            cells = [f"{m[f'mmd_{stat}']['mean']:.2e} ± {m[f'mmd_{stat}']['sem']:.1e}" for stat in STATISTICS]
            lines.append(f"| {label} | {steps} | {' | '.join(cells)} | {_ms(m['edges_mean'])} |")
        lines += ["", f"GRPO runs (reward = mean `{section_reward(part, name)}` of the step's rollouts):", ""]
        lines += [
            "| seed | train s | reward, first step | reward, last step | test V.U.N. |",
            "| --- | --- | --- | --- | --- |",
        ]
        for run in part["runs"]:
            lines.append(
                f"| {run['seed']} | {run['seconds']:.0f} | {run['reward_curve'][0]:.3f} | {run['reward_curve'][-1]:.3f} "
                f"| {run['test']['vun']:.3f} |"
            )
        lines.append("")
    return lines


def draw(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        for run in results["datasets"][name]["runs"]:
            ax.plot(
                range(1, len(run["reward_curve"]) + 1), run["reward_curve"], alpha=0.7, label=f"seed {run['seed']}"
            )
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(f"mean rollout reward ({section_reward(results['datasets'][name], name)})")
        ax.set_title(f"{name}-{results['settings']['num_nodes']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.protocol import settings_code_hash
    from diffusers_ext.evaluation.reporting import command, write_results

    args = parse_args(argv)
    # a rebuild writes under the file's own stem (graph_grpo_planar_validity_reward.json, renamed after its run)
    name = os.path.splitext(os.path.basename(args.from_results))[0] if args.from_results else "graph_grpo"
    stem = os.path.join(args.output_dir, name)
    title = "Graph-GRPO on tree-16 / planar-16 (CPU proxies of SPECTRE tree / planar)"
    if args.from_results is not None:
        results = rebuild(args.from_results)
    elif args.merge_from is not None:
        results = merge_results(args.merge_from)
    else:
        start = time.perf_counter()
        skip = ("output_dir", "no_cache", "from_results", "merge_from")
        settings = {k: v for k, v in vars(args).items() if k not in skip}
        results = {
            "command": command(__file__, argv, omit=("--output_dir",)),
            "settings": settings,
            "code_hash": settings_code_hash(settings, [os.path.join(REPO, p) for p in CODE]),
            "datasets": {name: run_dataset(args, name) for name in args.datasets},
        }
        results["seconds"] = time.perf_counter() - start
        results["summary"] = {"targets": all_targets(results)}
    results["summary"]["difference_se"] = DIFFERENCE_SE
    write_results(
        stem,
        results,
        title,
        report_sections(results),
        settings_line=(
            f"Settings: {results['settings']['num_nodes']} nodes, seeds {results['settings']['seeds']}, "
            f"{results['settings']['num_samples']} test samples per seed, GRPO {results['settings']['grpo_steps']} "
            f"steps x {results['settings']['groups_per_step']} groups of {results['settings']['num_generations']} "
            f"(shared start), beta {results['settings']['beta']}; one CPU thread."
        ),
        figures={".png": lambda path: draw(results, path)},
    )
    return results


if __name__ == "__main__":
    main()
