"""Loading a saved [`DivideAndDenoisePipeline`] folder with a weight `variant`.

diffusers' `DiffusionPipeline.from_pretrained(folder, variant=...)` scans each component folder for file names of
the form `name.<variant>.ext` and fails on the nested `denoisers/denoiser_{i}/` folders of a
[`MultiDenoiserModel`]. Here the folder is scanned recursively instead: components that hold the variant are loaded
with it, and a variant found nowhere is a `ValueError` naming the variants the folder has.
"""

import importlib
import json
import os

from ...loading import resolve_model_class


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _weight_variants(folder: str) -> set[str]:
    """The variants of the weight files under `folder` (`model.fp16.safetensors` -> `"fp16"`), recursively."""
    variants = set()
    for _, _, files in os.walk(folder):
        for name in files:
            parts = name.split(".")
            if name.endswith(_WEIGHT_SUFFIXES) and len(parts) >= 3 and not parts[-2].startswith("index"):
                variants.add(parts[-2])
            elif name.endswith(".index.json") and len(parts) >= 4:  # sharded: model.safetensors.index.fp16.json
                variants.add(parts[-2])
    return variants


def load_variant_components(folder: str, variant: str, passed: set[str], **load_kwargs) -> dict:
    """The components of the saved pipeline `folder` whose weights exist in `variant`, loaded with it.

    Args:
        folder (`str`): a local folder written by `save_pretrained`.
        variant (`str`): the weight variant, e.g. `"fp16"`.
        passed (`set[str]`): components the caller passes itself (not loaded here).
        **load_kwargs: given to every component's `from_pretrained` (e.g. `dtype`).

    Raises:
        `ValueError`: when no component of `folder` has weights of `variant`.
    """
    with open(os.path.join(folder, "model_index.json"), encoding="utf-8") as f:
        index = json.load(f)
    components, available = {}, set()
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or value[0] is None:
            continue
        sub_folder = os.path.join(folder, name)
        if not os.path.isdir(sub_folder):
            continue
        variants = _weight_variants(sub_folder)
        available |= variants
        if variant not in variants or name in passed:
            continue
        library, class_name = value
        if library in ("diffusers", "diffusers_ext"):
            model_class = resolve_model_class(library, class_name)
        else:
            model_class = getattr(importlib.import_module(library), class_name)
        components[name] = model_class.from_pretrained(sub_folder, variant=variant, **load_kwargs)
    if variant not in available:
        raise ValueError(
            f"`variant` {variant!r}: no weights of that variant under {folder!r}; the folder has "
            f"{sorted(available) or 'no variant weights'} (weights saved without a variant load with variant=None)."
        )
    return components
