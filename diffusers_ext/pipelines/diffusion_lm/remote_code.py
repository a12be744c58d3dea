"""Saving and loading a [`DiffusionLMPipeline`] whose model runs its own modeling code (`trust_remote_code`).

LLaDA and Dream checkpoints ship their modeling files beside the weights (`config.json` has an `auto_map`).
transformers loads them under a generated module name (`transformers_modules.<folder>.<hash>.modeling_llada`),
which diffusers then writes into `model_index.json` as the component's library; no later process can import that
name, so the saved pipeline could not be loaded. The model's own `save_pretrained` copies the modeling files and the
`auto_map` into `model/`, so the folder is complete: this module records the component as a `transformers`
`PreTrainedModel` (what it is; diffusers checks a passed component against the recorded class) and loads it back
through the auto class that `auto_map` names for its architecture, when the caller passes `trust_remote_code`.
"""

import json
import os


REMOTE_CODE_PREFIX = "transformers_modules"


def is_remote_code_model(model) -> bool:
    """Whether `model`'s class was loaded from a checkpoint's own modeling file."""
    return type(model).__module__.split(".")[0] == REMOTE_CODE_PREFIX


def _auto_class_for(auto_map: dict, class_name: str) -> str | None:
    """The most specific auto class (`"AutoModelForCausalLM"` over `"AutoModel"`) that `auto_map` maps to
    `class_name`."""
    matches = [
        auto for auto, target in auto_map.items() if auto != "AutoConfig" and str(target).endswith(f".{class_name}")
    ]
    return max(matches, key=len) if matches else None


def remote_code_auto_class(model) -> str:
    """The `transformers` auto class whose `auto_map` entry in `model.config` names `model`'s class."""
    auto_map = getattr(model.config, "auto_map", None) or {}
    auto_class = _auto_class_for(auto_map, type(model).__name__)
    if auto_class is None:
        raise ValueError(
            f"`model` ({type(model).__name__}) runs remote code but its config's `auto_map` ({auto_map!r}) names no "
            "auto class for it, so the saved pipeline could not load it again; add the entry (e.g. 'AutoModel') to "
            "its config."
        )
    return auto_class


def record_remote_code_model(save_directory: str | os.PathLike) -> None:
    """Rewrite the `model` entry of a saved `model_index.json` as `["transformers", "PreTrainedModel"]`."""
    path = os.path.join(save_directory, "model_index.json")
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    index["model"] = ["transformers", "PreTrainedModel"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def saved_remote_code_auto_class(folder: str | os.PathLike) -> str | None:
    """The auto class to load a saved pipeline folder's `model` with, when it runs its own code (recorded by
    [`record_remote_code_model`], its `config.json` mapping its architecture in `auto_map`), else `None`."""
    index_path = os.path.join(folder, "model_index.json")
    config_path = os.path.join(folder, "model", "config.json")
    if not (os.path.isfile(index_path) and os.path.isfile(config_path)):
        return None
    with open(index_path, encoding="utf-8") as f:
        entry = json.load(f).get("model")
    if entry != ["transformers", "PreTrainedModel"]:
        return None
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    architectures = config.get("architectures") or []
    return _auto_class_for(config.get("auto_map") or {}, architectures[0]) if architectures else None


def load_remote_code_model(folder: str | os.PathLike, auto_class: str, trust_remote_code: bool, **kwargs):
    """Load `folder/model` through `transformers.<auto_class>` with its own modeling code.

    Raises a `ValueError` unless `trust_remote_code` is True: the folder's Python files run on loading, and, as in
    transformers, that must be asked for.
    """
    model_folder = os.path.join(folder, "model")
    if not trust_remote_code:
        files = sorted(f for f in os.listdir(model_folder) if f.endswith(".py"))
        raise ValueError(
            f"The saved model in {model_folder} runs its own modeling code ({', '.join(files) or 'auto_map'}); pass "
            "`trust_remote_code=True` to `from_pretrained` to load it, as transformers requires."
        )
    import transformers

    return getattr(transformers, auto_class).from_pretrained(
        model_folder, trust_remote_code=trust_remote_code, **kwargs
    )
