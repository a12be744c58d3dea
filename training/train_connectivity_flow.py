#!/usr/bin/env python
"""Train a connectivity distribution of a low-rank RNN by flow matching (input-side flow, then output-side flow).

Data: the input-side loadings `m` and the latent dynamics of one lrRNN, either a synthetic ground truth
(`--dataset_name quadstable | limit_cycle | ring | heavy_tailed_limit_cycle`, `diffusers_ext.data.lrrnn`) or an
`.npz` file (`--train_data_file`) holding `input_loadings` `(N, R)` (or `(N, R + 1)` with a bias column) and
`latents` `(K, T, R)` (trajectories, e.g. of an lrRNN fitted to recordings).

    accelerate launch training/train_connectivity_flow.py --dataset_name quadstable --output_dir connectivity-quad

The first `--input_flow_fraction` of `--max_train_steps` trains the input-side flow on the given rows; then
`--readout_networks` networks of `--readout_neurons` neurons are sampled from it, each read out by ridge (one
posterior draw: the maximum-entropy completion of `n`), and the rest of the steps train the output-side flow on
those pairs. The result is a `ConnectivityPipeline` folder (model + `FlowMatchEulerDiscreteScheduler`) with a model
card; checkpoints are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues where the last
one stopped (the read-out pairs are rebuilt from the resumed input-side flow with the same seed).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_optimizer_arguments,
    add_validation_arguments,
    backward_and_step,
    build_optimizer,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")

DATASETS = ("quadstable", "limit_cycle", "ring", "heavy_tailed_limit_cycle")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name", type=str, default="quadstable", choices=DATASETS, help="Synthetic ground truth."
    )
    data.add_argument(
        "--train_data_file",
        type=str,
        default=None,
        help="An .npz with `input_loadings` (N, R[+1]) and `latents` (K, T, R); replaces --dataset_name.",
    )
    data.add_argument("--num_neurons", type=int, default=1000, help="Neurons of the synthetic network.")
    data.add_argument("--data_seed", type=int, default=0, help="Seed of the synthetic network.")
    data.add_argument("--num_dynamics_steps", type=int, default=100, help="Steps of the synthetic trajectories.")
    data.add_argument("--num_transitions", type=int, default=4000, help="Transitions the ridge read-out uses.")
    data.add_argument("--alpha", type=float, default=0.1, help="The lrRNN's leak dt / tau.")
    model = parser.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=128, help="Width of both velocity MLPs.")
    model.add_argument("--num_layers", type=int, default=3, help="Hidden layers of each MLP.")
    readout = parser.add_argument_group("ridge read-out")
    readout.add_argument("--input_flow_fraction", type=float, default=0.5, help="Share of steps for the input flow.")
    readout.add_argument("--readout_networks", type=int, default=20, help="Networks sampled for the read-out.")
    readout.add_argument("--readout_neurons", type=int, default=500, help="Neurons of each.")
    readout.add_argument("--ridge_lambda", type=float, default=1.0, help="Prior precision of each output loading.")
    readout.add_argument(
        "--ridge_noise_std",
        type=float,
        default=0.001,
        help="One-step observation noise std of the latents (the benchmark's validation chose 0.001 for noise-free "
        "synthetic transitions; set your recordings' own).",
    )
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, batches and read-out.")
    train.add_argument("--train_batch_size", type=int, default=256, help="Neurons per batch per process.")
    train.add_argument(
        "--max_train_steps", type=int, default=6000, help="Total optimizer steps (both flows; half each by default)."
    )
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=2e-3, lr_scheduler="cosine", lr_warmup_steps=50, weight_decay=0.0)
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline samples --num_validation_images networks (seeded with --seed) of --num_neurons neurons; their "
        "loadings' mean and std and their final latent states are written to the tracker (text) and to "
        "output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text")
    validation.add_argument(
        "--eval_inference_steps",
        type=int,
        default=100,
        help="Euler steps of each flow when sampling (the read-outs' networks and validation).",
    )
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "num_neurons",
        "num_dynamics_steps",
        "num_transitions",
        "hidden_size",
        "num_layers",
        "readout_networks",
        "readout_neurons",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not 0 < args.input_flow_fraction < 1:
        parser.error(f"--input_flow_fraction must lie in (0, 1), got {args.input_flow_fraction}.")
    if (
        round(args.max_train_steps * args.input_flow_fraction) < 1
        or round(args.max_train_steps * args.input_flow_fraction) >= args.max_train_steps
    ):
        parser.error(f"--max_train_steps {args.max_train_steps} leaves one of the two flows without steps.")
    if not 0 < args.alpha <= 1:
        parser.error(f"--alpha must lie in (0, 1], got {args.alpha}.")
    for name in ("ridge_lambda", "ridge_noise_std"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}.")
    if args.train_data_file is not None and not os.path.isfile(args.train_data_file):
        parser.error(f"--train_data_file {args.train_data_file!r} is not a file.")


def build_data(args):
    """`(input_loadings (N, D) float64, states (T, R), next_states (T, R), description)`."""
    from diffusers_ext.data.lrrnn import initial_state_grid, make_ground_truth

    if args.train_data_file is not None:
        with np.load(args.train_data_file, allow_pickle=False) as data:
            missing = {"input_loadings", "latents"} - set(data.files)
            if missing:
                raise ValueError(f"--train_data_file {args.train_data_file!r} lacks {sorted(missing)}.")
            m = torch.from_numpy(data["input_loadings"]).double()
            latents = torch.from_numpy(data["latents"]).double()
        if latents.ndim != 3 or m.ndim != 2 or m.shape[1] not in (latents.shape[2], latents.shape[2] + 1):
            raise ValueError(
                f"--train_data_file: `latents` must be (K, T, R) and `input_loadings` (N, R) or (N, R + 1); got "
                f"{tuple(latents.shape)} and {tuple(m.shape)}."
            )
        rank = latents.shape[2]
        states, next_states = latents[:, :-1].reshape(-1, rank), latents[:, 1:].reshape(-1, rank)
        description = f"the loadings and latents of `{os.path.basename(args.train_data_file)}`"
    else:
        net = make_ground_truth(args.dataset_name, alpha=args.alpha).network(args.num_neurons, args.data_seed)
        m = net.input_loadings
        states, next_states = net.transitions(initial_state_grid(20, 2.4), args.num_dynamics_steps)
        description = (
            f"the `{args.dataset_name}` ground truth of `diffusers_ext.data.lrrnn` ({args.num_neurons} neurons, "
            f"seed {args.data_seed})"
        )
    pick = torch.randperm(len(states), generator=torch.Generator().manual_seed(args.seed))[: args.num_transitions]
    return m, states[pick], next_states[pick], description


def run_validation(pipeline, args, accelerator, step: int, rank: int) -> None:
    """Sample `--num_validation_images` networks; log their loadings' statistics and final latent states."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)

    def sample(conditions, generator):
        out = pipeline(
            num_neurons=args.num_neurons,
            num_networks=len(conditions),
            num_inference_steps=args.eval_inference_steps,
            generator=generator,
        )
        texts = []
        for loadings, trajectories in zip(out.loadings, out.trajectories):
            final = trajectories[:, -1]
            texts.append(
                f"loadings mean {loadings.mean(0).tolist()} std {loadings.std(0).tolist()}; final latent norms "
                f"{sorted(round(float(v), 2) for v in final.norm(dim=-1))[:: max(1, len(final) // 8)]}"
            )
        return texts

    validate(accelerator, args, step, sample, [None], [pipeline.model], logger, texts=True)


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)  # a missing checkpoint fails first

    from accelerate.utils import DistributedDataParallelKwargs
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import ConnectivityFlowModel, ConnectivityPipeline, ridge_readout_targets
    from diffusers_ext.losses.connectivity_flow import connectivity_flow_loss
    from diffusers_ext.training_utils import (
        command_line,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    m, states, next_states, description = build_data(args)
    rank = states.shape[1]
    model = ConnectivityFlowModel(
        rank=rank,
        bias=m.shape[1] == rank + 1,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        input_scale=float(m.std()),
        alpha=args.alpha,
    )
    scheduler = FlowMatchEulerDiscreteScheduler()
    input_steps = round(args.max_train_steps * args.input_flow_fraction)
    # one optimizer (and schedule) per flow: the idle head never moves, whatever DDP does with its gradients
    stages = []
    for head, steps in (
        (model.input_velocity, input_steps),
        (model.output_velocity, args.max_train_steps - input_steps),
    ):
        stage_args = argparse.Namespace(**{**vars(args), "max_train_steps": steps})
        stages += list(build_optimizer(head.parameters(), stage_args, accelerator.num_processes))
    # each step trains one head, so DDP must not wait for the other head's gradients
    accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    model, *stages = accelerator.prepare(model, *stages)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_connectivity_flow", config={k: str(v) for k, v in vars(args).items()})
    logger.info(f"{len(m)} neurons, {len(states)} transitions, {args.max_train_steps} steps, from {global_step}")

    def make_pipeline(trained=None):
        trained = accelerator.unwrap_model(model) if trained is None else trained
        pipe = ConnectivityPipeline(model=trained, scheduler=scheduler)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    pairs = None
    device = accelerator.device
    data_m = m.float().to(device)
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        if global_step >= input_steps and pairs is None:
            # every process builds the same pairs (same seed, same input-side flow)
            unwrapped = accelerator.unwrap_model(model).eval()
            with torch.no_grad():
                pairs = ridge_readout_targets(
                    make_pipeline(),
                    states,
                    next_states,
                    args.readout_networks,
                    args.readout_neurons,
                    lam=args.ridge_lambda,
                    noise_std=args.ridge_noise_std,
                    num_inference_steps=args.eval_inference_steps,
                    generator=torch.Generator().manual_seed(args.seed + 1),
                )
            unwrapped.register_to_config(output_scale=float(pairs[1].std()))
            pairs = (pairs[0].to(device), pairs[1].to(device))
            model.train()
            logger.info(f"read out {len(pairs[0])} neuron pairs; output_scale {unwrapped.config.output_scale:.3f}")
        optimizer, lr_scheduler = stages[:2] if pairs is None else stages[2:]
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            size = len(data_m) if pairs is None else len(pairs[0])
            index = torch.randint(0, size, (args.train_batch_size,), generator=generator).to(device)
            noise_generator = step_generator(args.seed + 7, global_step, accelerator.process_index, device)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    if pairs is None:
                        loss = connectivity_flow_loss(model, data_m[index], None, noise_generator)
                    else:
                        loss = connectivity_flow_loss(model, pairs[0][index], pairs[1][index], noise_generator)
                backward_and_step(accelerator, loss, model.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        stage = "input" if pairs is None else "output"
        progress.set_postfix(loss=loss_sum, flow=stage)
        log_and_checkpoint(
            accelerator,
            args,
            global_step,
            {f"{stage}_flow_loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]},
            logger,
        )
        if pairs is not None and global_step < args.max_train_steps and validation_due(args, global_step):
            trained = gathered_model(accelerator, model)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                run_validation(make_pipeline(trained), args, accelerator, global_step, rank)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = make_pipeline(final)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, args, accelerator, global_step, rank)
        metrics = {"output_scale": final.config.output_scale, "input_scale": final.config.input_scale}
        with open(os.path.join(args.output_dir, "training_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        write_model_card(
            args.output_dir,
            title="Connectivity distribution of a low-rank RNN (two flows + ridge read-out)",
            description=(
                f"A `ConnectivityFlowModel` ({sum(p.numel() for p in final.parameters()):,} parameters) trained with "
                f"`training/train_connectivity_flow.py` on {description}: {input_steps} steps of the input-side "
                f"flow, {args.max_train_steps - input_steps} of the output-side flow on ridge read-outs (lambda "
                f"{args.ridge_lambda}). Sample networks with `ConnectivityPipeline.from_pretrained(folder)(num_neurons)`."
            ),
            command=command_line(),
            metrics=metrics,
            tags=["flow-matching", "low-rank-rnn", "connectivity"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_connectivity_flow.py: error: {error}", file=sys.stderr)
        sys.exit(2)
