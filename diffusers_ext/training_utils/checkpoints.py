"""Checkpoints that survive an interrupted run: exact-resume batch sampling and per-step generators, atomic
`checkpoint-<step>` folders, resuming from the latest, and a diffusers model folder from a gathered state dict."""

import os
import re
import shutil
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from ..utils import check_positive_int


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
