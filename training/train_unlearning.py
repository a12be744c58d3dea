#!/usr/bin/env python
"""Unlearn a concept or training data from a diffusion model by constrained primal-dual training (or a baseline).

Concept unlearning of a class of a class-conditional pipeline (e.g. the zoo digits DDPM):

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/digits-ddpm \\
        --output_dir digits-without-3 --forget_classes 3 --constraint reverse_kl --constraint_level auto

Concept unlearning of a prompt of a Stable Diffusion-style pipeline (UNet2DConditionModel), here with LoRA:

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/sd \\
        --output_dir no-cats --forget_prompts "a photo of a cat" --retain_prompts "a photo of a dog" --use_lora

Data unlearning of training images of the digits (`--forget_size` random training images, or `--forget_indices`):

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/digits-ddpm \\
        --output_dir digits-forget-64 --forget_size 64 --constraint forward_kl --constraint_level auto

`--baseline esd|siss|neggrad_plus|retain_only` trains a baseline instead. The result is the pipeline with the
unlearned UNet (`from_pretrained`), or for LoRA on a UNet2DConditionModel the LoRA weights
(`pipe.load_lora_weights(output_dir)`), with a model card stating what was unlearned, the constraint and the
measured results. Checkpoints are `output_dir/checkpoint-<step>` every `--save_steps`; `--resume_from_checkpoint
latest` continues exactly (weights, optimizer, lambda and the model's own sample pool).

The training options carry the names of `ConstrainedUnlearningConfig` (those of `transformers.TrainingArguments`:
`--max_steps`, `--per_device_train_batch_size`, `--weight_decay`, `--save_steps`, `--save_total_limit`,
`--lora_rank`). The earlier flags (`--max_train_steps`, `--train_batch_size`, `--adam_weight_decay`,
`--checkpointing_steps`, `--checkpoints_total_limit`, `--rank`) still work for now, with a deprecation warning.
"""

import argparse
import logging
import os
import sys
import warnings

import torch
from accelerate.logging import get_logger
from accelerate.utils import set_seed


logger = get_logger(__name__, log_level="INFO")

CONSTRAINTS = ("reverse_kl", "forward_kl", "likelihood")
BASELINES = ("esd", "siss", "neggrad_plus", "retain_only")
# Flags renamed to the config's (TrainingArguments') names; the old spelling is mapped with a FutureWarning.
DEPRECATED_FLAGS = {
    "--max_train_steps": "--max_steps",
    "--train_batch_size": "--per_device_train_batch_size",
    "--adam_weight_decay": "--weight_decay",
    "--checkpointing_steps": "--save_steps",
    "--checkpoints_total_limit": "--save_total_limit",
    "--rank": "--lora_rank",
}
# Options passed to the config under the same name (DiffusionTrainerConfig's fields).
SHARED_FIELDS = (
    "output_dir", "seed", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
    "adam_beta1", "adam_beta2", "weight_decay", "adam_epsilon", "max_grad_norm", "mixed_precision", "save_steps",
    "save_total_limit", "resume_from_checkpoint", "report_to", "logging_dir", "logging_steps",
)  # fmt: skip


