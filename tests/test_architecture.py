"""The layering rules of docs/architecture.md, checked by parsing every module's imports (nothing is imported).

- Nothing outside ``diffusers_ext/testing/`` and ``tests/`` imports the test kit ``diffusers_ext.testing``.
- Each package of the library imports only its own layer or lower ones:
  foundations (utils, metrics, geometry, ...) < models, schedulers, data, rewards < pipelines, trainers
  < evaluation, zoo < demo, cli.
- A method room ``diffusers_ext/pipelines/<method>/`` imports no other method room. A family room (``SHARED_ROOMS``:
  the generic pipeline a family of methods builds on, e.g. ``diffusion_lm``) is not a method room: any room may
  import it, and it imports no method room.
- Nothing under ``benchmarks/`` imports a ``training/`` script (what both need lives in the library).

Each rule is a function returning the violations it finds, so a test can also show that it catches one.
"""

import ast
import os

import pytest


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "diffusers_ext"
# Family rooms: generic pipelines several methods build on (every masked diffusion LM runs on DiffusionLMPipeline).
SHARED_ROOMS = {"diffusion_lm"}
# Top-level entries of diffusers_ext and their layer: a module may import its own layer or a lower one.
LAYERS = {
    "_lazy_module": 0,
    "_mixins": 0,
    "geometry": 0,
    "loading": 0,
    "metrics": 0,
    "training_utils": 0,
    "utils": 0,
    "data": 1,
    "models": 1,
    "losses": 1,
    "rewards": 1,
    "schedulers": 1,
    "pipelines": 2,
    "trainers": 2,
    "evaluation": 3,
    "zoo": 3,
    "cli": 4,
    "demo": 4,
}
# The lazy public API (`diffusers_ext/__init__.py`) names every layer; the test kit may import any of them.
UNLAYERED = {"__init__", "testing"}


def python_files(root: str, subdirs: tuple[str, ...]) -> list[str]:
    """Repository-relative paths of the `.py` files under `subdirs` of `root` (or the file itself)."""
    found = []
    for subdir in subdirs:
        top = os.path.join(root, subdir)
        if os.path.isfile(top):
            found.append(subdir)
        for folder, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            found += [os.path.relpath(os.path.join(folder, n), root) for n in sorted(names) if n.endswith(".py")]
    return found


