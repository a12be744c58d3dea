"""Pretrain a discrete graph flow model (DeFoG) on SPECTRE-style planar or tree graphs, or on small molecules.

    accelerate launch training/train_graph_flow.py --output_dir graph-flow-tree16 --dataset_name tree --num_nodes 16 \
        --max_train_steps 3000
    accelerate launch training/train_graph_flow.py --output_dir graph-flow-moses16 --dataset_name moses \
        --max_heavy_atoms 16 --num_train_molecules 4000

The planar / tree graphs are regenerated with the benchmark's generators (`diffusers_ext.data.graphs.spectre_splits`,
split 128 / 32 / 40). `moses` trains on `--num_train_molecules` random MOSES training molecules with at most
`--max_heavy_atoms` heavy atoms (`diffusers_ext.data.molecules.moses_splits`; RDKit and the `molsets` wheel):
7 atom types (C, N, O, F, S, Cl, Br) and 4 edge classes (none and the kekulized single, double, triple bonds); node
counts are drawn from the training molecules' (`--num_nodes` is not used). The result is a `GraphFlowPipeline` folder (`GraphTransformerModel` + `GraphDiscreteFlowScheduler`
with the training marginals); checkpoints are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest`
continues where the last one stopped. At the end, V.U.N. of `--num_eval_graphs` samples against the training split
is written to `output_dir/validation_metrics.json` (against the validation split's validity rule; not a benchmark); for
`moses`, validity (RDKit sanitization, one fragment), uniqueness, novelty against the training molecules and mean QED.
"""

import argparse
import json
import os
import sys

