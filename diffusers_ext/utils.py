"""Small helpers shared across the package."""

import argparse
import json
import math
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


def check_finite(
    name: str,
    value,
    minimum: float | None = None,
    maximum: float | None = None,
    greater_than: float | None = None,
    expected: str | None = None,
    scalar: bool = False,
) -> None:
    """Raise a `ValueError` naming the argument `name`, the first bad entry's index and its value unless every entry
    of `value` is finite (and, where given, `>= minimum`, `<= maximum`, `> greater_than`): "`start` must hold finite
    numbers, got nan at index 1." A `TypeError` when `value` is not a real number (a bool, a string, None) or an
    array of them. The package's one check of "a finite number, tensor or array": NaN compares false with
    everything, so a range check alone (`radius > 0`) lets it through, and a NaN input gives NaN outputs silently.

    Args:
        name (`str`): the argument's name as the caller's user writes it (`"obstacles[:, 2]"` for a column).
        value: a number, a `torch.Tensor` (checked on its own device), a `numpy.ndarray` or a nested sequence of
            numbers.
        minimum, maximum (`float`, *optional*): inclusive bounds.
        greater_than (`float`, *optional*): an exclusive lower bound (a radius, a scale).
        expected (`str`, *optional*): the words for what was expected where the default ("finite numbers >= 0")
            says less than the caller's (`"finite radii > 0"`).
        scalar (`bool`, defaults to `False`): accept only a number (a `guidance_scale`), not an array.
    """
    import sys
    from numbers import Real

    bounds = []
    if greater_than is not None:
        bounds.append(f"> {greater_than:g}")
    if minimum is not None and maximum is not None:
        bounds.append(f"in [{minimum:g}, {maximum:g}]")
    elif minimum is not None:
        bounds.append(f">= {minimum:g}")
    elif maximum is not None:
        bounds.append(f"<= {maximum:g}")
    suffix = "".join(f" {b}" for b in bounds)
    torch = sys.modules.get("torch")
    if isinstance(value, Real) and not isinstance(value, bool):
        number = float(value)
        ok = math.isfinite(number)
        ok = ok and (minimum is None or number >= minimum) and (maximum is None or number <= maximum)
        ok = ok and (greater_than is None or number > greater_than)
        if not ok:
            raise ValueError(f"`{name}` must be {expected or 'a finite number' + suffix}, got {number!r}.")
        return
    if scalar:
        raise TypeError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).")
    expected = expected or "finite numbers" + suffix
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"`{name}` must hold {expected}, got a {value.dtype} tensor.")
        if not value.is_floating_point() and minimum is None and maximum is None and greater_than is None:
            return  # integers are finite
        tensor = value.detach()
        bad = ~torch.isfinite(tensor) if tensor.is_floating_point() else torch.zeros_like(tensor, dtype=torch.bool)
        for bound, failed in ((minimum, lambda t, b: t < b), (maximum, lambda t, b: t > b)):
            if bound is not None:
                bad |= failed(tensor, bound)
        if greater_than is not None:
            bad |= tensor <= greater_than
        if not bool(bad.any()):
            return
        flat = int(bad.flatten().nonzero()[0])
        shape, entry = tuple(tensor.shape), tensor.flatten()[flat].item()
    else:
        import numpy as np

        try:
            array = np.asarray(value)
            if array.dtype == bool or not (np.issubdtype(array.dtype, np.number) or array.dtype == object):
                raise TypeError
            if array.dtype == object and not all(
                isinstance(v, Real) and not isinstance(v, bool) for v in array.reshape(-1)
            ):
                raise TypeError
            array = array.astype(np.float64)
        except (TypeError, ValueError):
            got = f"a {value.dtype} array" if isinstance(value, np.ndarray) else f"{value!r} ({type(value).__name__})"
            raise TypeError(f"`{name}` must be a number or an array of numbers, got {got}.") from None
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(array)
            if minimum is not None:
                bad |= array < minimum
            if maximum is not None:
                bad |= array > maximum
            if greater_than is not None:
                bad |= array <= greater_than
        if not bad.any():
            return
        flat = int(np.flatnonzero(bad)[0])
        shape, entry = array.shape, array.reshape(-1)[flat].item()
    where = f" at index {_unravel(flat, shape)}" if shape else ""
    entry = f"{entry:.7g}" if isinstance(entry, float) else repr(entry)  # a float32's -0.2, not -0.20000000298...
    raise ValueError(f"`{name}` must hold {expected}, got {entry}{where}.")


def _unravel(flat: int, shape: tuple) -> str:
    """The index of the `flat`-th entry of an array of `shape`, as a user writes it: `3` in 1-D, `(0, 2)` beyond."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    index = tuple(reversed(index))
    return str(index[0]) if len(index) == 1 else str(index)


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


def saved_folder_class(path: str | os.PathLike) -> tuple[str, str] | None:
    """What a saved folder holds, read from its JSON alone (nothing is loaded): `("pipeline", class name)` from a
    `model_index.json`, `("model", class name)` from a `config.json`, `("scheduler", class name)` from a
    `scheduler_config.json`; None for a folder with none of them (or unreadable ones)."""
    for kind, file in (
        ("pipeline", "model_index.json"),
        ("model", "config.json"),
        ("scheduler", "scheduler_config.json"),
    ):
        try:
            with open(os.path.join(path, file), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        name = config.get("_class_name") if isinstance(config, dict) else None
        if kind == "model" and name is None and isinstance(config, dict) and "architectures" in config:
            name = config["architectures"][0] if config["architectures"] else None  # a transformers model
        if isinstance(name, str):
            return kind, name
    return None


def check_saved_folder(argument: str, path, kind: str, classes: tuple[str, ...] = (), example: str = "") -> str:
    """Raise a `ValueError` naming `argument` (a flag such as `"--classifier_path"`) unless the folder `path` holds a
    saved `kind` (`"pipeline"`, `"model"` or `"scheduler"`), of one of `classes` when given; return its class name.
    The message says what the folder holds instead ("holds a StableDiffusionPipeline pipeline (model_index.json),
    not a ConvImageClassifier model folder"), so a wrong folder fails before any weights load, not inside
    `from_pretrained` or the first forward. `example` is appended as "e.g. ..."."""
    files = {"pipeline": "model_index.json", "model": "config.json", "scheduler": "scheduler_config.json"}
    wanted = f"{' or '.join(classes)} {kind} folder" if classes else f"{kind} folder"
    wanted = ("an " if wanted[0] in "AEIOUaeiou" else "a ") + wanted + f" ({files[kind]})"
    wanted += f", e.g. {example}" if example else ""
    if not os.path.isdir(path):
        raise ValueError(f"{argument} {str(path)!r} is not a folder; expected {wanted}.")
    found = saved_folder_class(path)
    if found is None:
        raise ValueError(f"{argument} {str(path)!r} holds no saved {kind} (no {files[kind]}); expected {wanted}.")
    found_kind, name = found
    if found_kind != kind or (classes and name not in classes):
        raise ValueError(f"{argument} {str(path)!r} holds a {name} {found_kind} ({files[found_kind]}), not {wanted}.")
    return name


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
