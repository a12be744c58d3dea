#!/usr/bin/env python
"""Fine-tune a pretrained discrete graph flow model (a `GraphFlowPipeline` folder) with Graph-GRPO.

Options are the fields of `GraphGRPOConfig`, of `LoraArguments` (LoRA off by default: the reference trains every
weight) and the script arguments below, parsed by TRL's `TrlParser` (`--config run.yaml` works as in TRL's scripts;
the diffusers-examples names `--max_train_steps`, `--train_batch_size`, `--checkpointing_steps`, ... are aliases of
the config's). The result is a `GraphFlowPipeline` folder with a model card (or, with `--use_lora`, the adapter);
`--resume_from_checkpoint latest` continues a run exactly. At the end, V.U.N. of `--num_eval_graphs` samples against
the regenerated training split is written to `output_dir/validation_metrics.json` (not a benchmark), and every
step's metrics to `output_dir/trainer_state.json` (`log_history`, as TRL keeps them).

`--dataset_name moses` fine-tunes a molecule pipeline (from `training/train_graph_flow.py --dataset_name moses`) with
the molecular rewards `qed` (RDKit's QED) or `similarity` (Morgan-fingerprint Tanimoto similarity to
`--similarity_target SMILES`); node counts are drawn from the pipeline's unless `--num_nodes` is given, and the final
check is molecule validity, uniqueness and novelty against the MOSES training molecules (RDKit, the `molecules`
extra, and the `molsets` wheel or `--moses_data_dir`).

    accelerate launch training/train_graph_grpo.py \
        --pretrained_model_name_or_path diffusers_ext/zoo/graph-flow-tree16 \
        --dataset_name tree --reward_funcs tree_validity --num_nodes 16 --output_dir graph-grpo-tree16
    accelerate launch training/train_graph_grpo.py --pretrained_model_name_or_path graph-flow-planar16 \
        --dataset_name planar --reward_funcs planar_shaped --num_nodes 16 --output_dir graph-grpo-planar16
    accelerate launch training/train_graph_grpo.py --pretrained_model_name_or_path graph-flow-moses16 \
        --dataset_name moses --reward_funcs qed --output_dir graph-grpo-qed
    accelerate launch training/train_graph_grpo.py --pretrained_model_name_or_path graph-flow-moses16 \
        --dataset_name moses --reward_funcs similarity --similarity_target "c1ccc(O)cc1" --output_dir graph-grpo-sim
"""

import json
import logging
import os
import sys
from dataclasses import dataclass, field


logger = logging.getLogger("train_graph_grpo")

GRAPH_REWARDS = ("tree_validity", "planar_validity", "planar_shaped")
MOLECULE_REWARDS = ("qed", "similarity")
REWARDS = GRAPH_REWARDS + MOLECULE_REWARDS
DATASETS = ("tree", "planar", "moses")