import torch
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_optimizer_arguments,
    build_optimizer,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name", type=str, default="tree", choices=["tree", "planar", "moses"], help="Graph family."
    )
    data.add_argument("--num_nodes", type=int, default=16, help="Nodes per graph (tree, planar).")
    data.add_argument("--max_heavy_atoms", type=int, default=16, help="moses: keep molecules up to this size.")
    data.add_argument(
        "--num_train_molecules", type=int, default=4000, help="moses: random training molecules (0: all, ~20k)."
    )
    data.add_argument("--data_seed", type=int, default=0, help="Seed of the regenerated graphs.")
    model = parser.add_argument_group("model")
    model.add_argument("--node_dim", type=int, default=64, help="Node stream width.")
    model.add_argument("--edge_dim", type=int, default=16, help="Edge stream width.")
    model.add_argument("--num_layers", type=int, default=4, help="Transformer layers.")
    model.add_argument("--num_heads", type=int, default=4, help="Attention heads.")
    model.add_argument("--num_random_walk_steps", type=int, default=8, help="RRWP powers.")
    model.add_argument("--lambda_edges", type=float, default=5.0, help="Weight of the edge cross-entropy.")
    train = parser.add_argument_group("training")
    train.add_argument("--output_dir", type=output_dir_arg, required=True, help="Where the pipeline goes.")
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and noise.")
    train.add_argument("--train_batch_size", type=int, default=32, help="Graphs per process and step.")
    train.add_argument("--max_train_steps", type=int, default=3000, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per step.")
    add_optimizer_arguments(train, learning_rate=2e-4, lr_scheduler="constant", lr_warmup_steps=0, weight_decay=0.0)
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log the loss every N steps.")
    train.add_argument("--num_eval_graphs", type=int, default=40, help="Samples for the final V.U.N. (0: none).")
    train.add_argument("--eval_inference_steps", type=int, default=50, help="CTMC steps of those samples.")
    args = parser.parse_args(argv)
    for name in (
        "num_nodes",
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.num_train_molecules < 0 or args.max_heavy_atoms < 2:
        parser.error(
            f"--num_train_molecules must be >= 0 and --max_heavy_atoms >= 2, got {args.num_train_molecules} and "
            f"{args.max_heavy_atoms}."
        )
    if args.num_nodes < 3:
        parser.error(f"--num_nodes must be >= 3, got {args.num_nodes}.")
    if args.num_eval_graphs < 0:
        parser.error(f"--num_eval_graphs must be >= 0, got {args.num_eval_graphs}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)

    from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel
    from diffusers_ext.data.graphs import graphs_to_dense, spectre_splits
    from diffusers_ext.losses.graph_flow import graph_flow_loss
    from diffusers_ext.metrics.graphs import vun
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        command_line,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        start_run,
        step_generator,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    molecules = args.dataset_name == "moses"
    if molecules:
        from diffusers_ext.data import molecules as mol_data

        splits = mol_data.moses_splits(
            args.max_heavy_atoms,
            num_train=args.num_train_molecules or None,
            num_val=0,
            num_test=1,
            seed=args.data_seed,
        )
        X, E, mask = mol_data.molecules_to_dense(splits["train"], args.max_heavy_atoms)
        num_node_classes, num_edge_classes = mol_data.NUM_NODE_CLASSES, mol_data.NUM_EDGE_CLASSES
        max_nodes = args.max_heavy_atoms
    else:
        splits = spectre_splits(args.dataset_name, args.num_nodes, args.data_seed)
        X, E, mask = graphs_to_dense(splits["train"])
        num_node_classes, num_edge_classes, max_nodes = 1, 2, args.num_nodes
    node_p0, edge_p0 = GraphDiscreteFlowScheduler.marginals_from_dense(X, E, mask, num_node_classes, num_edge_classes)
    counts = torch.bincount(mask.sum(1), minlength=max_nodes + 1).double()
    scheduler = GraphDiscreteFlowScheduler(
        num_node_classes=num_node_classes,
        num_edge_classes=num_edge_classes,
        node_marginals=node_p0,
        edge_marginals=edge_p0,
        node_count_probs=(counts / counts.sum()).tolist(),
    )
    model = GraphTransformerModel(
        num_node_classes=num_node_classes,
        num_edge_classes=num_edge_classes,
        node_dim=args.node_dim,
        edge_dim=args.edge_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_random_walk_steps=args.num_random_walk_steps,
    )
    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)

    dataset = torch.utils.data.TensorDataset(X, E, mask)
    sampler = ResumableBatchSampler(
        len(dataset),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler))
    if accelerator.is_main_process:
        accelerator.init_trackers("train_graph_flow", config={k: str(v) for k, v in vars(args).items()})
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            X1, E1, M1 = (x.to(accelerator.device) for x in next(loader))
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = graph_flow_loss(model, scheduler, X1, E1, M1, generator, args.lambda_edges)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss_sum)
        log_and_checkpoint(
            accelerator, args, global_step, {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}, logger
        )

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = GraphFlowPipeline(model=final, scheduler=scheduler)
        pipeline.save_pretrained(args.output_dir)
        metrics = {}
        if args.num_eval_graphs:
            pipeline.set_progress_bar_config(disable=True)
            graphs = pipeline(
                num_graphs=args.num_eval_graphs,
                num_nodes=None if molecules else args.num_nodes,
                num_inference_steps=args.eval_inference_steps,
                generator=torch.Generator(accelerator.device).manual_seed(args.seed),
            ).graphs
            if molecules:
                from diffusers_ext.rewards.molecules import qed_reward

                scores = mol_data.molecule_metrics(graphs, splits["train"])
                scores["qed"] = sum(qed_reward(graphs)) / len(graphs)
            else:
                scores = vun(graphs, splits["train"], args.dataset_name)
            metrics = {f"{k} ({args.eval_inference_steps} steps)": v for k, v in scores.items()}
        with open(os.path.join(args.output_dir, "validation_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        data_text = (
            f"{len(splits['train'])} MOSES molecules of at most {args.max_heavy_atoms} heavy atoms"
            if molecules
            else f"128 regenerated {args.dataset_name} graphs of {args.num_nodes} nodes"
        )
        write_model_card(
            args.output_dir,
            title=f"Discrete graph flow (DeFoG) on {args.dataset_name}-{max_nodes}",
            description=(
                f"A `GraphTransformerModel` ({sum(p.numel() for p in final.parameters()):,} parameters) trained with "
                f"`training/train_graph_flow.py` on {data_text}: "
                f"{args.max_train_steps} steps. Sample with `GraphFlowPipeline.from_pretrained(folder)`."
            ),
            command=command_line(),
            metrics=metrics,
            tags=["graph-generation", "discrete-flow-matching", args.dataset_name],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except (ValueError, ImportError) as error:
        print(f"train_graph_flow.py: error: {error}", file=sys.stderr)
        sys.exit(2)
