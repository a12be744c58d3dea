#!/usr/bin/env python
"""Train a Diffuser-style trajectory DDPM (a diffusers `UNet1DModel` over 2-D waypoints) with accelerate.

Data: smooth demonstrations between random start/goal pairs in sparse 2-D maps (`diffusers_ext.data.navigation2d`,
generated, no download). The result is a `DoobGuidedPlannerPipeline` folder (UNet + `DDPMScheduler`) with a model
card; checkpoints are `output_dir/checkpoint-<step>`, `--resume_from_checkpoint latest` continues.

    accelerate launch training/train_trajectory_diffusion.py --output_dir navigation-planner
"""

import argparse
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
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", type=output_dir_arg, required=True, help="Where the pipeline goes.")
    parser.add_argument("--horizon", type=int, default=32, help="Waypoints per trajectory (a multiple of 4).")
    parser.add_argument("--num_train_samples", type=int, default=20000, help="Demonstrations generated.")
    parser.add_argument("--block_out_channels", type=int, nargs="+", default=[32, 64, 96], help="UNet channels.")
    parser.add_argument("--num_train_timesteps", type=int, default=1000, help="DDPM training timesteps.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the data, initialisation and noise.")
    parser.add_argument("--train_batch_size", type=int, default=128, help="Batch size per process.")
    parser.add_argument("--max_train_steps", type=int, default=3000, help="Total optimizer steps.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--save_fp16", action="store_true", help="Store the final weights in float16 (zoo size).")
    add_optimizer_arguments(parser, 2e-3, "cosine", 100, 1e-4)
    add_validation_arguments(parser, "unconditional", num_validation_images=64)
    parser.add_argument("--eval_inference_steps", type=int, default=20, help="Sampling steps of validation.")
    add_accelerate_arguments(parser, checkpointing_steps=1000, checkpoints_total_limit=2)
    args = parser.parse_args(argv)
    if args.horizon < 8 or args.horizon % 4:
        parser.error(f"--horizon must be a multiple of 4 and >= 8, got {args.horizon}.")
    for name in (
        "num_train_samples",
        "num_train_timesteps",
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "eval_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def build_unet(horizon: int, block_out_channels):
    """The trajectory `UNet1DModel` (the block layout of diffusers' value-guided Diffuser checkpoints)."""
    from diffusers import UNet1DModel

    n = len(block_out_channels)
    return UNet1DModel(
        sample_size=horizon,
        in_channels=2,
        out_channels=2,
        down_block_types=("DownResnetBlock1D",) * n,
        up_block_types=("UpResnetBlock1D",) * (n - 1),
        mid_block_type="MidResTemporalBlock1D",
        out_block_type="OutConv1DBlock",
        block_out_channels=tuple(block_out_channels),
        layers_per_block=1,
        use_timestep_embedding=True,
        time_embedding_type="positional",
        flip_sin_to_cos=False,
        freq_shift=1,
        downsample_each_block=False,
        act_fn="mish",
        norm_num_groups=8,
    )


def validate(pipe, args, step, accelerator, generator_seed):
    """Sample `--num_validation_images` plans on fresh random start/goal pairs without obstacles: the mean jerk and
    the demonstrations' jerk, the mean excess length over the straight line, and the share leaving the map."""
    from diffusers_ext.data import navigation2d as nav

    generator = torch.Generator().manual_seed(generator_seed)
    start, goal = nav.random_start_goal(args.num_validation_images, generator)
    out = pipe(
        start,
        goal,
        torch.zeros(0, 3),
        batch_size=args.num_validation_images,
        num_inference_steps=args.eval_inference_steps,
        generator=generator,
    )
    plans = out.trajectories
    metrics = {
        "validation_jerk": float(nav.jerk(plans).mean()),
        "validation_length_ratio": float((nav.path_length(plans) / (goal - start).norm(dim=1)).mean()),
        "validation_outside_rate": float((plans.abs() > 1).any(-1).any(-1).float().mean()),
    }
    accelerator.log(metrics, step=step)
    logger.info(f"validation at step {step}: {metrics}")
    return metrics


def main(argv=None):
    args = parse_args(argv)
    from diffusers import DDPMScheduler

    from diffusers_ext import DoobGuidedPlannerPipeline
    from diffusers_ext.data import navigation2d as nav
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        command_line,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    demos = nav.make_demonstrations(args.num_train_samples, args.horizon, seed=args.seed).transpose(1, 2)
    unet = build_unet(args.horizon, args.block_out_channels)
    scheduler = DDPMScheduler(num_train_timesteps=args.num_train_timesteps, clip_sample=False)
    optimizer, lr_scheduler = build_optimizer(unet.parameters(), args, accelerator.num_processes)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    sampler = ResumableBatchSampler(
        len(demos),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(demos), batch_sampler=sampler))
    if accelerator.is_main_process:
        accelerator.init_trackers("train_trajectory_diffusion", config={k: str(v) for k, v in vars(args).items()})

    def pipeline(trained):
        pipe = DoobGuidedPlannerPipeline(unet=trained, scheduler=scheduler)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    unet.train()
    metrics = {}
    while global_step < args.max_train_steps:
        for _ in range(args.gradient_accumulation_steps):
            (x0,) = next(loader)
            x0 = x0.to(accelerator.device)
            generator = step_generator(args.seed, global_step, accelerator.process_index)
            noise = torch.randn(x0.shape, generator=generator).to(x0)
            t = torch.randint(0, args.num_train_timesteps, (x0.shape[0],), generator=generator).to(x0.device)
            with accelerator.accumulate(unet), accelerator.autocast():
                # as the planner samples: start and goal are clean in the noisy input (inpainting, as Diffuser
                # trains), and only the free waypoints are scored
                noisy = scheduler.add_noise(x0, noise, t)
                noisy[:, :, 0], noisy[:, :, -1] = x0[:, :, 0], x0[:, :, -1]
                pred = unet(noisy, t).sample
                loss = F.mse_loss(pred[:, :, 1:-1].float(), noise[:, :, 1:-1])
                backward_and_step(accelerator, loss, unet.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss.item())
        if global_step % 50 == 0:
            accelerator.log({"loss": loss.item(), "lr": lr_scheduler.get_last_lr()[0]}, step=global_step)
        if global_step % args.checkpointing_steps == 0 or global_step == args.max_train_steps:
            save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)
        final = global_step == args.max_train_steps
        if validation_due(args, global_step, final=final):
            trained = gathered_model(accelerator, unet)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                metrics = validate(pipeline(trained), args, global_step, accelerator, args.seed + 1)

    accelerator.wait_for_everyone()
    final_unet = gathered_model(accelerator, unet)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipe = pipeline(final_unet)
        if args.save_fp16:
            pipe.unet.to(torch.float16)
        pipe.save_pretrained(args.output_dir)
        demo_jerk = float(nav.jerk(demos.transpose(1, 2)[:1000]).mean())
        write_model_card(
            args.output_dir,
            title="Navigation2D trajectory planner",
            description=(
                f"A Diffuser-style `UNet1DModel` ({sum(p.numel() for p in pipe.unet.parameters()):,} parameters) "
                f"over {args.horizon} 2-D waypoints, trained with `training/train_trajectory_diffusion.py` as a DDPM "
                f"({args.max_train_steps} steps, batch {args.train_batch_size}) on {args.num_train_samples} smooth "
                "demonstrations (cubic Bezier paths with random bends between random start/goal pairs, avoiding "
                "0-2 random discs). Loaded as a `DoobGuidedPlannerPipeline`: start and goal are inpainted, obstacles "
                "are avoided by Doob guidance (docs/doob_guidance.md)."
                + (" Weights stored in float16." if args.save_fp16 else "")
            ),
            command=command_line(),
            metrics={**metrics, "demonstration_jerk": demo_jerk},
            tags=["trajectory-planning", "doob-guidance"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_trajectory_diffusion.py: error: {error}", file=sys.stderr)
        sys.exit(2)
