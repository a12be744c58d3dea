"""Input checks shared by the metrics: every check names the argument, the value given and what was expected."""

import math
from numbers import Integral, Real

import numpy as np
import torch


def to_tensor(value, name: str) -> torch.Tensor:
    """Return ``value`` (a `torch.Tensor` or `numpy.ndarray` of real numbers) as a tensor, without copying tensors."""
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, np.ndarray):
        try:
            tensor = torch.from_numpy(np.ascontiguousarray(value))
        except TypeError as err:
            raise TypeError(f"`{name}` is a numpy array of dtype {value.dtype}, which torch cannot read.") from err
    else:
        raise TypeError(f"`{name}` must be a torch.Tensor or a numpy.ndarray; got {type(value).__name__}.")
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"`{name}` has dtype {tensor.dtype}; expected a real floating or integer dtype.")
    return tensor


def to_tensors(**named) -> list[torch.Tensor]:
    """Convert each keyword argument with [`to_tensor`] and put them all on one device.

    Tensors must already share a device; numpy arrays are moved to it (to the CPU when no argument is a tensor).
    """
    devices = {name: value.device for name, value in named.items() if isinstance(value, torch.Tensor)}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"`{name}` on {device}" for name, device in devices.items())
        raise ValueError(f"The tensors are on different devices ({where}); expected them all on one device.")
    device = next(iter(devices.values())) if devices else torch.device("cpu")
    return [to_tensor(value, name).to(device) for name, value in named.items()]


def check_ndim(tensor: torch.Tensor, name: str, ndim: int, layout: str) -> None:
    if tensor.ndim != ndim:
        raise ValueError(f"`{name}` has shape {tuple(tensor.shape)} ({tensor.ndim}-D); expected a {ndim}-D {layout}.")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"`{name_a}` has shape {tuple(a.shape)} but `{name_b}` has shape {tuple(b.shape)}; expected equal shapes."
        )


def check_positive_real(value, name: str) -> float:
    """Return ``value`` as a float after checking it is a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`{name}` must be a real number; got {value!r} of type {type(value).__name__}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` is {value!r}; expected a finite number > 0.")
    return float(value)


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int after checking it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"`{name}` must be an integer; got {value!r} of type {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"`{name}` is {value!r}; expected an integer >= 1.")
    return int(value)
