#!/usr/bin/env python
"""Easy consistency training (ECT) of a diffusers `UNet2DModel`, optionally with AYT's manifold feature distance.

Trains a consistency model from scratch or from a pretrained diffusers UNet on scikit-learn's bundled 8x8 digits
(no download). The loss compares `f(x + t noise, t)` with the stopped-gradient `f(x + r noise, r)` on ECT's
shrinking `(t, r)` curriculum, weighted by `1 / (t - r)`:

- `--loss pseudo_huber` (improved consistency training's default), `--loss l2`;
- `--loss mfd`: "Align Your Tangent" (AYT): the update follows the unit-normalised, per-sample gradient of the
  manifold feature distance of an `AugmentationRegressor` (`--feature_network`, made by
  `training/train_augmentation_regressor.py`).

    accelerate launch training/train_consistency.py --output_dir digits-cm --loss mfd \
        --feature_network digits-augmentation-regressor --use_ema

The result is a diffusers `ConsistencyModelPipeline` folder (`CMStochasticIterativeScheduler`) with a model card:
`ConsistencyModelPipeline.from_pretrained(output_dir)(num_inference_steps=1)`. Checkpoints are
`output_dir/checkpoint-<step>`; `--resume_from_checkpoint latest` continues exactly where the last one stopped.
"""

import argparse
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

LOSSES = ("pseudo_huber", "mfd", "l2")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument("--resolution", type=int, default=8, help="Digits resolution (the 8x8 originals are resized).")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_name_or_path",
        type=str,
        default=None,
        help="Start from this diffusers UNet2DModel (a Hub id or a folder); default: a fresh UNet from the flags below.",
    )
    model.add_argument(
        "--pretrained_subfolder",
        type=str,
        default="unet",
        help="Subfolder of the UNet inside --pretrained_model_name_or_path ('' for a bare model folder).",
    )
    model.add_argument(
        "--class_conditional",
        action="store_true",
        help="Condition on digit labels (implied when the pretrained UNet has class embeddings).",
    )
    model.add_argument("--block_out_channels", type=int, nargs="+", default=[16, 32], help="UNet channels per level.")
    model.add_argument("--layers_per_block", type=int, default=1, help="ResNet layers per UNet block.")
    model.add_argument("--norm_num_groups", type=int, default=8, help="GroupNorm groups of a fresh UNet.")
    cm = parser.add_argument_group("consistency training")
    cm.add_argument("--loss", type=str, default="pseudo_huber", choices=LOSSES, help="The consistency loss.")
    cm.add_argument(
        "--feature_network",
        type=str,
        default=None,
        help="AugmentationRegressor folder whose features define the manifold feature distance (--loss mfd).",
    )
    cm.add_argument("--huber_c", type=float, default=None, help="Pseudo-Huber constant (default 0.00054 sqrt(dim)).")
    cm.add_argument("--num_stages", type=int, default=4, help="ECT stages; the (t, r) gap shrinks by q per stage.")
    cm.add_argument("--ect_q", type=float, default=2.0, help="ECT gap shrink factor per stage.")
    cm.add_argument("--ect_k", type=float, default=8.0, help="ECT adjustment n(t) = 1 + k sigmoid(-b t): k.")
    cm.add_argument("--ect_b", type=float, default=1.0, help="ECT adjustment n(t) = 1 + k sigmoid(-b t): b.")
    cm.add_argument(
        "--stage_offset",
        type=int,
        default=0,
        help="Added to the stage in q's exponent; 0 makes the first stage denoising pretraining (r = 0).",
    )
    cm.add_argument("--p_mean", type=float, default=-1.1, help="Mean of log t.")
    cm.add_argument("--p_std", type=float, default=2.0, help="Standard deviation of log t.")
    cm.add_argument("--sigma_min", type=float, default=0.002, help="Smallest noise level (scheduler config).")
    cm.add_argument("--sigma_max", type=float, default=80.0, help="Largest noise level (scheduler config).")
    cm.add_argument("--sigma_data", type=float, default=0.5, help="Data standard deviation (scheduler config).")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and noise.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Batch size per process.")
    train.add_argument("--max_train_steps", type=int, default=800, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(
        train,
        learning_rate=1e-3,
        lr_scheduler="constant_with_warmup",
        lr_warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=None,
    )
    train.add_argument("--use_ema", action="store_true", help="Keep an EMA of the weights; the saved model uses it.")
    train.add_argument("--ema_max_decay", type=float, default=0.999, help="EMA maximum decay.")
    train.add_argument("--ema_inv_gamma", type=float, default=1.0, help="EMA warm-up inverse gamma.")
    train.add_argument("--ema_power", type=float, default=0.75, help="EMA warm-up power.")
    add_accelerate_arguments(train, checkpointing_steps=200, checkpoints_total_limit=None)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "One-step samples of the pipeline the script saves (EMA weights with --use_ema), logged to the tracker and "
        "saved under output_dir/validation/. Class-conditional models draw --num_validation_images per "
        "--validation_class_labels entry (the counterpart of diffusers' --validation_prompt); unconditional ones "
        "draw --num_validation_images.",
    )
    add_validation_arguments(validation, "class_label")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    if args.loss == "mfd" and args.feature_network is None:
        parser.error("--loss mfd needs --feature_network (a folder made by train_augmentation_regressor.py).")
    if args.feature_network is not None and not os.path.isdir(args.feature_network):
        parser.error(f"--feature_network {args.feature_network!r} is not a folder.")
    if args.pretrained_model_name_or_path is None:
        factor = 2 ** (len(args.block_out_channels) - 1)
        if args.resolution < factor or args.resolution % factor:
            parser.error(
                f"--resolution {args.resolution} must be a positive multiple of {factor} for a "
                f"{len(args.block_out_channels)}-level UNet."
            )
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "num_stages",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.num_stages > args.max_train_steps:
        parser.error(f"--num_stages {args.num_stages} exceeds --max_train_steps {args.max_train_steps}.")
    if args.ect_q <= 1:
        parser.error(f"--ect_q must be > 1, got {args.ect_q}.")
    if not 0 < args.sigma_min < args.sigma_max:
        parser.error(f"expected 0 < --sigma_min < --sigma_max, got {args.sigma_min} and {args.sigma_max}.")
    if args.resume_from_checkpoint is not None:
        from diffusers_ext.training_utils import resolve_resume_checkpoint

        try:  # fail before any model is built
            resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)
        except ValueError as error:
            parser.error(str(error))


