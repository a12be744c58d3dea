"""Comparing pipeline outputs and counting model forwards, for the conformance suites and tests."""

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput


def output_to_numpy(output: Any) -> np.ndarray:
    """Convert a pipeline output to a numpy array, for comparisons.

    A `BaseOutput` or a `return_dict=False` tuple contributes its first element. Tensors become arrays (floating
    ones as float32), a list of PIL images becomes a `(batch, height, width, channels)` uint8 array, and a list of
    strings an array of strings.
    """
    if isinstance(output, (BaseOutput, tuple)):
        output = output[0]
    if isinstance(output, torch.Tensor):
        output = output.detach().cpu()
        return (output.float() if output.is_floating_point() else output).numpy()
    if isinstance(output, np.ndarray):
        return output
    if isinstance(output, PIL.Image.Image):
        return np.asarray(output)
    if isinstance(output, list) and output and all(isinstance(x, str) for x in output):
        return np.asarray(output)
    if isinstance(output, list) and output:
        return np.stack([output_to_numpy(item) for item in output])
    raise TypeError(f"cannot convert a pipeline output of type {type(output).__name__} to numpy.")


@contextlib.contextmanager
def count_module_forwards(pipe: DiffusionPipeline) -> Iterator[dict[str, int]]:
    """Count the forward calls of every `torch.nn.Module` component of `pipe` while the block runs.

    Yields a dict `{component_name: number_of_forward_calls}`, updated live; the hooks are removed on exit.
    """
    counts: dict[str, int] = {}
    handles = []
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            counts[name] = 0

            def hook(module, args, name=name):
                counts[name] += 1

            handles.append(component.register_forward_pre_hook(hook))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def assert_outputs_close(actual: np.ndarray, expected: np.ndarray, atol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if np.issubdtype(actual.dtype, np.inexact):
        max_diff = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max(initial=0.0))
        assert max_diff <= atol, f"{what}: max abs difference {max_diff:.3g} > atol {atol:g}"
    else:
        assert np.array_equal(actual, expected), f"{what}: arrays differ"


def outputs_differ(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    if a.shape != b.shape:
        return True
    if np.issubdtype(a.dtype, np.inexact):
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0)) > atol
    return not np.array_equal(a, b)
