#!/usr/bin/env python
"""Train a SemanticNVS multi-view denoiser (or its no-semantics baseline) on posed multi-view scenes with accelerate.

By default each step renders fresh procedural scenes (a function of the seed and the step, so resuming replays the
same data): view 0 is the input, the others are targets at random azimuth offsets. `--train_data_dir` (a folder of
captures) or `--dataset_name` (a `datasets` dataset, saved to disk or by name) trains on posed captures instead
(`diffusers_ext/data/multiview_folder.py` describes the format: images, intrinsics, camera-to-world poses, optional
depth, which the semantic model needs for warping); each step draws scenes and views from the seed and the step. The targets are noised and denoised with the input view
clean. Semantic conditioning follows SemanticNVS: input-view features warped to each target by depth, and features
of the model's own estimate of the clean targets ("iterative"). Each scene draws one of "warped", "iterative",
"warped+iterative", and with `--cond_dropout` probability drops the conditioning for classifier-free guidance
as the pipeline's unconditional branch does (the input view and the warped features go; the cameras and the
iterative features stay).

The iterative features at inference come from the model's early, often wrong, estimates. `--iterative_surrogate`
chooses what stands in for them in training:

- `self_cond` (default): two-pass self-conditioning. With probability `--self_cond_prob` a scene in an iterative mode
  first runs through the model without iterative features (what the pipeline's first step sees), under no_grad; the
  features of that pass's estimate of the clean targets at the training timestep, extracted exactly as the pipeline
  does (`pipelines/semantic_nvs/conditioning.py`), condition the second pass, which gets the gradient. Otherwise
  the scene is trained as at the first step (no iterative features yet).
- `blur`: the paper's surrogate, features of the Gaussian-blurred clean target (`--blur_sigma`), always right.

    accelerate launch training/train_semantic_nvs.py --output_dir nvs --semantic_encoder diffusers_ext/zoo/procedural-semantic-encoder
    accelerate launch training/train_semantic_nvs.py --output_dir nvs-baseline --no_semantics
    accelerate launch training/train_semantic_nvs.py --output_dir nvs --semantic_encoder ENCODER --train_data_dir captures
"""

import argparse
import logging
import os
import sys

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from diffusers_ext.training_utils import add_accelerate_arguments, add_validation_arguments, output_dir_arg


