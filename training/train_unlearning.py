#!/usr/bin/env python
"""Unlearn a concept or training data from a diffusion model by constrained primal-dual training (or a baseline).

Concept unlearning of a class of a class-conditional pipeline (e.g. the zoo digits DDPM):

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/digits-ddpm \\
        --output_dir digits-without-3 --forget_classes 3 --constraint reverse_kl --constraint_level auto

Concept unlearning of a prompt of a Stable Diffusion-style pipeline (UNet2DConditionModel), here with LoRA:

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/sd \\
        --output_dir no-cats --forget_prompts "a photo of a cat" --retain_prompts "a photo of a dog" --use_lora

Concept unlearning on SDXL, SD3 / SD3.5 or Flux (the pipeline's own `encode_prompt`; SD3 and Flux with the
velocity-space targets, LoRA on the transformer's attention):

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/flux \
        --output_dir flux-no-cats --forget_prompts "a photo of a cat" --retain_prompts "a photo of a dog" \
        --use_lora --resolution 512 --max_sequence_length 128 --mixed_precision bf16

Data unlearning of training images of the digits (`--forget_size` random training images, or `--forget_indices`):

    accelerate launch training/train_unlearning.py --pretrained_model_name_or_path path/to/digits-ddpm \\
        --output_dir digits-forget-64 --forget_size 64 --constraint forward_kl --constraint_level auto

`--baseline esd|siss|neggrad_plus|retain_only` trains a baseline instead. The result is the pipeline with the
unlearned denoiser (`from_pretrained`), or for LoRA on a text-to-image model the LoRA weights
(`pipe.load_lora_weights(output_dir)`), with a model card stating what was unlearned, the constraint and the
measured results. Checkpoints are `output_dir/checkpoint-<step>` every `--save_steps`; `--resume_from_checkpoint
latest` continues exactly (weights, optimizer, lambda and the model's own sample pool).

Options are the fields of `ConstrainedUnlearningConfig` (the shared ones named as in `transformers.TrainingArguments`:
`--max_steps`, `--per_device_train_batch_size`, `--weight_decay`, `--save_steps`, `--save_total_limit`, ...), of
`LoraArguments` (`--use_lora`, `--lora_rank`, `--lora_alpha`) and the script arguments below, parsed by TRL's
`TrlParser` (so `--config run.yaml` works as in TRL's scripts). This script's defaults: `--constraint_level auto`,
`--dual_learning_rate auto`, `--max_steps 150`, `--report_to tensorboard`; `--output_dir` is required. For data
unlearning, `--constraint_level auto` is the held-out digits' denoising loss under the pretrained model (membership
parity), computed here; for concepts the trainer calibrates it at train start (times `--constraint_level_factor`).
"""

import dataclasses
import logging
import os
import re
import sys
from dataclasses import dataclass, field

import torch
from accelerate import PartialState
from accelerate.logging import get_logger
from accelerate.utils import parse_flag_from_env, set_seed


logger = get_logger(__name__, log_level="INFO")

# This script's defaults where they differ from the config's.
DEFAULTS = {
    "constraint_level": "auto",
    "dual_learning_rate": "auto",
    "max_steps": 150,
    "report_to": "tensorboard",
    "output_dir": None,
}
LIST_OPTIONS = ("forget_classes", "forget_prompts", "forget_indices")


