"""Repository contracts: CI runs the README's test command, and torchvision stays out of every install path."""

import os
import re

import pytest
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


def _ci_lines():
    return _read(".ci", "run").splitlines()


def _fresh_venv_before(lines, index):
    """The name of the last `fresh_venv NAME` line above `lines[index]`, or None."""
    names = [line.split()[1] for line in lines[:index] if line.startswith("fresh_venv ")]
    return names[-1] if names else None


def test_ci_runs_both_readme_commands_verbatim_each_in_its_own_fresh_venv():
    ci = _read(".ci", "run")
    lines = ci.splitlines()
    demo, tests = _readme_commands()[:2]
    assert demo in lines and tests in lines
    # each runs in an environment of its own, made just before it; the first before the test extras exist
    demo_env, tests_env = _fresh_venv_before(lines, lines.index(demo)), _fresh_venv_before(lines, lines.index(tests))
    assert demo_env and tests_env and demo_env != tests_env
    assert lines.index(demo) < lines.index(tests)
    # a fresh environment: `python -m venv` without the machine's packages, activated in the CI shell
    function = ci[ci.index("fresh_venv() {") : ci.index("\n}\n", ci.index("fresh_venv() {"))]
    assert 'python -m venv "$envs/$1"' in function and 'source "$envs/$1/bin/activate"' in function
    assert "--system-site-packages" not in ci
    assert "set -euo pipefail" in lines
    # the demo's report is checked, and lint runs
    assert "python .ci/check_demo_report.py demo_output/index.html default" in lines
    assert "ruff check ." in lines and "ruff format --check ." in lines


def test_ci_tries_the_declared_lower_bounds_in_a_fresh_venv():
    lines = _ci_lines()
    install = 'python -m pip install -e ".[rl]" -c "$envs/lowest.txt"'
    assert install in lines and _fresh_venv_before(lines, lines.index(install)) == "lowest"
    after = lines[lines.index(install) :]
    assert "python .ci/import_public_names.py" in after
    assert any(line.startswith("diffusers-ext demo --quick") for line in after)


def test_lowest_constraints_pin_every_named_package_at_its_declared_bound(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "lowest_constraints", os.path.join(REPO, ".ci", "lowest_constraints.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pins = dict(
        line.split("==") for line in module.lowest_constraints(__import__("pathlib").Path(REPO, "pyproject.toml"))
    )
    assert set(pins) == set(module.PINNED)
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    assert f"diffusers>={pins['diffusers']}" in project["dependencies"]
    unbounded = tmp_path / "pyproject.toml"
    unbounded.write_text('[project]\ndependencies = ["diffusers"]\n[project.optional-dependencies]\n')
    with pytest.raises(ValueError, match="diffusers>="):
        module.lowest_constraints(unbounded)


def test_ci_runs_the_slow_two_process_tests():
    assert 'python -m pytest -m "two_process and slow" -n 2 --dist loadfile' in _ci_lines()


def test_no_torchvision_anywhere_in_the_install_path():
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    assert not any(r.lower().startswith("torchvision") for r in requirements)


def _two_process_tests() -> set[str]:
    """`file::test` of every test function under tests/ decorated `@pytest.mark.two_process` (parsed, not imported)."""
    import ast

    found = set()
    for name in sorted(os.listdir(os.path.join(REPO, "tests"))):
        if name.startswith("test_") and name.endswith(".py"):
            tree = ast.parse(_read("tests", name))
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d) == "pytest.mark.two_process" for d in node.decorator_list
                ):
                    found.add(f"tests/{name}::{node.name}")
    return found


def test_the_docs_list_every_two_process_test_and_nothing_else():
    section = _read("docs", "testing.md").split("## Tests with two real processes", 1)[1]
    listed = set(re.findall(r"^\| `(tests/[^`]+::[^`]+)` \|", section, flags=re.M))
    marked = _two_process_tests()
    assert len(marked) >= 14
    assert listed == marked, (sorted(marked - listed), sorted(listed - marked))


def test_an_unmarked_test_cannot_start_two_processes():
    import script_launch

    with pytest.raises(AssertionError, match="two_process"):
        script_launch.accelerate_cpu_launch(2)
    assert script_launch.accelerate_cpu_launch(1)[-1] == "1"  # one process needs no marker
