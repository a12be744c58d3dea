"""Helpers shared by the `training/` scripts: exact-resume batch sampling, safe checkpoints, model cards, learning-rate
schedules and the one-forward training modules of a latent text-to-image model."""

import argparse
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from .utils import check_output_dir, check_positive_int, positive_int_arg


CHECKPOINT_PREFIX = "checkpoint-"


class ResumableBatchSampler(Sampler[list[int]]):
    r"""
    An endless batch sampler whose batches depend only on `(seed, step)`, so a run resumed at step `k`
    sees exactly the batches an uninterrupted run would have seen from step `k` on.

    Each epoch is a fresh permutation of the dataset drawn from `seed + epoch`; the global batch of step `s` is
    the slice `[s * global_batch, (s + 1) * global_batch)` of the concatenated permutations, and process `rank`
    takes its contiguous share of it.

    Args:
        num_samples (`int`): dataset size.
        batch_size (`int`): per-process batch size.
        num_replicas (`int`): number of processes.
        rank (`int`): this process's index.
        seed (`int`): base seed of the permutations.
        start_step (`int`, defaults to 0): the first micro-batch index to yield (resume point).
    """

    def __init__(
        self, num_samples: int, batch_size: int, num_replicas: int, rank: int, seed: int, start_step: int = 0
    ):
        if num_samples < 1:
            raise ValueError(f"`num_samples` must be >= 1, got {num_samples}.")
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.start_step = start_step

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        global_batch = self.batch_size * self.num_replicas
        step = self.start_step
        cache: dict[int, torch.Tensor] = {}
        while True:
            start = step * global_batch + self.rank * self.batch_size
            indices = []
            for position in range(start, start + self.batch_size):
                epoch, offset = divmod(position, self.num_samples)
                if epoch not in cache:
                    cache = {epoch: self._permutation(epoch), **{k: v for k, v in cache.items() if k == epoch - 1}}
                indices.append(int(cache[epoch][offset]))
            yield indices
            step += 1


