#!/usr/bin/env python
"""Fine-tune a pretrained discrete graph flow model (a `GraphFlowPipeline` folder) with Graph-GRPO.

Options are the fields of `GraphGRPOConfig`, of `LoraArguments` (LoRA off by default: the reference trains every
weight) and the script arguments below, parsed by TRL's `TrlParser` (`--config run.yaml` works as in TRL's scripts;
the diffusers-examples names `--max_train_steps`, `--train_batch_size`, `--checkpointing_steps`, ... are aliases of
the config's). The result is a `GraphFlowPipeline` folder with a model card (or, with `--use_lora`, the adapter);
`--resume_from_checkpoint latest` continues a run exactly. At the end, V.U.N. of `--num_eval_graphs` samples against
the regenerated training split is written to `output_dir/validation_metrics.json` (not a benchmark), and every
step's metrics to `output_dir/trainer_state.json` (`log_history`, as TRL keeps them).

    accelerate launch training/train_graph_grpo.py --pretrained_model_name_or_path graph-flow-tree16 \
        --dataset_name tree --reward_funcs tree_validity --num_nodes 16 --output_dir graph-grpo-tree16
    accelerate launch training/train_graph_grpo.py --pretrained_model_name_or_path graph-flow-planar16 \
        --dataset_name planar --reward_funcs planar_shaped --num_nodes 16 --output_dir graph-grpo-planar16
"""

import json
import logging
import os
import sys
from dataclasses import dataclass, field


logger = logging.getLogger("train_graph_grpo")

REWARDS = ("tree_validity", "planar_validity", "planar_shaped")


@dataclass
class ScriptArguments:
    """What to fine-tune, with which rewards, and the final check; the trainer's options are `GraphGRPOConfig`'s."""

    pretrained_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A GraphFlowPipeline folder (e.g. from training/train_graph_flow.py)."}
    )
    dataset_name: str = field(
        default="tree",
        metadata={"help": "'tree' or 'planar': the graph family of the final V.U.N. check (its training split)."},
    )
    data_seed: int = field(default=0, metadata={"help": "Seed of the regenerated split (as in pretraining)."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["tree_validity"],
        metadata={
            "help": f"Reward functions by name: {', '.join(REWARDS)} (planar_shaped: Graph-GRPO's planar reward, its "
            "reference statistics from the regenerated planar training split at the --num_nodes node counts)."
        },
    )
    num_eval_graphs: int = field(default=40, metadata={"help": "Samples for the final V.U.N. (0: none)."})
    eval_inference_steps: int | None = field(
        default=None, metadata={"help": "CTMC steps of those samples; None: --num_inference_steps."}
    )


def build_reward(name: str, num_nodes: list[int], data_seed: int):
    """The reward function called `name`; `planar_shaped` takes its reference statistics from the regenerated planar
    training splits (seed `data_seed`) of the node counts `num_nodes`."""
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
    if script_args.dataset_name not in ("tree", "planar"):
        raise ValueError(f"--dataset_name must be 'tree' or 'planar', got {script_args.dataset_name!r}.")
    if not script_args.reward_funcs:
        raise ValueError(f"--reward_funcs needs at least one reward, some of {REWARDS}.")
    unknown = [name for name in script_args.reward_funcs if name not in REWARDS]
    if unknown:
        raise ValueError(f"--reward_funcs {' '.join(unknown)!r} unknown; expected some of {REWARDS}.")
    if script_args.num_eval_graphs < 0:
        raise ValueError(f"--num_eval_graphs must be >= 0, got {script_args.num_eval_graphs}.")
    if script_args.eval_inference_steps is not None and script_args.eval_inference_steps < 1:
        raise ValueError(f"--eval_inference_steps must be >= 1, got {script_args.eval_inference_steps}.")
    return script_args, config, lora_args


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


def evaluate(pipeline, script_args, config, num_nodes: int, seed: int) -> dict:
    """V.U.N. of `--num_eval_graphs` samples of `num_nodes` nodes against the regenerated training split."""
    import torch

    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.metrics.graphs import vun

    steps = script_args.eval_inference_steps or config.num_inference_steps
    pipeline.set_progress_bar_config(disable=True)
    graphs = pipeline(
        num_graphs=script_args.num_eval_graphs,
        num_nodes=num_nodes,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
    ).graphs
    train = spectre_splits(script_args.dataset_name, num_nodes, script_args.data_seed)["train"]
    return {f"{k} ({steps} steps)": v for k, v in vun(graphs, train, script_args.dataset_name).items()}


def main(argv=None):
    script_args, config, lora_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    from diffusers_ext import GraphGRPOTrainer
    from diffusers_ext.data.graphs import require_networkx

    require_networkx("train_graph_grpo.py")
    pipeline = load_pipeline(script_args.pretrained_model_name_or_path)
    node_counts = config.num_nodes or [int(pipeline.scheduler.node_count_probs.argmax())]
    reward_funcs = [build_reward(name, node_counts, script_args.data_seed) for name in script_args.reward_funcs]
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
    except ValueError as error:
        print(f"train_graph_grpo.py: error: {error}", file=sys.stderr)
        sys.exit(2)
