"""Small helpers shared across the package."""

import argparse
import os
from typing import TYPE_CHECKING, TypeVar


if TYPE_CHECKING:
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
    """Whether `value` is an `int` or a `float`, not a `bool` and not NaN (NaN compares false with everything, so a
    range check such as `guidance_scale > 1` would silently pass it through as "off")."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def check_positive_int(
    name: str,
    value,
    minimum: int = 1,
    error: type[Exception] = ValueError,
    optional: bool = False,
    expected: str | None = None,
) -> None:
    """Raise `error` (a `ValueError` by default) naming the argument `name` unless `value` is an int (not a bool)
    of at least `minimum` (or `None`, when `optional`): "`name` must be a positive int, got value." ("an int >=
    minimum" for another minimum, "... or None" when optional). The package's one check of a count, a size or an
    index: `tests/test_formula_homes.py` fails on a hand-written copy.

    Args:
        name (`str`): the argument's name, as the caller's user writes it.
        value: the value given.
        minimum (`int`, defaults to 1): the smallest value accepted (0 for an index or a count that may be zero).
        error (`type[Exception]`, defaults to `ValueError`): what to raise (`TypeError` where a wrong type is one).
        optional (`bool`, defaults to `False`): whether `None` is accepted too (an option left unset).
        expected (`str`, *optional*): the words for what was expected, where the caller's say more than the default
            (`"a positive int (the support size n)"`).
    """
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        if expected is None:
            expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            expected += " or None" if optional else ""
        raise error(f"`{name}` must be {expected}, got {value!r}.")


def check_output_dir(name: str, path) -> None:
    """Raise a `ValueError` naming the argument `name` (a field name, or a flag such as `"--output_dir"`) unless
    `path` is a folder or can be created as one: an existing file (at `path` or at one of its parents) or a parent
    folder without write access is refused, so a run fails before its work rather than at its first save."""
    label = name if name.startswith("-") else f"`{name}`"
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"{label} must be a folder path, got {path!r}.")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{label} {path!r} is an existing file, not a folder; give a folder path.")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{label} {path!r} cannot be created: {existing!r} is a file, not a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{label} {path!r} cannot be written: no write permission in {existing!r}.")


def positive_int_arg(value: str) -> int:
    """The argparse `type=` of a count or side length that must be >= 1 (a 0 would otherwise read as "off" or
    "all", e.g. `--checkpoints_total_limit 0` keeping every checkpoint)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {number}")
    return number


def positive_float_arg(value: str) -> float:
    """The argparse `type=` of a finite number that must be > 0 (a rate, a budget)."""
    return _float_arg(value, allow_zero=False)


def nonnegative_float_arg(value: str) -> float:
    """The argparse `type=` of a finite number that must be >= 0 (a weight that 0 switches off)."""
    return _float_arg(value, allow_zero=True)


def _float_arg(value: str, allow_zero: bool) -> float:
    import math

    expected = "a finite number >= 0" if allow_zero else "a finite number > 0"
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {number}")
    return number


def exact_dtype(device) -> "torch.dtype":
    """The dtype of small exact-as-possible bookkeeping (beam scores, camera geometry) on `device`: float64, or
    float32 on Apple's MPS, which has no float64."""
    import torch  # here, so that importing the package's small helpers stays free of torch

    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def synchronized_perf_counter(device) -> float:
    """`time.perf_counter()` once the work queued on `device` has finished: CUDA, MPS and XPU run kernels
    asynchronously, so a reading without a synchronise times the launches, not the work. On the CPU, a plain reading."""
    import time

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)
    return time.perf_counter()
