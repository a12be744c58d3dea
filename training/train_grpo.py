#!/usr/bin/env python
"""Align a flow-matching text-to-image pipeline (SD3 or Flux) to reward functions with GRPO or E2PO.

Options are the fields of `DiffusionGRPOConfig` / `E2POConfig`, of `LoraArguments` (here LoRA is on by default:
`--use_lora`, rank 32, alpha 64; `--use_lora false` trains the whole transformer) and the script arguments below,
parsed by TRL's `TrlParser` (so `--config run.yaml` works as in TRL's scripts). The result is a LoRA that
`load_lora_weights` accepts, with a model card; `--resume_from_checkpoint latest` continues a run exactly.

    accelerate launch training/train_grpo.py --algorithm e2po \
        --pretrained_model_name_or_path diffusers_ext/zoo/digits-sd3 --dataset_name digits \
        --reward_funcs digit_classifier --height 8 --width 8 --max_sequence_length 8 --output_dir digits-e2po
"""

import json
import logging
import os
import sys
from dataclasses import dataclass, field


logger = logging.getLogger("train_grpo")

ALGORITHMS = ("grpo", "e2po")
REWARD_HELP = (
    "Reward functions by name: jpeg_compressibility, jpeg_incompressibility, brightness:<target in [0, 1]>, "
    "color:<r>,<g>,<b>, digit_classifier (zoo classifier probability of the `label` column), digit_correct "
    "(1 if the classifier's top class is the label), clip_score:<CLIPModel path>, pickscore:<CLIPModel path>."
)


@dataclass
class ScriptArguments:
    """What to train and on what; the trainer's options come from its config dataclass."""

    pretrained_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A StableDiffusion3Pipeline or FluxPipeline folder (or Hub id)."}
    )
    algorithm: str = field(default="grpo", metadata={"help": "'grpo' (Flow-GRPO) or 'e2po' (perturbed groups)."})
    dataset: str = field(
        default="digits",
        metadata={
            "aliases": ["--dataset_name"],
            "help": "'digits' (the ten prompts of the digits-sd3 zoo model, with a `label` column), a .txt file "
            "(one prompt per line) or a .jsonl file (objects with 'prompt' and any other columns).",
        },
    )
    reward_funcs: list[str] = field(default_factory=lambda: ["digit_classifier"], metadata={"help": REWARD_HELP})
    validation_prompt: list[str] | None = field(
        default=None,
        metadata={
            "aliases": ["--validation_prompts"],
            "help": "Prompt(s) sampled during training (diffusers' examples); validation runs only when given. "
            "Images (the trained pipeline, the rollouts' height/width/steps/guidance, seeded with --seed) go to "
            "the tracker and to output_dir/validation/step-<N>/.",
        },
    )
    num_validation_images: int = field(default=4, metadata={"help": "Validation images per prompt."})
    validation_steps: int | None = field(
        default=None,
        metadata={"help": "Validate every N steps and once after training (needs --validation_prompt)."},
    )


def load_prompts(dataset: str) -> list:
    """Rows for the trainer from `--dataset`."""
    if dataset == "digits":
        names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
        return [{"prompt": f"a handwritten digit {name}", "label": label} for label, name in enumerate(names)]
    if not os.path.isfile(dataset):
        raise ValueError(f"--dataset {dataset!r} is neither 'digits' nor a .txt/.jsonl file.")
    rows = []
    with open(dataset, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):  # 1-based, blank lines counted, as an editor shows them
            line = line.strip()
            if not line:
                continue
            if not dataset.endswith(".jsonl"):
                rows.append(line)
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"--dataset {dataset!r} line {number} is not JSON: {error.msg} (column {error.colno})."
                ) from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(
                    f"--dataset {dataset!r} line {number}: expected an object with a 'prompt' string, "
                    f"got {line[:80]!r}."
                )
            rows.append(row)
    if not rows:
        raise ValueError(f"--dataset {dataset!r} holds no prompts.")
    return rows


