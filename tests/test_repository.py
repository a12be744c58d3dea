"""Repository contracts: CI runs the README's test command, and torchvision stays out of every install path."""

import os
import re

import tomllib


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def _readme_commands():
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", _read("README.md"), flags=re.S)]


def test_readme_opens_with_the_two_setup_commands():
    demo, tests = _readme_commands()[:2]
    assert demo.startswith("python -m pip install torch==2.13.0") and "diffusers-ext demo" in demo
    assert tests.startswith("python -m pip install torch==2.13.0") and tests.endswith(
        "python -m pytest -n 2 --dist loadfile"
    )


def test_ci_runs_the_readme_test_command_verbatim():
    ci = _read(".ci", "run").splitlines()
    test_command = _readme_commands()[1]
    assert test_command in ci
    assert ci.index("python -m pip install torch==2.13.0") < ci.index(test_command)
    assert "ruff check ." in ci


def test_no_torchvision_anywhere_in_the_install_path():
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    assert not any(r.lower().startswith("torchvision") for r in requirements)


def test_ci_runs_the_demo_from_a_bare_install_first():
    ci = _read(".ci", "run")
    lines = ci.splitlines()
    venv = lines.index('python -m venv "$bare/venv"')  # bare: no --system-site-packages, no extras
    assert "--system-site-packages" not in ci
    assert lines.index('"$bare/venv/bin/python" -m pip install --quiet -e .') > venv
    demo = lines.index('"$bare/venv/bin/diffusers-ext" demo --quick --output_dir "$bare/report"')
    assert demo < lines.index(_readme_commands()[1])  # before the test extras are installed
    assert "set -euo pipefail" in lines
