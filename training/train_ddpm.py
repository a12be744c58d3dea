#!/usr/bin/env python
"""Train a pixel-space DDPM (a diffusers `UNet2DModel`, optionally class-conditional) with accelerate.

Default data: scikit-learn's bundled 8x8 handwritten digits (no download). Or any `datasets` image folder
(`--train_data_dir`, one sub-folder per class for class-conditional training).

    accelerate launch training/train_ddpm.py --output_dir digits-ddpm --class_conditional --max_train_steps 6000

The result is a `ClassConditionalDDPMPipeline` folder (or a diffusers `DDPMPipeline` when unconditional) with a
model card; checkpoints are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues
exactly where the last one stopped.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
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

DOWN_BLOCKS = {"plain": "DownBlock2D", "attn": "AttnDownBlock2D"}
UP_BLOCKS = {"plain": "UpBlock2D", "attn": "AttnUpBlock2D"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--train_data_dir",
        type=str,
        default=None,
        help="A `datasets` image folder. Default: scikit-learn's bundled 8x8 digits.",
    )
    data.add_argument("--image_column", type=str, default="image", help="Image column of the image folder.")
    data.add_argument("--label_column", type=str, default="label", help="Label column (class-conditional only).")
    data.add_argument("--resolution", type=int, default=8, help="Training resolution (square).")
    data.add_argument(
        "--num_channels",
        type=int,
        default=None,
        help="Image channels: 1 (grayscale) or 3 (RGB). Default: 1 for digits, 3 for an image folder.",
    )
    data.add_argument("--random_flip", action="store_true", help="Random horizontal flips (not for digits).")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--class_conditional",
        action="store_true",
        help="Condition on class labels, with a learned null class for classifier-free guidance.",
    )
    model.add_argument(
        "--class_dropout_prob",
        type=float,
        default=0.1,
        help="Probability of replacing a label by the null class during training.",
    )
    model.add_argument("--block_out_channels", type=int, nargs="+", default=[32, 64], help="UNet channels per level.")
    model.add_argument(
        "--block_types",
        type=str,
        nargs="+",
        default=["plain", "attn"],
        help="'plain' or 'attn' for each level, down path order.",
    )
    model.add_argument("--layers_per_block", type=int, default=2, help="ResNet layers per UNet block.")
    model.add_argument("--norm_num_groups", type=int, default=8, help="GroupNorm groups in the UNet.")
    model.add_argument("--ddpm_num_steps", type=int, default=1000, help="Diffusion training timesteps.")
    model.add_argument("--ddpm_beta_schedule", type=str, default="squaredcos_cap_v2", help="DDPM beta schedule.")
    model.add_argument(
        "--clip_sample",
        action="store_true",
        help="Clip the predicted clean image to [-1, 1] when sampling (off: clipping breaks classifier-free guidance).",
    )
    model.add_argument(
        "--prediction_type",
        type=str,
        default="epsilon",
        choices=["epsilon", "sample", "v_prediction"],
        help="What the UNet predicts.",
    )
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and noise.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Batch size per process.")
    train.add_argument("--max_train_steps", type=int, default=6000, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=2e-3, lr_scheduler="cosine", lr_warmup_steps=200, weight_decay=1e-4)
    train.add_argument("--use_ema", action="store_true", help="Keep an exponential moving average of the weights.")
    train.add_argument("--ema_max_decay", type=float, default=0.999, help="EMA maximum decay.")
    train.add_argument("--ema_inv_gamma", type=float, default=1.0, help="EMA warm-up inverse gamma.")
    train.add_argument("--ema_power", type=float, default=0.75, help="EMA warm-up power.")
    add_accelerate_arguments(train, checkpointing_steps=1000, checkpoints_total_limit=None)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    train.add_argument("--dataloader_num_workers", type=int, default=0, help="DataLoader worker processes.")
    validation = parser.add_argument_group(
        "validation",
        "Samples of the pipeline the script saves (EMA weights with --use_ema), logged to the tracker and saved under "
        "output_dir/validation/. Class-conditional runs draw --num_validation_images per --validation_class_labels "
        "entry (the counterpart of diffusers' --validation_prompt); unconditional runs draw --num_validation_images.",
    )
    add_validation_arguments(validation, "class_label")
    validation.add_argument(
        "--ddpm_num_inference_steps", type=int, default=50, help="DDIM steps of the validation samples."
    )
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    if args.train_data_dir is not None and not os.path.isdir(args.train_data_dir):
        parser.error(f"--train_data_dir {args.train_data_dir!r} is not a folder.")
    if len(args.block_types) != len(args.block_out_channels):
        parser.error(
            f"--block_types has {len(args.block_types)} entries but --block_out_channels has "
            f"{len(args.block_out_channels)}; give one type per level."
        )
    unknown = [t for t in args.block_types if t not in DOWN_BLOCKS]
    if unknown:
        parser.error(f"--block_types {unknown} unknown; expected 'plain' or 'attn'.")
    factor = 2 ** (len(args.block_out_channels) - 1)
    if args.resolution < factor or args.resolution % factor:
        parser.error(
            f"--resolution {args.resolution} must be a positive multiple of {factor} for a "
            f"{len(args.block_out_channels)}-level UNet."
        )
    if args.num_channels is not None and args.num_channels not in (1, 3):
        parser.error(f"--num_channels must be 1 or 3, got {args.num_channels}.")
    if not 0.0 <= args.class_dropout_prob < 1.0:
        parser.error(f"--class_dropout_prob must lie in [0, 1), got {args.class_dropout_prob}.")
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "ddpm_num_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.validation_class_labels is not None and not args.class_conditional:
        parser.error("--validation_class_labels needs --class_conditional (an unconditional model takes no labels).")


class ImageFolderTensors(torch.utils.data.Dataset):
    """A `datasets` image folder mapped to `(image in [-1, 1] of shape (C, R, R), label)` pairs."""

    def __init__(self, folder: str, resolution: int, channels: int, image_column: str, label_column: str | None):
        from datasets import load_dataset

        self.data = load_dataset("imagefolder", data_dir=folder, split="train")
        if image_column not in self.data.column_names:
            raise ValueError(
                f"--image_column {image_column!r} not in the image folder's columns {self.data.column_names}."
            )
        if label_column is not None and label_column not in self.data.column_names:
            raise ValueError(
                f"--label_column {label_column!r} not in the image folder's columns {self.data.column_names}; "
                "class-conditional training needs one sub-folder per class."
            )
        self.resolution, self.channels = resolution, channels
        self.image_column, self.label_column = image_column, label_column
        names = self.data.features[label_column].names if label_column else None
        self.num_classes = len(names) if names else None
        if len(self.data) == 0:
            raise ValueError(f"--train_data_dir {folder!r} holds no images.")
        self.paths = self._check_images()

    def _check_images(self) -> list[str]:
        """Open every image's header (no decoding) before training: an unreadable file or one smaller than the
        resolution is an error naming the file now, not when the sampler reaches it. Returns the file names."""
        import io

        from datasets import Image as ImageFeature
        from PIL import Image

        files = self.data.cast_column(self.image_column, ImageFeature(decode=False))[self.image_column]
        paths = []
        for index, item in enumerate(files):
            name = item.get("path") or f"image {index}"
            paths.append(name)
            try:
                source = io.BytesIO(item["bytes"]) if item.get("bytes") is not None else item["path"]
                with Image.open(source) as image:
                    size = image.size
                    image.verify()
            except Exception as error:  # PIL raises several types for a bad file; all mean "not an image"
                raise ValueError(
                    f"--train_data_dir: {name!r} is not a readable image ({type(error).__name__}: {error})."
                ) from error
            if min(size) < self.resolution:
                raise ValueError(
                    f"--train_data_dir: {name!r} is {size[0]}x{size[1]}, smaller than --resolution "
                    f"{self.resolution}; pass a smaller --resolution."
                )
        return paths

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        import numpy as np
        from PIL import Image

        try:
            row = self.data[index]
            image = row[self.image_column].convert("L" if self.channels == 1 else "RGB")
        except Exception as error:  # a file that passed the header check but does not decode
            raise ValueError(
                f"--train_data_dir: {self.paths[index]!r} does not decode ({type(error).__name__}: {error})."
            ) from error
        scale = self.resolution / min(image.size)
        image = image.resize(
            (max(self.resolution, round(image.size[0] * scale)), max(self.resolution, round(image.size[1] * scale))),
            Image.BICUBIC,
        )
        left, top = (image.size[0] - self.resolution) // 2, (image.size[1] - self.resolution) // 2
        image = image.crop((left, top, left + self.resolution, top + self.resolution))
        array = (
            np.asarray(image, dtype=np.float32).reshape(self.resolution, self.resolution, self.channels) / 127.5 - 1
        )
        label = row[self.label_column] if self.label_column else 0
        return torch.from_numpy(array).permute(2, 0, 1), torch.tensor(label)


def build_dataset(args):
    """Return `(dataset, num_classes, channels)` for the digits default or an image folder."""
    if args.train_data_dir is None:
        from diffusers_ext.data.digits import NUM_CLASSES, load_digits_images

        if args.num_channels not in (None, 1):
            raise ValueError(f"--num_channels {args.num_channels}: the digits are grayscale (1 channel).")
        images, labels = load_digits_images("train", resolution=args.resolution)
        return torch.utils.data.TensorDataset(images, labels), NUM_CLASSES, 1
    channels = args.num_channels or 3
    dataset = ImageFolderTensors(
        args.train_data_dir,
        args.resolution,
        channels,
        args.image_column,
        args.label_column if args.class_conditional else None,
    )
    if args.class_conditional and not dataset.num_classes:
        raise ValueError(
            f"--train_data_dir {args.train_data_dir!r} has no class labels; make one sub-folder per class."
        )
    return dataset, dataset.num_classes, channels


def build_unet(args, channels: int, num_classes: int | None):
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=args.resolution,
        in_channels=channels,
        out_channels=channels,
        block_out_channels=tuple(args.block_out_channels),
        down_block_types=tuple(DOWN_BLOCKS[t] for t in args.block_types),
        up_block_types=tuple(UP_BLOCKS[t] for t in reversed(args.block_types)),
        layers_per_block=args.layers_per_block,
        norm_num_groups=args.norm_num_groups,
        num_class_embeds=num_classes + 1 if args.class_conditional else None,
    )


def build_pipeline(unet, noise_scheduler, args, null_label):
    """The pipeline the script saves: a `ClassConditionalDDPMPipeline` (or diffusers' `DDPMPipeline` when
    unconditional) with the DDIM sampler of the training noise schedule."""
    from diffusers import DDIMScheduler, DDPMPipeline

    from diffusers_ext import ClassConditionalDDPMPipeline
    from diffusers_ext.schedulers.compatibility import swap_ready_scheduler_config

    scheduler = DDIMScheduler.from_config(swap_ready_scheduler_config(noise_scheduler.config))
    if args.class_conditional:
        return ClassConditionalDDPMPipeline(unet, scheduler, null_class_label=null_label)
    return DDPMPipeline(unet, scheduler)


def run_validation(pipeline, args, accelerator, step: int) -> None:
    """`--num_validation_images` samples per `--validation_class_labels` entry (default: every class), or in all
    for an unconditional model, seeded with `--seed`; saved under `output_dir/validation/step-<step>/` and logged
    to the trackers. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)
    if args.class_conditional:
        labels = args.validation_class_labels or list(range(pipeline.config.null_class_label))

        def sample(conditions, generator):
            return pipeline(
                class_labels=list(conditions),
                num_inference_steps=args.ddpm_num_inference_steps,
                generator=generator,
                output_type="pt",
            ).images

    else:
        labels = [None]

        def sample(conditions, generator):
            images = pipeline(
                batch_size=len(conditions),
                num_inference_steps=args.ddpm_num_inference_steps,
                generator=generator,
                output_type="np",
            ).images
            return torch.from_numpy(images).permute(0, 3, 1, 2)

    validate(accelerator, args, step, sample, labels, [pipeline.unet], logger)


