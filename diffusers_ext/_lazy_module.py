"""A module whose public names are imported on first access (the pattern of diffusers' and transformers' `_LazyModule`).

Ours imports nothing heavy itself, so `import diffusers_ext` (and the `diffusers-ext --help` command) does not pay for
torch or diffusers until a class is used.

It also lets `diffusers.DiffusionPipeline.from_pretrained(folder)` load the folders the pack saves, after
`import diffusers_ext` ([`register_pipeline_names`]). diffusers resolves a saved folder's `_class_name` as an attribute of the `diffusers` module
(`pipeline_loading_utils._get_pipeline_class`) and each component `[library, class]` in `library`; components of the
pack name `"diffusers_ext"` and resolve there, but `diffusers.ClassConditionalDDPMPipeline` does not exist. Once
`diffusers_ext` is imported, the `diffusers` module also answers the pack's pipeline names: an attribute diffusers
lacks and the pack defines (one of `names`) is imported from `diffusers_ext` on first access, the way diffusers'
own lazy module imports its classes. diffusers' own names always win, and nothing is imported early: when
`diffusers` is not imported yet, the names are added right after it is (`import diffusers_ext` stays free of torch
and diffusers).
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys
from itertools import chain
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """Surfaces `import_structure` (`{submodule: [public names]}`) and imports a submodule when a name is asked for."""

    def __init__(
        self,
        name: str,
        module_file: str,
        import_structure: dict[str, list[str]],
        module_spec=None,
        extra_objects: dict[str, Any] | None = None,
    ):
        super().__init__(name)
        self._import_structure = import_structure
        self._name_to_submodule = {value: key for key, values in import_structure.items() for value in values}
        self._objects = dict(extra_objects or {})
        self.__all__ = sorted(set(import_structure) | set(chain(*import_structure.values())))
        self.__file__ = module_file
        self.__spec__ = module_spec
        self.__path__ = [os.path.dirname(module_file)]

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__all__) | set(self._objects))

    def __getattr__(self, name: str) -> Any:
        if name in self._objects:
            return self._objects[name]
        if name in self._name_to_submodule:
            value = getattr(importlib.import_module(f".{self._name_to_submodule[name]}", self.__name__), name)
        elif name in self._import_structure:
            value = importlib.import_module(f".{name}", self.__name__)
        else:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def __reduce__(self):
        return (self.__class__, (self.__name__, self.__file__, self._import_structure))


# `diffusers` answers the pack's pipeline names -------------------------------------------------------------------

_NAMES: tuple[str, ...] = ()


def _extended_module_class(base: type) -> type:
    """A subclass of the `diffusers` module's type whose failed attribute lookups fall back to the pack's pipelines."""

    class DiffusersWithExtPipelines(base):
        def __getattr__(self, name: str):
            try:
                return super().__getattr__(name)
            except AttributeError:
                if name not in _NAMES:
                    raise
            value = getattr(importlib.import_module("diffusers_ext"), name)
            setattr(self, name, value)
            return value

    DiffusersWithExtPipelines.__qualname__ = DiffusersWithExtPipelines.__name__ = base.__name__
    DiffusersWithExtPipelines.__module__ = base.__module__
    return DiffusersWithExtPipelines


def _extend(module: ModuleType) -> None:
    base = type(module)
    if getattr(base, "_extended_by_diffusers_ext", False) or not isinstance(module, ModuleType):
        return
    extended = _extended_module_class(base)
    extended._extended_by_diffusers_ext = True
    module.__class__ = extended


class _ExtendAfterExec(importlib.abc.Loader):
    """Runs `diffusers`' own loader, then extends the module it leaves in `sys.modules`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _extend(sys.modules.get(module.__name__, module))

    def __getattr__(self, name):  # resource readers, `get_filename`, ...: the original loader's
        return getattr(self._loader, name)


class _DiffusersImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `diffusers` is imported, wraps the loader the path finder returns (once)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "diffusers":
            return None
        _remove_finder()  # once; and the search below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ExtendAfterExec(spec.loader)
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DiffusersImportFinder)]


def register_pipeline_names(names) -> None:
    """Make the `diffusers` module answer the pack's pipeline class `names` (see the module docstring)."""
    global _NAMES
    _NAMES = tuple(names)
    if "diffusers" in sys.modules:
        _extend(sys.modules["diffusers"])
    elif not any(isinstance(f, _DiffusersImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DiffusersImportFinder())
