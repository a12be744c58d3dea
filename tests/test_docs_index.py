"""docs/index.md lists every page of docs/, and its status column agrees with the results files it links."""

import json
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


def test_linked_results_files_exist_and_target_counts_agree():
    for row in index_rows():
        for method, name in re.findall(r"\(\.\./benchmarks/(\w+)/results/([\w-]+)\.md\)", row):
            results = ROOT / "benchmarks" / method / "results" / f"{name}.json"
            assert results.is_file(), f"docs/index.md links {name}.md but {results} is missing"
            stated = re.search(r"(\d+) of (\d+) targets met", row)
            targets = json.loads(results.read_text(encoding="utf-8")).get("summary", {}).get("targets")
            if stated and isinstance(targets, list):
                met = sum(bool(t["met"]) for t in targets)
                assert (int(stated.group(1)), int(stated.group(2))) == (met, len(targets)), (
                    f"docs/index.md says {stated.group(0)} for {name}; {results.name} has {met} of {len(targets)}"
                )
    assert index_rows(), "docs/index.md has no table"
