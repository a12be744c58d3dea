"""The opening of every training script and its optimisation step: the `Accelerator`, the optimizer and learning-rate
schedule from the shared flags, and one backward-and-step with gradient clipping."""

import math
import os

import torch


def backward_and_step(accelerator, loss, parameters, optimizer, lr_scheduler=None, max_grad_norm=None) -> None:
    """One micro-step of the pack's scripts, inside `accelerator.accumulate(model)`: `accelerator.backward(loss)`,
    gradient clipping to `max_grad_norm` where the accumulated gradients are synchronised (None or <= 0: no
    clipping), then the optimizer step, the learning-rate scheduler's step (when given) and `zero_grad`. Under
    accumulation accelerate's wrapped optimizer and scheduler skip the steps between synchronisations themselves."""
    accelerator.backward(loss)
    if accelerator.sync_gradients and max_grad_norm is not None and max_grad_norm > 0:
        accelerator.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    if lr_scheduler is not None:
        lr_scheduler.step()
    optimizer.zero_grad()


def build_accelerator(
    output_dir: str,
    logging_dir: str = "logs",
    mixed_precision: str | None = None,
    report_to: str = "tensorboard",
    gradient_accumulation_steps: int = 1,
):
    """The `Accelerator` of our training scripts: trackers under `output_dir/logging_dir`, `report_to="none"` off."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    return Accelerator(
        gradient_accumulation_steps=gradient_accumulation_steps,
        mixed_precision=mixed_precision,
        log_with=None if report_to == "none" else report_to,
        project_config=ProjectConfiguration(project_dir=output_dir, logging_dir=os.path.join(output_dir, logging_dir)),
    )


def build_optimizer(params, args, num_processes: int = 1):
    """`(optimizer, lr_scheduler)`: AdamW over `params` and the diffusers schedule named by the flags of
    [`add_optimizer_arguments`], over `args.max_train_steps` optimizer steps.

    accelerate steps a prepared LR scheduler once per process per optimizer step, so warm-up and length are scaled
    by `num_processes` (`accelerator.num_processes`).
    """
    from diffusers.optimization import get_scheduler

    optimizer = torch.optim.AdamW(
        params,
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.adam_weight_decay,
        eps=args.adam_epsilon,
    )
    lr_scheduler = get_scheduler(
        args.lr_scheduler,
        optimizer=optimizer,
        num_warmup_steps=args.lr_warmup_steps * num_processes,
        num_training_steps=args.max_train_steps * num_processes,
    )
    return optimizer, lr_scheduler


def start_run(args, logger):
    """The opening every training script shares; returns the `Accelerator`.

    Builds it with [`build_accelerator`] from the flags of [`add_accelerate_arguments`] (plus `output_dir` and
    `gradient_accumulation_steps`), formats log lines with a timestamp, logs the accelerate state from every process
    through `logger` (an `accelerate.logging.get_logger` logger) and seeds everything with `args.seed`.
    """
    import logging

    from accelerate.utils import set_seed

    accelerator = build_accelerator(
        args.output_dir, args.logging_dir, args.mixed_precision, args.report_to, args.gradient_accumulation_steps
    )
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    set_seed(args.seed)
    return accelerator


def cosine_with_warmup(optimizer, step: int, total: int, peak: float, warmup: int) -> None:
    """Set every group's learning rate for `step`: linear warm-up over `warmup` steps to `peak`, then cosine decay
    to 0 at `total`. A function of the step alone, so a resumed run continues the schedule exactly."""
    lr = peak * min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * step / max(1, total)))
    for group in optimizer.param_groups:
        group["lr"] = lr
