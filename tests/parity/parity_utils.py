"""What every parity check shares: the commit of a reference checkout (regeneration scripts), loading a fixture and
comparing by relative error (tests)."""

import json
import os
import subprocess
from pathlib import Path

import torch


FIXTURES = Path(__file__).parent / "fixtures"


def reference_commit(path: str | os.PathLike) -> str | None:
    """The commit of a reference checkout: `git log`, or for an exported tree without `.git` the id in a `REVISION`
    file in it or one of its two parents (e.g. `git -C MIRROR log -1 --format=%H > TREE/REVISION`)."""
    path = str(path)
    for folder in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        revision = os.path.join(folder, "REVISION")
        if os.path.isfile(revision):
            with open(revision) as f:
                return f.read().strip()
    try:
        return subprocess.run(
            ["git", "-C", path, "log", "-1", "--format=%H"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


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
