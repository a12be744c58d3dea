"""Validation during training (diffusers' examples: `--validation_prompt`, `--num_validation_images`, `--validation_steps`),
logged to the trackers and saved under `output_dir/validation/`."""

import os
import re

import torch

from ..utils import positive_int_arg


VALIDATION_DIR = "validation"


VALIDATION_CONDITIONS = ("prompt", "class_label", "unconditional", "text")


def add_validation_arguments(parser, condition: str, num_validation_images: int = 4):
    """Add the validation flags of diffusers' examples to `parser` (an `ArgumentParser` or an argument group).

    `condition` says what a validation sample is conditioned on:

    - `"prompt"` (text-to-image): `--validation_prompt` (one or more prompts; `--validation_prompts` is accepted as
      in diffusers' `train_text_to_image.py`); validation runs only when it is given, as in diffusers' examples.
    - `"class_label"` (class-conditional): `--validation_class_labels` (default: every class).
    - `"unconditional"`: no conditioning flag.
    - `"text"` (language models): no conditioning flag; `--num_validation_images` counts generated texts (the
      script says which prompts, if any, they complete).

    Every kind gets `--num_validation_images` (samples per prompt or label, or in all) and `--validation_steps`
    (run every N optimizer steps and once after training). Without a prompt, validation runs when
    `--validation_steps` or (class-conditional) `--validation_class_labels` is given. [`validation_enabled`] and
    [`validation_due`] read them back.
    """
    if condition not in VALIDATION_CONDITIONS:
        raise ValueError(f"`condition` must be one of {VALIDATION_CONDITIONS}, got {condition!r}.")
    if condition == "prompt":
        parser.add_argument(
            "--validation_prompt",
            "--validation_prompts",
            type=str,
            nargs="+",
            default=None,
            help="Prompt(s) sampled during training; validation runs only when given. Images are logged to the "
            "tracker and saved under output_dir/validation/step-<N>/.",
        )
    elif condition == "class_label":
        parser.add_argument(
            "--validation_class_labels",
            type=int,
            nargs="+",
            default=None,
            help="Class labels sampled at validation (the class-conditional counterpart of diffusers' "
            "--validation_prompt; default: every class). Images are logged to the tracker and saved under "
            "output_dir/validation/step-<N>/.",
        )
    what = {"prompt": "per prompt", "class_label": "per class label"}.get(condition, "in all")
    parser.add_argument(
        "--num_validation_images",
        type=positive_int_arg,
        default=num_validation_images,
        help=f"Validation samples {what}"
        + (
            " (texts: the language-model counterpart of diffusers' images; logged to the tracker and saved as "
            "output_dir/validation/step-<N>.txt)."
            if condition == "text"
            else "."
        )
        + " Seeded with --seed.",
    )
    parser.add_argument(
        "--validation_steps",
        type=positive_int_arg,
        default=None,
        help="Validate every N optimizer steps and once after training"
        + {
            "prompt": " (needs --validation_prompt).",
            "class_label": "; with only --validation_class_labels, once after training. Off without either.",
            "unconditional": ". Off without it.",
            "text": ". Off without it.",
        }[condition],
    )


def validation_enabled(args) -> bool:
    """Whether a run asked for validation (a prompt, class labels or `--validation_steps`)."""
    return any(
        getattr(args, name, None) is not None
        for name in ("validation_prompt", "validation_class_labels", "validation_steps")
    )


def check_validation_arguments(args, parser) -> None:
    """Parse-time check of the flags of [`add_validation_arguments`] for text-to-image scripts:
    `--validation_steps` without a `--validation_prompt` is an error (nothing to sample)."""
    if getattr(args, "validation_steps", None) is not None and getattr(args, "validation_prompt", ()) is None:
        parser.error(f"--validation_steps {args.validation_steps} needs --validation_prompt (what to sample).")


def validation_due(args, step: int, final: bool = False) -> bool:
    """Whether validation runs after optimizer step `step`: every `--validation_steps`, and after the last step
    (`final`), when [`validation_enabled`]."""
    if not validation_enabled(args):
        return False
    return final or (args.validation_steps is not None and step % args.validation_steps == 0)


