"""Each formula once: the package's source, parsed (nothing is imported), writes these formulas only at their home.

- `diffusers_ext/pipelines/pipeline_utils.py`:
  - the conversions between a denoiser's prediction types, `x_0 = (x_t - noise * eps) / signal` and
    `eps = (x_t - signal * x_0) / noise` (`prediction_to_x0`, `prediction_to_epsilon`, `NoiseLevels.split`);
  - the noise levels of a variance-preserving schedule, the pair `sqrt(alpha_bar)`, `sqrt(1 - alpha_bar)`
    (`vp_coefficients`, `NoiseLevels.coefficients`);
  - whether a scheduler is a flow-matching one, by its class hierarchy (`is_flow_matching`), never by testing a
    class name against a `"FlowMatch..."` string (a renamed subclass would pass one test and fail another);
  - where a timestep is in `scheduler.timesteps` (`timestep_index`);
  - the VAE codec, `(latent_dist.mode() - shift_factor) * scaling_factor` and its inverse (`encode_vae_latents`,
    `decode_vae_latents`).
- `diffusers_ext/utils.py`: the positive-int argument check (`check_positive_int`).

The formula rules read the modules that can import `pipeline_utils` (layer 2 and up in `test_architecture.LAYERS`,
and the test kit); models, schedulers and losses sit below it and keep their own arithmetic. The positive-int rule
reads every module (its home is in the lowest layer).

Each rule is a function returning the violations it finds, so a test can also show that it catches one.
"""

import ast
import os
import re

import pytest
from test_architecture import LAYERS, PACKAGE, REPO, UNLAYERED, _write, module_name, python_files


PIPELINE_UTILS = f"{PACKAGE}/pipelines/pipeline_utils.py"
UTILS = f"{PACKAGE}/utils.py"
# Names that hold a noise level in the package's formulas (`x_t = signal x_0 + noise e`).
NOISE_LEVEL_NAME = re.compile(r"^(a|b|signal|noise|root|sigma\w*|alpha\w*|abar\w*|\w*alphas_cumprod)$")
# Methods that only move or cast a tensor (`timesteps.double()`, `b.view(-1, 1).clamp_min(1e-8)`).
PASS_THROUGH = {"clamp", "clamp_min", "cpu", "detach", "double", "float", "long", "reshape", "to", "view"}
SCHEDULE_NAMES = {"timesteps", "sigmas"}


def _library_files(root: str, min_layer: int) -> list[tuple[str, ast.Module]]:
    """`(path, tree)` of the package's modules whose top-level entry is at `min_layer` or above (the test kit and
    the lazy API count as any layer)."""
    found = []
    for path in python_files(root, (PACKAGE,)):
        parts = module_name(path).split(".")
        entry = parts[1] if len(parts) > 1 else "__init__"
        if entry in UNLAYERED or LAYERS.get(entry, 0) >= min_layer:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                found.append((path, ast.parse(f.read(), filename=path)))
    return found


def _name(node: ast.AST) -> str | None:
    """The variable a value comes from, through casts and moves: `b.view(-1, 1).clamp_min(1e-8)` -> `b`,
    `self.scheduler.alphas_cumprod[t]` -> `alphas_cumprod`; else None."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PASS_THROUGH:
            node = node.func.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _sqrt_argument(node: ast.AST) -> ast.AST | None:
    """`X` of `X.sqrt()`, `torch.sqrt(X)`, `math.sqrt(X)`, `X ** 0.5`; else None."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "sqrt":
        if node.args:
            return node.args[0]
        return node.func.value if isinstance(node.func, ast.Attribute) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        if isinstance(node.right, ast.Constant) and node.right.value == 0.5:
            return node.left
    return None


