"""The support matrix (method x model family) of docs/support.md, written from the tests that prove each cell.

A test proves a cell with the `support_cell` marker (registered in pyproject.toml):

    @pytest.mark.support_cell("divide_and_denoise", "sdxl", dtype="float16")
    @pytest.mark.support_cell("dirp", "flux", status="refused")

on the test function or on a `pytest.param(..., marks=...)` of its parametrization. `dtype` is the dtype the test
runs the family in (`None`: float32); a cell is "tested" when tests cover it in float32 and in the dtype its users run
(`USER_DTYPES`), "refused" when tests prove a clear error (`status="refused"`), and "not applicable" only when listed
in `NOT_APPLICABLE` with a reason. A dtype that runs but fails is marked `status="failing"` on a strict `xfail` test
(which fails as soon as the dtype works): the cell then says where it fails instead of "tested". `note="..."` adds a
fact to the cell (e.g. what the CPU could not run). Any other cell, a tested cell short of one of its dtypes, or a cell both tested and refused is a problem: `--write` and
`--check` refuse to go on.

    python tests/support_matrix.py --write   # regenerate docs/support.md
    python tests/support_matrix.py --check   # exit 1 when docs/support.md differs from the markers

The markers are read through pytest's own collection, in this process, of the test files that mention them
(`tests/test_support_matrix.py` runs `--check`).
"""

import argparse
import contextlib
import difflib
import io
import sys
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "support.md"
MARKER = "support_cell"

# rows: method key -> what users call
METHODS = {
    "diffusion_lm": "SOAR / diffusion-LM decoding (`DiffusionLMPipeline`, `SOARScheduler`)",
    "divide_and_denoise": "Divide-and-Denoise (`DivideAndDenoisePipeline`)",
    "region_prompting": "Region prompting (`DivideAndDenoisePipeline(masks=...)`, `MaskAllocator`)",
    "dirp": "DIRP (`DIRPPipeline`)",
    "unlearning": "Constrained unlearning (`ConstrainedUnlearningTrainer`)",
    "grpo": "GRPO (`DiffusionGRPOTrainer`)",
    "e2po": "E2PO (`E2POTrainer`)",
    "semantic_nvs": "SemanticNVS (`SemanticNVSPipeline`)",
    "class_conditional": "Class-conditional DDPM (`ClassConditionalDDPMPipeline`)",
    "lomdm": "LoMDM (`LoMDMPipeline`)",
    "discrete_flow": "Discrete flow matching (`DiscreteFlowPipeline`)",
    "doob_guidance": "Doob guidance (`DoobGuidedPlannerPipeline`)",
    "certified_transfer": "Certified transfer (`SampleThenEvaluatePipeline`)",
    "connectivity": "Connectivity flow (`ConnectivityPipeline`)",
    "epidiff": "EpiDiff (`EpiDiffForecastPipeline`)",
    "graph_flow": "Graph flow (`GraphFlowPipeline`)",
    "graph_grpo": "Graph GRPO (`GraphGRPOTrainer`)",
    "manifold_flow": "Manifold flow (`ManifoldFlowPipeline`)",
    "spade": "SPADE (`OfflineOptimizationPipeline`)",
    "brain_network_flow": "Brain-network flow (`BrainNetworkFlowPipeline`)",
    "distributional_recommendation": "Distributional recommendation (`DistributionalRecommendationPipeline`)",
}
# columns: family key -> its name
FAMILIES = {
    "sd1_sd2": "SD 1.x / 2.x",
    "sdxl": "SDXL",
    "sd3": "SD3 / 3.5",
    "flux": "Flux",
    "llada": "LLaDA",
    "dream": "Dream",
    "llada2": "LLaDA2",
    "pack": "the pack's own models",
}
# the dtype each family's users run it in (the pack's own small models run in float32)
USER_DTYPES = {
    "sd1_sd2": "float16",
    "sdxl": "float16",
    "sd3": "bfloat16",
    "flux": "bfloat16",
    "llada": "bfloat16",
    "dream": "bfloat16",
    "llada2": "bfloat16",
    "pack": "float32",
}

IMAGE_FAMILIES = ("sd1_sd2", "sdxl", "sd3", "flux")
TEXT_FAMILIES = ("llada", "dream", "llada2")
IMAGE_METHODS = ("divide_and_denoise", "region_prompting", "dirp", "unlearning", "grpo", "e2po")
# methods whose models are the pack's own architectures (each its own model class or data type)
PACK_METHODS = (
    "semantic_nvs",
    "class_conditional",
    "lomdm",
    "discrete_flow",
    "doob_guidance",
    "certified_transfer",
    "connectivity",
    "epidiff",
    "graph_flow",
    "graph_grpo",
    "manifold_flow",
    "spade",
    "brain_network_flow",
    "distributional_recommendation",
)