logger = get_logger(__name__, log_level="INFO")
TRAIN_MODES = ("warped", "iterative", "warped+iterative")
SURROGATES = ("self_cond", "blur")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    parser.add_argument(
        "--semantic_encoder",
        type=str,
        default=None,
        help="A transformers ViT/Dinov2 folder giving the semantic features.",
    )
    parser.add_argument("--no_semantics", action="store_true", help="Train the baseline without semantic inputs.")
    parser.add_argument(
        "--train_data_dir",
        type=str,
        default=None,
        help="A folder of posed multi-view captures (default: procedural scenes).",
    )
    parser.add_argument(
        "--dataset_name",
        type=str,
        default=None,
        help="A `datasets` dataset of posed captures: a folder from save_to_disk or a name for "
        "load_dataset (default: procedural scenes).",
    )
    parser.add_argument("--dataset_split", type=str, default="train", help="The split of --dataset_name.")
    parser.add_argument("--resolution", type=int, default=16, help="View size.")
    parser.add_argument("--num_views", type=int, default=3, help="Views per scene: 1 input + targets.")
    parser.add_argument("--max_azimuth_span", type=float, default=90.0, help="Largest target azimuth offset (deg).")
    parser.add_argument("--block_out_channels", type=int, nargs="+", default=[32, 64], help="UNet channels.")
    parser.add_argument(
        "--iterative_surrogate",
        type=str,
        default="self_cond",
        choices=SURROGATES,
        help="What stands in for the iterative features in training: the model's own stop-gradient "
        "estimate ('self_cond') or the blurred clean target ('blur', the paper's).",
    )
    parser.add_argument(
        "--self_cond_prob",
        type=float,
        default=0.5,
        help="With 'self_cond': probability that a scene in an iterative mode gets features of the "
        "model's estimate (else none, as at the first sampling step).",
    )
    parser.add_argument(
        "--blur_sigma",
        type=float,
        nargs=2,
        default=[1.0, 3.0],
        help="With 'blur': range of the Gaussian blur of the surrogate (pixels).",
    )
    parser.add_argument(
        "--cond_dropout", type=float, default=0.1, help="Probability of dropping the conditioning (for guidance)."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of initialisation, scenes and noise.")
    parser.add_argument("--train_batch_size", type=int, default=8, help="Scenes per step and process.")
    parser.add_argument("--max_train_steps", type=int, default=3000, help="Optimizer steps.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="Peak learning rate (cosine decay).")
    parser.add_argument("--use_ema", action="store_true", help="Keep an exponential moving average of the weights.")
    add_accelerate_arguments(parser, checkpointing_steps=500, checkpoints_total_limit=1)
    validation = parser.add_argument_group(
        "validation",
        "The pipeline the script saves renders the target views of --num_validation_images fixed scenes (drawn with "
        "--seed from the training source; the scene is the NVS counterpart of diffusers' --validation_prompt); "
        "each image is a row: input view, then generated targets. They go to the tracker and to "
        "output_dir/validation/step-<N>/.",
    )
    add_validation_arguments(validation, "unconditional")
    validation.add_argument(
        "--validation_inference_steps", type=int, default=25, help="DDIM steps of the validation views."
    )
    args = parser.parse_args(argv)
    if args.no_semantics == (args.semantic_encoder is not None):
        parser.error("pass exactly one of --semantic_encoder FOLDER and --no_semantics.")
    if args.semantic_encoder is not None and not os.path.isdir(args.semantic_encoder):
        parser.error(f"--semantic_encoder {args.semantic_encoder!r} is not a folder.")
    if args.train_data_dir is not None and args.dataset_name is not None:
        parser.error("pass at most one of --train_data_dir and --dataset_name.")
    if args.train_data_dir is not None and not os.path.isdir(args.train_data_dir):
        parser.error(f"--train_data_dir {args.train_data_dir!r} is not a folder.")
    if not 0.0 <= args.self_cond_prob <= 1.0:
        parser.error(f"--self_cond_prob must be in [0, 1], got {args.self_cond_prob}.")
    if args.num_views < 2:
        parser.error(f"--num_views must be >= 2 (an input and a target), got {args.num_views}.")
    factor = 2 ** (len(args.block_out_channels) - 1)
    if args.resolution % factor:
        parser.error(f"--resolution {args.resolution} must be a multiple of {factor}.")
    for name in ("train_batch_size", "max_train_steps", "gradient_accumulation_steps", "checkpointing_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def gaussian_blur(images: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Blur each image of `(N, C, H, W)` with its own Gaussian `sigmas` `(N,)` (separable, reflected edges)."""
    radius = int(torch.ceil(3 * sigmas.max()).item())
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernels = torch.exp(-(offsets[None] ** 2) / (2 * sigmas[:, None].to(images) ** 2))
    kernels = kernels / kernels.sum(-1, keepdim=True)  # (N, K)
    n, c, h, w = images.shape
    mode = "reflect" if radius < min(h, w) else "replicate"  # reflection needs the image to be wider than the pad
    x = F.pad(images, [radius] * 4, mode=mode).reshape(1, n * c, h + 2 * radius, w + 2 * radius)
    weight = kernels.repeat_interleave(c, 0)
    x = F.conv2d(x, weight[:, None, None, :], groups=n * c)
    x = F.conv2d(x, weight[:, None, :, None], groups=n * c)
    return x.reshape(n, c, h, w)


def scene_semantics(encoder, batch, generator):
    """Input-view features `(B, 1, S, H, W)`, their warp to the targets `(B, V - 1, S, H, W)` with its coverage
    `(B, V - 1, 1, H, W)`, and one training mode per scene (names from `TRAIN_MODES`)."""
    from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_map
    from diffusers_ext.pipelines.semantic_nvs.warp import warp_to_targets

    images = batch["images"]
    b, v, c, h, w = images.shape
    with torch.no_grad():
        inputs = semantic_feature_map(encoder, images[:, 0]).reshape(b, 1, -1, h, w)
        warped, coverage = warp_to_targets(
            inputs,
            batch["depths"][:, :1],
            batch["intrinsics"][:, :1],
            batch["c2w"][:, :1],
            batch["intrinsics"][:, 1:],
            batch["c2w"][:, 1:],
        )
    modes = [TRAIN_MODES[m] for m in torch.randint(0, len(TRAIN_MODES), (b,), generator=generator).tolist()]
    return inputs, warped, coverage, modes


def blurred_target_semantics(encoder, images, generator, blur_sigma):
    """The paper's surrogate for the iterative features: features `(B, V - 1, S, H, W)` of the targets of `images`
    `(B, V, 3, H, W)` in [0, 1], each blurred with a Gaussian of random sigma in `blur_sigma`."""
    from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_map

    b, v, c, h, w = images.shape
    with torch.no_grad():
        sigmas = blur_sigma[0] + (blur_sigma[1] - blur_sigma[0]) * torch.rand(b * (v - 1), generator=generator)
        blurred = gaussian_blur(images[:, 1:].reshape(-1, c, h, w), sigmas)
        return semantic_feature_map(encoder, blurred).reshape(b, v - 1, -1, h, w)


def compose_semantics(inputs, warped, coverage, modes, iterative, keep=None):
    """Features `(B, V, S, H, W)` and validity `(B, V, 1, H, W)` of every view as the pipeline builds them for each
    scene's mode: the input view's own features and the targets' (`target_semantics`); for scenes whose conditioning
    is dropped (`keep` `(B,)` False), those of the unconditional branch: no input-view or warped features, only the
    iterative ones (`unconditional_target_semantics`). `iterative` is a list with, per scene, `(V - 1, S, H, W)`
    features of an estimate of its targets or None (no estimate yet)."""
    from diffusers_ext.pipelines.semantic_nvs.conditioning import target_semantics, unconditional_target_semantics

    features, masks = [], []
    for scene, mode in enumerate(modes):
        if keep is None or keep[scene]:
            feature, mask = target_semantics(mode, warped[scene], coverage[scene], iterative[scene])
            features.append(torch.cat([inputs[scene], feature]))
            masks.append(torch.cat([torch.ones_like(mask[:1]), mask]))
        else:
            feature, mask = unconditional_target_semantics(mode, warped[scene], coverage[scene], iterative[scene])
            features.append(torch.cat([torch.zeros_like(inputs[scene]), feature]))
            masks.append(torch.cat([torch.zeros_like(mask[:1]), mask]))
    return torch.stack(features), torch.stack(masks)


def load_captures(args):
    """The posed captures named by `--train_data_dir` / `--dataset_name` as a `MultiViewSceneDataset`, or None."""
    from diffusers_ext.data.multiview_folder import MultiViewSceneDataset

    if args.train_data_dir is not None:
        return MultiViewSceneDataset.from_folder(args.train_data_dir, args.resolution)
    if args.dataset_name is None:
        return None
    import datasets

    if os.path.isdir(args.dataset_name):
        dataset = datasets.load_from_disk(args.dataset_name)
        if isinstance(dataset, datasets.DatasetDict):
            if args.dataset_split not in dataset:
                raise ValueError(f"--dataset_split {args.dataset_split!r} is not one of {list(dataset)}.")
            dataset = dataset[args.dataset_split]
    else:
        dataset = datasets.load_dataset(args.dataset_name, split=args.dataset_split)
    return MultiViewSceneDataset.from_dataset(dataset, args.resolution)


def run_validation(pipeline, captures, args, accelerator, step: int) -> None:
    """Render the targets of `--num_validation_images` fixed scenes (procedural, or drawn from `captures`, with a
    generator seeded by `--seed`) with `pipeline`; each logged image is one scene's input view followed by its
    generated targets, `(3, H, W * V)`. Saved under `output_dir/validation/step-<step>/`. Main process only."""
    from diffusers_ext.data.procedural_scenes import sample_scene_batch
    from diffusers_ext.training_utils import run_validation as validate
    from diffusers_ext.training_utils import validation_generator

    pipeline.set_progress_bar_config(disable=True)
    scenes = validation_generator(args.seed + 1)
    if captures is None:
        batch = sample_scene_batch(
            scenes,
            args.num_validation_images,
            args.num_views,
            args.resolution,
            max_azimuth_span_deg=args.max_azimuth_span,
        )
    else:
        batch = captures.sample_batch(scenes, args.num_validation_images, args.num_views)
    device = accelerator.device

    def sample(conditions, generator):
        out = pipeline(
            images=batch["images"][:, :1].to(device),
            input_intrinsics=batch["intrinsics"][:, :1].to(device),
            input_c2w=batch["c2w"][:, :1].to(device),
            target_intrinsics=batch["intrinsics"][:, 1:].to(device),
            target_c2w=batch["c2w"][:, 1:].to(device),
            depths=batch["depths"][:, :1].to(device) if batch.get("depths") is not None else None,
            semantic_mode="warped+iterative" if pipeline.semantic_encoder is not None else "none",
            num_inference_steps=args.validation_inference_steps,
            generator=generator,
            output_type="pt",
        ).images  # (B, V - 1, 3, H, W) in [0, 1]
        views = torch.cat([batch["images"][:, :1].to(out), out], dim=1)  # input view first
        return torch.cat(list(views.unbind(1)), dim=-1)  # (B, 3, H, W * V)

    validate(accelerator, args, step, sample, ["scene"], [pipeline.unet], logger, repeat=args.num_validation_images)


def main(argv=None):
    args = parse_args(argv)
    from diffusers import DDIMScheduler, DDPMScheduler
    from diffusers.training_utils import EMAModel
    from transformers import AutoModel

    from diffusers_ext import SemanticMultiViewUNetModel, SemanticNVSPipeline
    from diffusers_ext.data.procedural_scenes import sample_scene_batch
    from diffusers_ext.geometry.camera import scene_plucker
    from diffusers_ext.pipelines.semantic_nvs.conditioning import iterative_semantics, x0_estimate
    from diffusers_ext.schedulers.compatibility import swap_ready_scheduler_config
    from diffusers_ext.training_utils import (
        build_accelerator,
        command_line,
        gathered_model,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = build_accelerator(
        args.output_dir, args.logging_dir, args.mixed_precision, args.report_to, args.gradient_accumulation_steps
    )
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    set_seed(args.seed)
    captures = load_captures(args)
    if captures is not None and args.semantic_encoder is not None and not captures.has_depth:
        raise ValueError(
            "the captures have no depth for every view; semantic training warps input features by depth "
            "(add depth maps, or train the baseline with --no_semantics)."
        )
    encoder = None
    if args.semantic_encoder is not None:
        encoder = AutoModel.from_pretrained(args.semantic_encoder).eval().requires_grad_(False)
    levels = len(args.block_out_channels)
    unet = SemanticMultiViewUNetModel(
        sample_size=args.resolution,
        semantic_channels=0 if encoder is None else encoder.config.hidden_size,
        block_out_channels=tuple(args.block_out_channels),
        down_block_types=("DownBlock2D",) + ("AttnDownBlock2D",) * (levels - 1),
        up_block_types=("AttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
    )
    noise_scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", clip_sample=False)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.max_train_steps)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    ema = None
    if args.use_ema:  # built after `prepare`, from the tensors the processes train (FSDP replaces them when wrapping)
        trained = accelerator.unwrap_model(unet)
        ema = EMAModel(
            trained.parameters(),
            decay=0.999,
            use_ema_warmup=True,
            power=0.75,
            model_cls=SemanticMultiViewUNetModel,
            model_config=trained.config,
        )
        accelerator.register_for_checkpointing(ema)
    if encoder is not None:
        encoder.to(accelerator.device)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_semantic_nvs", config={k: str(v) for k, v in vars(args).items()})

    size = args.resolution
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    unet.train()
    while global_step < args.max_train_steps:
        for micro in range(args.gradient_accumulation_steps):
            micro_step = global_step * args.gradient_accumulation_steps + micro
            generator = step_generator(args.seed, micro_step, accelerator.process_index)
            with accelerator.accumulate(unet):
                if captures is None:
                    batch = sample_scene_batch(
                        generator,
                        args.train_batch_size,
                        args.num_views,
                        size,
                        max_azimuth_span_deg=args.max_azimuth_span,
                    )
                else:
                    batch = captures.sample_batch(generator, args.train_batch_size, args.num_views)
                b, v = batch["images"].shape[:2]
                clean = batch["images"] * 2 - 1
                plucker = scene_plucker(batch["intrinsics"], batch["c2w"], size, size)
                features = masks = None
                if encoder is not None:
                    inputs, warped, coverage, modes = scene_semantics(encoder, batch, generator)
                    if args.iterative_surrogate == "blur":
                        blurred = blurred_target_semantics(encoder, batch["images"], generator, args.blur_sigma)
                        iterative = [
                            blurred[scene] if "iterative" in mode else None for scene, mode in enumerate(modes)
                        ]
                    else:
                        draws = torch.rand(b, generator=generator) < args.self_cond_prob
                        self_cond = [bool(d) and "iterative" in mode for d, mode in zip(draws, modes)]
                        iterative = [None] * b  # filled after the first pass below
                keep = torch.rand(b, generator=generator) >= args.cond_dropout
                input_mask = torch.zeros(b, v, dtype=torch.bool)
                input_mask[:, 0] = True
                input_images = torch.zeros_like(clean)
                input_images[:, 0] = clean[:, 0]

                noise = torch.randn(clean[:, 1:].shape, generator=generator)
                timesteps = torch.randint(0, 1000, (b,), generator=generator)
                noisy = noise_scheduler.add_noise(
                    clean[:, 1:].reshape(b * (v - 1), 3, size, size),
                    noise.reshape(b * (v - 1), 3, size, size),
                    timesteps.repeat_interleave(v - 1),
                ).reshape(b, v - 1, 3, size, size)
                sample = torch.cat([clean[:, :1], noisy], 1)
                device = accelerator.device
                if encoder is not None and args.iterative_surrogate == "self_cond" and any(self_cond):
                    # First pass, as the pipeline's conditional branch at the step before: the input view, no iterative
                    # features yet. Its estimate of the clean targets at this timestep gives the iterative features of the
                    # second pass (stop-gradient), for the conditional and the unconditional (dropped) scenes alike.
                    first_features, first_masks = compose_semantics(inputs, warped, coverage, modes, [None] * b)
                    with torch.no_grad(), accelerator.autocast():
                        first = accelerator.unwrap_model(unet)(
                            sample.to(device),
                            timesteps.to(device),
                            plucker.to(device),
                            input_mask.to(device),
                            input_images.to(device),
                            first_features.to(device),
                            first_masks.to(device),
                        ).sample[:, 1:]
                        x0 = x0_estimate(
                            noise_scheduler,
                            first.float().reshape(-1, 3, size, size),
                            noisy.to(device).reshape(-1, 3, size, size),
                            timesteps.to(device).repeat_interleave(v - 1),
                        )
                        estimated = (
                            iterative_semantics(encoder, x0).reshape(b, v - 1, -1, size, size).to(inputs.device)
                        )
                    iterative = [estimated[scene] if use else None for scene, use in enumerate(self_cond)]
                if encoder is not None:
                    features, masks = compose_semantics(inputs, warped, coverage, modes, iterative, keep)
                # Dropped scenes (classifier-free guidance) lose the input view and, in compose_semantics, its features.
                input_mask[:, 0] = keep
                input_images[:, 0] = clean[:, 0] * keep[:, None, None, None]
                with accelerator.autocast():
                    prediction = unet(
                        sample.to(device),
                        timesteps.to(device),
                        plucker.to(device),
                        input_mask.to(device),
                        input_images.to(device),
                        None if features is None else features.to(device),
                        None if masks is None else masks.to(device),
                    ).sample
                loss = F.mse_loss(prediction[:, 1:].float(), noise.to(device))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        global_step += 1
        if ema is not None:
            ema.step(unet.parameters())
        progress.update(1)
        progress.set_postfix(loss=loss.item())
        if global_step % 50 == 0:
            accelerator.log({"loss": loss.item(), "lr": lr_scheduler.get_last_lr()[0]}, step=global_step)
        if global_step % args.checkpointing_steps == 0 or global_step == args.max_train_steps:
            save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            # every process takes part (a sharded run gathers here); the EMA weights, as the saved pipeline holds them
            model = gathered_model(accelerator, unet, ema)
            if accelerator.is_main_process:
                pipeline = SemanticNVSPipeline(
                    model, DDIMScheduler.from_config(swap_ready_scheduler_config(noise_scheduler.config)), encoder
                )
                run_validation(pipeline, captures, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, unet, ema)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = SemanticNVSPipeline(
            final, DDIMScheduler.from_config(swap_ready_scheduler_config(noise_scheduler.config)), encoder
        )
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, captures, args, accelerator, global_step)
        kind = "without semantic conditioning (the baseline)" if encoder is None else "with semantic conditioning"
        if captures is None:
            data = (
                f"procedural scenes at {size}x{size}: 1 input view and {args.num_views - 1} targets within "
                f"{args.max_azimuth_span:g} degrees of azimuth"
            )
        else:
            data = f"{len(captures)} posed multi-view scenes at {size}x{size}: 1 input view and {args.num_views - 1} targets"
        surrogate = ""
        if encoder is not None:
            surrogate = (
                f"; iterative features from the model's own stop-gradient estimate (two-pass self-conditioning, "
                f"probability {args.self_cond_prob:g})"
                if args.iterative_surrogate == "self_cond"
                else f"; iterative features from the Gaussian-blurred clean target (sigma {args.blur_sigma})"
            )
        write_model_card(
            args.output_dir,
            title=f"SemanticNVS on {'procedural scenes' if captures is None else 'posed captures'}, {kind}",
            description=(
                f"A `SemanticMultiViewUNetModel` ({sum(p.numel() for p in final.parameters()):,} parameters) trained "
                f"{kind} with `training/train_semantic_nvs.py` on {data}, "
                f"{args.max_train_steps} steps of {args.train_batch_size} scenes{surrogate}"
                + (", EMA weights." if ema is not None else ".")
            ),
            command=command_line(),
            tags=["novel-view-synthesis", "semantic-nvs"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_semantic_nvs.py: error: {error}", file=sys.stderr)
        sys.exit(2)
