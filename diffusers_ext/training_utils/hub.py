"""Pushing a training result (and its model card) to the Hugging Face Hub, as diffusers' examples do with `--push_to_hub`."""

import os

from .checkpoints import CHECKPOINT_PREFIX


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
