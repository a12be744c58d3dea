"""Small helpers shared across the package."""

from typing import TypeVar

import torch


T = TypeVar("T", bound=type)

PUBLIC_MODULE = "diffusers_ext"


def public(cls: T) -> T:
    """Mark ``cls`` as part of the public API: pin its ``__module__`` to ``"diffusers_ext"``.

    diffusers writes ``cls.__module__`` into a saved pipeline's ``model_index.json`` for classes outside
    diffusers and transformers. Pinning it to the package name keeps saved folders loadable when a file moves.
    """
    cls.__module__ = PUBLIC_MODULE
    return cls


def is_int(value) -> bool:
    """Whether `value` is an `int` and not a `bool` (`True` is an `int` in Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """Whether `value` is an `int` or a `float` and not a `bool`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(name: str, value, minimum: int = 1, error: type[Exception] = ValueError) -> None:
    """Raise `error` (a `ValueError` by default) naming the argument `name` unless `value` is an int (not a bool)
    of at least `minimum`: "`name` must be a positive int, got value." (or "an int >= minimum" for another
    minimum)."""
    if not is_int(value) or value < minimum:
        expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise error(f"`{name}` must be {expected}, got {value!r}.")


def exact_dtype(device) -> torch.dtype:
    """The dtype of small exact-as-possible bookkeeping (beam scores, camera geometry) on `device`: float64, or
    float32 on Apple's MPS, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64
