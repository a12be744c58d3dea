"""docs/index.md lists every page of docs/, and every method record it links exists."""

import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs" / "index.md"


def index_rows() -> list[str]:
    return [line for line in INDEX.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]


def test_the_index_lists_every_page():
    text = INDEX.read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"]({page.name})" in text, f"docs/index.md does not link docs/{page.name}"


def test_every_record_a_page_links_exists():
    for row in index_rows():
        for method in re.findall(r"\(\.\./benchmarks/(\w+)/README\.md\)", row):
            assert (ROOT / "benchmarks" / method / "README.md").is_file(), f"docs/index.md links benchmarks/{method}/"
    assert index_rows(), "docs/index.md has no table"
