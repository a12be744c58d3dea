#!/usr/bin/env python
"""Train a small latent text-to-image model (Stable Diffusion format) from scratch on mosaic scenes, with accelerate.

Two phases in one run, one global step counter: an `AutoencoderKL` (`--vae_steps`), then a `UNet2DConditionModel`
together with a small `CLIPTextModel` (`--max_train_steps`, epsilon prediction, captions dropped with probability
`--prompt_dropout` for classifier-free guidance). The tokenizer is the word-level
`diffusers_ext.data.mosaic.mosaic_tokenizer`. The result is a `diffusers.StableDiffusionPipeline` folder:

    accelerate launch training/train_text_to_image_from_scratch.py --output_dir mosaic-t2i --num_train_samples 20000

    >>> from diffusers import StableDiffusionPipeline
    >>> pipe = StableDiffusionPipeline.from_pretrained("mosaic-t2i", dtype=torch.float32)
    >>> pipe("a red circle to the left of a blue square", height=32, width=32).images[0]

Data: a mosaic dataset drawn on the fly from the `--mosaic_*`/`--num_train_samples` options (train split), or any
`datasets.save_to_disk` folder with `image` and `caption` columns (`--train_data_dir`; the tokenizer only knows
mosaic's words). Checkpoints are `output_dir/checkpoint-<step>`; `--resume_from_checkpoint latest` continues
exactly where the last one stopped, in either phase. `--pretrained_model_name_or_path` continues training a pipeline
this script made (a warm start, e.g. the zoo's `mosaic-t2i-64` for more steps): its autoencoder, text encoder and
UNet are loaded, the autoencoder phase is skipped (the UNet was trained on its latents), and the model options are
taken from the folder. With `--eval_num_prompts` > 0 the model card reports the
`diffusers_ext.evaluation.mosaic` judge's per-skill accuracy on held-out test prompts.
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.data.mosaic import (
    add_mosaic_data_arguments,
    check_mosaic_data_arguments,
    load_text_image_data,
    mosaic_config_from_args,
)
from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_validation_arguments,
    backward_and_step,
    check_unsharded,
    check_validation_arguments,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_mosaic_data_arguments(parser.add_argument_group("data"))
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_name_or_path",
        default=None,
        help="A StableDiffusionPipeline folder made by this script to continue training (warm start): the VAE phase"
        " is skipped and the model options below are ignored.",
    )
    model.add_argument(
        "--vae_channels",
        type=int,
        nargs="+",
        default=[16, 32, 32],
        help="AutoencoderKL channels per level (3 levels: 4x downsampling).",
    )
    model.add_argument("--latent_channels", type=int, default=4, help="Latent channels.")
    model.add_argument("--unet_channels", type=int, nargs="+", default=[32, 64], help="UNet channels per level.")
    model.add_argument(
        "--unet_down_block_types",
        nargs="+",
        default=None,
        choices=["CrossAttnDownBlock2D", "DownBlock2D"],
        help="UNet down_block_types, one per level (the up path mirrors it). Default: cross-attention everywhere.",
    )
    model.add_argument("--attention_head_dim", type=int, default=8, help="UNet attention head width.")
    model.add_argument("--text_hidden_size", type=int, default=64, help="CLIP text encoder width.")
    model.add_argument("--text_layers", type=int, default=2, help="CLIP text encoder layers.")
    model.add_argument("--max_length", type=int, default=16, help="Tokens per prompt (with start/end tokens).")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and noise.")
    train.add_argument(
        "--vae_steps",
        type=int,
        default=None,
        help="Optimizer steps of the autoencoder (phase 1); default 1500, and 0 with --pretrained_model_name_or_path.",
    )
    train.add_argument("--vae_learning_rate", type=float, default=2e-3, help="Peak learning rate of phase 1.")
    train.add_argument("--vae_kl_weight", type=float, default=1e-6, help="Weight of the autoencoder's KL term.")
    train.add_argument("--max_train_steps", type=int, default=2500, help="Optimizer steps of the UNet (phase 2).")
    train.add_argument("--learning_rate", type=float, default=1e-3, help="Peak learning rate of phase 2.")
    train.add_argument("--lr_warmup_steps", type=int, default=100, help="Linear warm-up of each phase.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Batch size per process.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per step.")
    train.add_argument("--prompt_dropout", type=float, default=0.1, help="Share of empty prompts (for guidance).")
    train.add_argument("--adam_weight_decay", type=float, default=1e-4, help="AdamW weight decay.")
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="Gradient clipping norm.")
    train.add_argument(
        "--save_dtype",
        choices=["float32", "float16"],
        default="float32",
        help="dtype of the saved weights (float16 halves the folder; load with dtype=float32).",
    )
    train.add_argument("--eval_num_prompts", type=int, default=0, help="Test prompts judged for the model card.")
    train.add_argument("--eval_guidance_scale", type=float, default=3.0, help="Guidance of the evaluation.")
    train.add_argument(
        "--eval_inference_steps",
        "--eval_steps",
        type=int,
        default=25,
        help="DDIM steps of the evaluation and of validation. --eval_steps: the earlier name.",
    )
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    add_validation_arguments(train, "prompt")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    check_mosaic_data_arguments(args, parser)
    if len(args.vae_channels) != 3:
        parser.error(f"--vae_channels needs 3 levels (4x downsampling), got {args.vae_channels}.")
    if args.resolution < 16 or args.resolution % 4:
        parser.error(f"--resolution must be a multiple of 4 and >= 16, got {args.resolution}.")
    factor = 2 ** (len(args.unet_channels) - 1)
    if (args.resolution // 4) % factor:
        parser.error(
            f"--unet_channels has {len(args.unet_channels)} levels; the latent side {args.resolution // 4} must be "
            f"a multiple of {factor}."
        )
    if args.unet_down_block_types is not None and len(args.unet_down_block_types) != len(args.unet_channels):
        parser.error(
            f"--unet_down_block_types names {len(args.unet_down_block_types)} blocks; --unet_channels has "
            f"{len(args.unet_channels)} levels."
        )
    for name in (
        "max_train_steps",
        "train_batch_size",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.pretrained_model_name_or_path is not None:
        _check_pretrained(args, parser)
    elif args.vae_steps is None:
        args.vae_steps = 1500
    if args.vae_steps < 0 or args.eval_num_prompts < 0:
        parser.error("--vae_steps and --eval_num_prompts must be >= 0.")
    if not 0 <= args.prompt_dropout < 1:
        parser.error(f"--prompt_dropout must lie in [0, 1), got {args.prompt_dropout}.")
    if args.max_length < 3:
        parser.error(f"--max_length must be >= 3, got {args.max_length}.")
    check_validation_arguments(args, parser)


def _check_pretrained(args, parser) -> None:
    """A warm start loads a pipeline folder of this script's kind; its autoencoder stays as it is."""
    import os

    path = args.pretrained_model_name_or_path
    missing = [sub for sub in ("vae", "unet", "text_encoder") if not os.path.isdir(os.path.join(path, sub))]
    if missing:
        parser.error(
            f"--pretrained_model_name_or_path {path!r} must be a StableDiffusionPipeline folder with vae, unet and "
            f"text_encoder subfolders; missing {missing}."
        )
    if args.vae_steps not in (None, 0):
        parser.error(
            f"--vae_steps must be 0 with --pretrained_model_name_or_path (the UNet was trained on that autoencoder's "
            f"latents), got {args.vae_steps}."
        )
    args.vae_steps = 0
    with open(os.path.join(path, "text_encoder", "config.json")) as f:
        positions = json.load(f)["max_position_embeddings"]
    if positions != args.max_length:
        parser.error(f"--max_length must be the pretrained text encoder's {positions}, got {args.max_length}.")


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.data.mosaic import mosaic_tokenizer
    from diffusers_ext.evaluation.mosaic import evaluate_text_to_image
    from diffusers_ext.models.stable_diffusion_components import (
        assemble_stable_diffusion_pipeline,
        build_stable_diffusion_components,
        load_stable_diffusion_components,
        stable_diffusion_schedulers,
    )
    from diffusers_ext.models.training_modules import AutoencoderStep, TextConditionedDenoiser
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        command_line,
        cosine_with_warmup,
        encode_posteriors,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        start_run,
        step_generator,
        tokenize_captions,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    check_unsharded(
        accelerator,
        "train_text_to_image_from_scratch.py",
        "it trains the VAE, and the UNet with its text encoder, through wrapper modules and saves the parts",
    )

    images, captions = load_text_image_data(args)
    tokenizer = mosaic_tokenizer(args.max_length)
    token_ids, empty_ids = tokenize_captions(tokenizer, captions, args.max_length)

    torch.manual_seed(args.seed)
    if args.pretrained_model_name_or_path is not None:
        vae, text_encoder, unet = load_stable_diffusion_components(args.pretrained_model_name_or_path)
    else:
        vae, text_encoder, unet = build_stable_diffusion_components(
            tokenizer,
            resolution=args.resolution,
            latent_channels=args.latent_channels,
            vae_channels=args.vae_channels,
            unet_channels=args.unet_channels,
            unet_down_block_types=args.unet_down_block_types,
            attention_head_dim=args.attention_head_dim,
            text_hidden_size=args.text_hidden_size,
            text_layers=args.text_layers,
            max_length=args.max_length,
        )
    noise_scheduler, _ = stable_diffusion_schedulers()
    vae_optimizer = torch.optim.AdamW(vae.parameters(), lr=args.vae_learning_rate, weight_decay=0.0)
    unet_optimizer = torch.optim.AdamW(
        [*unet.parameters(), *text_encoder.parameters()], lr=args.learning_rate, weight_decay=args.adam_weight_decay
    )
    autoencoder_step, denoiser, vae_optimizer, unet_optimizer = accelerator.prepare(
        AutoencoderStep(vae), TextConditionedDenoiser(unet, text_encoder), vae_optimizer, unet_optimizer
    )
    vae = vae.to(accelerator.device)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    total_steps = args.vae_steps + args.max_train_steps

    sampler = ResumableBatchSampler(
        len(images),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    batches = iter(sampler)
    if accelerator.is_main_process:
        accelerator.init_trackers(
            "train_text_to_image_from_scratch", config={k: str(v) for k, v in vars(args).items()}
        )
    logger.info(f"{len(images)} images, {args.vae_steps} VAE + {args.max_train_steps} UNet steps, from {global_step}")

    def latent_scaling(means: torch.Tensor) -> float:
        if args.pretrained_model_name_or_path is not None:
            return float(vae.config.scaling_factor)  # the latent scale the pretrained UNet learned
        return float(1.0 / means.std())

    latent_stats = None  # (means, stds, scaling_factor), once phase 1 is over
    latent_size = (args.resolution // 4, args.resolution // 4)
    progress = tqdm(range(total_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    while global_step < total_steps:
        in_vae_phase = global_step < args.vae_steps
        if not in_vae_phase and latent_stats is None:
            vae.eval()
            means, stds = encode_posteriors(vae, images, accelerator.device)
            scaling = latent_scaling(means)
            latent_stats = (means, stds, scaling)
            logger.info(f"latents {tuple(means.shape[1:])}, scaling factor {scaling:.4f}")
        if in_vae_phase:
            cosine_with_warmup(
                vae_optimizer, global_step, args.vae_steps, args.vae_learning_rate, args.lr_warmup_steps
            )
        else:
            phase_step = global_step - args.vae_steps
            cosine_with_warmup(
                unet_optimizer, phase_step, args.max_train_steps, args.learning_rate, args.lr_warmup_steps
            )
        logs = {}
        for micro in range(args.gradient_accumulation_steps):
            index = torch.tensor(next(batches))
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            if in_vae_phase:
                x = images[index].float().to(accelerator.device) / 127.5 - 1
                eps = torch.randn((len(index), args.latent_channels, *latent_size), generator=generator)
                with accelerator.accumulate(autoencoder_step), accelerator.autocast():
                    reconstruction, kl = autoencoder_step(x, eps.to(accelerator.device))
                    kl = kl.mean() / eps[0].numel()
                    loss = F.mse_loss(reconstruction.float(), x) + args.vae_kl_weight * kl
                    backward_and_step(
                        accelerator, loss, autoencoder_step.parameters(), vae_optimizer, None, args.max_grad_norm
                    )
                logs["vae_loss"] = logs.get("vae_loss", 0.0) + loss.item() / args.gradient_accumulation_steps
            else:
                means, stds, scaling = latent_stats
                eps = torch.randn(means[index].shape, generator=generator)
                latents = ((means[index] + stds[index] * eps) * scaling).to(accelerator.device)
                noise = torch.randn(latents.shape, generator=generator).to(accelerator.device)
                timesteps = torch.randint(
                    0, noise_scheduler.config.num_train_timesteps, (len(index),), generator=generator
                ).to(accelerator.device)
                drop = torch.rand(len(index), generator=generator) < args.prompt_dropout
                ids = torch.where(drop[:, None], empty_ids, token_ids[index]).to(accelerator.device)
                noisy = noise_scheduler.add_noise(latents, noise, timesteps)
                with accelerator.accumulate(denoiser), accelerator.autocast():
                    prediction = denoiser(noisy, timesteps, ids)
                    loss = F.mse_loss(prediction.float(), noise)
                    backward_and_step(
                        accelerator, loss, denoiser.parameters(), unet_optimizer, None, args.max_grad_norm
                    )
                logs["loss"] = logs.get("loss", 0.0) + loss.item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        progress.set_postfix(**logs)
        if global_step % args.logging_steps == 0 or global_step == total_steps:
            accelerator.log(logs, step=global_step)
            logger.info(f"step {global_step}: " + ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        if global_step % args.checkpointing_steps == 0 or global_step == total_steps:
            path = save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)
            logger.info(f"Saved {path}")
        if not in_vae_phase and global_step < total_steps and validation_due(args, global_step):
            if accelerator.is_main_process:
                vae.register_to_config(scaling_factor=latent_stats[2])
                pipe = assemble_stable_diffusion_pipeline(vae, text_encoder, tokenizer, unet)
                run_validation(pipe, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        vae.eval()
        if latent_stats is None:  # the UNet phase did not run in this invocation (resumed at the last step)
            means, _ = encode_posteriors(vae, images, accelerator.device)
            latent_stats = (means, None, latent_scaling(means))
        vae.register_to_config(scaling_factor=latent_stats[2])
        pipe = assemble_stable_diffusion_pipeline(vae, text_encoder.eval(), tokenizer, unet.eval())
        pipe.set_progress_bar_config(disable=True)
        if validation_due(args, global_step, final=True):
            run_validation(pipe, args, accelerator, global_step)
        metrics = {}
        if args.eval_num_prompts:
            summary = evaluate_text_to_image(
                pipe,
                mosaic_config_from_args(args),
                args.eval_num_prompts,
                args.mosaic_seed + 1,
                args.eval_guidance_scale,
                args.eval_inference_steps,
            )
            metrics = {f"judge_{k}": v for k, v in summary.items() if isinstance(v, float)}
            logger.info(f"evaluation: {json.dumps(summary)}")
        if args.save_dtype == "float16":
            pipe.to(torch.float16)
        pipe.save_pretrained(args.output_dir)
        write_card(args, pipe, metrics, command_line(), write_model_card)
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


def run_validation(pipe, args, accelerator, step: int) -> None:
    """`--num_validation_images` images per `--validation_prompt` from `pipe` (the pipeline the script saves, DDIM
    `--eval_inference_steps`, guidance `--eval_guidance_scale`, seeded with `--seed`), saved under
    `output_dir/validation/step-<step>/` and logged to the trackers. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    pipe.set_progress_bar_config(disable=True)

    def sample(prompts, generator):
        return pipe(
            prompts,
            height=args.resolution,
            width=args.resolution,
            num_inference_steps=args.eval_inference_steps,
            guidance_scale=args.eval_guidance_scale,
            generator=generator,
            output_type="pt",
        ).images

    validate(accelerator, args, step, sample, args.validation_prompt, [pipe.unet, pipe.text_encoder, pipe.vae], logger)


def write_card(args, pipe, metrics, command, write_model_card):
    parameters = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in ("vae", "unet")}
    parameters["text_encoder"] = sum(p.numel() for p in pipe.text_encoder.parameters())
    data = (
        f"`{args.train_data_dir}`"
        if args.train_data_dir
        else f"{args.num_train_samples} mosaic scenes (`diffusers_ext.data.mosaic`, train split, seed "
        f"{args.mosaic_seed}, tasks {', '.join(args.mosaic_tasks)}, counts up to {args.mosaic_max_count}, "
        f"{args.mosaic_extra_objects} extra objects, Zipf exponent {args.mosaic_zipf_exponent}, held-out fraction "
        f"{args.mosaic_heldout_fraction})"
    )
    evaluation = ""
    if metrics:
        evaluation = (
            f"\n\nMeasured with the `diffusers_ext.evaluation.mosaic` judge on {args.eval_num_prompts} test prompts "
            f"(mosaic seed {args.mosaic_seed + 1}), {args.eval_inference_steps} DDIM steps, guidance scale "
            f"{args.eval_guidance_scale}: the share of prompts whose every skill holds (`judge_overall`) and per skill."
        )
    dtype_note = (
        " Weights are stored in float16 to keep the folder small: load with `dtype=torch.float32`."
        if args.save_dtype == "float16"
        else ""
    )
    text_layers = pipe.text_encoder.config.num_hidden_layers
    latent_side, latent_channels = args.resolution // 4, pipe.vae.config.latent_channels
    if args.pretrained_model_name_or_path is None:
        origin = "trained from scratch by `training/train_text_to_image_from_scratch.py`"
        autoencoder_steps = f", {args.vae_steps} steps"
    else:
        origin = (
            f"continued from `{args.pretrained_model_name_or_path}` (its autoencoder kept as it was) by "
            "`training/train_text_to_image_from_scratch.py`"
        )
        autoencoder_steps = ", kept from the pretrained pipeline"
    write_model_card(
        args.output_dir,
        title="Small latent text-to-image model of mosaic scenes",
        description=(
            f"A `diffusers.StableDiffusionPipeline` {origin} on "
            f"{data} at {args.resolution}x{args.resolution}: an `AutoencoderKL` ({parameters['vae']:,} parameters, "
            f"{args.resolution}x{args.resolution}x3 -> {latent_side}x{latent_side}x"
            f"{latent_channels}{autoencoder_steps}), then a `UNet2DConditionModel` ({parameters['unet']:,} "
            f"parameters) and a `CLIPTextModel` ({parameters['text_encoder']:,} parameters, {text_layers} "
            f"layers, {args.max_length} tokens) trained together for {args.max_train_steps} steps of batch "
            f"{args.train_batch_size} with {args.prompt_dropout:.0%} empty prompts for guidance. The tokenizer is the "
            "word-level `mosaic_tokenizer`. Sample with `height=width="
            + str(args.resolution)
            + "`."
            + dtype_note
            + evaluation
        ),
        command=command,
        metrics=metrics,
        tags=["text-to-image", "stable-diffusion", "mosaic"],
    )


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_text_to_image_from_scratch.py: error: {error}", file=sys.stderr)
        sys.exit(2)
