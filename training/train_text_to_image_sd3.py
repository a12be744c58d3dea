#!/usr/bin/env python
"""Train a small `StableDiffusion3Pipeline` (rectified flow) from scratch on mosaic scenes, with accelerate.

The flow-matching twin of `training/train_text_to_image_from_scratch.py`: the same world and data options, and the autoencoder of
a model that script trained (`--pretrained_vae_model_name_or_path`, a pipeline folder or an `AutoencoderKL` folder),
so that both models share one latent space and one autoencoder is trained. Its latents get SD3's shift and scaling
factors (their mean and 1 / std over the training images). The three text encoders of SD3 (two
`CLIPTextModelWithProjection`, one `T5EncoderModel`, built by
`diffusers_ext.models.stable_diffusion_components.build_stable_diffusion_3_components`) read the word-level
`mosaic_tokenizer` and stay frozen at their seeded initialisation: SD3's joint blocks process the text tokens
themselves, so the encoders only have to give every word and position a distinct embedding, and each distinct
caption is encoded once before training. An `SD3Transformer2DModel` is trained with SD3's objective (the velocity
`noise - x0` at a logit-normal `sigma`, timestep `1000 sigma`), `--prompt_dropout` empty prompts for guidance.

    python training/train_text_to_image_from_scratch.py --output_dir mosaic-t2i-64 --resolution 64 ...
    accelerate launch training/train_text_to_image_sd3.py --output_dir mosaic-sd3-64 --resolution 64 \\
        --pretrained_vae_model_name_or_path mosaic-t2i-64

    >>> from diffusers import StableDiffusion3Pipeline
    >>> pipe = StableDiffusion3Pipeline.from_pretrained("mosaic-sd3-64", dtype=torch.float32)
    >>> pipe("a red circle to the left of a blue square", height=64, width=64, max_sequence_length=8).images[0]

Call the result with the `max_sequence_length` it was trained with (`--max_sequence_length`, the T5 tokens).
Checkpoints are `output_dir/checkpoint-<step>`; `--resume_from_checkpoint latest` continues exactly where the last one
stopped. `--pretrained_model_name_or_path` continues training a pipeline this script made (a warm start, e.g. the
zoo's `mosaic-sd3-64` for more steps): its autoencoder (with the shift and scaling factors the transformer learned),
text encoders and transformer are loaded, and the model options are taken from the folder. With `--eval_num_prompts`
> 0 the model card reports the `diffusers_ext.evaluation.mosaic` judge's per-skill accuracy on held-out test prompts.
"""

