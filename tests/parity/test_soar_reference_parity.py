"""Parity of the diffusion-LM decoders with their verbatim reference implementations, kept as fixtures.

`fixtures/soar_references.json` holds what LLaDA's `generate`, Fast-dLLM's threshold `generate`, Dream's
`diffusion_generate` and SOAR's `generate_soar` / `generate_pbs` / `_sample_soar` returned on the package's tiny
models (with the references' commit ids); `regenerate_soar.py` rebuilds it from local checkouts. Here the package
recomputes its side with `SOARScheduler.from_preset(name)` and the reference call's own arguments, nothing else:

- temperature 0: the same tokens and the same forward counts, exactly (the references break exact confidence ties
  at the top-k boundary with `torch.topk`, the package by lowest position; no case here has such a tie);
- sampling (temperature > 0, random remasking, Dream's `origin`): the package draws its noise per row over the
  generated positions, not one tensor over the padded batch and prompt as the references do, so it is compared in
  distribution: per generated position, the total-variation distance between the reference's and the package's
  token frequencies over 2000 seeds each stays within the sampling-error bound of `tv_tolerance`.
"""

import json
import os
import re

import pytest
import torch
from soar_parity_models import position_counts, run_package, total_variation, tv_tolerance


with open(os.path.join(os.path.dirname(__file__), "fixtures", "soar_references.json")) as f:
    FIXTURE = json.load(f)
EXACT = FIXTURE["exact"]
SAMPLED = FIXTURE["sampled"]
# the number of position comparisons all sampled cases make (the union bound of the tolerance)
NUM_POSITIONS = sum(len(case["expected"]["counts"]) for case in SAMPLED)


def test_the_fixture_records_each_reference_and_its_commit():
    commits = FIXTURE["references"]
    for name in ("ML-GSAI/LLaDA", "NVlabs/Fast-dLLM", "duterscmy/SOAR"):
        assert re.fullmatch(r"[0-9a-f]{40}", commits[name]), name
    assert re.fullmatch(r"[0-9a-f]{40}", commits["Dream generation_utils.py"]["commit"])
    references = {case["reference"] for case in EXACT}
    assert references == {"llada", "fast-dllm", "dream", "soar-llada", "soar-dream", "pbs"}
    assert references == {case["reference"] for case in SAMPLED}
    # several configurations spend fewer steps than tokens
    short = [c for c in EXACT if c["call"].get("steps") is not None and c["call"]["steps"] < c["call"]["gen_length"]]
    assert {c["reference"] for c in short} >= {"llada", "fast-dllm", "dream", "soar-llada", "pbs"}


def test_ties_occur_only_on_bf16_models():
    assert all(case["expected"]["topk_ties"] == 0 for case in EXACT if case["dtype"] == "float32")
    assert sum(case["expected"]["topk_ties"] == 0 for case in EXACT) >= 200


@pytest.mark.parametrize("case", EXACT, ids=[case["id"] for case in EXACT])
def test_temperature_zero_matches_the_reference_exactly(case):
    out = run_package(case)
    expected = case["expected"]
    if expected["topk_ties"]:
        # the one documented exception: `torch.topk` chose among equal confidences, the package takes the lowest
        # position; the case still has to run
        return
    assert out.sequences.tolist() == expected["sequences"]
    batch = len(expected["sequences"])
    reference = case["reference"]
    if reference == "soar-dream":
        # this reference runs one forward per beam: its calls are the package's row forwards
        assert out.row_forwards.tolist() == [expected["forward_calls"]]
    elif reference == "pbs":
        # one forward per beam too; where a block has one mask left for two children, the reference's top-2 also
        # picks a committed position and keeps that unchanged "child" (score -inf) as a beam, which costs
        # forwards; the package keeps only children that commit a token
        assert 0 <= expected["forward_calls"] - int(out.row_forwards[0]) <= case["call"]["steps"]
    else:
        assert out.nfe.tolist() == [expected["forward_calls"]] * batch
        assert int(out.row_forwards.sum()) == expected["forward_rows"]
    if reference == "fast-dllm":
        assert out.nfe.tolist() == [expected["nfe"]]  # Fast-dLLM's own count


def _frequency_gaps(case, counts):
    """Per position: (total-variation distance, tolerance) between the reference's counts and `counts`."""
    return [
        (total_variation(reference, ours), tv_tolerance(reference, ours, NUM_POSITIONS))
        for reference, ours in zip(case["expected"]["counts"], counts)
    ]


# The package's side draws fewer samples than the reference's 2000 (suite time); the tolerance accounts for both
# sample sizes (`tv_tolerance`), 1.3x wider than with 2000 on each side.
PACKAGE_SAMPLES = 800


@pytest.mark.parametrize("case", SAMPLED, ids=[case["id"] for case in SAMPLED])
def test_sampled_decoders_match_the_reference_in_distribution(case):
    out = run_package(case, num_samples=min(case["num_samples"], PACKAGE_SAMPLES))
    gaps = _frequency_gaps(case, position_counts(out.sequences))
    assert len(gaps) == case["call"]["gen_length"]
    for position, (distance, tolerance) in enumerate(gaps):
        assert distance <= tolerance, (position, distance, tolerance)


def test_the_frequency_comparison_detects_a_different_sampler():
    """The tolerance is tight enough to fail on a real difference: the same LLaDA case at another temperature."""
    case = next(c for c in SAMPLED if c["reference"] == "llada" and c["call"]["temperature"] == 1.0)
    colder = {**case, "call": {**case["call"], "temperature": 0.5}}
    out = run_package(colder, num_samples=case["num_samples"])
    gaps = _frequency_gaps(case, position_counts(out.sequences))
    assert any(distance > tolerance for distance, tolerance in gaps)


def test_the_tolerance_shrinks_with_the_number_of_samples():
    small = {"1": 60, "2": 40}
    large = {"1": 6000, "2": 4000}
    assert tv_tolerance(large, large, 10) < tv_tolerance(small, small, 10) / 5
    assert total_variation({"1": 3, "2": 1}, {"1": 1, "2": 3}) == pytest.approx(0.5)


@torch.no_grad()
def test_each_preset_needs_no_option_beyond_the_reference_call():
    """The cases pass no scheduler option but those naming the reference call's own arguments (Dream's `alg`,
    Fast-dLLM's `threshold`, LLaDA's `remasking`)."""
    allowed = {"confidence_measure", "confidence_threshold", "transfer_schedule"}
    for case in EXACT + SAMPLED:
        assert set(case["overrides"]) <= allowed, case["id"]
