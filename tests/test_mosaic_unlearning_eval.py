"""Judging concept erasure on mosaic: prompt sets, concept presence, paired sampling, the feature network."""

import numpy as np
import pytest
import torch

from diffusers_ext.data.mosaic import MosaicConfig
from diffusers_ext.evaluation.mosaic import MosaicEvaluator, MosaicFeatureNet, image_features, train_feature_net
from diffusers_ext.evaluation.mosaic_unlearning import (
    asks_for,
    classifier_concept_presence,
    concept_kind,
    concept_presence,
    concept_prompt_sets,
    judge_accuracy,
    sample_prompts,
)


@pytest.fixture(scope="module")
def sets():
    return concept_prompt_sets(MosaicConfig(), "red", {"train": 6, "val": (5, 7)}, seed=0)


def test_prompt_sets_split_by_the_concept_and_training_prompts_are_distinct(sets):
    assert [len(sets["train"]["forget"]), len(sets["train"]["retain"])] == [6, 6]
    assert [len(sets["val"]["forget"]), len(sets["val"]["retain"])] == [5, 7]
    for split in sets.values():
        assert all(asks_for(p, "red") and "red" in p["caption"] for p in split["forget"])
        assert not any(asks_for(p, "red") or "red" in p["caption"] for p in split["retain"])
    train = [p["caption"] for kind in ("forget", "retain") for p in sets["train"][kind]]
    assert len(set(train)) == len(train)
    again = concept_prompt_sets(MosaicConfig(), "red", {"train": 6, "val": (5, 7)}, seed=0)
    assert [p["caption"] for p in again["val"]["forget"]] == [p["caption"] for p in sets["val"]["forget"]]


def test_the_judge_finds_the_concept_exactly_on_real_renders(sets):
    judge = MosaicEvaluator(MosaicConfig())
    forget, retain = sets["val"]["forget"], sets["val"]["retain"]
    assert concept_presence(judge, [p["image"] for p in forget], "red").all()
    assert not concept_presence(judge, [p["image"] for p in retain], "red").any()
    assert concept_presence(judge, [p["image"] for p in forget], "circle").dtype == bool
    skills = judge_accuracy(judge, [p["image"] for p in retain], retain)
    assert skills["overall"].tolist() == [1.0] * len(retain)


@pytest.mark.parametrize("concept, message", [("purple", "mosaic colour"), ("hexagon", "mosaic colour")])
def test_unknown_concepts_are_refused(concept, message):
    with pytest.raises(ValueError, match=message):
        concept_kind(concept)
    with pytest.raises(ValueError, match=message):
        concept_prompt_sets(MosaicConfig(), concept, {"val": 2})


def test_a_concept_outside_the_world_and_empty_sets_are_refused():
    with pytest.raises(ValueError, match="not one of this world's colours"):
        concept_prompt_sets(MosaicConfig(colours=("green", "blue")), "red", {"val": 2})
    with pytest.raises(ValueError, match="at least one prompt"):
        concept_prompt_sets(MosaicConfig(), "red", {"val": (0, 2)})


def test_sampling_pairs_prompts_with_noise_fixed_by_the_seed():
    from diffusers import StableDiffusionPipeline

    from diffusers_ext.testing import get_tiny_sd_components

    pipe = StableDiffusionPipeline(**get_tiny_sd_components(seed=0))
    pipe.set_progress_bar_config(disable=True)
    captions = ["a red circle", "a blue square", "two green triangles"]
    first = sample_prompts(pipe, captions, seed=3, num_inference_steps=2, batch_size=2)
    assert first.shape[0] == 3 and first.shape[-1] == 3 and 0 <= first.min() and first.max() <= 1
    np.testing.assert_allclose(sample_prompts(pipe, captions, seed=3, num_inference_steps=2), first, atol=1e-5)
    assert not np.allclose(sample_prompts(pipe, captions, seed=4, num_inference_steps=2), first)
    with pytest.raises(ValueError, match="empty"):
        sample_prompts(pipe, [], seed=0)


def test_feature_net_trains_on_renders_and_gives_features(sets):
    net, report = train_feature_net(MosaicConfig(), num_train=64, num_heldout=16, steps=3, seed=0)
    assert 0 <= report.exact_accuracy <= report.label_accuracy <= 1 and report.num_heldout == 16
    features = image_features(net, [p["image"] for p in sets["val"]["retain"]])
    assert features.shape == (7, 16) and torch.isfinite(features).all()
    array = np.stack([np.asarray(p["image"], dtype=np.float32) / 255 for p in sets["val"]["retain"]])
    torch.testing.assert_close(image_features(net, array), features, atol=1e-5, rtol=1e-5)
    assert MosaicFeatureNet(12)(torch.zeros(2, 3, 32, 32)).shape == (2, 12)


def test_the_second_judge_reads_the_classifier_columns_of_the_concept():
    """A net whose head names exactly (red, circle) in every image: red and circle are present, blue and square are
    not; PIL images and [0, 1] arrays give the same verdicts."""
    config = MosaicConfig()
    pairs = [(c, s) for c in config.colours for s in config.shapes]
    net = MosaicFeatureNet(len(pairs)).eval()
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.bias.fill_(-1.0)
        net.head.bias[pairs.index(("red", "circle"))] = 1.0
    images = np.zeros((3, 32, 32, 3), dtype=np.float32)
    for concept, expected in (("red", True), ("circle", True), ("blue", False), ("square", False)):
        assert classifier_concept_presence(net, config, images, concept).tolist() == [expected] * 3
    from PIL import Image

    pil = [Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8))] * 2
    assert classifier_concept_presence(net, config, pil, "red").tolist() == [True, True]
    with pytest.raises(ValueError, match="concept"):
        classifier_concept_presence(net, config, images, "purple")


def test_the_second_judge_agrees_with_the_exact_judge_on_real_renders_once_trained(sets):
    net, report = train_feature_net(MosaicConfig(), num_train=600, num_heldout=100, steps=300, seed=0)
    images = [p["image"] for p in sets["val"]["forget"] + sets["val"]["retain"]]
    expected = concept_presence(MosaicEvaluator(MosaicConfig()), images, "red")
    agreement = (classifier_concept_presence(net, MosaicConfig(), images, "red") == expected).mean()
    assert report.label_accuracy > 0.9 and agreement >= 0.9, (report, agreement)
