"""Every relative link in the repository's Markdown (README, docs/, benchmarks/, the zoo's model cards) points at a
file that exists, and every `#anchor` at a heading of that file (GitHub's anchor rule), so moving a section or a file
cannot leave a dead link behind."""

import re
import subprocess
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.split() if not name.startswith("tests/")]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def dead_links(path: Path) -> list[str]:
    """The links of `path` whose file or anchor does not exist."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            dead.append(target)
        elif fragment and where.suffix == ".md" and fragment not in anchors_of(where):
            dead.append(target)
    return dead


def test_the_checker_finds_a_dead_file_and_a_dead_anchor(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# B\n\n## Some part\n", encoding="utf-8")
    page.write_text("[ok](b.md#some-part) [gone](c.md) [bad](b.md#other) [self](#a)\n\n# A\n", encoding="utf-8")
    assert dead_links(page) == ["c.md", "b.md#other"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert dead_links(path) == []
