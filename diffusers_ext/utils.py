"""Small helpers shared across the package."""

from typing import TypeVar


T = TypeVar("T", bound=type)

PUBLIC_MODULE = "diffusers_ext"


def public(cls: T) -> T:
    """Mark ``cls`` as part of the public API: pin its ``__module__`` to ``"diffusers_ext"``.

    diffusers writes ``cls.__module__`` into a saved pipeline's ``model_index.json`` for classes outside
    diffusers and transformers. Pinning it to the package name keeps saved folders loadable when a file moves.
    """
    cls.__module__ = PUBLIC_MODULE
    return cls