@dataclass
class ScriptArguments:
    """What to unlearn from and how to measure the result; the trainer's options come from its config."""

    pretrained_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A pipeline folder: a ClassConditionalDDPMPipeline, a DDPMPipeline, or a text-to-image pipeline: "
            "StableDiffusion (1.x / 2.x), StableDiffusionXL, StableDiffusion3 or Flux."
        },
    )
    forget_indices: list[int] | None = field(
        default=None, metadata={"help": "Data unlearning: indices into the digits training split to forget."}
    )
    forget_size: int | None = field(default=None, metadata={"help": "Data unlearning: forget N random train images."})
    forget_seed: int = field(default=1234, metadata={"help": "Seed of the --forget_size subset."})
    eval_classifier: str | None = field(
        default=None,
        metadata={
            "help": "A ConvImageClassifier folder, or 'zoo' for the zoo digits classifier: measure the result on the "
            "digits and put the numbers in the model card."
        },
    )
    eval_samples_per_class: int = field(default=50, metadata={"help": "Samples per class to judge."})
    eval_inference_steps: int = field(default=25, metadata={"help": "DDIM steps of those samples (and validation)."})
    validation_prompt: list[str] | None = field(
        default=None,
        metadata={
            "aliases": ["--validation_prompts"],
            "help": "Text-conditioned models: prompt(s) sampled during training (diffusers' examples); validation "
            "runs when given. Images of the unlearned pipeline (seeded with --seed) go to the tracker and to "
            "output_dir/validation/step-<N>/.",
        },
    )
    validation_class_labels: list[int] | None = field(
        default=None,
        metadata={
            "help": "Class-conditional models: labels sampled at validation (the counterpart of "
            "--validation_prompt; default with --validation_steps: every class)."
        },
    )
    num_validation_images: int = field(
        default=4, metadata={"help": "Validation images per prompt or label (in all for an unconditional model)."}
    )
    validation_steps: int | None = field(
        default=None, metadata={"help": "Validate every N steps and once after training."}
    )