def rename_deprecated_flags(argv: list[str]) -> list[str]:
    """`argv` with every deprecated flag replaced by its new name, warning once per flag."""
    renamed = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in DEPRECATED_FLAGS:
            new = DEPRECATED_FLAGS[flag]
            warnings.warn(f"{flag} is deprecated; use {new}.", FutureWarning, stacklevel=3)
            arg = new + eq + value
        renamed.append(arg)
    return renamed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_name_or_path",
        type=str,
        required=True,
        help="A pipeline folder or hub id: a ClassConditionalDDPMPipeline, a DDPMPipeline, or a StableDiffusion-style "
        "pipeline (UNet2DConditionModel + text encoder).",
    )
    method = parser.add_argument_group("method")
    method.add_argument("--constraint", type=str, default="reverse_kl", choices=CONSTRAINTS, help="The constraint.")
    method.add_argument("--baseline", type=str, default=None, choices=BASELINES, help="Train a baseline instead.")
    method.add_argument(
        "--constraint_level",
        type=str,
        default="auto",
        help="The level b, or 'auto': for concepts the constraint read on the retained classes/prompts under the "
        "pretrained model (times --level_factor); for data the held-out loss (membership parity).",
    )
    method.add_argument("--level_factor", type=float, default=1.0, help="Multiplies an 'auto' level.")
    method.add_argument(
        "--dual_learning_rate",
        type=float,
        default=None,
        help="Dual step size. Default 0.02 / |level| (0.3 / level for data unlearning).",
    )
    method.add_argument("--lambda_init", type=float, default=0.0, help="Initial lambda.")
    method.add_argument("--lambda_min", type=float, default=0.0, help="Lower bound of lambda.")
    method.add_argument(
        "--lambda_max", type=float, default=None, help="Upper bound of lambda (default 0.9, or 10 for likelihood)."
    )
    method.add_argument(
        "--stop_patience", type=int, default=50, help="Stop after N steps at lambda_max with the level unmet."
    )
    method.add_argument("--retain_weight", type=float, default=1.0, help="Weight of the retain term.")
    method.add_argument("--esd_negative_guidance", type=float, default=2.0, help="ESD's eta.")
    method.add_argument(
        "--neggrad_weight",
        type=float,
        default=1.0,
        help="NegGrad+'s alpha; SISS's forget-term weight (1: as published).",
    )
    method.add_argument("--siss_mixture_weight", type=float, default=0.5, help="SISS's mixture weight.")
    what = parser.add_argument_group("what to forget and keep")
    what.add_argument("--forget_classes", type=int, nargs="*", default=None, help="Class labels to forget.")
    what.add_argument("--retain_classes", type=int, nargs="*", default=None, help="Class labels to keep.")
    what.add_argument("--reference_class", type=int, default=None, help="p_ref (default: the null class).")
    what.add_argument("--forget_prompts", type=str, nargs="*", default=None, help="Prompts of the concept to forget.")
    what.add_argument("--retain_prompts", type=str, nargs="*", default=None, help="Anchor prompts to keep.")
    what.add_argument("--reference_prompt", type=str, default="", help="The prompt of p_ref (default empty).")
    what.add_argument(
        "--forget_indices",
        type=int,
        nargs="*",
        default=None,
        help="Data unlearning: indices into the digits training split to forget.",
    )
    what.add_argument("--forget_size", type=int, default=None, help="Data unlearning: forget N random train images.")
    what.add_argument("--forget_seed", type=int, default=1234, help="Seed of the --forget_size subset.")
    train = parser.add_argument_group("training")
    train.add_argument("--output_dir", type=str, required=True, help="Where the result and checkpoints go.")
    train.add_argument("--seed", type=int, default=0, help="Seed of batches, noise and sample pools.")
    train.add_argument("--max_steps", type=int, default=150, help="Primal-dual steps.")
    train.add_argument("--per_device_train_batch_size", type=int, default=32, help="Per-process batch of each kind.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per step.")
    train.add_argument("--learning_rate", type=float, default=1e-4, help="AdamW learning rate.")
    train.add_argument("--adam_beta1", type=float, default=0.9, help="AdamW beta1.")
    train.add_argument("--adam_beta2", type=float, default=0.999, help="AdamW beta2.")
    train.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay.")
    train.add_argument("--adam_epsilon", type=float, default=1e-8, help="AdamW epsilon.")
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="Gradient clipping norm.")
    train.add_argument("--pool_size", type=int, default=64, help="Samples per pool (per process).")
    train.add_argument("--pool_sampling_steps", type=int, default=10, help="DDIM steps of the pools.")
    train.add_argument("--pool_refresh_steps", type=int, default=10, help="Refresh the on-policy pool every N steps.")
    train.add_argument("--use_lora", action="store_true", help="Train LoRA adapters instead of all weights.")
    train.add_argument("--lora_rank", type=int, default=8, help="LoRA rank.")
    train.add_argument("--lora_alpha", type=float, default=None, help="LoRA alpha (default: the rank).")
    train.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16"],
                       help="Overrides accelerate's config.")  # fmt: skip
    train.add_argument("--save_steps", type=int, default=50, help="Save a checkpoint every N steps.")
    train.add_argument("--save_total_limit", type=int, default=None, help="Keep at most N checkpoints.")
    train.add_argument("--resume_from_checkpoint", type=str, default=None,
                       help="'latest', a checkpoint folder name in output_dir, or a path.")  # fmt: skip
    train.add_argument("--report_to", type=str, default="tensorboard",
                       help="accelerate tracker: 'tensorboard', 'wandb', 'all' or 'none'.")  # fmt: skip
    train.add_argument("--logging_dir", type=str, default="logs", help="Tracker folder, relative to output_dir.")
    train.add_argument("--logging_steps", type=int, default=1, help="Log metrics every N steps.")
    evaluation = parser.add_argument_group("evaluation (model card)")
    evaluation.add_argument(
        "--eval_classifier",
        type=str,
        default=None,
        help="A ConvImageClassifier folder, or 'zoo' for the zoo digits classifier: measure the result on the "
        "digits and put the numbers in the model card.",
    )
    evaluation.add_argument("--eval_samples_per_class", type=int, default=50, help="Samples per class to judge.")
    evaluation.add_argument("--eval_inference_steps", type=int, default=25, help="DDIM steps of those samples.")
    args = parser.parse_args(rename_deprecated_flags(sys.argv[1:] if argv is None else list(argv)))
    validate_args(args, parser)
    return args