def _one_minus(node: ast.AST) -> ast.AST | None:
    """`X` of `1 - X` (or `1.0 - X`); else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        if isinstance(node.left, ast.Constant) and node.left.value == 1:
            return node.right
    return None


def _functions(tree: ast.Module):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]


def conversion_violations(root: str) -> list[str]:
    """Divisions `(x - c * y) / d` by a noise level `d` (a square root, or a noise-level name such as `signal`,
    `alpha_bar`, `sigma`): `x_0` from a noise prediction or `eps` from a clean-sample one, outside pipeline_utils."""
    violations = []
    for path, tree in _library_files(root, LAYERS["pipelines"]):
        if path == PIPELINE_UTILS:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
                continue
            numerator = node.left
            if not (isinstance(numerator, ast.BinOp) and isinstance(numerator.op, ast.Sub)):
                continue
            if not (isinstance(numerator.right, ast.BinOp) and isinstance(numerator.right.op, ast.Mult)):
                continue
            by_level = any(_sqrt_argument(n) is not None for n in ast.walk(node))
            if by_level or NOISE_LEVEL_NAME.match(_name(node.right) or ""):
                violations.append(
                    f"{path}:{node.lineno} converts a prediction by hand ({ast.unparse(node)}); use "
                    "pipeline_utils.prediction_to_x0 / prediction_to_epsilon"
                )
    return violations


def noise_level_violations(root: str) -> list[str]:
    """Functions that take both `sqrt(X)` and `sqrt(1 - X)` of one `X` (the scales of a variance-preserving level),
    outside pipeline_utils."""
    violations = set()
    for path, tree in _library_files(root, LAYERS["pipelines"]):
        if path == PIPELINE_UTILS:
            continue
        for function in _functions(tree):
            roots, complements = {}, {}
            for node in ast.walk(function):
                argument = _sqrt_argument(node)
                if argument is None:
                    continue
                inner = _one_minus(argument)
                if inner is not None:
                    complements[ast.unparse(inner)] = node.lineno
                else:
                    roots[ast.unparse(argument)] = node.lineno
            for level in sorted(roots.keys() & complements.keys()):
                violations.add(
                    f"{path}:{complements[level]} takes sqrt({level}) and sqrt(1 - {level}) by hand; use "
                    "pipeline_utils.vp_coefficients (or NoiseLevels)"
                )
    return sorted(violations)


def _int_checked(node: ast.AST) -> str | None:
    """`v` of `not isinstance(v, int)` or `not is_int(v)`."""
    if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Call)):
        return None
    call = node.operand
    function = getattr(call.func, "id", getattr(call.func, "attr", None))
    if function == "isinstance" and len(call.args) == 2 and ast.unparse(call.args[1]) == "int":
        return ast.unparse(call.args[0])
    if function == "is_int" and len(call.args) == 1:
        return ast.unparse(call.args[0])
    return None


def _bool_checked(node: ast.AST) -> str | None:
    """`v` of `isinstance(v, bool)`."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
        if ast.unparse(node.args[1]) == "bool":
            return ast.unparse(node.args[0])
    return None


def _bounded(node: ast.AST) -> str | None:
    """`v` of `v < k` or `v <= k` with an int literal `k`."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Lt, ast.LtE)):
        bound = node.comparators[0]
        if isinstance(bound, ast.Constant) and type(bound.value) is int:
            return ast.unparse(node.left)
    return None


def _hand_int_check(test: ast.AST) -> str | None:
    """`v` when `test` is `not isinstance(v, int) or v < k` (or `not is_int(v)`, with an optional
    `isinstance(v, bool)`), possibly behind `v is not None and (...)`; else None."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and len(test.values) == 2:
        guard, test = test.values
        if not (isinstance(guard, ast.Compare) and isinstance(guard.ops[0], ast.IsNot)):
            return None
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)):
        return None
    typed = [v for v in map(_int_checked, test.values) if v is not None]
    bounded = [v for v in map(_bounded, test.values) if v is not None]
    booleans = [v for v in map(_bool_checked, test.values) if v is not None]
    if len(typed) != 1 or not bounded or len(typed) + len(bounded) + len(booleans) != len(test.values):
        return None
    return typed[0] if set(bounded + booleans) == set(typed) else None


def positive_int_violations(root: str) -> list[str]:
    """`if not isinstance(v, int) or v < 1: raise ...` (and its variants) written out instead of
    `utils.check_positive_int`."""
    violations = []
    for path, tree in _library_files(root, 0):
        if path == UTILS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and any(isinstance(n, ast.Raise) for n in node.body):
                value = _hand_int_check(node.test)
                if value is not None:
                    violations.append(f"{path}:{node.lineno} checks `{value}` by hand; use utils.check_positive_int")
    return violations


