"""Print pip constraints that pin the Hugging Face packages to the lowest versions `pyproject.toml` allows.

CI installs the package under these constraints in a fresh virtual environment, so a lower bound that no longer
works (an API the code uses that the oldest allowed release lacks) fails there instead of on a user's machine:

    python .ci/lowest_constraints.py > lowest.txt && python -m pip install -e ".[rl]" -c lowest.txt

Only the packages whose APIs the library leans on are pinned; torch stays at the README's pin.
"""

import re
import sys
from pathlib import Path

import tomllib


PINNED = ("diffusers", "transformers", "accelerate", "peft", "datasets", "trl")


def lowest_constraints(pyproject: Path) -> list[str]:
    """`["diffusers==0.42", ...]`: each `PINNED` package at the `>=` bound of its first requirement in the
    project's dependencies or extras. Raises a `ValueError` for a package without a `>=` bound."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    constraints = []
    for name in PINNED:
        bounds = [m.group(1) for r in requirements if (m := re.fullmatch(rf"{name}\s*>=\s*([\w.]+)", r.strip()))]
        if not bounds:
            raise ValueError(f"pyproject.toml declares no `{name}>=` lower bound.")
        constraints.append(f"{name}=={bounds[0]}")
    return constraints


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    sys.stdout.write("".join(f"{line}\n" for line in lowest_constraints(root / "pyproject.toml")))