def validate_args(args, parser):
    data = args.forget_indices is not None or args.forget_size is not None
    concept = args.forget_classes is not None or args.forget_prompts is not None
    for name in ("forget_classes", "forget_prompts", "forget_indices"):
        if getattr(args, name) is not None and len(getattr(args, name)) == 0:
            parser.error(f"--{name} is empty: nothing to forget.")
    if args.forget_size is not None and args.forget_size < 1:
        parser.error(f"--forget_size must be >= 1, got {args.forget_size}: nothing to forget.")
    if not data and not concept:
        parser.error("nothing to forget: give --forget_classes, --forget_prompts, --forget_indices or --forget_size.")
    if data and concept:
        parser.error("give a concept (--forget_classes/--forget_prompts) or data (--forget_indices/--forget_size).")
    if args.forget_indices is not None and args.forget_size is not None:
        parser.error("give --forget_indices or --forget_size, not both.")
    if args.constraint_level != "auto":
        try:
            args.constraint_level = float(args.constraint_level)
        except ValueError:
            parser.error(f"--constraint_level must be a number or 'auto', got {args.constraint_level!r}.")
    if args.lambda_max is not None and args.lambda_max >= 1 and args.constraint in ("reverse_kl", "forward_kl"):
        parser.error(
            f"--lambda_max {args.lambda_max} must be < 1 for --constraint {args.constraint}: the target's strength "
            "lambda / (1 - lambda) is undefined at lambda >= 1."
        )
    for name in ("max_steps", "per_device_train_batch_size", "save_steps", "pool_size", "stop_patience",
                 "gradient_accumulation_steps", "logging_steps"):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")


def load_base(path):
    from diffusers_ext import load_pipeline

    if not os.path.isdir(path):
        raise ValueError(f"--pretrained_model_name_or_path {path!r} is not a pipeline folder.")
    return load_pipeline(path)


def build_data(args):
    """The forget/retain split of the digits training images, and the held-out digits (data unlearning)."""
    from diffusers_ext.data.digits import load_digits_images

    images, labels = load_digits_images("train", resolution=8)
    if args.forget_indices is not None:
        bad = [i for i in args.forget_indices if not 0 <= i < len(images)]
        if bad:
            raise ValueError(f"--forget_indices {bad} are outside the digits training split (0..{len(images) - 1}).")
        forget = torch.tensor(sorted(set(args.forget_indices)))
    else:
        if args.forget_size >= len(images):
            raise ValueError(f"--forget_size {args.forget_size} leaves nothing to retain of {len(images)} images.")
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.forget_seed))
        forget = order[: args.forget_size]
    keep = torch.ones(len(images), dtype=torch.bool)
    keep[forget] = False
    return (images[forget], labels[forget]), (images[keep], labels[keep]), load_digits_images("heldout", resolution=8)


def measure(args, pipe, base_pipe, classifier, data, accelerator):
    """Numbers for the model card: classifier judgement of samples, membership losses (data unlearning)."""
    from diffusers_ext.evaluation.digits import evaluate_digits_generator
    from diffusers_ext.evaluation.unlearning import denoising_losses, evaluate_concept_unlearning, membership_summary

    metrics = {}
    if data is not None:
        forget, _, heldout = data
        for name, p in (("pretrained", base_pipe), ("unlearned", pipe)):
            losses = [denoising_losses(p.unet, p.scheduler, *d, seed=args.seed) for d in (forget, heldout)]
            summary = membership_summary(*losses)
            metrics[f"{name} forget-set denoising loss"] = summary["forget_loss"]
            metrics[f"{name} held-out denoising loss (mean ± std)"] = (
                f"{summary['heldout_loss_mean']:.4f} ± {summary['heldout_loss_std']:.4f}"
            )
    if classifier is None:
        return metrics
    n, steps = args.eval_samples_per_class, args.eval_inference_steps
    if args.forget_classes:
        reports = {
            name: evaluate_concept_unlearning(p, classifier, args.forget_classes, n, steps, seed=args.seed)
            for name, p in (("pretrained", base_pipe), ("unlearned", pipe))
        }
        for name, report in reports.items():
            metrics[f"{name} forgotten rate (classes {args.forget_classes})"] = report.forgotten_rate
            metrics[f"{name} retained Fréchet distance"] = report.retained_frechet
        metrics["max retained-class accuracy drop"] = reports["unlearned"].max_retained_accuracy_drop(
            reports["pretrained"]
        )
    else:
        for name, p in (("pretrained", base_pipe), ("unlearned", pipe)):
            report = evaluate_digits_generator(p, classifier, n, steps, seed=args.seed)
            metrics[f"{name} conditional accuracy"] = report.conditional_accuracy
            metrics[f"{name} Fréchet distance"] = report.frechet_distance
    return metrics


