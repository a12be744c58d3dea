#!/usr/bin/env python
"""Train an `AugmentationRegressor`, the feature network of the manifold feature distance (AYT), with accelerate.

Each training image gets random grey-scale augmentations (scale, rotation, aspect, shift, blur, mixup, noise; each
with probability `--augment_p`), and the network regresses their parameters by mean squared error. Default data:
scikit-learn's bundled 8x8 digits (no download).

    accelerate launch training/train_augmentation_regressor.py --output_dir digits-augmentation-regressor

The result loads with `AugmentationRegressor.from_pretrained(output_dir)` and plugs into
`ManifoldFeatureDistance`; `--resume_from_checkpoint latest` continues exactly where the last checkpoint stopped.
"""

import argparse
import logging
import sys

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from diffusers_ext.training_utils import add_accelerate_arguments, output_dir_arg


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the network and checkpoints go."
    )
    parser.add_argument("--resolution", type=int, default=8, help="Image side (the digits are resized to it).")
    parser.add_argument("--block_out_channels", type=int, nargs="+", default=[32, 64], help="Channels per stage.")
    parser.add_argument("--layers_per_block", type=int, default=2, help="Convolutions per stage.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and augmentation.")
    parser.add_argument("--train_batch_size", type=int, default=64, help="Batch size per process.")
    parser.add_argument("--max_train_steps", type=int, default=2000, help="Total optimizer steps.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate (cosine decay).")
    parser.add_argument(
        "--adam_weight_decay",
        "--weight_decay",
        type=float,
        default=1e-4,
        help="AdamW weight decay (--weight_decay: the earlier name).",
    )
    parser.add_argument("--augment_p", type=float, default=0.15, help="Probability of each augmentation.")
    add_accelerate_arguments(parser, checkpointing_steps=1000, checkpoints_total_limit=None)
    args = parser.parse_args(argv)
    factor = 2 ** len(args.block_out_channels)
    if args.resolution < factor or args.resolution % factor:
        parser.error(
            f"--resolution {args.resolution} must be a positive multiple of {factor} "
            f"for {len(args.block_out_channels)} pooling stages."
        )
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "layers_per_block",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not 0.0 < args.augment_p <= 1.0:
        parser.error(f"--augment_p must lie in (0, 1], got {args.augment_p}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


@torch.no_grad()
def heldout_r2(model, images: torch.Tensor, config, seed: int = 12345) -> float:
    """Share of the augmentation labels' variance the model explains on augmented held-out images (1 is perfect)."""
    from diffusers_ext.data.image_augmentations import augment_with_labels

    model.eval()
    augmented, labels = augment_with_labels(images, torch.Generator().manual_seed(seed), config)
    predictions = model(augmented.to(model.device)).predictions.float().cpu()
    residual = (predictions - labels).square().sum()
    total = (labels - labels.mean(dim=0)).square().sum()
    return float(1 - residual / total)


def main(argv=None):
    args = parse_args(argv)
    from diffusers.optimization import get_scheduler

    from diffusers_ext import AugmentationRegressor
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.data.image_augmentations import (
        AUGMENTATION_LABELS,
        GreyscaleAugmentationConfig,
        augment_with_labels,
    )
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        build_accelerator,
        command_line,
        gathered_model,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        step_generator,
        write_model_card,
    )

    accelerator = build_accelerator(
        args.output_dir, args.logging_dir, args.mixed_precision, args.report_to, args.gradient_accumulation_steps
    )
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    set_seed(args.seed)

    augment_config = GreyscaleAugmentationConfig(p=args.augment_p)
    images, _ = load_digits_images("train", resolution=args.resolution)
    heldout_images, _ = load_digits_images("heldout", resolution=args.resolution)
    model = AugmentationRegressor(
        in_channels=1,
        sample_size=args.resolution,
        block_out_channels=tuple(args.block_out_channels),
        layers_per_block=args.layers_per_block,
        num_labels=len(AUGMENTATION_LABELS),
        label_names=AUGMENTATION_LABELS,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.adam_weight_decay)
    lr_scheduler = get_scheduler(
        "cosine",
        optimizer=optimizer,
        num_warmup_steps=min(100, args.max_train_steps // 10) * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes,
    )
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)

    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    sampler = ResumableBatchSampler(
        len(images),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_sampler=sampler))
    if accelerator.is_main_process:
        accelerator.init_trackers("train_augmentation_regressor", config={k: str(v) for k, v in vars(args).items()})

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        for micro in range(args.gradient_accumulation_steps):
            (batch,) = next(loader)
            micro_step = global_step * args.gradient_accumulation_steps + micro
            generator = step_generator(args.seed, micro_step, accelerator.process_index)
            augmented, labels = augment_with_labels(batch, generator, augment_config)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    predictions = model(augmented.to(accelerator.device)).predictions
                loss = F.mse_loss(predictions.float(), labels.to(accelerator.device))
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss.item())
        if global_step % 50 == 0:
            accelerator.log({"loss": loss.item(), "lr": lr_scheduler.get_last_lr()[0]}, step=global_step)
        if global_step % args.checkpointing_steps == 0 or global_step == args.max_train_steps:
            save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        r2 = heldout_r2(final, heldout_images, augment_config)
        accelerator.log({"heldout_r2": r2}, step=global_step)
        logger.info(f"held-out R^2 of the augmentation labels: {r2:.4f}")
        final.save_pretrained(args.output_dir)
        write_model_card(
            args.output_dir,
            title="Augmentation regressor (AYT feature network)",
            description=(
                f"An `AugmentationRegressor` ({sum(p.numel() for p in final.parameters()):,} parameters) trained "
                f"with `training/train_augmentation_regressor.py` on the train split of scikit-learn's 8x8 digits at "
                f"{args.resolution}x{args.resolution}, {args.max_train_steps} steps: it regresses the parameters of "
                f"random grey-scale augmentations ({', '.join(AUGMENTATION_LABELS)}; each applied with probability "
                f"{args.augment_p}). Its feature maps define `ManifoldFeatureDistance` for consistency training."
            ),
            command=command_line(),
            metrics={"heldout_r2": r2},
            tags=["consistency-training", "feature-network"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_augmentation_regressor.py: error: {error}", file=sys.stderr)
        sys.exit(2)
