"""Pushing a training result (and its model card) to the Hugging Face Hub, as diffusers' examples do with `--push_to_hub`.

[`check_hub_arguments`] runs at every script's start, so that an upload that cannot happen (offline, no or a bad
token, a malformed repository id, the Hub unreachable) fails in a second with one line naming the flag, not after
the training. [`push_to_hub`] uploads the result at the end. Both go through `huggingface_hub.HfApi` methods
(`whoami`, `create_repo`, `upload_folder`), which the tests replace with a local stand-in of the Hub.
"""

import os

from .checkpoints import CHECKPOINT_PREFIX


HUB_IGNORE_PATTERNS = [f"{CHECKPOINT_PREFIX}*", "*.partial", "logs/*", "step_*", "epoch_*"]


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` is set (read now, so a variable set after `huggingface_hub` was imported counts)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_repo_id(output_dir: str, hub_model_id: str | None) -> str:
    """The repository a result goes to: `hub_model_id`, or the output folder's name (diffusers' examples' default)."""
    return hub_model_id or os.path.basename(os.path.abspath(output_dir))


def check_hub_arguments(args, parser=None) -> str | None:
    """With `args.push_to_hub`, check before any work that the upload can happen; return the repository id (with
    the token's namespace when `--hub_model_id` has none), or None without `--push_to_hub`.

    `args` holds `push_to_hub`, `hub_model_id`, `hub_token` and `output_dir` (a script's argparse namespace, or a
    trainer config). Refused, each in one line naming the flag: `HF_HUB_OFFLINE` set (an upload cannot happen
    offline: drop `--push_to_hub` or go online); a repository id the Hub cannot take; no token (`--hub_token` or
    `hf auth login`); a token the Hub refuses, or a read-only one; the Hub unreachable. With `parser` (an
    `argparse.ArgumentParser`), the error is `parser.error` (exit code 2); else a `ValueError`.
    """
    if not getattr(args, "push_to_hub", False):
        return None
    try:
        return _check_hub(args)
    except ValueError as error:
        if parser is None:
            raise
        parser.error(str(error))


def _check_hub(args) -> str:
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, HTTPError
    from huggingface_hub.utils import validate_repo_id

    if hub_offline():
        raise ValueError(
            "--push_to_hub: HF_HUB_OFFLINE is set, so the upload to the Hub cannot happen; drop --push_to_hub (the "
            "result is saved in --output_dir either way) or unset HF_HUB_OFFLINE."
        )
    repo_id = hub_repo_id(args.output_dir, getattr(args, "hub_model_id", None))
    flag = "--hub_model_id" if getattr(args, "hub_model_id", None) else "--push_to_hub (the --output_dir folder name)"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"{flag} {repo_id!r} is not a Hub repository id ({error}); pass --hub_model_id.") from None
    if repo_id.count("/") > 1:
        raise ValueError(f"{flag} {repo_id!r} is not a Hub repository id; expected 'name' or 'namespace/name'.")
    token = getattr(args, "hub_token", None) or get_token()
    if token is None:
        raise ValueError(
            "--push_to_hub needs a Hub token with write access: pass --hub_token or log in with `hf auth login`."
        )
    source = "--hub_token" if getattr(args, "hub_token", None) else "the logged-in token"
    try:
        identity = HfApi(token=token).whoami()
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 401:
            raise ValueError(
                f"--push_to_hub: the Hub refuses {source} (401 Unauthorized); pass a valid --hub_token."
            ) from None
        raise ValueError(f"--push_to_hub: the Hub answered {status} to {source}: {error}") from None
    except (HTTPError, OSError) as error:  # no network: a connection error before any answer
        raise ValueError(
            f"--push_to_hub: the Hub cannot be reached ({type(error).__name__}: {error}); check the network, or drop "
            "--push_to_hub (or set HF_HUB_OFFLINE=1 to work offline)."
        ) from None
    role = (identity.get("auth") or {}).get("accessToken", {}).get("role")
    if role == "read":
        raise ValueError(f"--push_to_hub: {source} is read-only; the upload needs a token with write access.")
    if "/" not in repo_id and identity.get("name"):
        repo_id = f"{identity['name']}/{repo_id}"
    return repo_id


def push_to_hub(output_dir: str, hub_model_id: str | None = None, hub_token: str | None = None, logger=None) -> str:
    """Create the Hub repository `hub_model_id` (default: `output_dir`'s folder name) if needed and upload
    `output_dir` to it without checkpoints or tracker logs (`HUB_IGNORE_PATTERNS`); return the repository id.

    A failure here (the network went away during training) is a `ValueError` that says the result is safe in
    `output_dir`, not a raw connection traceback."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HTTPError

    if hub_offline():
        raise ValueError(
            f"--push_to_hub: HF_HUB_OFFLINE is set, so {output_dir!r} was not uploaded (the result is saved there)."
        )
    api = HfApi(token=hub_token)
    try:
        repo_id = api.create_repo(hub_repo_id(output_dir, hub_model_id), exist_ok=True, token=hub_token).repo_id
        api.upload_folder(
            repo_id=repo_id,
            folder_path=output_dir,
            commit_message="End of training",
            ignore_patterns=HUB_IGNORE_PATTERNS,
            token=hub_token,
        )
    except (HTTPError, OSError) as error:
        raise ValueError(
            f"--push_to_hub: the upload of {output_dir!r} failed ({type(error).__name__}: {error}); the result is "
            "saved there, upload it later with `hf upload`."
        ) from None
    if logger is not None:
        logger.info(f"Pushed {output_dir} to https://huggingface.co/{repo_id}")
    return repo_id


def maybe_push_to_hub(args, logger=None) -> str | None:
    """[`push_to_hub`] with a script's `--output_dir`, `--hub_model_id` and `--hub_token` when `--push_to_hub` is
    set (call on the main process, after the result and its model card are written); None otherwise. The script
    has checked the flags at its start with [`check_hub_arguments`]."""
    if not getattr(args, "push_to_hub", False):
        return None
    return push_to_hub(args.output_dir, args.hub_model_id, args.hub_token, logger)
