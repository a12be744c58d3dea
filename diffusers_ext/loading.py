"""Load any saved pipeline folder whose class is ours or a diffusers pipeline."""

import importlib
import json
import os

from diffusers import DiffusionPipeline


def _pipeline_class_name(path: str | os.PathLike) -> str:
    index_file = os.path.join(path, "model_index.json")
    if not os.path.isdir(path):
        raise ValueError(f"`path` {str(path)!r} is not a folder; expected a saved pipeline folder.")
    if not os.path.isfile(index_file):
        raise ValueError(f"`path` {str(path)!r} has no model_index.json; expected a saved pipeline folder.")
    with open(index_file, encoding="utf-8") as f:
        try:
            index = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{index_file} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}); "
                "a saved pipeline folder's model_index.json is a JSON object."
            ) from None
    class_name = index.get("_class_name") if isinstance(index, dict) else None
    if not isinstance(class_name, str):
        raise ValueError(f"{index_file} has no `_class_name` string; got {class_name!r}.")
    return class_name


def resolve_pipeline_class(class_name: str) -> type[DiffusionPipeline]:
    """Return the pipeline class named ``class_name``: ours first, then diffusers'."""
    for module_name in ("diffusers_ext", "diffusers"):
        module = importlib.import_module(module_name)
        try:
            cls = getattr(module, class_name)
        except (AttributeError, ModuleNotFoundError):
            continue
        if isinstance(cls, type) and issubclass(cls, DiffusionPipeline):
            return cls
    raise ValueError(
        f"`_class_name` {class_name!r} is neither a diffusers_ext nor a diffusers pipeline class; "
        "expected e.g. 'ClassConditionalDDPMPipeline' or 'DDPMPipeline'."
    )


# Saved folders name every class of the package ["diffusers_ext", Class]. Most are top-level names; models that only
# measure (e.g. EmpiricalOptimalDenoiser, which a MultiDenoiserModel may hold) are exported by diffusers_ext.evaluation.
_OUR_NAMESPACES = ("diffusers_ext", "diffusers_ext.evaluation")


def resolve_model_class(library: str, class_name: str) -> type:
    """Return the class a saved folder names as `[library, class_name]`, for `library` "diffusers" or "diffusers_ext".

    A "diffusers_ext" class is looked up in the top-level API, then in ``diffusers_ext.evaluation``, so folders saved
    before a class moved between the two still load.
    """
    namespaces = {"diffusers": ("diffusers",), "diffusers_ext": _OUR_NAMESPACES}.get(library)
    if namespaces is None:
        raise ValueError(f"library {library!r} is not resolved; expected 'diffusers' or 'diffusers_ext'.")
    for module_name in namespaces:
        cls = getattr(importlib.import_module(module_name), class_name, None)
        if isinstance(cls, type):
            return cls
    raise ValueError(f"{class_name!r} is not a class of {library!r} (looked in {', '.join(namespaces)}).")


def load_pipeline(path: str | os.PathLike, **kwargs) -> DiffusionPipeline:
    """Load a saved pipeline folder whose ``_class_name`` is a diffusers_ext or diffusers pipeline.

    This reads the folder's ``model_index.json`` and calls ``from_pretrained`` on the right class, so a folder's
    own class loader runs (e.g. `DivideAndDenoisePipeline`'s `variant=` handling). diffusers' generic
    ``DiffusionPipeline.from_pretrained(folder)`` also resolves the pack's pipeline classes once ``diffusers_ext``
    is imported (see `diffusers_ext._lazy_module.register_pipeline_names`).

    Args:
        path (`str` or `os.PathLike`): a local folder written by `save_pretrained`.
        **kwargs: passed on to `from_pretrained` (e.g. `torch_dtype`).
    """
    class_name = _pipeline_class_name(path)
    return resolve_pipeline_class(class_name).from_pretrained(path, **kwargs)