# (method, family) -> why the cell does not apply. Every cell with no test must be here.
NOT_APPLICABLE = {
    **{
        (method, family): "an image method; LLaDA, Dream and LLaDA2 generate text"
        for method in IMAGE_METHODS
        for family in TEXT_FAMILIES
    },
    **{
        ("diffusion_lm", family): "decodes masked diffusion language models; SD, SDXL, SD3 and Flux generate images"
        for family in IMAGE_FAMILIES
    },
    **{
        (method, family): "runs the pack's own model class for its data (no text-to-image or text diffusion LM "
        "checkpoint of this kind exists)"
        for method in PACK_METHODS
        for family in IMAGE_FAMILIES + TEXT_FAMILIES
    },
    ("grpo", "pack"): "trains flow-matching text-to-image pipelines (SD3, Flux); the pack's own graph models have "
    "their own row (graph_grpo)",
    ("e2po", "pack"): "perturbs the prompt embeddings of flow-matching text-to-image pipelines (SD3, Flux); the "
    "pack's own models take no prompt embeddings",
}


@dataclass(frozen=True)
class Proof:
    """One `support_cell` marker of one test: the cell, how the test proves it, and where the test is."""

    method: str
    family: str
    dtype: str
    status: str
    note: str | None
    path: str  # relative to the repository, e.g. tests/test_x.py
    name: str  # the test function, without parameters


def proof_from_marker(marker, path: str, name: str) -> Proof:
    """A `Proof` from a `support_cell` marker; a `ValueError` names the test when the marker is malformed."""
    args, kwargs = list(marker.args), dict(marker.kwargs)
    where = f"{path}::{name}"
    if len(args) < 2:
        raise ValueError(f"{where}: `support_cell` needs (method, family), got {args!r}.")
    method, family = args[0], args[1]
    dtype = args[2] if len(args) > 2 else kwargs.pop("dtype", None)
    status, note = kwargs.pop("status", "tested"), kwargs.pop("note", None)
    if kwargs:
        raise ValueError(f"{where}: unknown `support_cell` arguments {sorted(kwargs)}.")
    if method not in METHODS:
        raise ValueError(f"{where}: unknown method {method!r}; expected one of {list(METHODS)}.")
    if family not in FAMILIES:
        raise ValueError(f"{where}: unknown family {family!r}; expected one of {list(FAMILIES)}.")
    if status not in ("tested", "refused", "failing"):
        raise ValueError(f"{where}: `status` must be 'tested', 'refused' or 'failing', got {status!r}.")
    dtype = "float32" if dtype is None else dtype
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"{where}: `dtype` must be None, 'float16' or 'bfloat16', got {dtype!r}.")
    return Proof(method, family, dtype, status, note, path, name)


class _MarkerCollector:
    """A pytest plugin that keeps the `support_cell` markers of every collected item (before any `-m`
    deselection) and the collection errors."""

    def __init__(self):
        self.proofs: list[Proof] = []
        self.errors: list[str] = []

    def pytest_itemcollected(self, item):
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        name = getattr(item, "originalname", None) or item.name
        for marker in item.iter_markers(MARKER):
            self.proofs.append(proof_from_marker(marker, path, name))

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(f"{report.nodeid}: {report.longreprtext}")


def collect_proofs() -> list[Proof]:
    """Every `support_cell` marker of the test suite, through pytest's collection of the test files that mention it."""
    import pytest

    files = sorted(
        str(path)
        for path in (ROOT / "tests").glob("test_*.py")
        if MARKER in path.read_text(encoding="utf-8") and path.name != "test_support_matrix.py"
    )
    collector = _MarkerCollector()
    with contextlib.redirect_stdout(io.StringIO()) as listing:  # the collected items: not this script's output
        code = pytest.main(
            ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), *files], plugins=[collector]
        )
    if code not in (0, 5):
        collector.errors.append(listing.getvalue()[-4000:])
    if collector.errors:
        raise RuntimeError(f"collecting the marked tests failed (pytest exit {code}): {collector.errors}")
    return sorted(set(collector.proofs), key=lambda p: (p.method, p.family, p.dtype, p.path, p.name))


