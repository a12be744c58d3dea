"""mosaic data: deterministic scenes, exact ground truth, the held-out split and Zipf knobs, datasets I/O."""

import collections

import numpy as np
import pytest

from diffusers_ext.data.mosaic import (
    PALETTE,
    MosaicConfig,
    caption_of,
    config_from_dataset,
    mosaic_dataset,
    mosaic_records,
    mosaic_split,
    sample_scene,
    scene_uses_heldout,
)


def test_scenes_are_deterministic_and_independent_of_the_sample_count():
    config = MosaicConfig()
    a = list(mosaic_records(config, 6, seed=3))
    b = list(mosaic_records(config, 3, seed=3))
    for x, y in zip(a, b):
        assert x["caption"] == y["caption"] and x["objects"] == y["objects"]
        assert np.array_equal(np.asarray(x["image"]), np.asarray(y["image"]))
    c = list(mosaic_records(config, 3, seed=4))
    assert [r["caption"] for r in c] != [r["caption"] for r in b]


def test_ground_truth_matches_the_pixels_and_the_caption():
    config = MosaicConfig(resolution=32)
    for row in mosaic_records(config, 40, seed=0):
        image = np.asarray(row["image"]).astype(int)
        assert image.shape == (32, 32, 3)
        groups, objects = row["groups"], row["objects"]
        # every object's centre pixel has its colour; objects do not overlap
        for obj in objects:
            colour = image[int(obj["y"]), int(obj["x"])]
            if obj["shape"] != "triangle":  # a small triangle's centre pixel can be anti-aliased
                assert np.abs(colour - np.array(PALETTE[obj["colour"]])).max() <= 2, (row["caption"], obj)
        for i, p in enumerate(objects):
            for q in objects[i + 1 :]:
                gap = max(abs(p["x"] - q["x"]), abs(p["y"] - q["y"])) - p["half_extent"] - q["half_extent"]
                assert gap >= 2.0
        # the objects are exactly what the groups ask for
        wanted = collections.Counter()
        for g in groups:
            wanted[g["colour"], g["shape"]] += g["count"]
        assert collections.Counter((o["colour"], o["shape"]) for o in objects) == wanted
        assert row["caption"] == caption_of(row["task"], groups, row["relation"])
        if row["task"] == "relation":
            a, b = objects[0], objects[1]
            dx, dy = b["x"] - a["x"], b["y"] - a["y"]
            along = {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[row["relation"]]
            assert along > 0
        # pixels outside every object's box are background
        covered = np.zeros((32, 32), bool)
        for o in objects:
            h = o["half_extent"] + 1
            covered[max(0, int(o["y"] - h)) : int(o["y"] + h) + 1, max(0, int(o["x"] - h)) : int(o["x"] + h) + 1] = 1
        assert image[~covered].max() == 0


def test_captions_follow_the_templates():
    red_circle = {"colour": "red", "shape": "circle", "count": 1, "size": "small"}
    blue_squares = {"colour": "blue", "shape": "square", "count": 3, "size": "large"}
    green_triangle = {"colour": "green", "shape": "triangle", "count": 1, "size": "large"}
    assert caption_of("single", [red_circle]) == "a red circle"
    assert caption_of("single", [red_circle], describe_size=True) == "a small red circle"
    assert caption_of("count", [blue_squares]) == "three blue squares"
    assert caption_of("pair", [red_circle, green_triangle]) == "a red circle and a green triangle"
    assert caption_of("relation", [red_circle, green_triangle], "left of") == (
        "a red circle to the left of a green triangle"
    )
    assert caption_of("relation", [red_circle, green_triangle, blue_squares], "above") == (
        "a red circle above a green triangle, with three blue squares"
    )
    assert caption_of("single", [red_circle, green_triangle, blue_squares]) == (
        "a red circle, a green triangle, and three blue squares"
    )


def test_heldout_split_separates_combinations():
    config = MosaicConfig(heldout_fraction=0.25)
    split = mosaic_split(config)
    assert len(split.heldout_concepts) == 3 and len(split.heldout_counts) == 2 and len(split.heldout_relations) == 9
    # every colour, shape, count and relation still appears in training combinations
    train_concepts = set(split.concepts) - split.heldout_concepts
    assert {c for c, _ in train_concepts} == set(config.colours) and {s for _, s in train_concepts} == set(
        config.shapes
    )
    for row in mosaic_records(config, 60, seed=0, split="train"):
        assert not scene_uses_heldout(row["task"], row["groups"], row["relation"], split)
    heldout = list(mosaic_records(config, 60, seed=0, split="heldout"))
    assert all(scene_uses_heldout(r["task"], r["groups"], r["relation"], split) and r["heldout"] for r in heldout)
    assert {r["task"] for r in heldout} == set(config.tasks)
    with pytest.raises(ValueError, match="heldout_fraction"):
        sample_scene(MosaicConfig(), 0, 0, split="heldout")


def test_zipf_exponent_skews_concept_frequencies():
    flat = collections.Counter()
    skewed = collections.Counter()
    for counter, exponent in ((flat, 0.0), (skewed, 2.0)):
        config = MosaicConfig(zipf_exponent=exponent, tasks=("single",))
        for row in mosaic_records(config, 300, seed=0):
            counter[row["groups"][0]["colour"], row["groups"][0]["shape"]] += 1
    assert max(flat.values()) < 3 * min(flat.values())
    assert max(skewed.values()) > 0.5 * 300
    weights = mosaic_split(MosaicConfig(zipf_exponent=2.0)).concept_weights
    assert sorted(weights.values(), reverse=True)[0] / sorted(weights.values(), reverse=True)[1] == pytest.approx(4.0)


def test_extra_objects_add_named_objects():
    config = MosaicConfig(extra_objects=2, tasks=("pair", "relation"))
    for row in mosaic_records(config, 10, seed=1):
        assert len(row["groups"]) == 4 and len(row["objects"]) == 4
        assert len({(g["colour"], g["shape"]) for g in row["groups"]}) == 4


def test_dataset_round_trips_through_disk(tmp_path):
    from datasets import load_from_disk

    config = MosaicConfig(resolution=24, max_count=3, heldout_fraction=0.2, zipf_exponent=1.0)
    data = mosaic_dataset(config, num_samples=5, seed=2, split="test")
    assert data.column_names == ["image", "caption", "task", "groups", "relation", "objects", "heldout"]
    assert data[0]["image"].size == (24, 24) and isinstance(data[0]["objects"][0]["x"], float)
    data.save_to_disk(str(tmp_path / "m"))
    again = load_from_disk(str(tmp_path / "m"))
    assert config_from_dataset(again) == config
    assert again["caption"] == data["caption"]


def test_command_line_writes_a_dataset(tmp_path):
    from datasets import load_from_disk

    from diffusers_ext.data.mosaic import main

    main(["--output_dir", str(tmp_path / "d"), "--num_samples", "3", "--tasks", "count", "--max_count", "3"])
    data = load_from_disk(str(tmp_path / "d"))
    assert len(data) == 3 and set(data["task"]) == {"count"}
    with pytest.raises(SystemExit):
        main(["--output_dir", str(tmp_path / "e"), "--heldout_fraction", "0.9"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"resolution": 8}, "`resolution`"),
        ({"shapes": ("circle", "hexagon")}, "`shapes`"),
        ({"colours": ("red", "red")}, "`colours`"),
        ({"task_weights": (1.0,)}, "`task_weights`"),
        ({"max_count": 1}, "`max_count`"),
        ({"zipf_exponent": -1.0}, "`zipf_exponent`"),
        ({"heldout_fraction": 0.9}, "`heldout_fraction`"),
        ({"extra_objects": 7}, "`extra_objects`"),
    ],
)
def test_bad_configs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MosaicConfig(**kwargs)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="`num_samples`"):
        list(mosaic_records(MosaicConfig(), 0))
    with pytest.raises(ValueError, match="`split`"):
        sample_scene(MosaicConfig(), 0, 0, split="validation")
