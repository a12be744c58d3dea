#!/usr/bin/env python
"""Train a tiny `StableDiffusion3Pipeline` (text-to-image, flow matching) on scikit-learn's 8x8 digits.

The prompts name the digit ("a handwritten digit seven"). Everything is the real SD3 format: an `AutoencoderKL`
(no downsampling, 4 latent channels, trained here first), the two CLIP text encoders and the T5 encoder of
`diffusers_ext.models.tiny_components.get_tiny_sd3_components` with their locally built tokenizers (kept frozen at their seeded
initialisation: they only have to give every prompt a distinct embedding), an `SD3Transformer2DModel` trained
with rectified flow, and a `FlowMatchEulerDiscreteScheduler`. It is the policy that the GRPO / E2PO trainers
improve in the benchmark; the zoo classifier measures how often a sample shows the digit its prompt names.

    python training/train_sd3_digits.py --output_dir diffusers_ext/zoo/digits-sd3

Use `max_sequence_length=8` with the result (the length it was trained with). One step counter runs over both
stages (`--vae_steps` autoencoder steps, then `--max_train_steps` transformer steps): checkpoints are
`output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues exactly where the last one stopped
(the running generators of both stages are part of the checkpoint).
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_validation_arguments,
    backward_and_step,
    check_unsharded,
    check_validation_arguments,
    output_dir_arg,
)


logger = get_logger("train_sd3_digits", log_level="INFO")

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MAX_SEQUENCE_LENGTH = 8


def digit_prompt(label: int) -> str:
    """The prompt that names digit `label`."""
    return f"a handwritten digit {DIGIT_NAMES[label]}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", type=output_dir_arg, required=True, help="Where the pipeline folder goes.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of every initialisation and random draw.")
    parser.add_argument("--vae_steps", type=int, default=600, help="Optimizer steps of the autoencoder.")
    parser.add_argument("--vae_kl_weight", type=float, default=1e-4, help="Weight of the autoencoder's KL term.")
    parser.add_argument(
        "--max_train_steps",
        "--train_steps",
        type=int,
        default=2500,
        help="Optimizer steps of the transformer (after the autoencoder's). --train_steps: the earlier name.",
    )
    parser.add_argument(
        "--train_batch_size",
        "--batch_size",
        type=int,
        default=64,
        help="Batch size per process and micro-batch, both stages. --batch_size: the earlier name.",
    )
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate (cosine decay).")
    parser.add_argument("--lr_warmup_steps", type=int, default=50, help="Linear warm-up steps of each stage.")
    parser.add_argument(
        "--max_grad_norm", type=float, default=1.0, help="Gradient clipping norm of the transformer stage."
    )
    parser.add_argument("--num_layers", type=int, default=2, help="Joint transformer blocks.")
    parser.add_argument("--attention_head_dim", type=int, default=16, help="Width of one attention head.")
    parser.add_argument("--num_attention_heads", type=int, default=4, help="Attention heads.")
    parser.add_argument("--prompt_dropout", type=float, default=0.1, help="Share of empty prompts (for guidance).")
    parser.add_argument("--eval_samples_per_class", type=int, default=30, help="Samples per digit for the card.")
    parser.add_argument(
        "--eval_inference_steps",
        "--eval_steps",
        type=int,
        default=10,
        help="Sampling steps of the evaluation and of validation. --eval_steps: the earlier name.",
    )
    parser.add_argument("--eval_guidance_scale", type=float, default=1.0, help="Guidance of evaluation/validation.")
    parser.add_argument("--logging_steps", type=int, default=50, help="Log metrics to the tracker every N steps.")
    add_accelerate_arguments(parser, checkpointing_steps=500)
    add_validation_arguments(parser, "prompt")
    args = parser.parse_args(argv)
    for name in (
        "vae_steps",
        "max_train_steps",
        "train_batch_size",
        "gradient_accumulation_steps",
        "eval_samples_per_class",
        "eval_inference_steps",
        "checkpointing_steps",
        "logging_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not 0 <= args.prompt_dropout < 1:
        parser.error(f"--prompt_dropout must lie in [0, 1), got {args.prompt_dropout}.")
    check_validation_arguments(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def build_vae(seed: int):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(32,),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def build_transformer(args):
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(args.seed + 1)
    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=args.num_layers,
        attention_head_dim=args.attention_head_dim,
        num_attention_heads=args.num_attention_heads,
        joint_attention_dim=48,
        caption_projection_dim=args.attention_head_dim * args.num_attention_heads,
        pooled_projection_dim=40,
        pos_embed_max_size=16,
    )


def train_vae_step(vae_step, optimizer, images, generator, step: int, args, accelerator) -> float:
    """One autoencoder optimizer step (`--gradient_accumulation_steps` micro-batches drawn from `generator`):
    reconstruction MSE plus `--vae_kl_weight` times the KL per latent element. Returns the mean loss."""
    from diffusers_ext.training_utils import cosine_with_warmup

    vae = accelerator.unwrap_model(vae_step).vae
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    latent_shape = (vae.config.latent_channels, images.shape[2] // factor, images.shape[3] // factor)
    cosine_with_warmup(optimizer, step, args.vae_steps, args.learning_rate, args.lr_warmup_steps)
    total = 0.0
    for _ in range(args.gradient_accumulation_steps):
        batch = images[torch.randint(0, len(images), (args.train_batch_size,), generator=generator)]
        eps = torch.randn((args.train_batch_size, *latent_shape), generator=generator)
        batch, eps = batch.to(accelerator.device), eps.to(accelerator.device)
        with accelerator.accumulate(vae_step):
            with accelerator.autocast():
                reconstruction, kl = vae_step(batch, eps)
            loss = F.mse_loss(reconstruction.float(), batch) + args.vae_kl_weight * (
                kl.float().mean() / eps[0].numel()
            )
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        total += loss.detach().item() / args.gradient_accumulation_steps
    return total


def train_transformer_step(
    transformer, optimizer, latents, labels, prompt_embeds, pooled, generator, step: int, args, accelerator
) -> float:
    """One rectified-flow optimizer step: x_s = (1 - s) x0 + s noise, the model predicts noise - x0 at timestep
    1000 s (s logit-normal, as SD3); `--prompt_dropout` of the prompts are the empty one. Returns the mean loss."""
    from diffusers_ext.training_utils import cosine_with_warmup

    null = len(DIGIT_NAMES)  # row of the empty prompt
    batch_size = args.train_batch_size
    cosine_with_warmup(optimizer, step, args.max_train_steps, args.learning_rate, args.lr_warmup_steps)
    total = 0.0
    for _ in range(args.gradient_accumulation_steps):
        index = torch.randint(0, len(latents), (batch_size,), generator=generator)
        x0, label = latents[index], labels[index]
        label = torch.where(torch.rand(batch_size, generator=generator) < args.prompt_dropout, null, label)
        noise = torch.randn(x0.shape, generator=generator)
        sigma = torch.sigmoid(torch.randn(batch_size, generator=generator))
        noisy = (1 - sigma[:, None, None, None]) * x0 + sigma[:, None, None, None] * noise
        device = accelerator.device
        with accelerator.accumulate(transformer):
            with accelerator.autocast():
                prediction = transformer(
                    hidden_states=noisy.to(device),
                    timestep=(sigma * 1000).to(device),
                    encoder_hidden_states=prompt_embeds[label].to(device),
                    pooled_projections=pooled[label].to(device),
                ).sample
            loss = F.mse_loss(prediction.float(), (noise - x0).to(device))
            backward_and_step(accelerator, loss, transformer.parameters(), optimizer, None, args.max_grad_norm)
        total += loss.detach().item() / args.gradient_accumulation_steps
    return total


def run_validation(pipe, args, accelerator, step: int) -> None:
    """`--num_validation_images` images per `--validation_prompt` from `pipe` (seeded with `--seed`), saved under
    `output_dir/validation/step-<step>/` and logged to the trackers. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    def sample(prompts, generator):
        return pipe(
            prompts,
            height=8,
            width=8,
            num_inference_steps=args.eval_inference_steps,
            guidance_scale=args.eval_guidance_scale,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            generator=generator,
            output_type="pt",
        ).images

    validate(accelerator, args, step, sample, args.validation_prompt, [pipe.transformer], logger)


