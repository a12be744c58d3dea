"""A module whose public names are imported on first access (the pattern of diffusers' and transformers' `_LazyModule`).

Ours imports nothing heavy itself, so `import diffusers_ext` (and the `diffusers-ext --help` command) does not pay for
torch or diffusers until a class is used.
"""

import importlib
import os
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