import argparse
import json
import os
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
    check_validation_arguments,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_mosaic_data_arguments(parser.add_argument_group("data"))
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_vae_model_name_or_path",
        type=str,
        default=None,
        help="The AutoencoderKL of a training from scratch: a pipeline folder (its vae/ subfolder is read) or an "
        "AutoencoderKL folder.",
    )
    model.add_argument(
        "--pretrained_model_name_or_path",
        type=str,
        default=None,
        help="A StableDiffusion3Pipeline folder made by this script to continue training (warm start), instead of "
        "--pretrained_vae_model_name_or_path; the model options below are then ignored.",
    )
    model.add_argument("--num_layers", type=int, default=4, help="Joint transformer blocks.")
    model.add_argument("--attention_head_dim", type=int, default=32, help="Width of one attention head.")
    model.add_argument("--num_attention_heads", type=int, default=4, help="Attention heads.")
    model.add_argument("--patch_size", type=int, default=2, help="Latent patch side of the transformer.")
    model.add_argument("--text_hidden_size", type=int, default=64, help="Width of each CLIP encoder (T5: twice).")
    model.add_argument("--text_layers", type=int, default=2, help="Layers of each text encoder.")
    model.add_argument("--max_length", type=int, default=16, help="CLIP tokens per prompt (with start/end tokens).")
    model.add_argument("--max_sequence_length", type=int, default=8, help="T5 tokens per prompt.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and noise.")
    train.add_argument("--max_train_steps", type=int, default=5000, help="Optimizer steps of the transformer.")
    train.add_argument("--learning_rate", type=float, default=1e-3, help="Peak learning rate (cosine decay).")
    train.add_argument("--lr_warmup_steps", type=int, default=100, help="Linear warm-up steps.")
    train.add_argument("--train_batch_size", type=int, default=32, help="Batch size per process.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per step.")
    train.add_argument("--prompt_dropout", type=float, default=0.1, help="Share of empty prompts (for guidance).")
    train.add_argument("--adam_weight_decay", type=float, default=1e-4, help="AdamW weight decay.")
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="Gradient clipping norm.")
    train.add_argument(
        "--save_dtype",
        type=str,
        default="float32",
        choices=["float32", "float16"],
        help="dtype of the saved weights (float16 halves the folder; load with dtype=float32).",
    )
    train.add_argument("--eval_num_prompts", type=int, default=0, help="Test prompts judged for the model card.")
    train.add_argument("--eval_guidance_scale", type=float, default=3.0, help="Guidance of the evaluation.")
    train.add_argument(
        "--eval_inference_steps", type=int, default=20, help="Euler steps of the evaluation and of validation."
    )
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    add_accelerate_arguments(train, checkpointing_steps=250)
    add_validation_arguments(train, "prompt")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    check_mosaic_data_arguments(args, parser)
    if args.resolution < 16 or args.resolution % 4:
        parser.error(f"--resolution must be a multiple of 4 and >= 16, got {args.resolution}.")
    for name in (
        "max_train_steps",
        "train_batch_size",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "eval_inference_steps",
        "logging_steps",
        "num_layers",
        "patch_size",
        "max_sequence_length",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.eval_num_prompts < 0:
        parser.error(f"--eval_num_prompts must be >= 0, got {args.eval_num_prompts}.")
    if not 0 <= args.prompt_dropout < 1:
        parser.error(f"--prompt_dropout must lie in [0, 1), got {args.prompt_dropout}.")
    if args.max_length < 3:
        parser.error(f"--max_length must be >= 3, got {args.max_length}.")
    if args.text_hidden_size % 4:
        parser.error(f"--text_hidden_size must be a multiple of 4 (4 attention heads), got {args.text_hidden_size}.")
    if (args.pretrained_vae_model_name_or_path is None) == (args.pretrained_model_name_or_path is None):
        parser.error(
            "Give exactly one of --pretrained_vae_model_name_or_path (train from scratch on that autoencoder) and "
            "--pretrained_model_name_or_path (continue a pipeline this script made); got "
            f"{args.pretrained_vae_model_name_or_path!r} and {args.pretrained_model_name_or_path!r}."
        )
    if args.pretrained_model_name_or_path is not None:
        _check_pretrained(args, parser)
    else:
        _check_vae_folder(args.pretrained_vae_model_name_or_path, parser)
    check_validation_arguments(args, parser)


def _check_vae_folder(path: str, parser) -> None:
    """--pretrained_vae_model_name_or_path is an `AutoencoderKL` folder, or a pipeline folder whose vae/ is one (a
    UNet or any other folder fails here, by name, not inside `from_pretrained`)."""
    from diffusers_ext.utils import check_saved_folder, saved_folder_class

    flag = "--pretrained_vae_model_name_or_path"
    try:
        if saved_folder_class(path) is not None and saved_folder_class(path)[0] == "pipeline":
            if not os.path.isdir(os.path.join(path, "vae")):
                raise ValueError(f"{flag} {path!r} is a pipeline folder without a vae/ subfolder.")
            check_saved_folder(f"{flag}'s vae/ subfolder", os.path.join(path, "vae"), "model", ("AutoencoderKL",))
        else:
            check_saved_folder(flag, path, "model", ("AutoencoderKL",), "a pipeline folder with a vae/ subfolder")
    except ValueError as error:
        parser.error(str(error))


def _check_pretrained(args, parser) -> None:
    """A warm start loads a pipeline folder of this script's kind, read by the same tokenizer length."""
    path = args.pretrained_model_name_or_path
    parts = ("vae", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3")
    missing = [sub for sub in parts if not os.path.isdir(os.path.join(path, sub))]
    if missing:
        parser.error(
            f"--pretrained_model_name_or_path {path!r} must be a StableDiffusion3Pipeline folder with "
            f"{', '.join(parts)} subfolders; missing {missing}."
        )
    with open(os.path.join(path, "text_encoder", "config.json")) as f:
        positions = json.load(f)["max_position_embeddings"]
    if positions != args.max_length:
        parser.error(f"--max_length must be the pretrained text encoders' {positions}, got {args.max_length}.")


def load_vae(path: str):
    """The `AutoencoderKL` of `path`: its `vae/` subfolder when it holds one (a pipeline folder), else `path`."""
    from diffusers import AutoencoderKL

    subfolder = "vae" if os.path.isfile(os.path.join(path, "vae", "config.json")) else None
    return AutoencoderKL.from_pretrained(path, subfolder=subfolder, dtype=torch.float32)


def encode_captions(pipe, captions: list[str], max_sequence_length: int, batch_size: int = 256):
    """`(prompt_embeds (U + 1, L, D), pooled (U + 1, P), index (N,))`: the frozen encoders' embeddings of the `U`
    distinct captions and, last, of the empty prompt; `index[i]` is caption `i`'s row."""
    distinct = sorted(set(captions))
    row = {caption: i for i, caption in enumerate(distinct)}
    prompts = [*distinct, ""]
    embeds, pooled = [], []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            e, _, p, _ = pipe.encode_prompt(
                chunk, chunk, chunk, do_classifier_free_guidance=False, max_sequence_length=max_sequence_length
            )
            embeds.append(e.float().cpu())
            pooled.append(p.float().cpu())
    return torch.cat(embeds), torch.cat(pooled), torch.tensor([row[c] for c in captions])


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.data.mosaic import mosaic_tokenizer
    from diffusers_ext.evaluation.mosaic import evaluate_text_to_image
    from diffusers_ext.models.stable_diffusion_components import (
        assemble_stable_diffusion_3_pipeline,
        build_stable_diffusion_3_components,
        load_stable_diffusion_3_components,
    )
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
    images, captions = load_text_image_data(args)
    tokenizer = mosaic_tokenizer(args.max_length)
    tokenize_captions(tokenizer, captions, args.max_length)  # vocabulary and length, before any expensive work

    if args.pretrained_model_name_or_path is not None:
        vae, text_encoder, text_encoder_2, text_encoder_3, transformer = load_stable_diffusion_3_components(
            args.pretrained_model_name_or_path
        )
    else:
        vae = load_vae(args.pretrained_vae_model_name_or_path)
    vae = vae.to(accelerator.device).eval().requires_grad_(False)
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    patch = args.patch_size if args.pretrained_model_name_or_path is None else transformer.config.patch_size
    if args.resolution % factor or (args.resolution // factor) % patch:
        raise ValueError(
            f"--resolution {args.resolution}: the autoencoder downsamples by {factor} and the transformer reads "
            f"patches of {patch}; the latent side must be a multiple of the patch."
        )
    if args.pretrained_model_name_or_path is not None and args.resolution // factor > transformer.config.sample_size:
        raise ValueError(
            f"--resolution {args.resolution}: the pretrained transformer's position embedding covers latents of side "
            f"{transformer.config.sample_size} (images of {transformer.config.sample_size * factor}) at most."
        )
    torch.manual_seed(args.seed)
    if args.pretrained_model_name_or_path is None:
        text_encoder, text_encoder_2, text_encoder_3, transformer = build_stable_diffusion_3_components(
            tokenizer,
            latent_channels=vae.config.latent_channels,
            sample_size=args.resolution // factor,
            patch_size=args.patch_size,
            num_layers=args.num_layers,
            attention_head_dim=args.attention_head_dim,
            num_attention_heads=args.num_attention_heads,
            text_hidden_size=args.text_hidden_size,
            text_layers=args.text_layers,
            max_length=args.max_length,
        )
    for encoder in (text_encoder, text_encoder_2, text_encoder_3):
        encoder.eval().requires_grad_(False)

    # Latent statistics and caption embeddings are functions of the frozen models and the data: recomputed on
    # resume, never checkpointed.
    means, stds = encode_posteriors(vae, images, accelerator.device)
    if args.pretrained_model_name_or_path is not None:  # the latent scale the pretrained transformer learned
        shift, scale = float(vae.config.shift_factor), float(vae.config.scaling_factor)
    else:
        shift, scale = float(means.mean()), float(1.0 / means.std())
        vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    pipe = assemble_stable_diffusion_3_pipeline(
        vae, text_encoder, text_encoder_2, text_encoder_3, tokenizer, transformer
    ).to(accelerator.device)
    pipe.set_progress_bar_config(disable=True)
    prompt_embeds, pooled, caption_rows = encode_captions(pipe, captions, args.max_sequence_length)
    empty_row = len(prompt_embeds) - 1
    logger.info(
        f"latents {tuple(means.shape[1:])}, shift {shift:.4f}, scaling {scale:.4f}; {empty_row} distinct captions"
    )

    optimizer = torch.optim.AdamW(transformer.parameters(), lr=args.learning_rate, weight_decay=args.adam_weight_decay)
    transformer, optimizer = accelerator.prepare(transformer, optimizer)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
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
        accelerator.init_trackers("train_text_to_image_sd3", config={k: str(v) for k, v in vars(args).items()})
    logger.info(f"{len(images)} images, {args.max_train_steps} transformer steps, from {global_step}")

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    transformer.train()
    while global_step < args.max_train_steps:
        cosine_with_warmup(optimizer, global_step, args.max_train_steps, args.learning_rate, args.lr_warmup_steps)
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            index = torch.tensor(next(batches))
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            eps = torch.randn(means[index].shape, generator=generator)
            x0 = (means[index] + stds[index] * eps - shift) * scale
            noise = torch.randn(x0.shape, generator=generator)
            sigma = torch.sigmoid(torch.randn(len(index), generator=generator))  # SD3's logit-normal sigma
            drop = torch.rand(len(index), generator=generator) < args.prompt_dropout
            rows = torch.where(drop, empty_row, caption_rows[index])
            noisy = (1 - sigma[:, None, None, None]) * x0 + sigma[:, None, None, None] * noise
            device = accelerator.device
            with accelerator.accumulate(transformer), accelerator.autocast():
                prediction = transformer(
                    hidden_states=noisy.to(device),
                    timestep=(sigma * 1000).to(device),
                    encoder_hidden_states=prompt_embeds[rows].to(device),
                    pooled_projections=pooled[rows].to(device),
                ).sample
                loss = F.mse_loss(prediction.float(), (noise - x0).to(device))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(transformer.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            loss_sum += loss.item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss_sum)
        if global_step % args.logging_steps == 0 or global_step == args.max_train_steps:
            accelerator.log({"loss": loss_sum}, step=global_step)
            logger.info(f"step {global_step}: loss {loss_sum:.4f}")
        if global_step % args.checkpointing_steps == 0 or global_step == args.max_train_steps:
            path = save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)
            logger.info(f"Saved {path}")
        if global_step < args.max_train_steps and validation_due(args, global_step):
            trained = gathered_model(accelerator, transformer)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                pipe.transformer = trained
                run_validation(pipe, args, accelerator, global_step)
                pipe.transformer = accelerator.unwrap_model(transformer)
    progress.close()

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, transformer)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipe.transformer = final
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
                pipeline_kwargs={"max_sequence_length": args.max_sequence_length},
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
    """`--num_validation_images` images per `--validation_prompt` from `pipe` (Euler `--eval_inference_steps`,
    guidance `--eval_guidance_scale`, seeded with `--seed`), saved under `output_dir/validation/step-<step>/` and
    logged to the trackers. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    def sample(prompts, generator):
        return pipe(
            prompts,
            height=args.resolution,
            width=args.resolution,
            num_inference_steps=args.eval_inference_steps,
            guidance_scale=args.eval_guidance_scale,
            max_sequence_length=args.max_sequence_length,
            generator=generator,
            output_type="pt",
        ).images

    validate(accelerator, args, step, sample, args.validation_prompt, [pipe.transformer], logger)


def write_card(args, pipe, metrics, command, write_model_card):
    parameters = sum(p.numel() for p in pipe.transformer.parameters())
    evaluation = ""
    if metrics:
        evaluation = (
            f"\n\nMeasured with the `diffusers_ext.evaluation.mosaic` judge on {args.eval_num_prompts} test prompts "
            f"(mosaic seed {args.mosaic_seed + 1}), {args.eval_inference_steps} Euler steps, guidance scale "
            f"{args.eval_guidance_scale}: the share of prompts whose every skill holds (`judge_overall`) and per skill."
        )
    data = (
        f"`{args.train_data_dir}`"
        if args.train_data_dir
        else f"{args.num_train_samples} mosaic scenes (`diffusers_ext.data.mosaic`, train split, seed "
        f"{args.mosaic_seed}, tasks {', '.join(args.mosaic_tasks)}, counts up to {args.mosaic_max_count})"
    )
    dtype_note = (
        " Weights are stored in float16 to keep the folder small: load with `dtype=torch.float32`."
        if args.save_dtype == "float16"
        else ""
    )
    config = pipe.transformer.config
    if args.pretrained_model_name_or_path is None:
        origin = "trained from scratch by `training/train_text_to_image_sd3.py`"
        latents = f"the autoencoder of `{args.pretrained_vae_model_name_or_path}`"
    else:
        origin = (
            f"continued from `{args.pretrained_model_name_or_path}` (its autoencoder and text encoders kept as they "
            "were) by `training/train_text_to_image_sd3.py`"
        )
        latents = "that pipeline's autoencoder"
    write_model_card(
        args.output_dir,
        title="Small SD3-format text-to-image model of mosaic scenes",
        description=(
            f"A `diffusers.StableDiffusion3Pipeline` {origin} on "
            f"{data} at {args.resolution}x{args.resolution}: an `SD3Transformer2DModel` ({parameters:,} parameters, "
            f"{config.num_layers} joint blocks, patch {config.patch_size}) trained with rectified flow for "
            f"{args.max_train_steps} steps of batch {args.train_batch_size} ({args.prompt_dropout:.0%} empty prompts "
            f"for guidance) on the latents of {latents}, with "
            "frozen, seeded CLIP and T5 encoders reading the word-level `mosaic_tokenizer`. Sample with "
            f"`height=width={args.resolution}, max_sequence_length={args.max_sequence_length}`."
            + dtype_note
            + evaluation
        ),
        command=command,
        metrics=metrics,
        tags=["text-to-image", "stable-diffusion-3", "flow-matching", "mosaic"],
    )


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_text_to_image_sd3.py: error: {error}", file=sys.stderr)
        sys.exit(2)
