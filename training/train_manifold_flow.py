#!/usr/bin/env python
"""Train a two-head flow-matching model (`ManifoldFlowTransformerModel`) on a point cloud near a low-dimensional subspace.

Data: one of the pack's synthetic manifolds embedded in R^D by a random orthonormal map
(`--dataset_name ring_mixture | swiss_roll | sphere_patch`, `diffusers_ext.data.manifolds`; `--ambient_dim`,
`--num_train_samples`, optional off-manifold noise `--noise_std`), or your own points (`--train_data_file`, a `.npy`
of shape `(N, D)`).

    accelerate launch training/train_manifold_flow.py --dataset_name ring_mixture --ambient_dim 64 \
        --output_dir manifold-ring64

Before the first step the subspace is fitted by uncentred PCA of the training points (`fit_subspace`, `--latent_dim`
directions; `--estimate_noise` also sets the off-subspace noise std from the residual); `--learn_subspace` then
trains it with the rest of the model. Only the tangent head (a small transformer on the `latent_dim` subspace
coordinates) has weights otherwise; the orthogonal head is analytic. The result is a `ManifoldFlowPipeline` folder
(model + `FlowMatchEulerDiscreteScheduler`) with a model card; checkpoints are `output_dir/checkpoint-<step>` and
`--resume_from_checkpoint latest` continues exactly where the last one stopped.
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
    add_validation_arguments,
    backward_and_step,
    build_optimizer,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")

DATASETS = ("ring_mixture", "swiss_roll", "sphere_patch")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", type=str, default="ring_mixture", choices=DATASETS, help="Synthetic manifold.")
    data.add_argument(
        "--train_data_file",
        type=str,
        default=None,
        help="A .npy of shape (N, D) with your points; replaces --dataset_name.",
    )
    data.add_argument("--ambient_dim", type=int, default=64, help="D of the synthetic manifold's embedding.")
    data.add_argument("--num_train_samples", type=int, default=1024, help="Points of the synthetic manifold.")
    data.add_argument(
        "--noise_std", type=float, default=0.0, help="Std of the synthetic isotropic off-manifold noise."
    )
    data.add_argument("--data_seed", type=int, default=0, help="Seed of the synthetic embedding and points.")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--latent_dim",
        type=int,
        default=None,
        help="Dimension d of the fitted subspace (default: the synthetic manifold's linear span, 2 for ring_mixture "
        "and 3 for swiss_roll / sphere_patch; 2 for a .npy).",
    )
    model.add_argument("--learn_subspace", action="store_true", help="Train the PCA-initialised subspace too.")
    model.add_argument(
        "--estimate_noise", action="store_true", help="Set the orthogonal head's noise std from the PCA residual."
    )
    model.add_argument("--num_tokens", type=int, default=4, help="Tokens of the tangent head's transformer.")
    model.add_argument("--hidden_size", type=int, default=32, help="Token width.")
    model.add_argument("--num_layers", type=int, default=2, help="Transformer layers.")
    model.add_argument("--num_attention_heads", type=int, default=2, help="Attention heads.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, batches and noise.")
    train.add_argument("--train_batch_size", type=int, default=256, help="Points per batch per process.")
    train.add_argument("--max_train_steps", type=int, default=1500, help="Optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=3e-3, lr_scheduler="cosine", lr_warmup_steps=50, weight_decay=0.0)
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline samples --num_validation_images points (seeded with --seed); their subspace coordinates' mean "
        "and std and their RMS distance to the fitted subspace are written to the tracker (text) and to "
        "output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text", num_validation_images=512)
    validation.add_argument("--eval_inference_steps", type=int, default=50, help="Euler steps when sampling.")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    for name in (
        "ambient_dim",
        "num_train_samples",
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "logging_steps",
        "num_tokens",
        "hidden_size",
        "num_layers",
        "num_attention_heads",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.latent_dim is not None and args.latent_dim < 1:
        parser.error(f"--latent_dim must be >= 1, got {args.latent_dim}.")
    if not args.noise_std >= 0:
        parser.error(f"--noise_std must be >= 0, got {args.noise_std}.")
    if args.hidden_size % args.num_attention_heads:
        parser.error(f"--hidden_size {args.hidden_size} must be divisible by --num_attention_heads.")
    if args.train_data_file is not None and not os.path.isfile(args.train_data_file):
        parser.error(f"--train_data_file {args.train_data_file!r} is not a file.")
    if args.train_data_file is None:
        from diffusers_ext.data.manifolds import SPAN_DIMS

        span = SPAN_DIMS[args.dataset_name]
        if args.ambient_dim <= max(span, args.latent_dim or 0):
            parser.error(
                f"--ambient_dim {args.ambient_dim} must exceed the subspace's dimension ({span} for "
                f"{args.dataset_name}, or --latent_dim)."
            )


def build_data(args):
    """`(points (N, D) float64, latent_dim, description)`; a bad `.npy` or `--latent_dim` raises a `ValueError`."""
    from diffusers_ext.data.manifolds import SPAN_DIMS, load_point_cloud, make_manifold

    if args.train_data_file is not None:
        points = load_point_cloud(args.train_data_file)
        latent_dim = 2 if args.latent_dim is None else args.latent_dim
        description = f"the points of `{os.path.basename(args.train_data_file)}` ({len(points)} x {points.shape[1]})"
    else:
        manifold = make_manifold(args.dataset_name, args.ambient_dim, args.noise_std, seed=args.data_seed)
        points = manifold.sample(args.num_train_samples, args.data_seed + 1)
        latent_dim = SPAN_DIMS[args.dataset_name] if args.latent_dim is None else args.latent_dim
        description = (
            f"{args.num_train_samples} points of the `{args.dataset_name}` manifold of `diffusers_ext.data.manifolds` "
            f"embedded in R^{args.ambient_dim} (seed {args.data_seed}, off-manifold noise std {args.noise_std})"
        )
    if latent_dim >= points.shape[1]:
        raise ValueError(f"--latent_dim {latent_dim} must be smaller than the data's dimension {points.shape[1]}.")
    return points, latent_dim, description


def run_validation(pipeline, args, accelerator, step: int) -> None:
    """Sample `--num_validation_images` points; log their subspace coordinates' statistics and off-subspace RMS."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)

    def sample(conditions, generator):
        points = pipeline(
            batch_size=args.num_validation_images, num_inference_steps=args.eval_inference_steps, generator=generator
        ).samples
        coordinates = pipeline.model.project(points)
        off = (points - pipeline.model.embed(coordinates)).square().sum(-1).mean().sqrt()
        return [
            f"{len(points)} samples: subspace coordinates mean {coordinates.mean(0).tolist()} std "
            f"{coordinates.std(0).tolist()}; RMS distance to the subspace {float(off):.3g}"
        ]

    # one text line summarising all --num_validation_images points
    validate(accelerator, args, step, sample, [None], [pipeline.model], logger, texts=True, repeat=1)


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)  # a missing checkpoint fails first

    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import ManifoldFlowPipeline, ManifoldFlowTransformerModel
    from diffusers_ext.losses.manifold_flow import manifold_flow_loss
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

    points, latent_dim, description = build_data(args)
    accelerator = start_run(args, logger)
    model = ManifoldFlowTransformerModel(
        ambient_dim=points.shape[1],
        latent_dim=latent_dim,
        num_tokens=args.num_tokens,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads,
        learn_subspace=args.learn_subspace,
    )
    fit = model.fit_subspace(points, estimate_noise=args.estimate_noise)  # the same on every process
    logger.info(
        f"subspace of dimension {latent_dim} by uncentred PCA: {fit.explained_fraction:.6f} of the squared norm, "
        f"residual std {fit.residual_std:.3g}"
    )
    scheduler = FlowMatchEulerDiscreteScheduler()
    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_manifold_flow", config={k: str(v) for k, v in vars(args).items()})
    logger.info(f"{len(points)} points in R^{points.shape[1]}, {args.max_train_steps} steps, from {global_step}")

    def make_pipeline(trained):
        pipe = ManifoldFlowPipeline(model=trained, scheduler=scheduler)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    device = accelerator.device
    data = points.float().to(device)
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    loss_sum = float("nan")
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            draw = global_step * args.gradient_accumulation_steps + micro
            index = torch.randint(
                0,
                len(data),
                (args.train_batch_size,),
                generator=step_generator(args.seed, draw, accelerator.process_index),
            ).to(device)
            noise_generator = step_generator(args.seed + 7, draw, accelerator.process_index, device)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = manifold_flow_loss(model, data[index], noise_generator)
                backward_and_step(accelerator, loss, model.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss_sum)
        log_and_checkpoint(
            accelerator, args, global_step, {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}, logger
        )
        if global_step < args.max_train_steps and validation_due(args, global_step):
            trained = gathered_model(accelerator, model)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                run_validation(make_pipeline(trained), args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = make_pipeline(final)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, args, accelerator, global_step)
        metrics = {
            "final_loss": loss_sum,
            "pca_explained_fraction": fit.explained_fraction,
            "pca_residual_std": fit.residual_std,
            "orthogonal_noise_std": float(final.config.orthogonal_noise_std),
        }
        with open(os.path.join(args.output_dir, "training_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        subspace = "learned from the PCA fit" if args.learn_subspace else "fitted by uncentred PCA and kept fixed"
        write_model_card(
            args.output_dir,
            title="Two-head flow matching on a low-dimensional subspace",
            description=(
                f"A `ManifoldFlowTransformerModel` ({sum(p.numel() for p in final.tangent_head.parameters()):,} "
                f"tangent-head parameters; a {latent_dim}-dim subspace of R^{points.shape[1]} {subspace}) trained "
                f"with `training/train_manifold_flow.py` on {description}. Sample points with "
                "`ManifoldFlowPipeline.from_pretrained(folder)(batch_size=...)`."
            ),
            command=command_line(),
            metrics=metrics,
            tags=["flow-matching", "manifold", "point-cloud"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_manifold_flow.py: error: {error}", file=sys.stderr)
        sys.exit(2)
