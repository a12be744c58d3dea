"""docs/support.md is the support matrix the tests' `support_cell` markers write (tests/support_matrix.py): it fails
when the two disagree, and the matrix's rules (every cell tested in float32 and in its users' dtype, refused, or
listed as not applicable) are checked on made-up markers."""

import re
import subprocess
import sys

import pytest
from support_matrix import FAMILIES, METHODS, NOT_APPLICABLE, ROOT, USER_DTYPES, Proof, problems, render


def test_docs_support_md_is_what_the_markers_write():
    """`python tests/support_matrix.py --check` collects the markers with pytest and compares the generated table."""
    result = subprocess.run(
        [sys.executable, "tests/support_matrix.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]


def complete_proofs() -> list[Proof]:
    """One float32 and one users'-dtype proof for every applicable cell."""
    proofs = []
    for method in METHODS:
        for family in FAMILIES:
            if (method, family) not in NOT_APPLICABLE:
                for dtype in {"float32", USER_DTYPES[family]}:
                    proofs.append(Proof(method, family, dtype, "tested", None, "tests/test_x.py", f"test_{method}"))
    return proofs


def test_a_complete_set_of_proofs_has_no_problems_and_renders_every_cell():
    proofs = complete_proofs()
    assert problems(proofs) == []
    text = render(proofs)
    assert len(re.findall(r"(?m)^\| the pack's own models \| ", text)) == len(METHODS)  # one row per method
    assert "tested (float32: [`test_divide_and_denoise`](../tests/test_x.py); float16:" in text


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ps: [p for p in ps if (p.method, p.family) != ("grpo", "sd3")], "('grpo', 'sd3') has no test"),
        (
            lambda ps: [p for p in ps if (p.method, p.family, p.dtype) != ("grpo", "flux", "bfloat16")],
            r"('grpo', 'flux') is tested but not in ['bfloat16']",
        ),
        (
            lambda ps: ps + [Proof("dirp", "sdxl", "float32", "refused", None, "tests/test_y.py", "test_refuses")],
            "('dirp', 'sdxl') is both refused and tested",
        ),
        (
            lambda ps: ps + [Proof("dirp", "llada", "float32", "tested", None, "tests/test_y.py", "test_text")],
            "('dirp', 'llada') is in NOT_APPLICABLE but tests prove it",
        ),
    ],
)
def test_a_missing_dtype_a_missing_cell_and_contradictions_are_problems(change, message):
    assert any(message in problem for problem in problems(change(complete_proofs())))


def test_a_failing_users_dtype_is_reported_as_partly_tested():
    proofs = [
        p
        if (p.method, p.family, p.dtype) != ("unlearning", "sd1_sd2", "float16")
        else Proof(**{**vars(p), "status": "failing"})
        for p in complete_proofs()
    ]
    assert problems(proofs) == []
    assert (
        "| SD 1.x / 2.x | partly tested (float32: [`test_unlearning`](../tests/test_x.py); float16 **fails**:"
        in render(proofs)
    )