@dataclass
class ScriptArguments:
    """What to fine-tune, with which rewards, and the final check; the trainer's options are `GraphGRPOConfig`'s."""

    pretrained_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A GraphFlowPipeline folder (e.g. from training/train_graph_flow.py)."}
    )
    dataset_name: str = field(
        default="tree",
        metadata={
            "help": "'tree' or 'planar': the graph family of the final V.U.N. check (its training split); 'moses': a "
            "molecule pipeline, its final check molecule validity / uniqueness / novelty against the MOSES training "
            "molecules."
        },
    )
    data_seed: int = field(default=0, metadata={"help": "Seed of the regenerated split (as in pretraining)."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["tree_validity"],
        metadata={
            "help": f"Reward functions by name: {', '.join(REWARDS)} (planar_shaped: Graph-GRPO's planar reward, its "
            "reference statistics from the regenerated planar training split at the --num_nodes node counts; qed and "
            "similarity: molecular rewards, with --dataset_name moses)."
        },
    )
    similarity_target: str | None = field(
        default=None,
        metadata={"help": "The SMILES string the `similarity` reward compares every molecule to (required by it)."},
    )
    moses_data_dir: str | None = field(
        default=None,
        metadata={
            "help": "moses: a folder with MOSES's train.csv.gz, the novelty reference; None: the installed molsets "
            "wheel's (`pip install --no-deps molsets==0.3.1`)."
        },
    )
    num_eval_graphs: int = field(
        default=40, metadata={"help": "Samples for the final V.U.N. (moses: validity, uniqueness, novelty; 0: none)."}
    )
    eval_inference_steps: int | None = field(
        default=None, metadata={"help": "CTMC steps of those samples; None: --num_inference_steps."}
    )


def build_reward(name: str, num_nodes: list[int] | None, data_seed: int, similarity_target: str | None = None):
    """The reward function called `name`; `planar_shaped` takes its reference statistics from the regenerated planar
    training splits (seed `data_seed`) of the node counts `num_nodes`, `similarity` compares to `similarity_target`."""
    if name == "qed":
        from diffusers_ext.rewards.molecules import qed_reward

        return qed_reward
    if name == "similarity":
        from diffusers_ext.rewards.molecules import SimilarityReward

        if similarity_target is None:
            raise ValueError("--reward_funcs similarity needs --similarity_target SMILES (the molecule to resemble).")
        return SimilarityReward(similarity_target)
    from diffusers_ext.rewards import graphs

    if name == "tree_validity":
        return graphs.tree_validity_reward
    if name == "planar_validity":
        return graphs.planar_validity_reward
    if name == "planar_shaped":
        from diffusers_ext.data.graphs import spectre_splits

        reference = [g for n in num_nodes for g in spectre_splits("planar", n, data_seed)["train"]]
        return graphs.PlanarShapedReward(reference)
    raise ValueError(f"--reward_funcs {name!r} unknown; expected some of {REWARDS}.")


def parse_args(argv=None):
    """`(script_args, config, lora_args)`."""
    from trl import TrlParser

    from diffusers_ext import GraphGRPOConfig, LoraArguments
    from diffusers_ext.training_utils import TRL_OPTION_ALIASES, add_option_aliases

    parser = TrlParser((ScriptArguments, GraphGRPOConfig, LoraArguments))
    add_option_aliases(parser, TRL_OPTION_ALIASES)
    script_args, config, lora_args, remaining = parser.parse_args_and_config(args=argv, return_remaining_strings=True)
    if remaining:
        raise ValueError(f"unrecognized arguments: {' '.join(remaining)}")
    if script_args.pretrained_model_name_or_path is None:
        raise ValueError("--pretrained_model_name_or_path is required (a GraphFlowPipeline folder).")
    if script_args.dataset_name not in DATASETS:
        raise ValueError(f"--dataset_name must be one of {DATASETS}, got {script_args.dataset_name!r}.")
    if not script_args.reward_funcs:
        raise ValueError(f"--reward_funcs needs at least one reward, some of {REWARDS}.")
    unknown = [name for name in script_args.reward_funcs if name not in REWARDS]
    if unknown:
        raise ValueError(f"--reward_funcs {' '.join(unknown)!r} unknown; expected some of {REWARDS}.")
    molecules = script_args.dataset_name == "moses"
    expected = MOLECULE_REWARDS if molecules else GRAPH_REWARDS
    mismatched = [name for name in script_args.reward_funcs if name not in expected]
    if mismatched:
        raise ValueError(
            f"--reward_funcs {' '.join(mismatched)!r} does not score --dataset_name {script_args.dataset_name} "
            f"samples; expected some of {expected}."
        )
    if script_args.num_eval_graphs < 0:
        raise ValueError(f"--num_eval_graphs must be >= 0, got {script_args.num_eval_graphs}.")
    if script_args.eval_inference_steps is not None and script_args.eval_inference_steps < 1:
        raise ValueError(f"--eval_inference_steps must be >= 1, got {script_args.eval_inference_steps}.")
    if molecules:
        check_molecule_arguments(script_args)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(config, parser)  # an upload that cannot happen fails now, not after training
    return script_args, config, lora_args


def check_molecule_arguments(script_args):
    """What `--dataset_name moses` needs before any weights load: RDKit, a `--similarity_target` RDKit parses if the
    `similarity` reward is asked for, and the MOSES training file when there is a final check."""
    from diffusers_ext.data.molecules import MOSES_SPLITS, moses_data_dir, require_rdkit

    target = script_args.similarity_target
    if "similarity" in script_args.reward_funcs and target is None:
        raise ValueError("--reward_funcs similarity needs --similarity_target SMILES (the molecule to resemble).")
    Chem = require_rdkit("train_graph_grpo.py --dataset_name moses")
    if target is not None:
        molecule = Chem.MolFromSmiles(target)
        if molecule is None or molecule.GetNumAtoms() == 0:
            raise ValueError(f"--similarity_target must be a SMILES string RDKit parses, got {target!r}.")
    if script_args.num_eval_graphs:
        folder = script_args.moses_data_dir
        if folder is None:
            moses_data_dir()  # an ImportError with the install hint if the molsets wheel is missing
        elif not os.path.isfile(os.path.join(folder, MOSES_SPLITS["train"])):
            raise ValueError(f"--moses_data_dir {folder!r} has no {MOSES_SPLITS['train']} (MOSES's training SMILES).")


def load_pipeline(path: str):
    """The `GraphFlowPipeline` at `path`, refused before any weights load if the folder is something else."""
    from diffusers import DiffusionPipeline

    from diffusers_ext import GraphFlowPipeline

    flag = "--pretrained_model_name_or_path"
    try:
        index = DiffusionPipeline.load_config(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{flag} {path!r} is not a pipeline folder: {error}") from None
    if index.get("_class_name") != "GraphFlowPipeline":
        raise ValueError(f"{flag} {path!r} is a {index.get('_class_name')}; this script trains a GraphFlowPipeline.")
    return GraphFlowPipeline.from_pretrained(path)


def check_molecule_pipeline(pipeline, path: str):
    """Refuse a pipeline whose classes are not the molecule vocabulary of `diffusers_ext.data.molecules`."""
    from diffusers_ext.data.molecules import NUM_EDGE_CLASSES, NUM_NODE_CLASSES

    config = pipeline.scheduler.config
    if (config.num_node_classes, config.num_edge_classes) != (NUM_NODE_CLASSES, NUM_EDGE_CLASSES):
        raise ValueError(
            f"--pretrained_model_name_or_path {path!r} has {config.num_node_classes} node and "
            f"{config.num_edge_classes} edge classes; --dataset_name moses expects a molecule pipeline with "
            f"{NUM_NODE_CLASSES} atom and {NUM_EDGE_CLASSES} bond classes (training/train_graph_flow.py --dataset_name "
            "moses)."
        )


def sample_for_evaluation(pipeline, script_args, config, num_nodes, seed: int):
    """`(graphs, steps)`: `--num_eval_graphs` samples of `num_nodes` nodes (an int, a list with one count per graph,
    or None: drawn from the scheduler's node-count distribution), seeded with `seed`."""
    import torch

    steps = script_args.eval_inference_steps or config.num_inference_steps
    pipeline.set_progress_bar_config(disable=True)
    graphs = pipeline(
        num_graphs=script_args.num_eval_graphs,
        num_nodes=num_nodes,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
    ).graphs
    return graphs, steps


def evaluate(pipeline, script_args, config, num_nodes: int, seed: int) -> dict:
    """V.U.N. of `--num_eval_graphs` samples of `num_nodes` nodes against the regenerated training split."""
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.metrics.graphs import vun

    graphs, steps = sample_for_evaluation(pipeline, script_args, config, num_nodes, seed)
    train = spectre_splits(script_args.dataset_name, num_nodes, script_args.data_seed)["train"]
    return {f"{k} ({steps} steps)": v for k, v in vun(graphs, train, script_args.dataset_name).items()}


def evaluate_molecules(pipeline, script_args, config, seed: int) -> dict:
    """Validity, uniqueness and novelty (`diffusers_ext.data.molecules.molecule_metrics`) and mean QED of
    `--num_eval_graphs` samples, their node counts `--num_nodes` cycled or drawn from the pipeline's. Novelty is
    against every MOSES training molecule: the training file is read up to the largest sampled size, and a molecule
    can only equal one of its own size."""
    from diffusers_ext.data.molecules import load_moses_smiles, molecule_metrics
    from diffusers_ext.rewards.molecules import qed_reward

    n = script_args.num_eval_graphs
    num_nodes = None if config.num_nodes is None else [config.num_nodes[i % len(config.num_nodes)] for i in range(n)]
    graphs, steps = sample_for_evaluation(pipeline, script_args, config, num_nodes, seed)
    largest = max(graph.number_of_nodes() for graph in graphs)
    train = load_moses_smiles("train", largest, script_args.moses_data_dir)
    scores = molecule_metrics(graphs, train)
    scores["qed"] = sum(qed_reward(graphs)) / len(graphs)
    return {f"{k} ({steps} steps)": v for k, v in scores.items()}


def main(argv=None):
    script_args, config, lora_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    from diffusers_ext import GraphGRPOTrainer
    from diffusers_ext.data.graphs import require_networkx

    require_networkx("train_graph_grpo.py")
    molecules = script_args.dataset_name == "moses"
    pipeline = load_pipeline(script_args.pretrained_model_name_or_path)
    if molecules:
        check_molecule_pipeline(pipeline, script_args.pretrained_model_name_or_path)
        node_counts = config.num_nodes  # None: the trainer draws them from the pipeline's node-count distribution
    else:
        node_counts = config.num_nodes or [int(pipeline.scheduler.node_count_probs.argmax())]
    reward_funcs = [
        build_reward(name, node_counts, script_args.data_seed, script_args.similarity_target)
        for name in script_args.reward_funcs
    ]
    trainer = GraphGRPOTrainer(pipeline, reward_funcs, config, peft_config=lora_args.to_peft_config())
    accelerator = trainer.accelerator
    logger.info(accelerator.state)
    logger.info(
        f"Graph-GRPO: {config.max_steps} steps, {trainer.graphs_per_process} graphs per process per step in groups "
        f"of {config.num_generations}, {accelerator.num_processes} processes"
    )
    history = trainer.train()
    if history and accelerator.is_main_process:
        last = history[-1]
        logger.info(
            f"step {int(last['step'])}: reward {last['reward']:.4f}, frac_reward_zero_std "
            f"{last['frac_reward_zero_std']:.3f}"
        )
    metrics = {}
    if accelerator.is_main_process and script_args.num_eval_graphs:
        trainer.unwrapped_model.eval()
        if molecules:
            metrics = evaluate_molecules(pipeline, script_args, config, config.seed)
        else:
            metrics = evaluate(pipeline, script_args, config, node_counts[0], config.seed)
        logger.info(f"validation: {metrics}")
    trainer.save_model(base_model=script_args.pretrained_model_name_or_path, metrics=metrics)
    if accelerator.is_main_process:
        with open(os.path.join(config.output_dir, "validation_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        # every step's metrics, as TRL's trainer_state.json keeps them
        with open(os.path.join(config.output_dir, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump({"global_step": trainer.global_step, "log_history": history}, f, indent=1)
        logger.info(f"Saved to {config.output_dir}")
    accelerator.end_training()
    return history


if __name__ == "__main__":
    try:
        main()
    except (ValueError, ImportError) as error:
        print(f"train_graph_grpo.py: error: {error}", file=sys.stderr)
        sys.exit(2)