def main(argv=None):
    args = parse_args(argv)
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.training_utils import EMAModel

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

    dataset, num_classes, channels = build_dataset(args)
    unet = build_unet(args, channels, num_classes)
    null_label = num_classes if args.class_conditional else None
    noise_scheduler = DDPMScheduler(
        num_train_timesteps=args.ddpm_num_steps,
        beta_schedule=args.ddpm_beta_schedule,
        prediction_type=args.prediction_type,
        clip_sample=args.clip_sample,
    )
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

    # Batches and noise are functions of (seed, step, process) alone: a resumed run replays the uninterrupted one.
    sampler = ResumableBatchSampler(
        len(dataset),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=args.dataloader_num_workers))

    if accelerator.is_main_process:
        accelerator.init_trackers("train_ddpm", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(dataset)} images, batch {total_batch}, {args.max_train_steps} steps, from step {global_step}")

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    unet.train()
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            images, labels = next(loader)
            images, labels = images.to(accelerator.device), labels.to(accelerator.device)
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            noise = torch.randn(images.shape, generator=generator).to(accelerator.device)
            timesteps = torch.randint(0, args.ddpm_num_steps, (images.shape[0],), generator=generator)
            timesteps = timesteps.to(accelerator.device)
            class_labels = None
            if args.class_conditional:
                drop = (
                    torch.rand(images.shape[0], generator=generator).to(accelerator.device) < args.class_dropout_prob
                )
                class_labels = torch.where(drop, torch.full_like(labels, null_label), labels)
            noisy = noise_scheduler.add_noise(images, noise, timesteps)
            if args.prediction_type == "epsilon":
                target = noise
            elif args.prediction_type == "sample":
                target = images
            else:
                target = noise_scheduler.get_velocity(images, noise, timesteps)

            with accelerator.accumulate(unet):
                with accelerator.autocast():
                    pred = unet(noisy, timesteps, class_labels=class_labels).sample
                loss = F.mse_loss(pred.float(), target.float())
                backward_and_step(accelerator, loss, unet.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps

        global_step += 1
        progress.update(1)
        if ema is not None:
            ema.step(unet.parameters())
        logs = {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}
        if ema is not None:
            logs["ema_decay"] = ema.cur_decay_value
        progress.set_postfix(**logs)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            # every process takes part (a sharded run gathers here); the EMA weights, as the saved pipeline holds them
            model = gathered_model(accelerator, unet, ema)
            if accelerator.is_main_process:
                pipeline = build_pipeline(model, noise_scheduler, args, null_label)
                run_validation(pipeline, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final_unet = gathered_model(accelerator, unet, ema)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = build_pipeline(final_unet, noise_scheduler, args, null_label)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, args, accelerator, global_step)
        data = args.train_data_dir or "scikit-learn's 8x8 digits (train split)"
        write_model_card(
            args.output_dir,
            title=f"{'Class-conditional ' if args.class_conditional else ''}pixel DDPM",
            description=(
                f"A `UNet2DModel` ({sum(p.numel() for p in final_unet.parameters()):,} parameters) trained with "
                f"`training/train_ddpm.py` on {data} at {args.resolution}x{args.resolution}, "
                f"{args.max_train_steps} steps of batch {total_batch}"
                + (", EMA weights" if ema is not None else "")
                + (
                    f"; label {null_label} is the null class for classifier-free guidance."
                    if args.class_conditional
                    else "."
                )
            ),
            command=command_line(),
            tags=["ddpm", "unconditional-image-generation" if not args.class_conditional else "class-conditional"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_ddpm.py: error: {error}", file=sys.stderr)
        sys.exit(2)