def main(argv=None):
    args = parse_args(argv)
    import copy

    from diffusers import DDPMScheduler

    from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    set_seed(args.seed)

    pipe = load_base(args.pretrained_model_name_or_path)
    base_pipe = copy.deepcopy(pipe)
    is_text = hasattr(pipe, "text_encoder")
    data = build_data(args) if (args.forget_indices is not None or args.forget_size is not None) else None
    if data is not None and (is_text or pipe.unet.config.sample_size != 8 or pipe.unet.config.in_channels != 1):
        raise ValueError("data unlearning here forgets digits training images: it needs an 8x8 grayscale UNet2DModel.")

    config = ConstrainedUnlearningConfig(
        constraint=args.constraint,
        baseline=args.baseline,
        constraint_level=1.0 if args.constraint_level == "auto" else args.constraint_level,
        dual_learning_rate=args.dual_learning_rate or 0.0,
        lambda_init=args.lambda_init,
        lambda_min=args.lambda_min,
        lambda_max=args.lambda_max,
        stop_patience=args.stop_patience,
        forget_classes=args.forget_classes,
        retain_classes=args.retain_classes,
        reference_class=args.reference_class,
        forget_prompts=args.forget_prompts,
        retain_prompts=args.retain_prompts,
        reference_prompt=args.reference_prompt,
        retain_weight=args.retain_weight,
        esd_negative_guidance=args.esd_negative_guidance,
        neggrad_weight=args.neggrad_weight,
        siss_mixture_weight=args.siss_mixture_weight,
        pool_size=args.pool_size,
        pool_sampling_steps=args.pool_sampling_steps,
        pool_refresh_steps=args.pool_refresh_steps,
        use_lora=args.use_lora,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        **{name: getattr(args, name) for name in SHARED_FIELDS},
    )
    trainer = ConstrainedUnlearningTrainer(
        pipe.unet,
        DDPMScheduler.from_config(pipe.scheduler.config),
        config,
        forget_dataset=data[0] if data else None,
        retain_dataset=data[1] if data else None,
        text_encoder=getattr(pipe, "text_encoder", None),
        tokenizer=getattr(pipe, "tokenizer", None),
        null_class_label=getattr(pipe.config, "null_class_label", None),
    )
    accelerator = trainer.accelerator
    logger.info(accelerator.state, main_process_only=False)
    if args.constraint_level == "auto" and args.baseline is None:
        if data is not None:
            from diffusers_ext.evaluation.unlearning import denoising_losses

            level = float(denoising_losses(base_pipe.unet, base_pipe.scheduler, *data[2], seed=args.seed).mean())
            logger.info(f"Constraint level: the held-out digits' denoising loss {level:.4g} (membership parity)")
        else:
            level = trainer.calibrate_level() * args.level_factor
            logger.info(f"Constraint level: {level:.4g} (the retained conditions' value x {args.level_factor:g})")
        config.constraint_level = level
    if args.dual_learning_rate is None:
        config.dual_learning_rate = (0.3 if data is not None else 0.02) / max(abs(config.constraint_level), 1e-3)

    logger.info(
        f"Unlearning {trainer.unlearned_description()} with {config.method}, level {config.constraint_level:.4g}"
    )
    trainer.train()  # resumes per --resume_from_checkpoint; checkpoints every --save_steps and where it stops

    metrics = {}
    if accelerator.is_main_process and not trainer.saves_lora_only:
        pipe.register_modules(unet=trainer.unlearned_unet())
        classifier = None
        if args.eval_classifier is not None:
            from diffusers_ext import ConvImageClassifier, zoo

            classifier = (
                zoo.load("digits-classifier")
                if args.eval_classifier == "zoo"
                else ConvImageClassifier.from_pretrained(args.eval_classifier)
            )
        pipe.set_progress_bar_config(disable=True)
        base_pipe.set_progress_bar_config(disable=True)
        metrics = measure(args, pipe, base_pipe, classifier, data, accelerator)
    trainer.save_model(args.output_dir, base_model=args.pretrained_model_name_or_path, metrics=metrics, pipeline=pipe)
    logger.info(f"Saved the result to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_unlearning.py: error: {error}", file=sys.stderr)
        sys.exit(2)
