#!/usr/bin/env python
"""Train a tiny `StableDiffusion3Pipeline` (text-to-image, flow matching) on scikit-learn's 8x8 digits.

The prompts name the digit ("a handwritten digit seven"). Everything is the real SD3 format: an `AutoencoderKL`
(no downsampling, 4 latent channels, trained here first), the two CLIP text encoders and the T5 encoder of
`diffusers_ext.models.tiny_components.get_tiny_sd3_components` with their locally built tokenizers (kept frozen at their seeded
initialisation: they only have to give every prompt a distinct embedding), an `SD3Transformer2DModel` trained
with rectified flow, and a `FlowMatchEulerDiscreteScheduler`. It is the policy that the GRPO / E2PO trainers
improve in the benchmark; the zoo classifier measures how often a sample shows the digit its prompt names.

    python training/train_sd3_digits.py --output_dir diffusers_ext/zoo/digits-sd3

Use `max_sequence_length=8` with the result (the length it was trained with).
"""

import argparse
import logging
import math
import sys
import time

import torch
import torch.nn.functional as F

from diffusers_ext.training_utils import add_hub_arguments, output_dir_arg


logger = logging.getLogger("train_sd3_digits")

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
    parser.add_argument("--train_steps", type=int, default=2500, help="Optimizer steps of the transformer.")
    parser.add_argument("--batch_size", type=int, default=64, help="Batch size of both stages.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate (cosine decay).")
    parser.add_argument("--num_layers", type=int, default=2, help="Joint transformer blocks.")
    parser.add_argument("--attention_head_dim", type=int, default=16, help="Width of one attention head.")
    parser.add_argument("--num_attention_heads", type=int, default=4, help="Attention heads.")
    parser.add_argument("--prompt_dropout", type=float, default=0.1, help="Share of empty prompts (for guidance).")
    parser.add_argument("--eval_samples_per_class", type=int, default=30, help="Samples per digit for the card.")
    parser.add_argument("--eval_steps", type=int, default=10, help="Sampling steps of the evaluation.")
    parser.add_argument("--eval_guidance_scale", type=float, default=1.0, help="Guidance of the evaluation.")
    add_hub_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("vae_steps", "train_steps", "batch_size", "eval_samples_per_class", "eval_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if not 0 <= args.prompt_dropout < 1:
        parser.error(f"--prompt_dropout must lie in [0, 1), got {args.prompt_dropout}.")
    return args


def _cosine_lr(optimizer, step: int, total: int, peak: float, warmup: int = 50) -> None:
    lr = peak * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))
    for group in optimizer.param_groups:
        group["lr"] = lr


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


def train_vae(vae, images: torch.Tensor, args) -> None:
    generator = torch.Generator().manual_seed(args.seed + 2)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=args.learning_rate, weight_decay=0.0)
    vae.train()
    for step in range(args.vae_steps):
        _cosine_lr(optimizer, step, args.vae_steps, args.learning_rate)
        batch = images[torch.randint(0, len(images), (args.batch_size,), generator=generator)]
        posterior = vae.encode(batch).latent_dist
        latents = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=generator)
        reconstruction = vae.decode(latents).sample
        kl = posterior.kl().mean() / latents[0].numel()
        loss = F.mse_loss(reconstruction, batch) + args.vae_kl_weight * kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == args.vae_steps - 1:
            logger.info(f"vae step {step}: loss {loss.item():.4f}")
    vae.eval()


def train_transformer(transformer, latents, labels, prompt_embeds, pooled, args) -> None:
    """Rectified flow: x_s = (1 - s) x0 + s noise, the model predicts noise - x0 at timestep 1000 s."""
    generator = torch.Generator().manual_seed(args.seed + 3)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=args.learning_rate, weight_decay=1e-4)
    null = len(DIGIT_NAMES)  # row of the empty prompt
    transformer.train()
    for step in range(args.train_steps):
        _cosine_lr(optimizer, step, args.train_steps, args.learning_rate)
        index = torch.randint(0, len(latents), (args.batch_size,), generator=generator)
        x0, label = latents[index], labels[index]
        label = torch.where(torch.rand(args.batch_size, generator=generator) < args.prompt_dropout, null, label)
        noise = torch.randn(x0.shape, generator=generator)
        sigma = torch.sigmoid(torch.randn(args.batch_size, generator=generator))  # logit-normal, as SD3
        noisy = (1 - sigma[:, None, None, None]) * x0 + sigma[:, None, None, None] * noise
        prediction = transformer(
            hidden_states=noisy,
            timestep=sigma * 1000,
            encoder_hidden_states=prompt_embeds[label],
            pooled_projections=pooled[label],
        ).sample
        loss = F.mse_loss(prediction, noise - x0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        optimizer.step()
        if step % 250 == 0 or step == args.train_steps - 1:
            logger.info(f"transformer step {step}: loss {loss.item():.4f}")
    transformer.eval()


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(message)s", level=logging.INFO)
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from diffusers_ext import zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.models.tiny_components import get_tiny_sd3_components
    from diffusers_ext.training_utils import command_line, maybe_push_to_hub, write_model_card

    start = time.perf_counter()
    torch.manual_seed(args.seed)
    gray, labels = load_digits_images("train", resolution=8)
    images = gray.expand(-1, 3, -1, -1).contiguous()

    vae = build_vae(args.seed)
    train_vae(vae, images, args)
    with torch.no_grad():
        moments = vae.encode(images).latent_dist.mean
    shift, scale = float(moments.mean()), float(1.0 / moments.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = (moments - shift) * scale

    components = get_tiny_sd3_components(args.seed)
    components.update(
        vae=vae, transformer=build_transformer(args), scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0)
    )
    pipe = StableDiffusion3Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    prompts = [digit_prompt(c) for c in range(len(DIGIT_NAMES))] + [""]
    with torch.no_grad():
        prompt_embeds, _, pooled, _ = pipe.encode_prompt(
            prompts, prompts, prompts, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQUENCE_LENGTH
        )
    train_transformer(pipe.transformer, latents, labels, prompt_embeds, pooled, args)
    minutes = (time.perf_counter() - start) / 60

    pipe.save_pretrained(args.output_dir)
    classifier = zoo.load("digits-classifier")
    accuracy = evaluate_prompt_following(
        pipe, classifier, args.eval_samples_per_class, args.eval_steps, args.eval_guidance_scale, args.seed
    )
    logger.info(f"prompt-following accuracy {accuracy:.3f}")
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
            f"{args.train_steps} rectified-flow steps of batch {args.batch_size}, {args.prompt_dropout:.0%} empty "
            "prompts for guidance). The CLIP and T5 text encoders are the seeded tiny encoders of "
            "`diffusers_ext.models.tiny_components.get_tiny_sd3_components`, frozen. Images are 8x8 RGB with equal channels "
            f"(grey digits). Call it with `max_sequence_length={MAX_SEQUENCE_LENGTH}`, `height=width=8`.\n\n"
            "Prompt-following accuracy: the share of samples that the zoo `digits-classifier` assigns to the digit "
            f"the prompt names ({args.eval_samples_per_class} samples per digit, {args.eval_steps} Euler steps, "
            f"guidance scale {args.eval_guidance_scale}, seed {args.seed})."
        ),
        command=command_line(),
        metrics={"prompt_following_accuracy": accuracy},
        tags=["text-to-image", "stable-diffusion-3", "flow-matching"],
    )
    logger.info(f"Saved the pipeline to {args.output_dir}")
    maybe_push_to_hub(args, logger)


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