def build_unet(args, num_classes: int):
    """A fresh `UNet2DModel` from the flags, or the pretrained one; returns `(unet, class_conditional)`."""
    from diffusers import UNet2DModel

    if args.pretrained_model_name_or_path is not None:
        unet = UNet2DModel.from_pretrained(
            args.pretrained_model_name_or_path, subfolder=args.pretrained_subfolder or None
        )
        if unet.config.in_channels != 1 or unet.config.out_channels != 1:
            raise ValueError(
                f"--pretrained_model_name_or_path {args.pretrained_model_name_or_path!r} has "
                f"{unet.config.in_channels} input / {unet.config.out_channels} output channels; the digits need 1."
            )
        if unet.config.sample_size != args.resolution:
            raise ValueError(
                f"--pretrained_model_name_or_path {args.pretrained_model_name_or_path!r} was made for "
                f"{unet.config.sample_size}x{unet.config.sample_size} images but --resolution is {args.resolution}."
            )
        conditional = unet.config.num_class_embeds is not None
        if conditional and unet.config.num_class_embeds < num_classes:
            raise ValueError(
                f"the pretrained UNet has {unet.config.num_class_embeds} class embeddings; the digits need "
                f"{num_classes}."
            )
        if args.class_conditional and not conditional:
            raise ValueError("--class_conditional: the pretrained UNet has no class embeddings.")
        return unet, conditional
    unet = UNet2DModel(
        sample_size=args.resolution,
        in_channels=1,
        out_channels=1,
        block_out_channels=tuple(args.block_out_channels),
        down_block_types=("DownBlock2D",) * len(args.block_out_channels),
        up_block_types=("UpBlock2D",) * len(args.block_out_channels),
        layers_per_block=args.layers_per_block,
        norm_num_groups=args.norm_num_groups,
        num_class_embeds=num_classes if args.class_conditional else None,
    )
    return unet, args.class_conditional


