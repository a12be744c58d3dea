"""The evaluation package's lazy table names every public module under `diffusers_ext/evaluation/` (docs/architecture.md),
and every name it lists resolves."""

import os

import diffusers_ext.evaluation as evaluation


FOLDER = os.path.dirname(evaluation.__file__)


def public_modules() -> set[str]:
    """Dotted names, relative to the package, of every `.py` module under `evaluation/` but `__init__` and `_private`."""
    found = set()
    for root, dirs, names in os.walk(FOLDER):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            if name.endswith(".py") and not name.startswith("_"):
                relative = os.path.relpath(os.path.join(root, name), FOLDER)[: -len(".py")]
                found.add(relative.replace(os.sep, "."))
    return found


def test_every_public_module_is_in_the_lazy_table():
    assert public_modules() - set(evaluation._import_structure) == set()
    assert set(evaluation._import_structure) - public_modules() == set()


def test_every_listed_name_resolves_to_its_module():
    for module, names in evaluation._import_structure.items():
        for name in names:
            value = getattr(evaluation, name)
            if callable(value):  # classes and functions; constants (e.g. `PROTECTIONS`) have no module of their own
                assert value.__module__ == f"diffusers_ext.evaluation.{module}", (name, value.__module__)