def validation_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of every validation call: the same seed at every step, so the samples are comparable."""
    return torch.Generator(device).manual_seed(seed)


def _to_uint8_nhwc(images):
    """`(N, C, H, W)` tensor in [0, 1], or a list of PIL images / uint8 arrays -> uint8 array `(N, H, W, C)`."""
    import numpy as np

    if isinstance(images, torch.Tensor):
        if images.ndim != 4:
            raise ValueError(f"`images` must be a (N, C, H, W) tensor in [0, 1], got shape {tuple(images.shape)}.")
        array = images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
        return (array * 255).round().astype(np.uint8)
    arrays = [np.asarray(image) for image in images]
    arrays = [a[..., None] if a.ndim == 2 else a for a in arrays]
    if not arrays:
        raise ValueError("`images` is empty.")
    return np.stack(arrays).astype(np.uint8)


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_")[:limit] or "sample"


def log_validation_images(accelerator, images, captions: list[str], step: int, output_dir: str, logger=None) -> str:
    """Save validation `images` under `output_dir/validation/step-<step>/` and log them to every tracker that takes
    images (tensorboard: `add_images`; wandb: `wandb.Image` with the caption); return the folder.

    `images` is a `(N, C, H, W)` tensor in [0, 1] or a list of `N` PIL images / `(H, W[, C])` uint8 arrays;
    `captions` has `N` entries (the prompt or label of each image). Call on the main process.
    """
    from PIL import Image

    array = _to_uint8_nhwc(images)
    if len(captions) != len(array):
        raise ValueError(f"`captions` has {len(captions)} entries for {len(array)} images.")
    folder = os.path.join(output_dir, VALIDATION_DIR, f"step-{step}")
    os.makedirs(folder, exist_ok=True)
    for index, (image, caption) in enumerate(zip(array, captions)):
        pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
        pil.save(os.path.join(folder, f"{index:02d}-{_slug(caption)}.png"))
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({"validation": array}, step=step, dataformats="NHWC")
        elif tracker.name == "wandb":
            import wandb

            tracker.log({"validation": [wandb.Image(a, caption=c) for a, c in zip(array, captions)]}, step=step)
        elif logger is not None:
            logger.info(f"tracker {tracker.name!r} takes no images here; validation images are in {folder}")
    if logger is not None:
        logger.info(f"validation at step {step}: {len(array)} images in {folder}")
    return folder


def log_validation_texts(accelerator, texts: list[str], prompts: list[str], step: int, output_dir: str, logger=None):
    """Save validation `texts` (generated from `prompts`, one each) as `output_dir/validation/step-<step>.txt` and log
    them to every tracker that takes text (tensorboard: `add_text`; wandb: a table); return the file path."""
    if len(texts) != len(prompts):
        raise ValueError(f"`prompts` has {len(prompts)} entries for {len(texts)} texts.")
    folder = os.path.join(output_dir, VALIDATION_DIR)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step-{step}.txt")
    with open(path, "w", encoding="utf-8") as f:
        for prompt, text in zip(prompts, texts):
            f.write(f"prompt: {prompt}\noutput: {text}\n\n")
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            table = "\n".join(f"| {p!r} | {t!r} |" for p, t in zip(prompts, texts))
            tracker.writer.add_text("validation", "| prompt | output |\n| --- | --- |\n" + table, global_step=step)
        elif tracker.name == "wandb":
            tracker.log_table("validation", columns=["prompt", "output"], data=list(zip(prompts, texts)), step=step)
        elif logger is not None:
            logger.info(f"tracker {tracker.name!r} takes no text here; validation texts are in {path}")
    if logger is not None:
        logger.info(f"validation at step {step}: {len(texts)} texts in {path}")
    return path


def run_validation(
    accelerator, args, step: int, sample, conditions: list, modules=(), logger=None, texts=False, repeat=None
):
    """Validation as diffusers' examples run it: each of `conditions` (prompts, class labels, or `[None]` for an
    unconditional model) repeated `repeat` times (default `--num_validation_images`), sampled by `sample(conditions, generator)` with
    the same seeded generator at every step ([`validation_generator`]), with `modules` in eval mode (restored after),
    without gradients and under the run's autocast; the result goes to [`log_validation_images`] (a `(N, C, H, W)`
    tensor in [0, 1] or PIL images) or, with `texts=True`, to [`log_validation_texts`] (a list of strings).

    Call on the main process with unwrapped modules (validation is a local computation, no collective)."""
    repeat = args.num_validation_images if repeat is None else repeat
    repeated = [condition for condition in conditions for _ in range(repeat)]
    modes = [module.training for module in modules]
    for module in modules:
        module.eval()
    try:
        with torch.no_grad(), accelerator.autocast():
            outputs = sample(repeated, validation_generator(args.seed, accelerator.device))
    finally:
        for module, mode in zip(modules, modes):
            module.train(mode)
    captions = ["" if condition is None else str(condition) for condition in repeated]
    if texts:
        return log_validation_texts(accelerator, list(outputs), captions, step, args.output_dir, logger)
    return log_validation_images(accelerator, outputs, captions, step, args.output_dir, logger)


def trainer_validation_args(script_args, config):
    """The flags [`run_validation`] and [`validation_due`] read, for a TRL-style script: the validation fields of
    its `script_args` dataclass with `seed` and `output_dir` from the trainer `config`."""
    from types import SimpleNamespace

    fields = ("validation_prompt", "validation_class_labels", "num_validation_images", "validation_steps")
    values = {name: getattr(script_args, name) for name in fields if hasattr(script_args, name)}
    return SimpleNamespace(seed=config.seed, output_dir=config.output_dir, **values)


def with_step_validation(trainer_class, args, validate):
    """A subclass of `trainer_class` (a `diffusers_ext` trainer) that calls `validate(trainer, step)` on the main
    process after each step [`validation_due`] names for `args` (the last step excepted: the script validates the
    result it saves). Same name, so trackers and model cards read as before."""

    class ValidatingTrainer(trainer_class):
        def finish_step(self, logs, max_steps):
            super().finish_step(logs, max_steps)
            if self.global_step < max_steps and validation_due(args, self.global_step):
                if self.accelerator.is_main_process:
                    validate(self, self.global_step)

    ValidatingTrainer.__name__ = ValidatingTrainer.__qualname__ = trainer_class.__name__
    return ValidatingTrainer
