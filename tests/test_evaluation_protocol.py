"""The measurement protocol's shared helpers (diffusers_ext.evaluation.protocol) and the D&D random placements."""

import math

import numpy as np
import pytest
import torch

from diffusers_ext.evaluation.divide_and_denoise.placements import (
    COLOURS,
    colour_object_scores,
    colour_success,
    count_colour_blobs,
    layout_experts,
    layout_regions,
    random_layout,
)
from diffusers_ext.evaluation.protocol import (
    binomial_standard_error,
    calibrate_threshold,
    mean_spread,
    settings_code_hash,
    target,
    targets_met,
    targets_status,
)


def test_target_rows_are_computed_both_ways():
    assert target("a", 0.95, 0.9) == {"name": "a", "value": 0.95, "threshold": 0.9, "comparison": ">=", "met": True}
    assert not target("a", 0.85, 0.9)["met"]
    assert target("overhead", 0.1, 0.15, "<=")["met"]
    assert not target("overhead", 0.2, 0.15, "<=")["met"]
    assert not target("a", float("nan"), 0.5)["met"]
    with pytest.raises(ValueError, match="comparison"):
        target("a", 1.0, 0.5, ">")
    with pytest.raises(ValueError, match="name"):
        target("", 1.0, 0.5)


def test_targets_status_counts_met_rows():
    rows = [target("a", 1, 0), target("b", 0, 1), target("c", 2, 1)]
    assert targets_met(rows) == (2, 3)
    assert targets_status(rows) == "2 of 3 targets met"
    with pytest.raises(ValueError, match="lacks"):
        targets_met([{"name": "a", "value": 1.0}])


def test_mean_spread_and_standard_errors():
    stats = mean_spread([1.0, 2.0, 3.0])
    assert stats["mean"] == 2.0 and stats["std"] == 1.0 and stats["n"] == 3
    assert math.isclose(stats["sem"], 1 / math.sqrt(3))
    assert mean_spread([4.0])["std"] == 0.0
    assert math.isclose(binomial_standard_error(0.5, 100), 0.05)
    with pytest.raises(ValueError, match="count"):
        binomial_standard_error(0.5, 0)


def test_calibrated_threshold_detects_the_requested_share():
    scores = np.linspace(0.0, 1.0, 101)
    threshold = calibrate_threshold(scores, 0.95)
    assert np.mean(scores >= threshold) >= 0.95
    assert np.mean(scores >= threshold + 0.02) < 0.95  # the most demanding such threshold
    with pytest.raises(ValueError, match="detect_fraction"):
        calibrate_threshold(scores, 0.0)


def test_cache_key_changes_with_any_setting_or_code(tmp_path):
    code = tmp_path / "bench.py"
    code.write_text("x = 1\n")
    key = settings_code_hash({"lr": 1e-3, "seed": 0}, [code])
    assert key == settings_code_hash({"seed": 0, "lr": 1e-3}, [code])  # key order does not matter
    assert key != settings_code_hash({"lr": 2e-3, "seed": 0}, [code])
    code.write_text("x = 2\n")
    assert key != settings_code_hash({"lr": 1e-3, "seed": 0}, [code])
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("y = 1\n")
    folder_key = settings_code_hash({}, [tmp_path / "pkg"])
    (tmp_path / "pkg" / "m.py").write_text("y = 3\n")
    assert folder_key != settings_code_hash({}, [tmp_path / "pkg"])
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        settings_code_hash({}, [tmp_path / "missing.py"])


def test_random_layouts_are_spread_and_seeded():
    for k in (2, 3):
        centres = random_layout(k, seed=5)
        assert centres == random_layout(k, seed=5)
        assert all(math.dist(a, b) >= 8.0 for i, a in enumerate(centres) for b in centres[:i])
    assert random_layout(2, seed=1) != random_layout(2, seed=2)
    with pytest.raises(ValueError, match="num_experts"):
        random_layout(4, seed=0)


def test_oracle_regions_cover_every_template_disc():
    centres = random_layout(3, seed=7)
    experts = layout_experts(centres, num_templates=20)
    regions = layout_regions(centres)
    assert regions.shape == (3, 16, 16)
    for k, expert in enumerate(experts):
        painted = (expert.templates > -1).any(dim=1)  # (T, 16, 16) pixels its discs cover
        assert (painted <= regions[k].bool()).all()


def test_colour_detector_counts_each_colour():
    centres = random_layout(3, seed=3)
    experts = layout_experts(centres, num_templates=2)
    canvas = torch.stack([e.templates[0] for e in experts]).amax(dim=0)  # three discs, full strength, in [-1, 1]
    images = torch.stack([canvas, canvas * 0.5 - 0.5]).add(1).div(2)  # the second one faded to half strength
    colours = list(COLOURS)
    assert count_colour_blobs(images, colours).tolist() == [[1, 1, 1], [0, 0, 0]]
    assert colour_success(images, colours).tolist() == [True, False]
    assert colour_success(images, colours, min_intensity=0.2).tolist() == [True, True]
    scores = colour_object_scores(images, "blue", grid=np.array([0.2, 0.4, 0.6, 0.9]))
    assert scores.tolist() == [0.9, 0.4]
    with pytest.raises(ValueError, match="colours"):
        count_colour_blobs(images, ["purple"])


def test_solo_disc_scores_score_each_expert_alone():
    from diffusers import DDIMScheduler

    from diffusers_ext.evaluation.divide_and_denoise.placements import solo_disc_scores

    experts = layout_experts(random_layout(2, 0), num_templates=20, seed=0)
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    scores = solo_disc_scores(experts, scheduler, num_images=2, num_inference_steps=10, seeds=[1, 2])
    # Sampled alone, an exact expert paints a full-strength disc of its own colour.
    assert len(scores) == 4 and min(scores) >= 0.9
    assert scores == solo_disc_scores(experts, scheduler, num_images=2, num_inference_steps=10, seeds=[1, 2])
    with pytest.raises(ValueError, match="one seed each"):
        solo_disc_scores(experts, scheduler, num_images=2, num_inference_steps=10, seeds=[1])


def test_paired_and_unpaired_differences():
    from diffusers_ext.evaluation.protocol import mean_spread, paired_difference, unpaired_difference

    a, b = [0.65, 0.65, 0.65, 0.75, 0.625], [0.575, 0.55, 0.675, 0.525, 0.6]
    paired = paired_difference(a, b)  # the shared per-seed part cancels
    assert paired["pairing"] == "paired" and paired["n"] == 5
    assert paired["difference"] == pytest.approx(0.08) and paired["sem"] == pytest.approx(0.0421307, rel=1e-5)
    assert paired["values"] == pytest.approx([0.075, 0.1, -0.025, 0.225, 0.025])
    unpaired = unpaired_difference(mean_spread(a), mean_spread(b))
    assert unpaired["pairing"] == "unpaired" and unpaired["difference"] == pytest.approx(0.08)
    assert unpaired["sem"] == pytest.approx((mean_spread(a)["sem"] ** 2 + mean_spread(b)["sem"] ** 2) ** 0.5)
    same = paired_difference([1.0, 2.0], [0.0, 1.0])  # identical differences: zero SE, infinite z
    assert same["sem"] == 0.0 and same["z"] == float("inf")
    with pytest.raises(ValueError, match="one score per shared unit"):
        paired_difference([1.0, 2.0], [1.0])