def main(argv=None):
    args = parse_args(argv)
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from diffusers_ext import zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.models.tiny_components import get_tiny_sd3_components
    from diffusers_ext.models.training_modules import AutoencoderStep
    from diffusers_ext.training_utils import (
        GeneratorState,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        start_run,
        validation_due,
    )

    start = time.perf_counter()
    accelerator = start_run(args, logger)
    check_unsharded(
        accelerator,
        "train_sd3_digits.py",
        "it trains the VAE through a wrapper module and saves it as a part of the pipeline",
    )
    gray, labels = load_digits_images("train", resolution=8)
    images = gray.expand(-1, 3, -1, -1).contiguous()

    vae = build_vae(args.seed)
    components = get_tiny_sd3_components(args.seed)
    components.update(
        vae=vae, transformer=build_transformer(args), scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0)
    )
    # Each stage draws from one running generator (process 0's is the one of the earlier, checkpoint-free script,
    # so the default run makes the same draws); both are part of every checkpoint.
    offset = 1_000_003 * accelerator.process_index
    vae_generator = torch.Generator().manual_seed(args.seed + 2 + offset)
    transformer_generator = torch.Generator().manual_seed(args.seed + 3 + offset)
    vae_optimizer = torch.optim.AdamW(vae.parameters(), lr=args.learning_rate, weight_decay=0.0)
    transformer_optimizer = torch.optim.AdamW(
        components["transformer"].parameters(), lr=args.learning_rate, weight_decay=1e-4
    )
    vae_step, transformer, vae_optimizer, transformer_optimizer = accelerator.prepare(
        AutoencoderStep(vae), components["transformer"], vae_optimizer, transformer_optimizer
    )
    accelerator.register_for_checkpointing(GeneratorState(vae_generator), GeneratorState(transformer_generator))
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)

    total_steps = args.vae_steps + args.max_train_steps
    if accelerator.is_main_process:
        accelerator.init_trackers("train_sd3_digits", config={k: str(v) for k, v in vars(args).items()})
    logger.info(
        f"{len(images)} digits, batch {args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps}, "
        f"{args.vae_steps} autoencoder + {args.max_train_steps} transformer steps, from step {global_step}"
    )
    progress = tqdm(total=total_steps, initial=global_step, disable=not accelerator.is_local_main_process)

    def end_of_step(loss: float, name: str, report_every: int) -> None:
        nonlocal global_step
        global_step += 1
        progress.update(1)
        progress.set_postfix({name: loss})
        stage_step = global_step - (0 if name == "vae_loss" else args.vae_steps) - 1
        if stage_step % report_every == 0 or global_step in (args.vae_steps, total_steps):
            logger.info(f"{name.removesuffix('_loss')} step {stage_step}: loss {loss:.4f}")
        if global_step % args.logging_steps == 0 or global_step == total_steps:
            accelerator.log({name: loss}, step=global_step)
        if global_step % args.checkpointing_steps == 0 or global_step == total_steps:
            save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)

    progress.set_description("autoencoder")
    vae_step.train()
    while global_step < args.vae_steps:
        loss = train_vae_step(vae_step, vae_optimizer, images, vae_generator, global_step, args, accelerator)
        end_of_step(loss, "vae_loss", 100)
    vae.eval()

    with torch.no_grad():
        moments = vae.encode(images.to(accelerator.device)).latent_dist.mean.cpu()
    shift, scale = float(moments.mean()), float(1.0 / moments.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = (moments - shift) * scale

    pipe = StableDiffusion3Pipeline(**components).to(accelerator.device)
    pipe.set_progress_bar_config(disable=True)
    prompts = [digit_prompt(c) for c in range(len(DIGIT_NAMES))] + [""]
    with torch.no_grad():
        prompt_embeds, _, pooled, _ = pipe.encode_prompt(
            prompts, prompts, prompts, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQUENCE_LENGTH
        )
    prompt_embeds, pooled = prompt_embeds.cpu(), pooled.cpu()

    progress.set_description("transformer")
    transformer.train()
    while global_step < total_steps:
        loss = train_transformer_step(
            transformer,
            transformer_optimizer,
            latents,
            labels,
            prompt_embeds,
            pooled,
            transformer_generator,
            global_step - args.vae_steps,
            args,
            accelerator,
        )
        end_of_step(loss, "transformer_loss", 250)
        if global_step < total_steps and validation_due(args, global_step) and accelerator.is_main_process:
            run_validation(pipe, args, accelerator, global_step)
    transformer.eval()
    progress.close()
    minutes = (time.perf_counter() - start) / 60

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        components.update(vae=vae, transformer=accelerator.unwrap_model(transformer, keep_fp32_wrapper=False))
        pipe = StableDiffusion3Pipeline(**components)
        pipe.set_progress_bar_config(disable=True)
        pipe.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipe, args, accelerator, global_step)
        classifier = zoo.load("digits-classifier").to(accelerator.device)
        accuracy = evaluate_prompt_following(
            pipe,
            classifier,
            args.eval_samples_per_class,
            args.eval_inference_steps,
            args.eval_guidance_scale,
            args.seed,
        )
        logger.info(f"prompt-following accuracy {accuracy:.3f}")
        accelerator.log({"prompt_following_accuracy": accuracy}, step=global_step)
        write_card(pipe, args, accuracy, minutes)
        logger.info(f"Saved the pipeline to {args.output_dir}")
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