def problems(proofs: list[Proof]) -> list[str]:
    """What keeps the matrix from being written: a cell with no test and no `NOT_APPLICABLE` reason, a cell that is
    both, a tested cell short of float32 or of its users' dtype, a cell both tested and refused."""
    found = []
    for method in METHODS:
        for family in FAMILIES:
            cell = [p for p in proofs if (p.method, p.family) == (method, family)]
            statuses = {p.status for p in cell}
            where = f"({method!r}, {family!r})"
            if (method, family) in NOT_APPLICABLE:
                if cell:
                    found.append(f"{where} is in NOT_APPLICABLE but tests prove it: {_names(cell)}")
                continue
            if not cell:
                found.append(f"{where} has no test and no NOT_APPLICABLE reason")
            elif "refused" in statuses and len(statuses) > 1:
                found.append(f"{where} is both refused and tested: {_names(cell)}")
            elif "refused" not in statuses:
                missing = {"float32", USER_DTYPES[family]} - {p.dtype for p in cell}
                if missing:
                    found.append(f"{where} is tested but not in {sorted(missing)}: {_names(cell)}")
    unknown = set(NOT_APPLICABLE) - {(m, f) for m in METHODS for f in FAMILIES}
    found += [f"NOT_APPLICABLE names an unknown cell {cell}" for cell in sorted(unknown)]
    return found


def _names(proofs) -> str:
    return ", ".join(sorted({f"{p.path}::{p.name}" for p in proofs}))


def _links(proofs) -> str:
    tests = sorted({(p.path, p.name) for p in proofs})
    return ", ".join(f"[`{name}`](../{path})" for path, name in tests)


def render_cell(method: str, family: str, proofs: list[Proof]) -> str:
    cell = [p for p in proofs if (p.method, p.family) == (method, family)]
    if not cell:
        return "n/a"
    notes = sorted({p.note for p in cell if p.note})
    suffix = "".join(f" Note: {note}" for note in notes)
    if cell[0].status == "refused":
        return f"refused with a clear error: {_links(cell)}{suffix}"
    parts = []
    for dtype in ("float32", "float16", "bfloat16"):
        for status, label in (("tested", ""), ("failing", " **fails**")):
            with_dtype = [p for p in cell if p.dtype == dtype and p.status == status]
            if with_dtype:
                parts.append(f"{dtype}{label}: {_links(with_dtype)}")
    failing = any(p.status == "failing" for p in cell)
    return ("partly tested (" if failing else "tested (") + "; ".join(parts) + ")" + suffix


def render(proofs: list[Proof]) -> str:
    """The text of docs/support.md."""
    lines = [
        "# Support matrix: every method on every model family",
        "",
        "<!-- Generated by `python tests/support_matrix.py --write` from the tests' `support_cell` markers; "
        "tests/test_support_matrix.py fails when this file and the tests disagree. Do not edit by hand. -->",
        "",
        "Each cell says whether a method runs on a model family, and which tests prove it. **tested**: tests run the "
        "family's real diffusers / transformers classes at reduced width with random weights (or the pack's own "
        "models), in float32 and in the dtype the family's users run it in (float16 for SD 1.x / 2.x and SDXL, "
        "bfloat16 for SD3, Flux, LLaDA, Dream and LLaDA2, float32 for the pack's own small models). **refused with a "
        "clear error**: the method rejects the family before any work, with an error naming the model; the tests "
        "check it. **partly tested**: tested in float32, but the users' dtype **fails** (a strict `xfail` test shows how; "
        "it turns into a failure once fixed). **n/a**: the method does not apply to the family (reasons below the "
        "table).",
        "",
    ]
    for method, title in METHODS.items():
        lines += [f"## {title}", "", "| family | status |", "| --- | --- |"]
        for family, family_name in FAMILIES.items():
            lines.append(f"| {family_name} | {render_cell(method, family, proofs)} |")
        lines.append("")
    lines += ["## Not applicable", "", "| method | family | why |", "| --- | --- | --- |"]
    for (method, family), reason in NOT_APPLICABLE.items():
        lines.append(f"| {method} | {FAMILIES[family]} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="regenerate docs/support.md")
    action.add_argument("--check", action="store_true", help="exit 1 when docs/support.md differs from the tests")
    args = parser.parse_args(argv)
    proofs = collect_proofs()
    found = problems(proofs)
    if found:
        print("The support matrix has problems:\n" + "\n".join(f"- {p}" for p in found), file=sys.stderr)
        return 1
    text = render(proofs)
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}")
        return 0
    current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if current != text:
        diff = difflib.unified_diff(
            current.splitlines(), text.splitlines(), "docs/support.md", "generated", lineterm=""
        )
        print(
            "docs/support.md differs from the tests' markers; run `python tests/support_matrix.py --write`:",
            file=sys.stderr,
        )
        print("\n".join(diff), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