def build_reward(spec: str):
    """A reward callable from its command-line name."""
    from diffusers_ext import rewards

    name, _, value = spec.partition(":")
    if name == "jpeg_compressibility":
        return rewards.jpeg_compressibility
    if name == "jpeg_incompressibility":
        return rewards.jpeg_incompressibility
    if name == "brightness":
        return rewards.BrightnessReward(float(value or 0.5))
    if name == "color":
        return rewards.ColorReward([float(v) for v in value.split(",")])
    if name in ("digit_classifier", "digit_correct"):
        from diffusers_ext import zoo

        mode = "probability" if name == "digit_classifier" else "correct"
        return rewards.ClassifierReward(zoo.load("digits-classifier"), mode=mode)
    if name in ("clip_score", "pickscore"):
        if not value:
            raise ValueError(f"--reward_funcs {name} needs a model path: {name}:<CLIPModel folder or Hub id>.")
        return rewards.CLIPScoreReward(value, scale="clip_score" if name == "clip_score" else "logit_scale")
    raise ValueError(f"--reward_funcs {spec!r} unknown. {REWARD_HELP}")


# This script's LoRA defaults (the shared `LoraArguments` default to no LoRA).
LORA_DEFAULTS = {"use_lora": True, "lora_rank": 32, "lora_alpha": 64}