def step_generator(seed: int, step: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for the random draws (noise, timesteps, label dropout) of one training step on one process."""
    return torch.Generator(device).manual_seed((seed * 1_000_003 + step) * 1_009 + rank)


def list_checkpoints(output_dir: str) -> list[str]:
    """Finished `checkpoint-<step>` folders in `output_dir`, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    names = [d for d in os.listdir(output_dir) if re.fullmatch(rf"{CHECKPOINT_PREFIX}\d+", d)]
    return sorted(names, key=lambda d: int(d[len(CHECKPOINT_PREFIX) :]))


def resolve_resume_checkpoint(output_dir: str, resume_from_checkpoint: str | None) -> str | None:
    """Map `--resume_from_checkpoint` (`"latest"`, a folder name or a path) to a checkpoint path, or None.

    `"latest"` with no checkpoint yet starts a fresh run; a named checkpoint that does not exist is an error.
    """
    if resume_from_checkpoint is None:
        return None
    if resume_from_checkpoint == "latest":
        found = list_checkpoints(output_dir)
        return os.path.join(output_dir, found[-1]) if found else None
    path = resume_from_checkpoint
    if not os.path.isdir(path):
        path = os.path.join(output_dir, resume_from_checkpoint)
    if not os.path.isdir(path):
        raise ValueError(
            f"--resume_from_checkpoint {resume_from_checkpoint!r} is not a checkpoint folder; expected 'latest', "
            f"a path, or a name in {output_dir!r} ({list_checkpoints(output_dir) or 'none there'})."
        )
    return path


def checkpoint_step(path: str) -> int:
    """The global step a `checkpoint-<step>` folder was saved at."""
    match = re.search(rf"{CHECKPOINT_PREFIX}(\d+)$", os.path.normpath(path))
    if match is None:
        raise ValueError(f"checkpoint folder {path!r} is not named '{CHECKPOINT_PREFIX}<step>'.")
    return int(match.group(1))


def save_checkpoint(accelerator, output_dir: str, step: int, total_limit: int | None = None) -> str:
    """Save the accelerator state as `output_dir/checkpoint-<step>` without ever losing the last good one.

    The state is written to a temporary folder and renamed into place once complete; older checkpoints beyond
    `total_limit` are removed only after that. Call on every process.
    """
    check_positive_int("total_limit", total_limit, optional=True, expected="None (keep all) or an int >= 1")
    final = os.path.join(output_dir, f"{CHECKPOINT_PREFIX}{step}")
    partial = final + ".partial"
    if accelerator.is_main_process and os.path.isdir(partial):
        shutil.rmtree(partial)
    accelerator.wait_for_everyone()
    accelerator.save_state(partial)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.replace(partial, final)
        if total_limit is not None:
            for old in list_checkpoints(output_dir)[:-total_limit]:
                shutil.rmtree(os.path.join(output_dir, old))
    accelerator.wait_for_everyone()
    return final


class GeneratorState:
    """A `torch.Generator` as a checkpointable object (`state_dict` / `load_state_dict`), for
    `accelerator.register_for_checkpointing`: a script that draws from one running generator resumes its draws
    exactly where the checkpoint left them."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["state"])


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


def log_and_checkpoint(accelerator, args, step: int, logs: dict, logger=None) -> str | None:
    """The end of one optimizer step in the pack's scripts: `accelerator.log(logs)` every `args.logging_steps` and a
    checkpoint (`save_checkpoint`, keeping `args.checkpoints_total_limit`) every `args.checkpointing_steps`, both
    also at the last step `args.max_train_steps`. Returns the checkpoint's path when one was saved."""
    last = step == args.max_train_steps
    if step % args.logging_steps == 0 or last:
        accelerator.log(logs, step=step)
    if step % args.checkpointing_steps == 0 or last:
        path = save_checkpoint(accelerator, args.output_dir, step, args.checkpoints_total_limit)
        if logger is not None:
            logger.info(f"Saved {path}")
        return path
    return None


def command_line() -> str:
    """The command that started this process, as a user would retype it (launcher included).

    accelerate's launchers set `ACCELERATE_MIXED_PRECISION`; a bare `torchrun` sets only `LOCAL_RANK` and
    `LOCAL_WORLD_SIZE` (with `ACCELERATE_USE_CPU=true` for CPU processes), so the two are told apart.
    """
    argv = [os.path.relpath(sys.argv[0]) if os.path.isabs(sys.argv[0]) else sys.argv[0], *sys.argv[1:]]
    processes = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if "ACCELERATE_MIXED_PRECISION" in os.environ:
        launcher = "accelerate launch" + (f" --multi_gpu --num_processes {processes}" if processes != "1" else "")
    elif "LOCAL_RANK" in os.environ:
        cpu = "ACCELERATE_USE_CPU=true " if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") else ""
        launcher = f"{cpu}torchrun --standalone --nproc_per_node {processes}"
    else:
        launcher = "python"
    return " ".join([launcher, *argv])


def base_model_license(base_model: str) -> str:
    """The `license` of `base_model`'s model card (its `README.md` front matter, read from the folder or the Hub):
    weights fine-tuned from it carry its licence, not the pack's. `"other"` when the card names none, or when the
    Hub can not be reached (a warning says so)."""
    import logging

    from huggingface_hub import metadata_load

    card = os.path.join(base_model, "README.md")
    if os.path.isdir(base_model):
        metadata = metadata_load(card) if os.path.isfile(card) else None
    else:
        try:
            from huggingface_hub import model_info

            data = model_info(base_model).card_data
            metadata = data.to_dict() if data is not None else None
        except Exception as error:  # offline, gated or unknown: the card says "other" and the log says why
            logging.getLogger(__name__).warning(f"licence of {base_model!r} unknown ({error}); writing 'other'.")
            metadata = None
    license = (metadata or {}).get("license")
    return license if isinstance(license, str) and license else "other"


def write_model_card(
    output_dir: str,
    title: str,
    description: str,
    command: str,
    metrics: dict[str, float] | None = None,
    tags: list[str] | None = None,
    base_model: str | None = None,
    license: str | None = None,
) -> str:
    """Write a Hub-style `README.md` model card (YAML front matter + text) into `output_dir`; return its path.

    `license` defaults to the base model's ([`base_model_license`]) when there is one, else `apache-2.0` (weights
    trained from scratch by the pack's Apache-2.0 scripts).
    """
    if license is None:
        license = base_model_license(base_model) if base_model else "apache-2.0"
    lines = ["---", "library_name: diffusers", f"license: {license}"]
    if base_model:
        lines.append(f"base_model: {base_model}")
    lines.append("tags:")
    lines += [f"- {tag}" for tag in ["diffusers", "diffusers-ext", *(tags or [])]]
    lines += [
        "---",
        "",
        f"# {title}",
        "",
        description.strip(),
        "",
        "## How it was made",
        "",
        "```bash",
        command,
        "```",
    ]
    if metrics:
        lines += ["", "## Measured quality", "", "| metric | value |", "| --- | --- |"]
        lines += [
            f"| {name} | {value:.4g} |" if isinstance(value, float) else f"| {name} | {value} |"
            for name, value in metrics.items()
        ]
    path = os.path.join(output_dir, "README.md")
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


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


def maybe_resume(accelerator, output_dir: str, resume_from_checkpoint: str | None, logger=None) -> int:
    """Load the checkpoint `--resume_from_checkpoint` names (if any) into `accelerator`; return its global step."""
    path = resolve_resume_checkpoint(output_dir, resume_from_checkpoint)
    if path is None:
        if resume_from_checkpoint == "latest" and logger is not None:
            logger.info(f"No checkpoint in {output_dir}; starting a new run.")
        return 0
    if logger is not None:
        logger.info(f"Resuming from {path}")
    accelerator.load_state(path)
    return checkpoint_step(path)


def output_dir_arg(value: str) -> str:
    """The argparse `type=` of `--output_dir`: a folder, or a path where one can be created (see
    [`~diffusers_ext.utils.check_output_dir`]), so that a file there fails at parse time, not at the first save."""
    try:
        check_output_dir("--output_dir", value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--output_dir ")) from None
    return value


def add_accelerate_arguments(parser, checkpointing_steps: int = 500, checkpoints_total_limit: int | None = None):
    """Add the flags every training script shares: mixed precision, checkpoints, resume and trackers.

    `parser` is an `argparse.ArgumentParser` or one of its argument groups; the defaults of the two checkpoint
    flags differ between scripts.
    """
    parser.add_argument(
        "--mixed_precision",
        type=str,
        default=None,
        choices=["no", "fp16", "bf16"],
        help="Overrides accelerate's config.",
    )
    parser.add_argument(
        "--checkpointing_steps", type=int, default=checkpointing_steps, help="Save a checkpoint every N steps."
    )
    parser.add_argument(
        "--checkpoints_total_limit",
        type=positive_int_arg,
        default=checkpoints_total_limit,
        help="Keep at most N checkpoints (the newest; N >= 1). Default: keep all.",
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        type=str,
        default=None,
        help="'latest', a checkpoint folder name in output_dir, or a path.",
    )
    parser.add_argument(
        "--report_to",
        type=str,
        default="tensorboard",
        help="accelerate tracker: 'tensorboard', 'wandb', 'all' or 'none'.",
    )
    parser.add_argument("--logging_dir", type=str, default="logs", help="Tracker folder, relative to output_dir.")
    add_hub_arguments(parser)


def add_hub_arguments(parser):
    """`--push_to_hub`, `--hub_model_id` and `--hub_token`, as in diffusers' examples (read by [`maybe_push_to_hub`])."""
    parser.add_argument("--push_to_hub", action="store_true", help="Upload the result to the Hub at the end.")
    parser.add_argument(
        "--hub_model_id", type=str, default=None, help="Hub repository (default: the output folder's name)."
    )
    parser.add_argument("--hub_token", type=str, default=None, help="Hub token (default: the logged-in one).")


HUB_IGNORE_PATTERNS = [f"{CHECKPOINT_PREFIX}*", "*.partial", "logs/*", "step_*", "epoch_*"]


def push_to_hub(output_dir: str, hub_model_id: str | None = None, hub_token: str | None = None, logger=None) -> str:
    """Create the Hub repository `hub_model_id` (default: `output_dir`'s folder name) if needed and upload
    `output_dir` to it without checkpoints or tracker logs (`HUB_IGNORE_PATTERNS`); return the repository id."""
    from huggingface_hub import create_repo, upload_folder

    repo_id = hub_model_id or os.path.basename(os.path.abspath(output_dir))
    repo_id = create_repo(repo_id, exist_ok=True, token=hub_token).repo_id
    upload_folder(
        repo_id=repo_id,
        folder_path=output_dir,
        commit_message="End of training",
        ignore_patterns=HUB_IGNORE_PATTERNS,
        token=hub_token,
    )
    if logger is not None:
        logger.info(f"Pushed {output_dir} to https://huggingface.co/{repo_id}")
    return repo_id


def maybe_push_to_hub(args, logger=None) -> str | None:
    """[`push_to_hub`] with a script's `--output_dir`, `--hub_model_id` and `--hub_token` when `--push_to_hub` is
    set (call on the main process, after the result and its model card are written); None otherwise."""
    if not getattr(args, "push_to_hub", False):
        return None
    return push_to_hub(args.output_dir, args.hub_model_id, args.hub_token, logger)


def add_optimizer_arguments(
    parser,
    learning_rate: float,
    lr_scheduler: str,
    lr_warmup_steps: int,
    weight_decay: float,
    max_grad_norm: float | None = 1.0,
):
    """Add the AdamW + learning-rate-schedule flags our training scripts share (the names of diffusers' examples).

    `parser` is an `argparse.ArgumentParser` or one of its argument groups; the defaults differ between scripts.
    [`build_optimizer`] reads the flags back.
    """
    parser.add_argument("--learning_rate", type=float, default=learning_rate, help="Peak learning rate.")
    parser.add_argument(
        "--lr_scheduler",
        type=str,
        default=lr_scheduler,
        help="A diffusers.optimization scheduler name ('cosine', 'constant_with_warmup', ...).",
    )
    parser.add_argument("--lr_warmup_steps", type=int, default=lr_warmup_steps, help="Warm-up optimizer steps.")
    parser.add_argument("--adam_beta1", type=float, default=0.9, help="AdamW beta1.")
    parser.add_argument("--adam_beta2", type=float, default=0.999, help="AdamW beta2.")
    parser.add_argument("--adam_weight_decay", type=float, default=weight_decay, help="AdamW weight decay.")
    parser.add_argument("--adam_epsilon", type=float, default=1e-8, help="AdamW epsilon.")
    parser.add_argument(
        "--max_grad_norm", type=float, default=max_grad_norm, help="Gradient clipping norm (none: no clipping)."
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


@torch.no_grad()
def encode_posteriors(vae, images: torch.Tensor, device, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior means and standard deviations `(N, C, h, w)` each (float32, on the CPU) of uint8 images
    `(N, 3, H, W)`, encoded `batch_size` at a time on `device`; training draws latents `mean + std * noise` from them
    without running the encoder every step."""
    means, stds = [], []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size].to(device).float() / 127.5 - 1
        posterior = vae.encode(x).latent_dist
        means.append(posterior.mean.float().cpu())
        stds.append(posterior.std.float().cpu())
    return torch.cat(means), torch.cat(stds)


class AutoencoderStep(torch.nn.Module):
    """An `AutoencoderKL`'s training forward as one module (one forward, so that data-parallel training syncs all
    of its gradients)."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, images: torch.Tensor, eps: torch.Tensor):
        """`images` `(B, 3, H, W)` in [-1, 1], `eps` `(B, C, h, w)` -> reconstructions `(B, 3, H, W)` of the
        reparameterised latents and the per-sample KL `(B,)` to the standard normal."""
        posterior = self.vae.encode(images).latent_dist
        reconstruction = self.vae.decode(posterior.mean + posterior.std * eps).sample
        return reconstruction, posterior.kl()


class TextConditionedDenoiser(torch.nn.Module):
    """A text encoder and a `UNet2DConditionModel` trained together, as one module (one forward for data-parallel
    training)."""

    def __init__(self, unet, text_encoder):
        super().__init__()
        self.unet = unet
        self.text_encoder = text_encoder

    def forward(self, noisy: torch.Tensor, timesteps: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """`noisy` `(B, C, h, w)`, `timesteps` `(B,)`, `input_ids` `(B, L)` -> the UNet's prediction `(B, C, h, w)`."""
        return self.unet(noisy, timesteps, self.text_encoder(input_ids)[0]).sample


# --------------------------------------------------------------------------------------------------------------------
# Validation during training (diffusers' examples: `--validation_prompt`, `--num_validation_images`,
# `--validation_steps`), logged to the trackers and saved under `output_dir/validation/`.

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


def add_option_aliases(parser, aliases: dict[str, str]) -> None:
    """Make `parser` (a TRL/`HfArgumentParser`) also answer to diffusers-examples names: `aliases` maps an alias
    (`"--max_train_steps"`) to an existing option (`"--max_steps"`), whose destination, type and choices it shares.
    The alias sets no default of its own, so the original's default (or a `--config` file's) stays."""
    by_option = {option: action for action in parser._actions for option in action.option_strings}
    for alias, original in aliases.items():
        action = by_option.get(original)
        if action is None:
            raise ValueError(f"`aliases`: {original!r} (for {alias!r}) is not an option of this parser.")
        if alias in by_option:
            continue
        kwargs = {"dest": action.dest, "default": argparse.SUPPRESS, "help": f"Alias of {original}."}
        if action.nargs == 0:  # store_true / store_const
            kwargs.update(action="store_const", const=action.const)
        else:
            kwargs.update(type=action.type, nargs=action.nargs, choices=action.choices, metavar=action.metavar)
            if action.nargs == "?":  # HfArgumentParser's booleans: `--flag` alone means its const
                kwargs["const"] = action.const
        parser.add_argument(alias, **kwargs)


# The diffusers-examples names that the TRL-style scripts (train_grpo.py, train_unlearning.py) also accept for
# their config's TrainingArguments-style fields.
TRL_OPTION_ALIASES = {
    "--max_train_steps": "--max_steps",
    "--train_batch_size": "--per_device_train_batch_size",
    "--adam_weight_decay": "--weight_decay",
    "--checkpointing_steps": "--save_steps",
    "--checkpoints_total_limit": "--save_total_limit",
}


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


def save_model_state_dict(model, state_dict: dict[str, torch.Tensor], save_directory: str) -> None:
    """Write a diffusers model folder (`config.json` + safetensors shards, what `model.save_pretrained` writes) from
    a full `state_dict` gathered off sharded processes (FSDP, DeepSpeed ZeRO-3), where `model` itself holds only
    a shard; loadable with `type(model).from_pretrained(save_directory)`."""
    from diffusers.utils import SAFETENSORS_WEIGHTS_NAME
    from huggingface_hub import save_torch_state_dict

    os.makedirs(save_directory, exist_ok=True)
    model.save_config(save_directory)
    # diffusers' names: diffusion_pytorch_model[-0000k-of-0000n].safetensors and its .safetensors.index.json
    stem, extension = SAFETENSORS_WEIGHTS_NAME.rsplit(".", 1)
    save_torch_state_dict(
        {k: v.detach().cpu().contiguous() for k, v in state_dict.items()},
        save_directory,
        filename_pattern=f"{stem}{{suffix}}.{extension}",
        max_shard_size="10GB",
    )


def tokenize_captions(tokenizer, captions: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(token_ids (N, max_length), empty_ids (1, max_length))` of `captions` and of the empty prompt, padded to
    `max_length`; a `ValueError` if a caption has a word outside the tokenizer's vocabulary or does not fit."""
    if any(token == tokenizer.unk_token for caption in captions for token in tokenizer.tokenize(caption)):
        raise ValueError("the captions hold words outside the mosaic vocabulary (`mosaic_vocabulary()`).")
    longest = max(len(ids) for ids in tokenizer(captions).input_ids)
    if longest > max_length:
        raise ValueError(f"a caption has {longest} tokens; raise --max_length (now {max_length}).")
    token_ids = tokenizer(captions, padding="max_length", max_length=max_length, return_tensors="pt").input_ids
    empty_ids = tokenizer([""], padding="max_length", max_length=max_length, return_tensors="pt").input_ids
    return token_ids, empty_ids