def write_card(pipe, args, accuracy: float, minutes: float) -> None:
    """The model card of the saved pipeline."""
    from diffusers_ext.training_utils import command_line, write_model_card

    parameters = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in ("transformer", "vae")}
    write_model_card(
        args.output_dir,
        title="Tiny SD3 text-to-image model of 8x8 digits",
        description=(
            "A `StableDiffusion3Pipeline` that draws the 8x8 handwritten digit its prompt names "
            f'(`"{digit_prompt(7)}"`), trained by `training/train_sd3_digits.py` on scikit-learn\'s digits '
            f"(train split) in {minutes:.1f} CPU minutes: an `AutoencoderKL` without downsampling "
            f"({parameters['vae']:,} parameters, 4 latent channels, {args.vae_steps} steps), then an "
            f"`SD3Transformer2DModel` ({parameters['transformer']:,} parameters, {args.num_layers} joint blocks, "
            f"{args.max_train_steps} rectified-flow steps of batch {args.train_batch_size}, "
            f"{args.prompt_dropout:.0%} empty prompts for guidance). The CLIP and T5 text encoders are the seeded "
            "tiny encoders of `diffusers_ext.models.tiny_components.get_tiny_sd3_components`, frozen. Images are "
            f"8x8 RGB with equal channels (grey digits). Call it with `max_sequence_length={MAX_SEQUENCE_LENGTH}`, "
            "`height=width=8`.\n\n"
            "Prompt-following accuracy: the share of samples that the zoo `digits-classifier` assigns to the digit "
            f"the prompt names ({args.eval_samples_per_class} samples per digit, {args.eval_inference_steps} Euler "
            f"steps, guidance scale {args.eval_guidance_scale}, seed {args.seed})."
        ),
        command=command_line(),
        metrics={"prompt_following_accuracy": accuracy},
        tags=["text-to-image", "stable-diffusion-3", "flow-matching"],
    )


def evaluate_prompt_following(
    pipe, classifier, samples_per_class: int, num_inference_steps: int, guidance_scale: float, seed: int
) -> float:
    """Share of samples the classifier assigns to the digit their prompt names."""
    from diffusers_ext.rewards import digit_accuracy

    hits = []
    for label in range(len(DIGIT_NAMES)):
        generator = torch.Generator().manual_seed(seed * 100 + label)
        images = pipe(
            [digit_prompt(label)] * samples_per_class,
            height=8,
            width=8,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            generator=generator,
            output_type="pt",
        ).images
        hits += digit_accuracy(classifier, images, [label] * samples_per_class)
    return float(sum(hits) / len(hits))


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_sd3_digits.py: error: {error}", file=sys.stderr)
        sys.exit(2)