def _attributes(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or function outside the functions and classes defined in it."""
    found, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _scales_latents(node: ast.AST) -> bool:
    """Whether `node` is arithmetic with a VAE's `scaling_factor` or `shift_factor`."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.Add, ast.Sub))):
        return False
    return bool(
        {getattr(node.left, "attr", None), getattr(node.right, "attr", None)} & {"scaling_factor", "shift_factor"}
    )


def vae_codec_violations(root: str) -> list[str]:
    """Functions (or modules) that do arithmetic with a VAE's `scaling_factor` or `shift_factor`, or read both
    `.latent_dist` and `scaling_factor`, outside pipeline_utils."""
    violations = []
    for path, tree in _library_files(root, LAYERS["pipelines"]):
        if path == PIPELINE_UTILS:
            continue
        for scope in [tree, *_functions(tree), *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            nodes = _own_nodes(scope)
            attributes = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
            if any(map(_scales_latents, nodes)) or {"latent_dist", "scaling_factor"} <= attributes:
                line = getattr(scope, "lineno", 1)
                violations.append(
                    f"{path}:{line} encodes or decodes VAE latents by hand; use encode/decode_vae_latents"
                )
    return violations


def _mentions_flow_match(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "FlowMatch" in n.value for n in ast.walk(node)
    )


def flow_detection_violations(root: str) -> list[str]:
    """A class name compared with a `"FlowMatch..."` string (`"FlowMatch" in type(s).__name__`,
    `cls.__name__.startswith("FlowMatch")`) outside pipeline_utils (whose `is_flow_matching` reads the MRO)."""
    violations = []
    for path, tree in _library_files(root, LAYERS["pipelines"]):
        if path == PIPELINE_UTILS:
            continue
        for node in ast.walk(tree):
            by_compare = isinstance(node, ast.Compare)
            by_call = isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "endswith")
            if (by_compare or by_call) and "__name__" in _attributes(node) and _mentions_flow_match(node):
                violations.append(
                    f"{path}:{node.lineno} tells flow matching by class name; use pipeline_utils.is_flow_matching"
                )
    return violations


def _is_schedule(node: ast.AST) -> bool:
    """Whether `node` is a scheduler's `timesteps` or `sigmas` (through casts and moves)."""
    return _name(node) in SCHEDULE_NAMES


def timestep_lookup_violations(root: str) -> list[str]:
    """A timestep searched for in a schedule (`timesteps == t`, `(timesteps - t).abs() < tol`,
    `torch.isclose(timesteps, t)`, `list(timesteps).index(t)`) outside pipeline_utils (`timestep_index`)."""
    violations = []
    for path, tree in _library_files(root, LAYERS["pipelines"]):
        if path == PIPELINE_UTILS:
            continue
        for node in ast.walk(tree):
            found = False
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                left, right, op = node.left, node.comparators[0], node.ops[0]
                if isinstance(op, ast.Eq):
                    found = _is_schedule(left) or _is_schedule(right)
                elif isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call):
                    target = left.func.value if getattr(left.func, "attr", None) == "abs" else None
                    if getattr(left.func, "id", None) == "abs" and left.args:
                        target = left.args[0]
                    if isinstance(target, ast.BinOp) and isinstance(target.op, ast.Sub):
                        found = _is_schedule(target.left) or _is_schedule(target.right)
            elif isinstance(node, ast.Call):
                function = getattr(node.func, "attr", getattr(node.func, "id", None))
                if function == "isclose":
                    found = any(_is_schedule(a) for a in node.args)
                elif function == "index" and isinstance(node.func, ast.Attribute):
                    holder = node.func.value
                    if isinstance(holder, ast.Call) and getattr(holder.func, "id", None) == "list" and holder.args:
                        holder = holder.args[0]
                    elif isinstance(holder, ast.Call) and getattr(holder.func, "attr", None) == "tolist":
                        holder = holder.func.value
                    found = _is_schedule(holder)
            if found:
                violations.append(
                    f"{path}:{node.lineno} looks a timestep up by hand; use pipeline_utils.timestep_index"
                )
    return violations


RULES = {
    "conversion": conversion_violations,
    "noise_levels": noise_level_violations,
    "positive_int": positive_int_violations,
    "vae_codec": vae_codec_violations,
    "flow_detection": flow_detection_violations,
    "timestep_lookup": timestep_lookup_violations,
}


# Files whose copies wait for work in flight elsewhere, with the reason. Each must still hold a copy (a stale entry
# fails), so the list only shrinks.
PENDING: dict[str, dict[str, str]] = {}


def _file(violation: str) -> str:
    return violation.split(":", 1)[0]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_formula_is_written_only_at_its_home(rule):
    pending = PENDING.get(rule, {})
    violations = RULES[rule](REPO)
    assert [v for v in violations if _file(v) not in pending] == []
    stale = sorted(set(pending) - {_file(v) for v in violations})
    assert stale == [], f"{stale} no longer hold a copy: remove them from PENDING[{rule!r}]"


def test_the_rules_read_the_real_tree():
    paths = {path for path, _ in _library_files(REPO, 0)}
    assert PIPELINE_UTILS in paths and UTILS in paths
    assert f"{PACKAGE}/pipelines/doob_guidance/guidance.py" in paths
    assert f"{PACKAGE}/evaluation/divide_and_denoise/region_multidiffusion.py" in paths
    assert all(not p.startswith(f"{PACKAGE}/schedulers/") for p, _ in _library_files(REPO, LAYERS["pipelines"]))


