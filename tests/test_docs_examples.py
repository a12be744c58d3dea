"""Every Python example in README.md and docs/*.md runs, so an example that drifts from the code fails CI.

The blocks of one file run in order in one namespace (a later block may use what an earlier one made), in a fresh
temporary working directory. An HTML comment on the line just above a block's fence adjusts it:

- ``<!-- example: replace OLD => NEW; OLD2 => NEW2 -->`` runs the block with smaller settings. Each ``OLD`` must
  occur in the block, so a replacement that no longer applies fails instead of silently testing something else.
- ``<!-- example: skip; REASON -->`` for a block that needs what a test cannot have (a hub checkpoint, a GPU). The
  block must still compile, and every name it imports from ``diffusers_ext`` must exist.
"""

import ast
import importlib
import os
import re
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\s*$")
DIRECTIVE = re.compile(r"^<!--\s*example:\s*(skip|replace)\s*(?:;\s*)?(.*?)\s*-->\s*$")


def python_blocks(path: Path) -> list[dict]:
    """The Python blocks of a markdown file: ``{"line", "source", "skip", "replacements"}`` each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        block = {"line": start + 1, "source": "\n".join(lines[start:end]) + "\n", "skip": None, "replacements": []}
        directive = DIRECTIVE.match(lines[i - 1].strip()) if i > 0 else None
        if directive and directive.group(1) == "skip":
            if not directive.group(2):
                raise ValueError(f"{path.name}:{i}: a skipped example must say why")
            block["skip"] = directive.group(2)
        elif directive:
            for pair in directive.group(2).split(";"):
                old, sep, new = pair.partition("=>")
                if not sep:
                    raise ValueError(f"{path.name}:{i}: replacement {pair!r} is not 'OLD => NEW'")
                block["replacements"].append((old.strip(), new.strip()))
        blocks.append(block)
        i = end + 1
    return blocks


def _imported_names_exist(tree: ast.Module, where: str) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "diffusers_ext":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"{where}: `from {node.module} import {alias.name}` names nothing"
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "diffusers_ext":
                    importlib.import_module(alias.name)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_examples_run(path, tmp_path, monkeypatch):
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.name} has no Python examples")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"__name__": f"example_{path.stem}"}
    for block in blocks:
        where = f"{path.relative_to(ROOT)}:{block['line']}"
        source = block["source"]
        for old, new in block["replacements"]:
            assert old in source, f"{where}: the test replacement {old!r} no longer occurs in the example"
            source = source.replace(old, new)
        code = compile(source, where, "exec")
        if block["skip"]:
            _imported_names_exist(ast.parse(source), where)
            continue
        exec(code, namespace)  # noqa: S102 - running the documentation's own examples is the point
    os.chdir(ROOT)


def test_directives_are_parsed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: skip; needs a hub checkpoint -->\n```python\nx = 1\n```\n\n"
        "<!-- example: replace steps=50 => steps=2; a => b -->\n```python\nrun(steps=50, a=1)\n```\n"
        "```python\ny = 2\n```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [b["skip"] for b in blocks] == ["needs a hub checkpoint", None, None]
    assert blocks[1]["replacements"] == [("steps=50", "steps=2"), ("a", "b")]
    assert blocks[2]["source"] == "y = 2\n" and blocks[2]["line"] == 11
    page.write_text("<!-- example: skip -->\n```python\nx = 1\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must say why"):
        python_blocks(page)
