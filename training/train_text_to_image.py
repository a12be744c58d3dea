#!/usr/bin/env python
"""Fine-tune a pretrained Stable Diffusion (1.x / 2.x) UNet on your images and captions, with accelerate.

The workflow of diffusers' `examples/text_to_image/train_text_to_image.py`, on the pack's checkpointing: the
pipeline's VAE and text encoder stay frozen (in the `--mixed_precision` dtype), its UNet is trained with the noise
scheduler's objective (epsilon or v-prediction; `--snr_gamma` for Min-SNR weighting, `--noise_offset`), an optional
EMA of its weights is what gets saved, and the result is a `StableDiffusionPipeline` folder holding the base
pipeline's other components:

    accelerate launch training/train_text_to_image.py \\
      --pretrained_model_name_or_path stable-diffusion-v1-5/stable-diffusion-v1-5 \\
      --train_data_dir path/to/imagefolder --caption_column text --resolution 512 --center_crop --random_flip \\
      --train_batch_size 1 --gradient_accumulation_steps 4 --max_train_steps 15000 --learning_rate 1e-5 \\
      --use_ema --mixed_precision fp16 --output_dir sd-finetuned

    >>> from diffusers import StableDiffusionPipeline
    >>> pipe = StableDiffusionPipeline.from_pretrained("sd-finetuned", torch_dtype=torch.float16)

Data: a `datasets` image folder (`--train_data_dir`, with a `metadata.jsonl` holding each file's caption) or a
dataset by name (`--dataset_name`, a Hub id or a `datasets.load_dataset` path), with `--image_column` and
`--caption_column`; a caption cell may hold a list, of which one caption is drawn per step. Crops, flips and caption
choices are functions of (seed, step, process), like the batches, so `--resume_from_checkpoint latest` continues
exactly where the last checkpoint stopped. Training the pack's small mosaic model from scratch is
`training/train_text_to_image_from_scratch.py`.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_optimizer_arguments,
    add_validation_arguments,
    backward_and_step,
    check_validation_arguments,
    output_dir_arg,
)
from diffusers_ext.utils import positive_int_arg


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_name_or_path",
        required=True,
        help="A Stable Diffusion 1.x / 2.x pipeline: a Hub id or a local folder (unet, vae, text_encoder, tokenizer, "
        "scheduler).",
    )
    model.add_argument("--revision", default=None, help="Revision of the pretrained model on the Hub.")
    model.add_argument("--variant", default=None, help="Weight variant of the pretrained model, e.g. 'fp16'.")
    model.add_argument(
        "--prediction_type",
        default=None,
        choices=["epsilon", "v_prediction"],
        help="Train towards this target instead of the scheduler's own `prediction_type`.",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", default=None, help="A dataset by name (`datasets.load_dataset`).")
    data.add_argument("--dataset_config_name", default=None, help="The dataset's configuration, if it has several.")
    data.add_argument(
        "--train_data_dir", default=None, help="A `datasets` image folder with a metadata.jsonl of captions."
    )
    data.add_argument("--image_column", default="image", help="The dataset column holding the images.")
    data.add_argument("--caption_column", default="text", help="The dataset column holding the captions.")
    data.add_argument("--max_train_samples", type=positive_int_arg, default=None, help="Use only the first N rows.")
    data.add_argument("--resolution", type=positive_int_arg, default=512, help="Training resolution (square).")
    data.add_argument("--center_crop", action="store_true", help="Crop the centre (default: a random crop).")
    data.add_argument("--random_flip", action="store_true", help="Random horizontal flips.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of data order, augmentations and noise.")
    train.add_argument("--train_batch_size", type=positive_int_arg, default=16, help="Batch size per process.")
    train.add_argument("--max_train_steps", type=positive_int_arg, default=15000, help="Total optimizer steps.")
    train.add_argument(
        "--gradient_accumulation_steps", type=positive_int_arg, default=1, help="Micro-batches per optimizer step."
    )
    train.add_argument(
        "--gradient_checkpointing", action="store_true", help="Recompute the UNet's activations in the backward."
    )
    add_optimizer_arguments(train, learning_rate=1e-5, lr_scheduler="constant", lr_warmup_steps=0, weight_decay=1e-2)
    train.add_argument(
        "--snr_gamma",
        type=float,
        default=None,
        help="Min-SNR loss weighting with this gamma (5.0 is the paper's); off by default.",
    )
    train.add_argument("--noise_offset", type=float, default=0.0, help="Scale of the per-channel noise offset.")
    train.add_argument("--use_ema", action="store_true", help="Keep (and save) an exponential moving average.")
    train.add_argument("--ema_decay", type=float, default=0.9999, help="EMA decay.")
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=None)
    train.add_argument("--logging_steps", type=positive_int_arg, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "Images of the pipeline being trained (EMA weights with --use_ema) for --validation_prompt, logged to the "
        "tracker and saved under output_dir/validation/.",
    )
    add_validation_arguments(validation, "prompt")
    validation.add_argument(
        "--num_inference_steps", type=positive_int_arg, default=25, help="Denoising steps of the validation images."
    )
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser) -> None:
    """Refuse impossible settings before any model or data is loaded."""
    if (args.dataset_name is None) == (args.train_data_dir is None):
        parser.error("give exactly one of --dataset_name and --train_data_dir.")
    if args.train_data_dir is not None and not os.path.isdir(args.train_data_dir):
        parser.error(f"--train_data_dir {args.train_data_dir!r} is not a folder.")
    if os.path.exists(args.pretrained_model_name_or_path) and not os.path.isfile(
        os.path.join(args.pretrained_model_name_or_path, "model_index.json")
    ):
        parser.error(
            f"--pretrained_model_name_or_path {args.pretrained_model_name_or_path!r} is a local path without a "
            "model_index.json; expected a saved StableDiffusionPipeline folder."
        )
    if args.snr_gamma is not None and not args.snr_gamma > 0:
        parser.error(f"--snr_gamma must be > 0 (or left out), got {args.snr_gamma}.")
    if not args.noise_offset >= 0:
        parser.error(f"--noise_offset must be >= 0, got {args.noise_offset}.")
    if not 0 < args.ema_decay < 1:
        parser.error(f"--ema_decay must lie in (0, 1), got {args.ema_decay}.")
    check_validation_arguments(args, parser)


class CaptionedImages:
    """A dataset's rows as `(image (3, R, R) in [-1, 1], caption)`, with the crop, flip and caption choice drawn from
    the generator each row is given (so a resumed run redraws them exactly)."""

    def __init__(self, data, image_column: str, caption_column: str, resolution: int, center_crop: bool, flip: bool):
        for argument, column in (("--image_column", image_column), ("--caption_column", caption_column)):
            if column not in data.column_names:
                raise ValueError(f"{argument} {column!r} is not a column of the dataset; it has {data.column_names}.")
        if len(data) == 0:
            raise ValueError("the training dataset holds no rows.")
        for index, caption in enumerate(data[caption_column]):
            captions = caption if isinstance(caption, (list, tuple)) else [caption]
            if not captions or not all(isinstance(c, str) for c in captions):
                raise ValueError(
                    f"--caption_column {caption_column!r}: row {index} holds {caption!r}; expected a string or a "
                    "list of strings."
                )
        self.data, self.image_column, self.caption_column = data, image_column, caption_column
        self.resolution, self.center_crop, self.flip = resolution, center_crop, flip

    def __len__(self) -> int:
        return len(self.data)

    def item(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, str]:
        import numpy as np
        from PIL import Image

        row = self.data[int(index)]
        image = row[self.image_column].convert("RGB")
        scale = self.resolution / min(image.size)
        size = (max(self.resolution, round(image.size[0] * scale)), max(self.resolution, round(image.size[1] * scale)))
        image = image.resize(size, Image.BILINEAR)
        spare_x, spare_y = size[0] - self.resolution, size[1] - self.resolution
        if self.center_crop:
            left, top = spare_x // 2, spare_y // 2
        else:
            left = int(torch.randint(0, spare_x + 1, (1,), generator=generator))
            top = int(torch.randint(0, spare_y + 1, (1,), generator=generator))
        image = image.crop((left, top, left + self.resolution, top + self.resolution))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)
        if self.flip and bool(torch.rand((), generator=generator) < 0.5):
            pixels = pixels.flip(-1)
        captions = row[self.caption_column]
        if isinstance(captions, (list, tuple)):
            captions = captions[int(torch.randint(0, len(captions), (1,), generator=generator))]
        return pixels, captions


def load_training_data(args):
    """The rows to train on: the image folder or the named dataset (train split), cut to --max_train_samples."""
    from datasets import load_dataset

    if args.train_data_dir is not None:
        data = load_dataset("imagefolder", data_dir=args.train_data_dir, split="train")
    else:
        data = load_dataset(args.dataset_name, args.dataset_config_name, split="train")
    if args.max_train_samples is not None:
        data = data.select(range(min(args.max_train_samples, len(data))))
    return CaptionedImages(
        data, args.image_column, args.caption_column, args.resolution, args.center_crop, args.random_flip
    )


def load_components(args, weight_dtype: torch.dtype):
    """`(tokenizer, text_encoder, vae, unet, noise_scheduler)` of the pretrained pipeline: the text encoder and VAE
    frozen in `weight_dtype`, the UNet trainable in float32 (the optimizer's master weights)."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    source = {"revision": args.revision}
    path = args.pretrained_model_name_or_path
    tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", **source)
    text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", variant=args.variant, **source)
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae", variant=args.variant, **source)
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", variant=args.variant, **source)
    noise_scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler", **source)
    if unet.config.get("addition_embed_type") is not None:
        raise ValueError(
            f"--pretrained_model_name_or_path {path!r} is an SDXL-style pipeline (its UNet has "
            f"`addition_embed_type={unet.config.addition_embed_type!r}`); this script fine-tunes SD 1.x / 2.x UNets."
        )
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    if args.resolution % factor:
        raise ValueError(
            f"--resolution must be a multiple of {factor} (the VAE's downsampling factor), got {args.resolution}."
        )
    for frozen in (text_encoder, vae):
        frozen.requires_grad_(False)
        frozen.to(dtype=weight_dtype)
    unet.to(dtype=torch.float32)
    return tokenizer, text_encoder, vae, unet, noise_scheduler


def min_snr_weights(noise_scheduler, timesteps: torch.Tensor, gamma: float) -> torch.Tensor:
    """Min-SNR-gamma loss weights `(B,)`: `min(SNR(t), gamma) / SNR(t)` for epsilon targets and
    `min(SNR(t), gamma) / (SNR(t) + 1)` for v targets (Hang et al., 2023)."""
    from diffusers.training_utils import compute_snr

    snr = compute_snr(noise_scheduler, timesteps)
    clipped = torch.minimum(snr, torch.full_like(snr, gamma))
    if noise_scheduler.config.prediction_type == "v_prediction":
        return clipped / (snr + 1)
    return clipped / snr


def main(argv=None):
    args = parse_args(argv)
    from accelerate.utils import DistributedType
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.training_utils import EMAModel

    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        build_optimizer,
        command_line,
        gathered_model,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        run_validation,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    if args.use_ema and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            f"--use_ema with {accelerator.distributed_type.value}: the EMA would track one process's shard of the "
            "UNet; train without --use_ema, or with data-parallel processes (DDP)."
        )
    weight_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision, torch.float32)
    dataset = load_training_data(args)
    tokenizer, text_encoder, vae, unet, noise_scheduler = load_components(args, weight_dtype)
    if args.prediction_type is not None:
        noise_scheduler.register_to_config(prediction_type=args.prediction_type)
    if args.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    text_encoder.to(accelerator.device)
    vae.to(accelerator.device)

    optimizer, lr_scheduler = build_optimizer(unet.parameters(), args, accelerator.num_processes)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    ema = None
    if args.use_ema:  # built after `prepare`, from the weights the processes train
        trained = accelerator.unwrap_model(unet)
        ema = EMAModel(
            trained.parameters(), decay=args.ema_decay, model_cls=UNet2DConditionModel, model_config=trained.config
        )
        ema.to(accelerator.device)
        accelerator.register_for_checkpointing(ema)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)

    # Batches, augmentations and noise are functions of (seed, step, process): a resumed run replays the original.
    sampler = ResumableBatchSampler(
        len(dataset),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    batches = iter(sampler)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_text_to_image", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(dataset)} images, batch {total_batch}, {args.max_train_steps} steps, from step {global_step}")

    def pipeline_of(model) -> StableDiffusionPipeline:
        pipe = StableDiffusionPipeline.from_pretrained(
            args.pretrained_model_name_or_path,
            unet=model,
            text_encoder=text_encoder,
            vae=vae,
            tokenizer=tokenizer,
            revision=args.revision,
            variant=args.variant,
            safety_checker=None,
            requires_safety_checker=False,
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def validate(model, step: int) -> None:
        def sample(prompts, generator):
            return pipeline_of(model)(
                prompts,
                num_inference_steps=args.num_inference_steps,
                height=args.resolution,
                width=args.resolution,
                generator=generator,
                output_type="pt",
            ).images

        run_validation(accelerator, args, step, sample, args.validation_prompt, modules=(model,), logger=logger)

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    unet.train()
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            rows = [dataset.item(index, generator) for index in next(batches)]
            pixels = torch.stack([pixel for pixel, _ in rows]).to(accelerator.device, dtype=weight_dtype)
            input_ids = tokenizer(
                [caption for _, caption in rows],
                padding="max_length",
                max_length=tokenizer.model_max_length,
                truncation=True,
                return_tensors="pt",
            ).input_ids.to(accelerator.device)
            with torch.no_grad():
                latents = vae.encode(pixels).latent_dist.sample(generator=generator)
                latents = latents.float() * vae.config.scaling_factor
                encoder_hidden_states = text_encoder(input_ids, return_dict=False)[0]
            noise = torch.randn(latents.shape, generator=generator).to(latents.device)
            if args.noise_offset:
                offset = torch.randn((latents.shape[0], latents.shape[1], 1, 1), generator=generator)
                noise = noise + args.noise_offset * offset.to(latents.device)
            timesteps = torch.randint(
                0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],), generator=generator
            ).to(latents.device)
            noisy = noise_scheduler.add_noise(latents, noise, timesteps)
            if noise_scheduler.config.prediction_type == "epsilon":
                target = noise
            else:
                target = noise_scheduler.get_velocity(latents, noise, timesteps)
            with accelerator.accumulate(unet):
                with accelerator.autocast():
                    prediction = unet(noisy, timesteps, encoder_hidden_states, return_dict=False)[0]
                if args.snr_gamma is None:
                    loss = F.mse_loss(prediction.float(), target.float())
                else:
                    per_sample = F.mse_loss(prediction.float(), target.float(), reduction="none").mean(dim=(1, 2, 3))
                    loss = (per_sample * min_snr_weights(noise_scheduler, timesteps, args.snr_gamma)).mean()
                backward_and_step(accelerator, loss, unet.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps

        global_step += 1
        progress.update(1)
        if ema is not None:
            ema.step(accelerator.unwrap_model(unet).parameters())
        logs = {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}
        progress.set_postfix(**logs)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            # every process takes part (a sharded run gathers here); the EMA weights, as the saved pipeline holds them
            model = gathered_model(accelerator, unet, ema)
            if accelerator.is_main_process:
                validate(model, global_step)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, unet, ema)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = pipeline_of(final)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            validate(final, global_step)
        data = args.train_data_dir or args.dataset_name
        write_model_card(
            args.output_dir,
            title="Stable Diffusion fine-tuned on captioned images",
            description=(
                f"`{args.pretrained_model_name_or_path}` with its UNet fine-tuned by `training/train_text_to_image.py` "
                f"on {data} ({len(dataset)} images at {args.resolution}x{args.resolution}), {args.max_train_steps} "
                f"steps of batch {total_batch} at learning rate {args.learning_rate}"
                + (", EMA weights" if ema is not None else "")
                + "; the VAE, text encoder and tokenizer are the base model's."
            ),
            command=command_line(),
            tags=["stable-diffusion", "text-to-image", "diffusers-training"],
            base_model=args.pretrained_model_name_or_path,
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
