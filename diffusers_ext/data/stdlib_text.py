"""A character-level text corpus from the docstrings of the Python standard library installed with the interpreter.

Every top-level module file of the stdlib (sorted by name) is parsed with `ast`; the module, class and function
docstrings are whitespace-normalised, docstrings with characters outside printable ASCII are dropped, and each
file's text is cut into windows of `length` characters. Files are split by their index in the sorted list
(`index % 10 == 8` validation, `== 9` test, the rest train), so no window crosses splits. The corpus depends on the
Python version; its size is reported with it.
"""

import ast
import os
import string
import sysconfig

import torch

from ..utils import check_positive_int


STDLIB_ALPHABET = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")
SPLITS = ("train", "validation", "test")


def _file_docstrings(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                doc = " ".join(doc.split())
                if all(c in STDLIB_ALPHABET for c in doc):
                    texts.append(doc)
    return " ".join(texts)


def stdlib_docstring_windows(split: str, length: int = 32, max_windows: int | None = None) -> list[str]:
    """Non-overlapping `length`-character windows of the stdlib docstrings of `split`.

    Args:
        split (`str`): `"train"`, `"validation"` or `"test"`.
        length (`int`, defaults to 32): characters per window.
        max_windows (`int`, *optional*): keep only the first windows.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    check_positive_int("length", length)
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(name for name in os.listdir(root) if name.endswith(".py"))
    wanted = {"train": lambda i: i % 10 < 8, "validation": lambda i: i % 10 == 8, "test": lambda i: i % 10 == 9}[split]
    windows: list[str] = []
    for index, name in enumerate(files):
        if not wanted(index):
            continue
        text = _file_docstrings(os.path.join(root, name))
        windows += [text[k : k + length] for k in range(0, len(text) - length + 1, length)]
        if max_windows is not None and len(windows) >= max_windows:
            return windows[:max_windows]
    return windows


def encode_windows(windows: list[str], alphabet: str = STDLIB_ALPHABET) -> torch.LongTensor:
    """Windows of equal length to symbol indices into `alphabet`, shape `(N, length)`."""
    index = {c: i for i, c in enumerate(alphabet)}
    return torch.tensor([[index[c] for c in w] for w in windows], dtype=torch.long)