def parse_args(argv=None):
    """`(script_args, config, lora_args)`: the config is an `E2POConfig` for `--algorithm e2po`, else a
    `DiffusionGRPOConfig`."""
    import argparse

    import yaml
    from trl import TrlParser

    from diffusers_ext import DiffusionGRPOConfig, E2POConfig, LoraArguments
    from diffusers_ext.training_utils import TRL_OPTION_ALIASES, add_option_aliases

    # The algorithm picks the config dataclass, so read it (from the command line or the YAML file) first.
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--algorithm", default=None)
    first.add_argument("--config", default=None)
    known, _ = first.parse_known_args(argv)
    algorithm = known.algorithm
    if algorithm is None and known.config is not None:
        with open(known.config, encoding="utf-8") as f:
            algorithm = (yaml.safe_load(f) or {}).get("algorithm")
    algorithm = algorithm or "grpo"
    if algorithm not in ALGORITHMS:
        raise ValueError(f"--algorithm {algorithm!r} unknown; expected one of {ALGORITHMS}.")
    parser = TrlParser((ScriptArguments, E2POConfig if algorithm == "e2po" else DiffusionGRPOConfig, LoraArguments))
    parser.set_defaults(**LORA_DEFAULTS)
    add_option_aliases(parser, TRL_OPTION_ALIASES)  # diffusers' example names beside TRL's
    script_args, config, lora_args, remaining = parser.parse_args_and_config(args=argv, return_remaining_strings=True)
    e2po_only = [arg for arg in remaining if arg.startswith("--e2po_")]
    if e2po_only:
        raise ValueError(f"{e2po_only[0]} is an E2PO option; pass --algorithm e2po to use it.")
    if remaining:
        raise ValueError(f"unrecognized arguments: {' '.join(remaining)}")
    if script_args.pretrained_model_name_or_path is None:
        raise ValueError("--pretrained_model_name_or_path is required (a StableDiffusion3Pipeline or FluxPipeline).")
    if script_args.num_validation_images < 1:
        raise ValueError(f"--num_validation_images must be >= 1, got {script_args.num_validation_images}.")
    if script_args.validation_steps is not None:
        if script_args.validation_steps < 1:
            raise ValueError(f"--validation_steps must be >= 1, got {script_args.validation_steps}.")
        if script_args.validation_prompt is None:
            raise ValueError(f"--validation_steps {script_args.validation_steps} needs --validation_prompt.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(config, parser)  # an upload that cannot happen fails now, not after training
    return script_args, config, lora_args


FLOW_PIPELINES = ("StableDiffusion3Pipeline", "FluxPipeline")


def check_model(path: str, height: int | None, width: int | None) -> None:
    """Read only the JSON configs of `--pretrained_model_name_or_path` and refuse, before any weights load, a
    pipeline that is not a flow-matching SD3/Flux one or a `--height`/`--width` its VAE and transformer can not
    take (a multiple of the VAE's downsampling times the transformer's patch: 16 for SD3 and Flux)."""
    import importlib

    from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler

    flag = "--pretrained_model_name_or_path"
    try:
        index = DiffusionPipeline.load_config(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{flag} {path!r} is not a diffusers pipeline folder or Hub id: {error}") from None
    name = index.get("_class_name")
    if name not in FLOW_PIPELINES:
        raise ValueError(
            f"{flag} {path!r} is a {name}; train_grpo.py trains flow-matching pipelines "
            f"({' or '.join(FLOW_PIPELINES)})."
        )

    def component_class(component):
        library, class_name = (index.get(component) or [None, None])[:2]
        return getattr(importlib.import_module(library), class_name, None) if library and class_name else None

    scheduler_class = component_class("scheduler")
    if not (isinstance(scheduler_class, type) and issubclass(scheduler_class, FlowMatchEulerDiscreteScheduler)):
        raise ValueError(
            f"{flag} {path!r} has a {(index.get('scheduler') or [None, None])[1]} scheduler; GRPO here needs a "
            "FlowMatchEulerDiscreteScheduler (the SDE of a rectified flow)."
        )
    vae = component_class("vae").load_config(path, subfolder="vae")
    transformer = component_class("transformer").load_config(path, subfolder="transformer")
    vae_scale = 2 ** (len(vae["block_out_channels"]) - 1)
    if name == "StableDiffusion3Pipeline":
        patch, what = transformer.get("patch_size", 1), "patch size"
    else:
        patch, what = 2, "latent packing"  # Flux packs 2x2 latent patches
    multiple = vae_scale * patch
    for option, value in (("--height", height), ("--width", width)):
        if value is not None and (value < multiple or value % multiple):
            raise ValueError(
                f"{option} {value} does not fit {path!r}: it must be a positive multiple of {multiple} "
                f"(VAE downsampling {vae_scale} x {what} {patch})."
            )


def load_pipeline(path: str):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(path)


def run_validation(pipeline, script_args, config, accelerator, step: int) -> None:
    """`--num_validation_images` images per `--validation_prompt` from `pipeline` at the rollouts' settings (seeded
    with `--seed`), saved under `output_dir/validation/step-<step>/` and logged to the trackers."""
    from diffusers_ext.training_utils import run_validation as validate
    from diffusers_ext.training_utils import trainer_validation_args

    args = trainer_validation_args(script_args, config)

    def sample(prompts, generator):
        kwargs = {"max_sequence_length": config.max_sequence_length}
        if config.height is not None:
            kwargs.update(height=config.height)
        if config.width is not None:
            kwargs.update(width=config.width)
        return pipeline(
            prompts,
            num_inference_steps=config.num_inference_steps,
            guidance_scale=config.guidance_scale,
            generator=generator,
            output_type="pt",
            **kwargs,
        ).images

    validate(accelerator, args, step, sample, script_args.validation_prompt, [pipeline.transformer], logger)


def main(argv=None):
    script_args, config, lora_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    import diffusers

    from diffusers_ext import DiffusionGRPOTrainer, E2POTrainer

    diffusers.utils.logging.set_verbosity_info()

    # Cheap inputs first: a bad prompt file or reward name fails before the model loads.
    prompts = load_prompts(script_args.dataset)
    reward_funcs = [build_reward(spec) for spec in script_args.reward_funcs]
    check_model(script_args.pretrained_model_name_or_path, config.height, config.width)
    pipeline = load_pipeline(script_args.pretrained_model_name_or_path)
    from diffusers_ext.training_utils import trainer_validation_args, with_step_validation

    trainer_class = with_step_validation(
        E2POTrainer if script_args.algorithm == "e2po" else DiffusionGRPOTrainer,
        trainer_validation_args(script_args, config),
        lambda trainer, step: run_validation(trainer.pipeline, script_args, config, trainer.accelerator, step),
    )
    trainer = trainer_class(
        pipeline, reward_funcs, config, train_dataset=prompts, peft_config=lora_args.to_peft_config()
    )
    accelerator = trainer.accelerator
    logger.info(accelerator.state)
    logger.info(
        f"{script_args.algorithm}: {config.max_steps} steps, {trainer.generation_batch_size} images per step "
        f"({trainer.images_per_process} per process, {accelerator.num_processes} processes)"
    )
    history = trainer.train()
    if history and accelerator.is_main_process:
        last = history[-1]
        logger.info(
            f"step {int(last['step'])}: reward {last['reward']:.4f}, frac_reward_zero_std "
            f"{last['frac_reward_zero_std']:.3f}"
        )
    trainer.save_model(base_model=script_args.pretrained_model_name_or_path)
    if accelerator.is_main_process:
        logger.info(f"Saved the {'LoRA' if lora_args.use_lora else 'transformer'} to {config.output_dir}")
        from diffusers_ext.training_utils import validation_due

        if validation_due(script_args, trainer.global_step, final=True):
            run_validation(trainer.pipeline, script_args, config, accelerator, trainer.global_step)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_grpo.py: error: {error}", file=sys.stderr)
        sys.exit(2)