def parse_args(argv=None):
    """`(script_args, config, lora_args)` from the command line (or `--config file.yaml`); exits with status 2 and a
    one-line message on a bad option."""
    from trl import TrlParser

    from diffusers_ext import ConstrainedUnlearningConfig, LoraArguments
    from diffusers_ext.training_utils import TRL_OPTION_ALIASES, add_option_aliases

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = TrlParser((ScriptArguments, ConstrainedUnlearningConfig, LoraArguments))
    parser.set_defaults(**DEFAULTS)
    add_option_aliases(parser, TRL_OPTION_ALIASES)  # diffusers' example names beside TRL's
    for index, arg in enumerate(argv):
        if arg.lstrip("-") in LIST_OPTIONS and (index + 1 == len(argv) or argv[index + 1].startswith("--")):
            parser.error(f"{arg} is empty: nothing to forget.")
    try:
        script_args, config, lora_args = parser.parse_args_and_config(args=argv)
    except ValueError as error:  # a config's own check: name the option as on the command line
        parser.error(re.sub(r"`(\w+)`", r"--\1", str(error)))
    validate_args(script_args, config, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(config, parser)  # an upload that cannot happen fails now, not after training
    return script_args, config, lora_args


def validate_args(script_args, config, parser):
    if script_args.pretrained_model_name_or_path is None:
        parser.error("--pretrained_model_name_or_path is required.")
    if config.output_dir is None:
        parser.error("--output_dir is required.")
    data = script_args.forget_indices is not None or script_args.forget_size is not None
    concept = config.forget_classes is not None or config.forget_prompts is not None
    if script_args.forget_size is not None and script_args.forget_size < 1:
        parser.error(f"--forget_size must be >= 1, got {script_args.forget_size}: nothing to forget.")
    if not data and not concept:
        parser.error("nothing to forget: give --forget_classes, --forget_prompts, --forget_indices or --forget_size.")
    if data and concept:
        parser.error("give a concept (--forget_classes/--forget_prompts) or data (--forget_indices/--forget_size).")
    if script_args.forget_indices is not None and script_args.forget_size is not None:
        parser.error("give --forget_indices or --forget_size, not both.")
    if script_args.num_validation_images < 1:
        parser.error(f"--num_validation_images must be >= 1, got {script_args.num_validation_images}.")
    if script_args.validation_steps is not None and script_args.validation_steps < 1:
        parser.error(f"--validation_steps must be >= 1, got {script_args.validation_steps}.")
    if script_args.validation_prompt is not None and script_args.validation_class_labels is not None:
        parser.error("give --validation_prompt (text models) or --validation_class_labels (class models), not both.")
    classifier = script_args.eval_classifier
    if classifier not in (None, "zoo") and not os.path.isfile(os.path.join(classifier, "config.json")):
        parser.error(
            f"--eval_classifier {classifier!r} is not a ConvImageClassifier folder (no config.json there); "
            "give a folder saved with save_pretrained, or 'zoo' for the zoo digits classifier."
        )


def load_classifier(path):
    """The `--eval_classifier` network (None without it), loaded before training so a bad one fails first."""
    if path is None:
        return None
    from diffusers_ext import ConvImageClassifier, zoo

    return zoo.load("digits-classifier") if path == "zoo" else ConvImageClassifier.from_pretrained(path)


def load_base(path):
    from diffusers_ext import load_pipeline

    if not os.path.isdir(path):
        raise ValueError(f"--pretrained_model_name_or_path {path!r} is not a pipeline folder.")
    return load_pipeline(path)


def build_data(script_args):
    """The forget/retain split of the digits training images, and the held-out digits (data unlearning)."""
    from diffusers_ext.data.digits import load_digits_images

    args = script_args
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


def measure(script_args, config, pipe, base_pipe, classifier, data):
    """Numbers for the model card: classifier judgement of samples, membership losses (data unlearning)."""
    from diffusers_ext.evaluation.digits import evaluate_digits_generator
    from diffusers_ext.evaluation.unlearning import denoising_losses, evaluate_concept_unlearning, membership_summary

    metrics = {}
    if data is not None:
        forget, _, heldout = data
        for name, p in (("pretrained", base_pipe), ("unlearned", pipe)):
            losses = [denoising_losses(p.unet, p.scheduler, *d, seed=config.seed) for d in (forget, heldout)]
            summary = membership_summary(*losses)
            metrics[f"{name} forget-set denoising loss"] = summary["forget_loss"]
            metrics[f"{name} held-out denoising loss (mean ± std)"] = (
                f"{summary['heldout_loss_mean']:.4f} ± {summary['heldout_loss_std']:.4f}"
            )
    if classifier is None:
        return metrics
    n, steps = script_args.eval_samples_per_class, script_args.eval_inference_steps
    if config.forget_classes:
        reports = {
            name: evaluate_concept_unlearning(p, classifier, config.forget_classes, n, steps, seed=config.seed)
            for name, p in (("pretrained", base_pipe), ("unlearned", pipe))
        }
        for name, report in reports.items():
            metrics[f"{name} forgotten rate (classes {config.forget_classes})"] = report.forgotten_rate
            metrics[f"{name} retained Fréchet distance"] = report.retained_frechet
        metrics["max retained-class accuracy drop"] = reports["unlearned"].max_retained_accuracy_drop(
            reports["pretrained"]
        )
    else:
        for name, p in (("pretrained", base_pipe), ("unlearned", pipe)):
            report = evaluate_digits_generator(p, classifier, n, steps, seed=config.seed)
            metrics[f"{name} conditional accuracy"] = report.conditional_accuracy
            metrics[f"{name} Fréchet distance"] = report.frechet_distance
    return metrics


def run_validation(pipe, script_args, config, accelerator, step: int) -> None:
    """`--num_validation_images` samples of the unlearned pipeline per `--validation_prompt` (text models) or per
    `--validation_class_labels` entry (class models; default every class), or in all (unconditional), DDIM
    `--eval_inference_steps`, seeded with `--seed`; saved under `output_dir/validation/step-<step>/` and logged."""
    from diffusers_ext.training_utils import run_validation as validate
    from diffusers_ext.training_utils import trainer_validation_args

    pipe.set_progress_bar_config(disable=True)
    steps = script_args.eval_inference_steps
    denoiser = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
    num_classes = getattr(denoiser.config, "num_class_embeds", None)
    if hasattr(pipe, "text_encoder"):
        conditions = script_args.validation_prompt

        def sample(prompts, generator):
            return pipe(prompts, num_inference_steps=steps, generator=generator, output_type="pt").images

    elif num_classes is not None:
        null = getattr(pipe.config, "null_class_label", None)
        conditions = script_args.validation_class_labels or [c for c in range(num_classes) if c != null]

        def sample(labels, generator):
            return pipe(class_labels=labels, num_inference_steps=steps, generator=generator, output_type="pt").images

    else:
        conditions = [None]

        def sample(conditions, generator):
            images = pipe(batch_size=len(conditions), num_inference_steps=steps, generator=generator, output_type="np")
            return torch.from_numpy(images.images).permute(0, 3, 1, 2)

    args = trainer_validation_args(script_args, config)
    validate(accelerator, args, step, sample, conditions, [denoiser], logger)


def main(argv=None):
    script_args, config, lora_args = parse_args(argv)
    import copy

    from diffusers_ext import ConstrainedUnlearningTrainer

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    # The process state the trainer's Accelerator joins (accelerate's logger needs it before that). Unlike
    # `Accelerator`, `PartialState` does not read ACCELERATE_USE_CPU itself: without it, torchrun's CPU processes
    # would each run alone instead of joining one gloo group.
    PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    set_seed(config.seed)

    pipe = load_base(script_args.pretrained_model_name_or_path)
    base_pipe = copy.deepcopy(pipe)
    is_text = hasattr(pipe, "text_encoder")
    if script_args.eval_classifier is not None and is_text:
        raise ValueError(
            f"--eval_classifier judges samples of a class-conditional digits pipeline; "
            f"{type(pipe).__name__} is text-conditioned. Drop --eval_classifier."
        )
    classifier = load_classifier(script_args.eval_classifier)
    data = (
        build_data(script_args)
        if (script_args.forget_indices is not None or script_args.forget_size is not None)
        else None
    )
    if data is not None and (is_text or pipe.unet.config.sample_size != 8 or pipe.unet.config.in_channels != 1):
        raise ValueError("data unlearning here forgets digits training images: it needs an 8x8 grayscale UNet2DModel.")
    if data is not None and config.constraint_level == "auto" and config.baseline is None:
        from diffusers_ext.evaluation.unlearning import denoising_losses

        level = float(denoising_losses(base_pipe.unet, base_pipe.scheduler, *data[2], seed=config.seed).mean())
        logger.info(f"Constraint level: the held-out digits' denoising loss {level:.4g} (membership parity)")
        config = dataclasses.replace(config, constraint_level=level)

    if script_args.validation_prompt is not None and not is_text:
        raise ValueError(f"--validation_prompt needs a text-conditioned pipeline; {type(pipe).__name__} is not.")
    if script_args.validation_class_labels is not None and (
        is_text or getattr(pipe.unet.config, "num_class_embeds", None) is None
    ):
        raise ValueError(
            f"--validation_class_labels needs a class-conditional pipeline; {type(pipe).__name__} is not."
        )
    if is_text and script_args.validation_steps is not None and script_args.validation_prompt is None:
        raise ValueError(f"--validation_steps {script_args.validation_steps} needs --validation_prompt.")

    from diffusers_ext.training_utils import trainer_validation_args, validation_due, with_step_validation

    trainer_class = with_step_validation(
        ConstrainedUnlearningTrainer,
        trainer_validation_args(script_args, config),
        lambda trainer, step: run_validation(
            trainer.unlearned_pipeline(), script_args, config, trainer.accelerator, step
        ),
    )
    trainer = trainer_class(
        pipe,
        config,
        forget_dataset=data[0] if data else None,
        retain_dataset=data[1] if data else None,
        peft_config=lora_args.to_peft_config(),
    )
    accelerator = trainer.accelerator
    logger.info(accelerator.state, main_process_only=False)
    logger.info(f"Unlearning {trainer.unlearned_description()} with {config.method}")
    # Resumes per --resume_from_checkpoint, resolves and logs an "auto" level, checkpoints every --save_steps.
    trainer.train()

    metrics = {}
    if accelerator.is_main_process and not trainer.saves_lora_only:
        unlearned = trainer.unlearned_pipeline()
        unlearned.set_progress_bar_config(disable=True)
        base_pipe.set_progress_bar_config(disable=True)
        metrics = measure(script_args, config, unlearned, base_pipe, classifier, data)
    trainer.save_model(config.output_dir, base_model=script_args.pretrained_model_name_or_path, metrics=metrics)
    logger.info(f"Saved the result to {config.output_dir}")
    if accelerator.is_main_process and validation_due(script_args, trainer.global_step, final=True):
        run_validation(trainer.unlearned_pipeline(), script_args, config, accelerator, trainer.global_step)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_unlearning.py: error: {error}", file=sys.stderr)
        sys.exit(2)
