#!/usr/bin/env python
"""Train a `ConvImageClassifier` on scikit-learn's bundled 8x8 digits with accelerate.

The classifier is the judge of the digits zoo: its held-out accuracy says how far its verdicts on generated
digits can be trusted, and its penultimate features are the space of the Fréchet distances.

    accelerate launch training/train_classifier.py --output_dir digits-classifier
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
        "--output_dir", type=output_dir_arg, required=True, help="Where the classifier and checkpoints go."
    )
    parser.add_argument("--resolution", type=int, default=8, help="Image side (the digits are resized to it).")
    parser.add_argument("--block_out_channels", type=int, nargs="+", default=[32, 64], help="Channels per block.")
    parser.add_argument("--feature_dim", type=int, default=128, help="Size of the penultimate features.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and augmentation.")
    parser.add_argument("--train_batch_size", type=int, default=64, help="Batch size per process.")
    parser.add_argument("--max_train_steps", type=int, default=3000, help="Total optimizer steps.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate (cosine decay).")
    parser.add_argument(
        "--adam_weight_decay",
        "--weight_decay",
        type=float,
        default=1e-4,
        help="AdamW weight decay (--weight_decay: the earlier name).",
    )
    parser.add_argument("--max_shift", type=int, default=1, help="Random translation augmentation, in pixels.")
    add_accelerate_arguments(parser, checkpointing_steps=1000, checkpoints_total_limit=None)
    args = parser.parse_args(argv)
    factor = 2 ** len(args.block_out_channels)
    if args.resolution < factor or args.resolution % factor:
        parser.error(
            f"--resolution {args.resolution} must be a positive multiple of {factor} "
            f"for {len(args.block_out_channels)} pooling blocks."
        )
    for name in ("train_batch_size", "max_train_steps", "gradient_accumulation_steps", "checkpointing_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.max_shift < 0:
        parser.error(f"--max_shift must be >= 0, got {args.max_shift}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image of `(B, C, H, W)` by up to `max_shift` pixels, filling with the background (-1)."""
    if max_shift == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, [max_shift] * 4, value=-1.0)
    offsets = torch.randint(0, 2 * max_shift + 1, (b, 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


def main(argv=None):
    args = parse_args(argv)
    from diffusers.optimization import get_scheduler

    from diffusers_ext import ConvImageClassifier
    from diffusers_ext.data.digits import NUM_CLASSES, load_digits_images
    from diffusers_ext.metrics import classifier_accuracy
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

    images, labels = load_digits_images("train", resolution=args.resolution)
    heldout_images, heldout_labels = load_digits_images("heldout", resolution=args.resolution)
    model = ConvImageClassifier(
        in_channels=1,
        num_classes=NUM_CLASSES,
        sample_size=args.resolution,
        block_out_channels=tuple(args.block_out_channels),
        feature_dim=args.feature_dim,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.adam_weight_decay)
    lr_scheduler = get_scheduler(
        "cosine",
        optimizer=optimizer,
        num_warmup_steps=100 * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes,
    )
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)

    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    sampler = ResumableBatchSampler(
        len(labels),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    dataset = torch.utils.data.TensorDataset(images, labels)
    loader = iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler))
    if accelerator.is_main_process:
        accelerator.init_trackers("train_classifier", config={k: str(v) for k, v in vars(args).items()})

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        for micro in range(args.gradient_accumulation_steps):
            batch, targets = next(loader)
            micro_step = global_step * args.gradient_accumulation_steps + micro
            generator = step_generator(args.seed, micro_step, accelerator.process_index)
            batch = random_shift(batch, args.max_shift, generator).to(accelerator.device)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    logits = model(batch).logits
                loss = F.cross_entropy(logits.float(), targets.to(accelerator.device))
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
        heldout_accuracy = classifier_accuracy(final, heldout_images, heldout_labels)
        accelerator.log({"heldout_accuracy": heldout_accuracy}, step=global_step)
        logger.info(f"held-out accuracy {heldout_accuracy:.4f} on {len(heldout_labels)} digits")
        final.save_pretrained(args.output_dir)
        write_model_card(
            args.output_dir,
            title="Digits classifier",
            description=(
                f"A `ConvImageClassifier` ({sum(p.numel() for p in final.parameters()):,} parameters) trained with "
                f"`training/train_classifier.py` on the train split of scikit-learn's 8x8 digits at "
                f"{args.resolution}x{args.resolution}, {args.max_train_steps} steps, random shifts of up to "
                f"{args.max_shift} px. It judges the digits zoo's generators (accuracy, Fréchet features)."
            ),
            command=command_line(),
            metrics={"heldout_accuracy": heldout_accuracy, "heldout_size": len(heldout_labels)},
            tags=["image-classification"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_classifier.py: error: {error}", file=sys.stderr)
        sys.exit(2)
