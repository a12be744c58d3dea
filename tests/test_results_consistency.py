"""Each README methods-table status line agrees with its results file (benchmarks/README.md, rule 5).

A row links its results as `benchmarks/<method>/results/<name>.md`; when the `.json` beside it carries a
computed `summary.targets` list, the row must say "N of M targets met" with the numbers that list gives, and must
not claim "all targets met" otherwise. A benchmark adopts the check by writing such a list (with
`diffusers_ext.evaluation.protocol.target`) and putting the phrase in its row: nothing here needs editing. Rows
whose results file has no list yet are skipped, by name; those in `ADOPTED` must have one.
"""

import json
import os
import re

import pytest

from diffusers_ext.evaluation.protocol import targets_met


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADOPTED = {
    "consistency",
    "dirp",
    "discrete_flow",
    "divide_and_denoise",
    "e2po",
    "latent_world",
    "lomdm",
    "mosaic",
    "semantic_nvs",
    "soar",
    "unlearning",
    "zoo",
}
RESULTS_LINK = re.compile(r"benchmarks/(\w+)/results/([A-Za-z0-9_\-]+)\.md")
STATUS = re.compile(r"(\d+) of (\d+) targets met")


def methods_rows(readme: str) -> list[tuple[str, str]]:
    """`(method, status)` of every row of the README's methods table (the table under `## Methods`)."""
    section = readme.split("## Methods", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] not in ("method", "---") and not set(cells[0]) <= {"-", " "}:
            rows.append((cells[0], cells[-1]))
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


def readme_results() -> list[tuple[str, str, str]]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        rows = methods_rows(f.read())
    found = []
    for method, status in rows:
        link = RESULTS_LINK.search(status)
        if link:
            found.append((method, status, f"{link.group(1)}/results/{link.group(2)}"))
    return found


def test_the_checker_catches_a_misstated_status():
    rows = [
        {"name": "a", "value": 1.0, "threshold": 0.5, "met": True},
        {"name": "b", "value": 0.1, "threshold": 0.5, "met": False},
    ]
    assert status_disagreement("shipped; 1 of 2 targets met ([results](x))", rows) is None
    assert "computes 1 of 2" in status_disagreement("shipped; 2 of 2 targets met", rows)
    assert "no 'N of M" in status_disagreement("shipped, all targets met", rows)
    assert "all targets met" in status_disagreement("1 of 2 targets met; all targets met", rows)


def test_the_table_parser_reads_status_cells():
    readme = (
        "# x\n\n## Methods\n\n| method | what | classes | status |\n| --- | --- | --- | --- |\n"
        "| A | a | `A` | shipped; 1 of 1 targets met ([results](benchmarks/a/results/a.md)) |\n\n## Usage\n| n | o | t | e |\n"
    )
    assert methods_rows(readme) == [("A", "shipped; 1 of 1 targets met ([results](benchmarks/a/results/a.md))")]


def test_the_readme_links_results_files():
    names = {name.rsplit("/", 1)[1] for _, _, name in readme_results()}
    assert ADOPTED <= names, f"README rows should link the results of {sorted(ADOPTED - names)}"


@pytest.mark.parametrize("method,status,name", readme_results(), ids=lambda v: v if isinstance(v, str) else None)
def test_status_line_agrees_with_results_file(method, status, name):
    path = os.path.join(ROOT, "benchmarks", f"{name}.json")
    assert os.path.isfile(path), f"{method}: the README links {name}.md but {path} is missing"
    with open(path, encoding="utf-8") as f:
        summary = json.load(f).get("summary", {})
    targets = summary.get("targets")
    if not isinstance(targets, list):
        assert name.rsplit("/", 1)[1] not in ADOPTED, f"{name}.json lost its computed summary.targets list"
        pytest.skip(f"{name}.json has no computed summary.targets list yet (issue 13)")
    problem = status_disagreement(status, targets)
    assert problem is None, f"README status of {method} {problem}"
