"""The status table of benchmarks/README.md agrees with the results files, and the README's status words are the
ones it defines.

Every committed `benchmarks/<method>/results/<name>.json` with a computed `summary.targets` list has one row in the
table of `## Status`, linking `<method>/results/<name>.md` (or the `.json` where no report was written) and saying "N of M targets met" with the numbers that list
gives (rule 5 of benchmarks/README.md). The README's methods table gives each method one status word, defined on the
page: "matched" (checked against the public reference; the row links docs/parity.md) or "tested".
"""

import json
import re
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, all_results_files

from diffusers_ext.evaluation.protocol import targets_met


ROOT = Path(__file__).resolve().parents[1]
STATUS = re.compile(r"(\d+) of (\d+) targets met")
ROW = re.compile(r"^\| \[(\w+)\]\(\1/README\.md\) \| \[([\w-]+)\]\(\1/results/\2\.(?:md|json)\) \| (.*) \|$", re.M)
STATUS_WORDS = ("matched", "tested")


def status_rows(page: str) -> dict[str, str]:
    """`{"<method>/<name>": status}` of the `## Status` table of a benchmarks README."""
    section = page.split("\n## Status\n", 1)[1]
    rows = {}
    for method, name, status in ROW.findall(section):
        key = f"{method}/{name}"
        assert key not in rows, f"two rows for {key}"
        rows[key] = status
    return rows


def status_disagreement(status: str, targets: list[dict]) -> str | None:
    """Why `status` misstates the computed `targets`, or `None` when it agrees."""
    met, total = targets_met(targets)
    claims = STATUS.findall(status)
    if not claims:
        return f"says no 'N of M targets met' while the results file computes {met} of {total}"
    if any((int(n), int(m)) != (met, total) for n, m in claims):
        return f"says {claims} while the results file computes {met} of {total}"
    if "all targets met" in status.lower() and met != total:
        return f"says 'all targets met' while the results file computes {met} of {total}"
    return None


def computed_targets() -> dict[str, list[dict]]:
    """`{"<method>/<name>": summary.targets}` of every results file that computes a target list."""
    found = {}
    for path in all_results_files("*.json"):
        targets = json.loads(path.read_text(encoding="utf-8")).get("summary", {}).get("targets")
        if isinstance(targets, list):
            found[f"{path.parents[1].name}/{path.stem}"] = targets
    return found


def test_the_checker_catches_a_misstated_status():
    rows = [
        {"name": "a", "value": 1.0, "threshold": 0.5, "met": True},
        {"name": "b", "value": 0.1, "threshold": 0.5, "met": False},
    ]
    assert status_disagreement("1 of 2 targets met", rows) is None
    assert "computes 1 of 2" in status_disagreement("2 of 2 targets met", rows)
    assert "no 'N of M" in status_disagreement("all targets met", rows)
    assert "all targets met" in status_disagreement("1 of 2 targets met; all targets met", rows)


def test_the_table_parser_reads_rows():
    page = "# x\n\n## Status\n\n| method | results | status |\n| --- | --- | --- |\n| [a](a/README.md) | [b](a/results/b.md) | 1 of 1 targets met |\n"
    assert status_rows(page) == {"a/b": "1 of 1 targets met"}


def test_every_results_file_has_one_row_and_every_row_a_file():
    rows = status_rows((BENCHMARKS / "README.md").read_text(encoding="utf-8"))
    files = computed_targets()
    assert len(files) >= 40
    assert set(rows) == set(files), (sorted(set(files) - set(rows)), sorted(set(rows) - set(files)))


@pytest.mark.parametrize("key", sorted(computed_targets()))
def test_status_row_agrees_with_results_file(key):
    status = status_rows((BENCHMARKS / "README.md").read_text(encoding="utf-8"))[key]
    problem = status_disagreement(status, computed_targets()[key])
    assert problem is None, f"benchmarks/README.md, {key}: {problem}"


def test_every_linked_record_exists():
    for key in status_rows((BENCHMARKS / "README.md").read_text(encoding="utf-8")):
        method = key.split("/")[0]
        assert (BENCHMARKS / method / "README.md").is_file(), f"benchmarks/{method}/README.md is missing"


def readme_methods() -> list[list[str]]:
    """The cells of each row of the README's methods table (the table under `## Methods`)."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith(("| method ", "| --- ")):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_readme_gives_each_method_one_defined_status_word():
    rows = readme_methods()
    assert len(rows) >= 15
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Methods\n", 1)[1]
    for word in STATUS_WORDS:
        assert f"- **{word}**: " in section, f"the README does not define the status {word!r}"
    for cells in rows:
        assert cells[-1] in STATUS_WORDS, f"{cells[0]}: status {cells[-1]!r} is not one of {STATUS_WORDS}"
        assert ("docs/parity.md" in cells[-2]) == (cells[-1] == "matched"), cells[0]
        page = re.match(r"\[[^\]]+\]\((docs/[\w]+\.md)\)", cells[0])
        assert page and (ROOT / page.group(1)).is_file(), f"{cells[0]} links no docs page"
