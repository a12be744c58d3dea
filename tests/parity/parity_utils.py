"""What every parity check shares: the commit of a reference checkout (regeneration scripts), loading a fixture and
comparing by relative error (tests)."""

import json
import os
from pathlib import Path

import torch

from diffusers_ext.evaluation.reporting import checkout_commit


FIXTURES = Path(__file__).parent / "fixtures"


def reference_commit(path: str | os.PathLike) -> str | None:
    """The commit of a reference checkout ([`checkout_commit`]: `git log`, or a `REVISION` file)."""
    return checkout_commit(path)


def load_fixture(name: str) -> dict:
    """`fixtures/<name>.json`."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


def assert_relative_close(ours, reference, name: str, tolerance: float = 1e-5) -> None:
    """`||ours - reference|| / ||reference|| <= tolerance` over all elements, in float64; shapes must agree."""
    ours = torch.as_tensor(ours, dtype=torch.float64).flatten()
    reference = torch.as_tensor(reference, dtype=torch.float64).flatten()
    assert ours.shape == reference.shape, name
    error = (ours - reference).norm() / reference.norm().clamp(min=1e-12)
    assert error <= tolerance, f"{name}: relative error {error:.3g} > {tolerance}"