@pytest.fixture
def fake_repo(tmp_path):
    """A tiny tree whose formulas sit at their homes, and a method room that uses them."""
    _write(
        tmp_path,
        PIPELINE_UTILS,
        "def prediction_to_x0(out, sample, signal, noise):\n"
        "    return (sample - noise * out) / signal\n"
        "def vp_coefficients(alpha_bar):\n"
        "    return alpha_bar.sqrt(), (1 - alpha_bar).sqrt()\n"
        "def is_flow_matching(s):\n"
        "    return any(c.__name__.startswith('FlowMatch') for c in type(s).__mro__)\n"
        "def timestep_index(s, t):\n"
        "    return int(((s.timesteps.double() - t).abs() < 1e-6).nonzero()[0, 0])\n"
        "def encode_vae_latents(vae, x):\n"
        "    return (vae.encode(x).latent_dist.mode() - vae.config.shift_factor) * vae.config.scaling_factor\n",
    )
    _write(
        tmp_path,
        UTILS,
        "def check_positive_int(name, value):\n    if not isinstance(value, int) or value < 1:\n        raise ValueError(name)\n",
    )
    _write(
        tmp_path,
        f"{PACKAGE}/pipelines/a/pipeline_a.py",
        "from ...utils import check_positive_int\n"
        "from ..pipeline_utils import prediction_to_x0, timestep_index, vp_coefficients\n"
        "def step(scheduler, out, sample, t, steps):\n"
        "    check_positive_int('steps', steps)\n"
        "    if not isinstance(steps, int) or steps % 2:\n"  # not a positive-int check
        "        raise ValueError(steps)\n"
        "    signal, noise = vp_coefficients(scheduler.alphas_cumprod[t])\n"
        "    weight = (steps - 2 * noise) / (1 - steps)\n"  # a division, not by a noise level
        "    return prediction_to_x0(out, sample, signal, noise) * weight, timestep_index(scheduler, t)\n",
    )
    # below pipelines: a scheduler keeps its own arithmetic
    _write(tmp_path, f"{PACKAGE}/schedulers/s.py", "def f(a, x, e):\n    return (x - (1 - a).sqrt() * e) / a.sqrt()\n")
    return tmp_path


def test_a_tree_with_formulas_at_their_homes_passes(fake_repo):
    assert {name: rule(fake_repo) for name, rule in RULES.items()} == {name: [] for name in RULES}


PLANTED = [
    ("conversion", "def f(x, eps, alpha_bar):\n    return (x - (1 - alpha_bar) ** 0.5 * eps) / alpha_bar**0.5\n"),
    ("conversion", "def f(x, x0, a, b):\n    return (x - a.view(-1, 1) * x0) / b.view(-1, 1).clamp_min(1e-6)\n"),
    ("noise_levels", "def f(s, t):\n    ab = s.alphas_cumprod[t]\n    return ab.sqrt(), (1 - ab).sqrt()\n"),
    ("noise_levels", "import math\ndef f(ab):\n    return math.sqrt(ab), math.sqrt(1.0 - ab)\n"),
    ("positive_int", "def f(n):\n    if not isinstance(n, int) or n < 1:\n        raise ValueError(n)\n"),
    ("positive_int", "def f(n):\n    if n is not None and (not is_int(n) or n <= 0):\n        raise TypeError(n)\n"),
    (
        "positive_int",
        "def f(n):\n    if not isinstance(n, int) or isinstance(n, bool) or n < 2:\n        raise ValueError(n)\n",
    ),
    ("vae_codec", "def f(vae, x):\n    return vae.encode(x).latent_dist.mean * vae.config.scaling_factor\n"),
    ("vae_codec", "def f(vae, z):\n    return vae.decode(z / vae.config.scaling_factor).sample\n"),
    ("flow_detection", "def f(s):\n    return 'FlowMatch' in type(s).__name__\n"),
    ("flow_detection", "def f(s):\n    return type(s).__name__.startswith('FlowMatchEuler')\n"),
    ("timestep_lookup", "def f(s, t):\n    return int((s.timesteps == t).nonzero()[0])\n"),
    (
        "timestep_lookup",
        "def f(s, t):\n    timesteps = s.timesteps\n    return ((timesteps.double() - t).abs() < 1e-6).any()\n",
    ),
    ("timestep_lookup", "def f(s, t):\n    return s.timesteps.tolist().index(t)\n"),
]


@pytest.mark.parametrize("rule, text", PLANTED)
def test_each_rule_catches_a_planted_copy(fake_repo, rule, text):
    path = f"{PACKAGE}/evaluation/copy.py"
    _write(fake_repo, path, text)
    violations = RULES[rule](fake_repo)
    assert len(violations) == 1 and violations[0].startswith(f"{path}:"), violations
