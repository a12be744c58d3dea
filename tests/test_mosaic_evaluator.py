"""The mosaic judge: exact on real renders, rejects wrong prompts per skill, stable under small perturbations."""

import random

import numpy as np
import pytest
import torch

from diffusers_ext.data.mosaic import MosaicConfig, mosaic_records, render_objects
from diffusers_ext.evaluation.mosaic import SKILLS, MosaicEvaluator, corrupt_prompt, summarize


@pytest.fixture(scope="module")
def rows():
    return list(mosaic_records(MosaicConfig(extra_objects=1), 80, seed=5, split="test"))


def test_real_renders_pass_every_skill(rows):
    judge = MosaicEvaluator(MosaicConfig(extra_objects=1))
    results = judge.evaluate_batch([r["image"] for r in rows], rows)
    summary = summarize(results, rows)
    assert summary["overall"] == 1.0
    assert (
        summary["n_count"] > 5
        and summary["n_relation"] > 5
        and set(summary["by_task"])
        == {
            "single",
            "pair",
            "count",
            "relation",
        }
    )


def test_detections_match_the_ground_truth(rows):
    judge = MosaicEvaluator()
    for row in rows[:30]:
        found = sorted((d.shape, d.colour) for d in judge.detect(row["image"]))
        assert found == sorted((o["shape"], o["colour"]) for o in row["objects"])
        for obj in row["objects"]:  # every object has a detection near its centre (triangles: centroid h/3 lower)
            near = [d for d in judge.detect(row["image"]) if abs(d.x - obj["x"]) < 1 and abs(d.y - obj["y"]) < 2.5]
            assert near and near[0].shape == obj["shape"]


def test_wrong_prompts_fail_in_the_corrupted_skill(rows):
    config = MosaicConfig(extra_objects=1)
    judge = MosaicEvaluator(config)
    rng = random.Random(0)
    checked = dict.fromkeys(SKILLS, 0)
    for row in rows:
        for skill in SKILLS:
            wrong = corrupt_prompt(row, skill, config, rng)
            if wrong is None:
                continue
            verdict = judge.evaluate(row["image"], wrong)
            assert verdict[skill] is False and verdict["overall"] is False, (row["caption"], wrong)
            checked[skill] += 1
    assert min(checked.values()) > 5


def test_small_perturbations_keep_the_verdicts(rows):
    judge = MosaicEvaluator(MosaicConfig(extra_objects=1))
    generator = np.random.default_rng(0)
    for row in rows[:40]:
        image = np.asarray(row["image"]) / 255
        noisy = np.clip(image + generator.normal(0, 0.03, image.shape), 0, 1)
        dimmer = image * 0.9
        shifted = np.roll(image, 1, axis=1)
        for variant in (noisy, dimmer, shifted):
            assert judge.evaluate(variant, row)["overall"]


def test_input_formats_agree_and_a_blank_image_fails():
    config = MosaicConfig()
    judge = MosaicEvaluator(config)
    objects = [
        {"shape": "circle", "colour": "red", "x": 8.0, "y": 16.0, "half_extent": 5.0},
        {"shape": "square", "colour": "blue", "x": 24.0, "y": 16.0, "half_extent": 4.0},
    ]
    image = render_objects(config, objects)
    prompt = {
        "task": "relation",
        "groups": [
            {"colour": "red", "shape": "circle", "count": 1},
            {"colour": "blue", "shape": "square", "count": 1},
        ],
        "relation": "left of",
    }
    as_tensor = torch.from_numpy(np.asarray(image) / 255.0).permute(2, 0, 1)
    for variant in (image, np.asarray(image), np.asarray(image) / 255.0, as_tensor):
        assert judge.evaluate(variant, prompt) == {"object": True, "colour": True, "relation": True, "overall": True}
    assert judge.evaluate(np.zeros((32, 32, 3)), prompt) == {
        "object": False,
        "colour": False,
        "relation": False,
        "overall": False,
    }
    # a tiny speck of colour is not an object
    speck = np.zeros((32, 32, 3))
    speck[3:5, 3:5] = [220 / 255, 45 / 255, 40 / 255]
    assert judge.detect(speck) == []


def test_bad_inputs_are_rejected():
    judge = MosaicEvaluator()
    prompt = {"task": "single", "groups": [{"colour": "red", "shape": "circle", "count": 1}], "relation": ""}
    with pytest.raises(ValueError, match="`image`"):
        judge.evaluate(np.zeros((32, 32)), prompt)
    with pytest.raises(ValueError, match="`prompt`"):
        judge.evaluate(np.zeros((32, 32, 3)), {"caption": "a red circle"})
    with pytest.raises(ValueError, match="outside the world"):
        judge.evaluate(np.zeros((32, 32, 3)), {**prompt, "groups": [{"colour": "pink", "shape": "circle"}]})
    with pytest.raises(ValueError, match="one prompt per image"):
        judge.evaluate_batch([np.zeros((32, 32, 3))] * 2, [prompt])
    with pytest.raises(ValueError, match="`foreground_threshold`"):
        MosaicEvaluator(foreground_threshold=1.5)
    with pytest.raises(ValueError, match="`results`"):
        summarize([])
