"""The model card written beside every trained result: the command that made it and the base model's licence."""

import os
import sys


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
