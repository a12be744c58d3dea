#!/usr/bin/env python
"""Train a conditional flow over brain-network connectivity matrices (`BrainNetworkFlowPipeline`).

Data: the pack's connectivity world (`--dataset_name world`, `diffusers_ext.data.brain_networks.ConnectivityWorld`:
subjects of random age and sex around the HCP Schaefer group-mean matrix of the installed `brainspace` wheel, with a
known conditional law; `--num_regions`, `--num_train_subjects`), the sliding-window trajectory of the wheel's one
real resting-state run (`--dataset_name sliding_window`, `load_sliding_window_connectivity`: ONE subject; the flow is
conditioned on the normalised time of each window; `--num_regions`, `--window`, `--window_step`, `--shrinkage`; needs
nibabel), or your own folder (`--train_data_dir` holding `matrices.npy`, an `(N, n, n)` array, and optionally
`covariates.csv`, a header of covariate names and one row per matrix; `--matrix_type correlation | spd`).

    accelerate launch training/train_brain_network_flow.py --dataset_name world --output_dir brain-flow
    accelerate launch training/train_brain_network_flow.py --dataset_name sliding_window --output_dir brain-flow-time

Before the first step the codec (`CorrelationMatrixCodec`, or `SPDMatrixCodec` with `--spd_map`) maps every
training matrix to a vector and fits its per-feature standardiser; the flow is trained in those coordinates with
diffusers' flow-matching convention, so every sampled matrix is valid. The result is a `BrainNetworkFlowPipeline`
folder (model + codec + `FlowMatchEulerDiscreteScheduler`) with a model card; checkpoints are
`output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues exactly where the last one stopped.
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
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")

MATRIX_TYPES = ("correlation", "spd")
DATASETS = ("world", "sliding_window")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name",
        type=str,
        default="world",
        choices=DATASETS,
        help="The pack's world, or the sliding-window trajectory of the wheel's one real run (time as covariate).",
    )
    data.add_argument(
        "--train_data_dir",
        type=str,
        default=None,
        help="Your folder: matrices.npy (N, n, n) and optionally covariates.csv; replaces --dataset_name.",
    )
    data.add_argument(
        "--matrix_type", type=str, default="correlation", choices=MATRIX_TYPES, help="What your matrices are."
    )
    data.add_argument(
        "--spd_map", type=str, default="log_euclidean", choices=("log_euclidean", "log_cholesky"), help="SPD map."
    )
    data.add_argument("--parcellation", type=str, default="schaefer", help="The world's group-mean parcellation.")
    data.add_argument(
        "--num_regions",
        type=int,
        default=100,
        help="Regions: the world's (100, 200, 300 or 400), or the trajectory's parcellation of fsaverage5 (even).",
    )
    data.add_argument("--window", type=int, default=40, help="The trajectory's volumes per sliding window.")
    data.add_argument("--window_step", type=int, default=2, help="The trajectory's volumes between window starts.")
    data.add_argument("--shrinkage", type=float, default=0.1, help="The trajectory's shrinkage towards the identity.")
    data.add_argument("--num_train_subjects", type=int, default=1024, help="Subjects drawn from the world.")
    data.add_argument(
        "--data_seed", type=int, default=0, help="Seed of the world's subjects, or of the trajectory's parcellation."
    )
    model = parser.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=512, help="MLP width.")
    model.add_argument("--num_layers", type=int, default=4, help="Modulated residual blocks.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, batches and noise.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Matrices per batch per process.")
    train.add_argument("--max_train_steps", type=int, default=2000, help="Optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=1e-3, lr_scheduler="cosine", lr_warmup_steps=50, weight_decay=0.0)
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline samples --num_validation_images matrices at the training set's first covariate rows (seeded "
        "with --seed); the fraction positive definite with unit diagonal and their mean off-diagonal value go to the "
        "tracker (text) and to output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text", num_validation_images=16)
    validation.add_argument("--eval_inference_steps", type=int, default=50, help="Euler steps when sampling.")
    args = parser.parse_args(argv)
    for name in (
        "num_regions",
        "num_train_subjects",
        "window",
        "window_step",
        "hidden_size",
        "num_layers",
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "logging_steps",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.train_data_dir is not None and not os.path.isdir(args.train_data_dir):
        parser.error(f"--train_data_dir {args.train_data_dir!r} is not a folder.")
    if args.train_data_dir is None and args.num_train_subjects < 2:
        parser.error(f"--num_train_subjects must be >= 2, got {args.num_train_subjects}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def build_data(args):
    """`(codec, vectors (N, k) float32, covariates (N, c) float32 or None, covariate names, description)`: the
    training matrices encoded by a codec fitted on them; a bad folder or matrix raises a `ValueError` first."""
    from diffusers_ext import CorrelationMatrixCodec, SPDMatrixCodec
    from diffusers_ext.data import brain_network_trajectory, brain_networks

    if args.train_data_dir is not None:
        matrices, covariates, names = brain_networks.load_matrix_folder(args.train_data_dir)
        matrix_type = args.matrix_type
        description = f"the {len(matrices)} matrices of `{os.path.basename(os.path.normpath(args.train_data_dir))}`"
    elif args.dataset_name == "sliding_window":
        matrices, times = brain_network_trajectory.load_sliding_window_connectivity(
            args.num_regions, args.window, args.window_step, args.shrinkage, seed=args.data_seed
        )
        covariates, names, matrix_type = times.float()[:, None], ["time"], "correlation"
        description = (
            f"the {len(matrices)} sliding-window connectivity matrices ({args.window} volumes every "
            f"{args.window_step}, shrinkage {args.shrinkage}, {args.num_regions} regions) of ONE subject's resting-state "
            "run shipped in the `brainspace` wheel (`diffusers_ext.data.brain_network_trajectory.load_sliding_window_connectivity`)"
        )
    else:
        group = brain_networks.load_group_connectivity(args.parcellation, args.num_regions)
        world = brain_networks.ConnectivityWorld(group)
        generator = torch.Generator().manual_seed(args.data_seed)
        draw = world.sample(world.random_covariates(args.num_train_subjects, generator), generator)
        matrices, covariates, names, matrix_type = draw.matrices, draw.covariates, ["age", "sex"], "correlation"
        description = (
            f"{args.num_train_subjects} subjects of the pack's connectivity world around the HCP "
            f"{args.parcellation}-{args.num_regions} group mean (`diffusers_ext.data.brain_networks`, seed "
            f"{args.data_seed})"
        )
    size = matrices.shape[1]
    if matrix_type == "correlation":
        codec = CorrelationMatrixCodec(size)
    else:
        codec = SPDMatrixCodec(size, map=args.spd_map)
    codec.fit(matrices)  # checks every matrix first: the error names the first invalid one
    vectors = codec.encode(matrices).float()
    return codec, vectors, covariates, names, description


def run_validation(pipeline, covariates, args, accelerator, step: int) -> None:
    """Sample `--num_validation_images` matrices; log the fraction valid and their mean off-diagonal value."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)

    def sample(conditions, generator):
        rows = None if covariates is None else covariates[: args.num_validation_images]
        count = args.num_validation_images if rows is None else len(rows)
        matrices = pipeline(
            rows,
            batch_size=None if rows is not None else count,
            num_inference_steps=args.eval_inference_steps,
            generator=generator,
        ).matrices
        positive = torch.linalg.eigvalsh(matrices).min(-1).values > 0
        off = matrices.sum((1, 2)) - torch.diagonal(matrices, dim1=1, dim2=2).sum(1)
        mean_off = float((off / (matrices.shape[1] * (matrices.shape[1] - 1))).mean())
        return [
            f"{len(matrices)} samples: {float(positive.float().mean()):.3f} positive definite; mean off-diagonal {mean_off:.4f}"
        ]

    validate(accelerator, args, step, sample, [None], [pipeline.model], logger, texts=True, repeat=1)


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)  # a missing checkpoint fails first

    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import BrainNetworkFlowModel, BrainNetworkFlowPipeline
    from diffusers_ext.losses.manifold_flow import manifold_flow_loss
    from diffusers_ext.training_utils import (
        command_line,
        gathered_model,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    codec, vectors, covariates, names, description = build_data(args)
    accelerator = start_run(args, logger)
    model = BrainNetworkFlowModel(
        num_features=codec.num_features,
        num_covariates=0 if covariates is None else covariates.shape[1],
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
    )
    scheduler = FlowMatchEulerDiscreteScheduler()
    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_brain_network_flow", config={k: str(v) for k, v in vars(args).items()})
    logger.info(
        f"{len(vectors)} matrices of {codec.config.get('num_regions', codec.config.get('size'))} regions -> "
        f"{codec.num_features} features, covariates {names or 'none'}; {args.max_train_steps} steps, from {global_step}"
    )

    def make_pipeline(trained):
        pipe = BrainNetworkFlowPipeline(model=trained, codec=codec, scheduler=scheduler)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    device = accelerator.device
    data = vectors.to(device)
    conditions = None if covariates is None else covariates.to(device)
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
            extra = {} if conditions is None else {"covariates": conditions[index]}
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = manifold_flow_loss(model, data[index], noise_generator, **extra)
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
                run_validation(make_pipeline(trained), covariates, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = make_pipeline(final)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, covariates, args, accelerator, global_step)
        metrics = {"final_loss": loss_sum, "num_features": codec.num_features, "covariates": names}
        with open(os.path.join(args.output_dir, "training_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        write_model_card(
            args.output_dir,
            title="Conditional flow matching over brain-network connectivity matrices",
            description=(
                f"A `BrainNetworkFlowModel` ({sum(p.numel() for p in final.parameters()):,} parameters) with a "
                f"`{type(codec).__name__}` trained with `training/train_brain_network_flow.py` on {description}, "
                f"conditioned on {', '.join(names) if names else 'nothing'}. Sample valid matrices with "
                "`BrainNetworkFlowPipeline.from_pretrained(folder)(covariates)`."
            ),
            command=command_line(),
            metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
            tags=["flow-matching", "connectivity", "brain-networks"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_brain_network_flow.py: error: {error}", file=sys.stderr)
        sys.exit(2)