def build_pipeline(unet, args):
    """The pipeline the script saves: diffusers' `ConsistencyModelPipeline` with a `CMStochasticIterativeScheduler`."""
    from diffusers import CMStochasticIterativeScheduler, ConsistencyModelPipeline

    scheduler = CMStochasticIterativeScheduler(
        sigma_min=args.sigma_min, sigma_max=args.sigma_max, sigma_data=args.sigma_data
    )
    return ConsistencyModelPipeline(unet=unet, scheduler=scheduler)


def run_validation(pipeline, args, accelerator, step: int) -> None:
    """`--num_validation_images` one-step samples per `--validation_class_labels` entry (default: every class), or
    in all for an unconditional model, seeded with `--seed`; saved under `output_dir/validation/step-<step>/` and
    logged to the trackers. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)
    num_classes = pipeline.unet.config.num_class_embeds
    labels = (args.validation_class_labels or list(range(num_classes))) if num_classes else [None]

    def sample(conditions, generator):
        images = pipeline(
            batch_size=len(conditions),
            class_labels=list(conditions) if num_classes else None,
            num_inference_steps=1,
            generator=generator,
            output_type="np",
        ).images
        return torch.from_numpy(images).permute(0, 3, 1, 2)

    validate(accelerator, args, step, sample, labels, [pipeline.unet], logger)


def main(argv=None):
    args = parse_args(argv)
    from diffusers import UNet2DModel
    from diffusers.training_utils import EMAModel

    from diffusers_ext import AugmentationRegressor, ManifoldFeatureDistance
    from diffusers_ext.data.digits import NUM_CLASSES, load_digits_images
    from diffusers_ext.losses.consistency import (
        EasyConsistencySchedule,
        consistency_model_output,
        consistency_training_loss,
    )
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
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

    accelerator = start_run(args, logger)

    images, labels = load_digits_images("train", resolution=args.resolution)
    dataset = torch.utils.data.TensorDataset(images, labels)
    unet, conditional = build_unet(args, NUM_CLASSES)
    distance = None
    if args.loss == "mfd":
        feature_network = AugmentationRegressor.from_pretrained(args.feature_network)
        if feature_network.config.sample_size != args.resolution:
            raise ValueError(
                f"--feature_network {args.feature_network!r} takes {feature_network.config.sample_size}x"
                f"{feature_network.config.sample_size} images but --resolution is {args.resolution}."
            )
        distance = ManifoldFeatureDistance(feature_network).to(accelerator.device)
    schedule = EasyConsistencySchedule(
        total_steps=args.max_train_steps,
        num_stages=args.num_stages,
        q=args.ect_q,
        k=args.ect_k,
        b=args.ect_b,
        stage_offset=args.stage_offset,
        p_mean=args.p_mean,
        p_std=args.p_std,
        sigma_min=args.sigma_min,
        sigma_max=args.sigma_max,
    )
    loss_type = "normalized_gradient" if args.loss == "mfd" else args.loss

    optimizer, lr_scheduler = build_optimizer(unet.parameters(), args, accelerator.num_processes)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    ema = None
    if args.use_ema:  # built after `prepare`, from the tensors the processes train (FSDP replaces them when wrapping)
        trained = accelerator.unwrap_model(unet)
        ema = EMAModel(
            trained.parameters(),
            decay=args.ema_max_decay,
            use_ema_warmup=True,
            inv_gamma=args.ema_inv_gamma,
            power=args.ema_power,
            model_cls=UNet2DModel,
            model_config=trained.config,
        )
        ema.to(accelerator.device)
        accelerator.register_for_checkpointing(ema)

    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    # Batches, noise and noise levels are functions of (seed, step, process) alone: a resumed run replays the
    # uninterrupted one.
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
        accelerator.init_trackers("train_consistency", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(
        f"{len(dataset)} images, batch {total_batch}, {args.max_train_steps} steps from step {global_step}, "
        f"loss {args.loss}"
    )

    cm_kwargs = {"sigma_data": args.sigma_data, "sigma_min": args.sigma_min}
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    unet.train()
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            clean, digit = next(loader)
            clean = clean.to(accelerator.device)
            class_labels = digit.to(accelerator.device) if conditional else None
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            t, r = schedule.sample(clean.shape[0], global_step, generator)
            t, r = t.to(accelerator.device), r.to(accelerator.device)
            noise = torch.randn(clean.shape, generator=generator).to(accelerator.device)

            # The target f(x + r noise, r) comes from the current weights without gradient; where r = 0 the
            # consistency function is the identity and the target is the clean image.
            target = clean.clone()
            noisy_r = r > 0
            if noisy_r.any():
                with torch.no_grad(), accelerator.autocast():
                    target[noisy_r] = consistency_model_output(
                        accelerator.unwrap_model(unet),
                        clean[noisy_r] + r[noisy_r, None, None, None] * noise[noisy_r],
                        r[noisy_r],
                        class_labels[noisy_r] if conditional else None,
                        **cm_kwargs,
                    ).to(target.dtype)
            with accelerator.accumulate(unet):
                with accelerator.autocast():
                    prediction = consistency_model_output(
                        unet, clean + t[:, None, None, None] * noise, t, class_labels, **cm_kwargs
                    )
                loss = consistency_training_loss(
                    prediction, target, t, r, loss_type, distance=distance, huber_c=args.huber_c
                ).mean()
                backward_and_step(accelerator, loss, unet.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps

        global_step += 1
        progress.update(1)
        if ema is not None:
            ema.step(unet.parameters())
        logs = {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0], "ect_stage": schedule.stage(global_step - 1)}
        if ema is not None:
            logs["ema_decay"] = ema.cur_decay_value
        progress.set_postfix(**logs)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            # every process takes part (a sharded run gathers here); the EMA weights, as the saved pipeline holds them
            model = gathered_model(accelerator, unet, ema)
            if accelerator.is_main_process:
                run_validation(build_pipeline(model, args), args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final_unet = gathered_model(accelerator, unet, ema)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = build_pipeline(final_unet, args)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, args, accelerator, global_step)
        start = (
            f"initialised from `{args.pretrained_model_name_or_path}`"
            if args.pretrained_model_name_or_path
            else "trained from scratch"
        )
        loss_text = {
            "pseudo_huber": "the pseudo-Huber consistency loss",
            "l2": "the squared L2 consistency loss",
            "mfd": "AYT's manifold feature distance (normalised-gradient update, feature network "
            f"`{args.feature_network}`)",
        }[args.loss]
        write_model_card(
            args.output_dir,
            title="Consistency model (easy consistency training)",
            description=(
                f"A `UNet2DModel` ({sum(p.numel() for p in final_unet.parameters()):,} parameters) {start} with "
                f"`training/train_consistency.py` on scikit-learn's 8x8 digits (train split) at "
                f"{args.resolution}x{args.resolution}: ECT curriculum with {args.num_stages} stages (q={args.ect_q}), "
                f"{loss_text}, {args.max_train_steps} steps of batch {total_batch}"
                + (", EMA weights" if ema is not None else "")
                + ".\n\nSample in one or two steps with diffusers' own pipeline:\n\n```python\n"
                "from diffusers import ConsistencyModelPipeline\n\n"
                "pipe = ConsistencyModelPipeline.from_pretrained(folder)\n"
                "images = pipe(batch_size=16, num_inference_steps=1"
                + (", class_labels=list(range(10)) + [0] * 6" if conditional else "")
                + ").images\n```"
            ),
            command=command_line(),
            tags=["consistency-models", "unconditional-image-generation" if not conditional else "class-conditional"],
            base_model=args.pretrained_model_name_or_path,
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_consistency.py: error: {error}", file=sys.stderr)
        sys.exit(2)