def module_name(path: str) -> str:
    """`diffusers_ext/a/b.py` -> `diffusers_ext.a.b`; a package's `__init__.py` names the package."""
    parts = path[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(root: str, path: str) -> list[tuple[int, list[str]]]:
    """Every import statement of `path` (also inside functions) as `(line, modules)`, relative imports resolved:
    `import X` gives `[X]`; `from X import a` gives `[X, X.a]` (`a` may be a submodule);
    `importlib.import_module("X")` with a literal gives `[X]`."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    statements = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            statements += [(node.lineno, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            statements.append((node.lineno, [base] + [f"{base}.{alias.name}" for alias in node.names]))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            statements.append((node.lineno, [node.args[0].value]))
    return sorted(statements)


def imported_modules(root: str, path: str) -> set[str]:
    """The union of the modules of `import_statements`."""
    return {module for _, modules in import_statements(root, path) for module in modules}


def public_names(root: str) -> dict[str, str]:
    """`{name: "diffusers_ext.<submodule>"}` of the lazy top-level API (`_import_structure` in `__init__.py`), so that
    `from diffusers_ext import SomePipeline` counts as importing the module that defines it."""
    init = os.path.join(root, PACKAGE, "__init__.py")
    with open(init, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_import_structure" for t in node.targets):
            structure = ast.literal_eval(node.value)
            return {name: f"{PACKAGE}.{module}" for module, names in structure.items() for name in names}
    return {}


def _is_within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _top_entry(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PACKAGE else None


def _room(module: str, rooms: set[str]) -> str | None:
    """The method room of a module under `diffusers_ext.pipelines.<room>`, else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == [PACKAGE, "pipelines"] and parts[2] in rooms else None


def kit_violations(root: str) -> list[str]:
    """Import statements outside `diffusers_ext/testing/` and `tests/` that reach `diffusers_ext.testing`."""
    checked = [p for p in python_files(root, (".",)) if not p.startswith(("tests" + os.sep, "diffusers_ext/testing"))]
    return [
        f"{path}:{line} imports {kit[0]}"
        for path in checked
        for line, modules in import_statements(root, path)
        if (kit := [m for m in modules if _is_within(m, f"{PACKAGE}.testing")])
    ]


def layer_violations(root: str) -> list[str]:
    """Library modules that import a higher layer, or another method room."""
    pipelines = os.path.join(root, PACKAGE, "pipelines")
    rooms = {d for d in os.listdir(pipelines) if os.path.isdir(os.path.join(pipelines, d))}
    public = public_names(root)
    violations = []
    for path in python_files(root, (PACKAGE,)):
        name = module_name(path)
        entry = _top_entry(name)
        if entry is None or entry in UNLAYERED:
            continue
        if entry not in LAYERS:
            violations.append(f"{path}: `{entry}` has no layer; add it to LAYERS and docs/architecture.md")
            continue
        for line, modules in import_statements(root, path):
            found = []
            for imported in modules:
                imported = public.get(imported.removeprefix(f"{PACKAGE}."), imported)
                target = _top_entry(imported)
                if target is None or target in UNLAYERED:
                    continue  # the test kit is reported by kit_violations
                if LAYERS.get(target, 0) > LAYERS[entry]:
                    found.append(f"({entry}, layer {LAYERS[entry]}) imports {imported} (layer {LAYERS[target]})")
                room, other = _room(name, rooms), _room(imported, rooms)
                if room is not None and other is not None and other != room and other not in SHARED_ROOMS:
                    found.append(f"(method room {room}) imports another method room: {imported}")
            if found:
                violations.append(f"{path}:{line} {found[0]}")
    return violations


def training_script_violations(root: str) -> list[str]:
    """Benchmark files that import a `training/` script: by name (`import train_x`, `from train_x import ...`) or by
    putting the `training/` folder on `sys.path`."""
    training = os.path.join(root, "training")
    scripts = (
        {n[: -len(".py")] for n in os.listdir(training) if n.endswith(".py")} if os.path.isdir(training) else set()
    )
    violations = []
    for path in python_files(root, ("benchmarks",)):
        for line, modules in import_statements(root, path):
            found = [m for m in modules if m.split(".")[0] in scripts or m.split(".")[0] == "training"]
            if found:
                violations.append(f"{path}:{line} imports the training script {found[0]}")
        with open(os.path.join(root, path), encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if "sys.path" in text and "training" in text:
                    violations.append(f"{path}:{number} puts training/ on sys.path")
    return violations


def test_nothing_outside_tests_imports_the_test_kit():
    assert kit_violations(REPO) == []


def test_layers_import_only_downwards_and_rooms_stay_apart():
    assert layer_violations(REPO) == []


def test_benchmarks_import_no_training_script():
    assert training_script_violations(REPO) == []


def test_the_checks_read_the_real_tree():
    files = python_files(REPO, (PACKAGE,))
    assert f"{PACKAGE}/pipelines/divide_and_denoise/pipeline_divide_and_denoise.py" in files
    imports = imported_modules(REPO, f"{PACKAGE}/pipelines/divide_and_denoise/pipeline_divide_and_denoise.py")
    assert f"{PACKAGE}.pipelines.divide_and_denoise.fair_division" in imports
    assert f"{PACKAGE}.utils.public" in imports


def _write(root, path: str, text: str) -> None:
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text, encoding="utf-8")


@pytest.fixture
def fake_repo(tmp_path):
    """A tiny tree that follows the rules: two method rooms, a model, an evaluation module, a test."""
    _write(tmp_path, "diffusers_ext/__init__.py", '_import_structure = {"pipelines.a.pipeline_a": ["APipeline"]}\n')
    _write(tmp_path, "diffusers_ext/models/tiny.py", "import torch\n")
    _write(tmp_path, "diffusers_ext/pipelines/a/pipeline_a.py", "from ...models.tiny import torch\n")
    _write(tmp_path, "diffusers_ext/pipelines/b/pipeline_b.py", "from ..pipeline_utils import x\n")
    _write(tmp_path, "diffusers_ext/pipelines/pipeline_utils.py", "x = 1\n")
    _write(tmp_path, "diffusers_ext/evaluation/a.py", "from ..pipelines.a.pipeline_a import torch\n")
    _write(tmp_path, "tests/test_a.py", "from diffusers_ext.testing import PipelineConformanceTests\n")
    _write(tmp_path, "training/train_a.py", "import diffusers_ext\n")
    _write(tmp_path, "benchmarks/a.py", "from diffusers_ext.evaluation.a import torch\n")
    return tmp_path


def test_a_tree_that_follows_the_rules_passes(fake_repo):
    assert kit_violations(fake_repo) == []
    assert layer_violations(fake_repo) == []
    assert training_script_violations(fake_repo) == []


@pytest.mark.parametrize(
    "path, text, check, expected",
    [
        ("training/train_x.py", "from diffusers_ext.testing import get_tiny_pixel_unet\n", "kit", "training"),
        ("diffusers_ext/zoo/build.py", "from diffusers_ext import testing\n", "kit", "diffusers_ext.testing"),
        ("benchmarks/x.py", "import importlib\nimportlib.import_module('diffusers_ext.testing')\n", "kit", "bench"),
        ("diffusers_ext/pipelines/a/extra.py", "from ..b.pipeline_b import x\n", "layers", "another method room"),
        ("diffusers_ext/pipelines/a/extra.py", "from ...evaluation.a import torch\n", "layers", "layer 3"),
        ("diffusers_ext/data/scenes.py", "from ..pipelines.a.pipeline_a import torch\n", "layers", "layer 2"),
        ("diffusers_ext/models/x.py", "def f():\n    from diffusers_ext.demo import run\n", "layers", "layer 4"),
        ("diffusers_ext/models/y.py", "from .. import APipeline\n", "layers", "pipelines.a.pipeline_a"),
        ("diffusers_ext/newthing/x.py", "x = 1\n", "layers", "has no layer"),
        ("benchmarks/b.py", "def f():\n    from train_a import main\n", "training", "train_a"),
        (
            "benchmarks/c.py",
            "import os, sys\nsys.path.insert(0, os.path.join('..', 'training'))\n",
            "training",
            "sys.path",
        ),
    ],
)
def test_each_rule_catches_a_violation(fake_repo, path, text, check, expected):
    _write(fake_repo, path, text)
    violations = {"kit": kit_violations, "layers": layer_violations, "training": training_script_violations}[check](
        fake_repo
    )
    assert len(violations) == 1 and expected in violations[0], violations
