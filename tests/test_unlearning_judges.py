"""The unlearning benchmark's evaluation pieces: held-out halves, the independent pixel-MLP judge, judging samples."""

import warnings

import pytest
import torch

from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.evaluation.unlearning import (
    PixelMLPJudge,
    heldout_halves,
    judge_samples,
    train_pixel_mlp_judge,
)


@pytest.fixture(scope="module")
def halves():
    return heldout_halves(resolution=8)


@pytest.fixture(scope="module")
def mlp_judge():
    images, labels = load_digits_images("train", resolution=8)
    with warnings.catch_warnings():  # a short fit for speed: sklearn warns that it has not fully converged
        warnings.simplefilter("ignore")
        return train_pixel_mlp_judge(images, labels, hidden_size=32, seed=0, max_iter=150)


def test_heldout_halves_are_disjoint_stratified_and_cover_the_heldout_split(halves):
    images, labels = load_digits_images("heldout", resolution=8)
    val, test = halves["validation"], halves["test"]
    assert len(val[1]) + len(test[1]) == len(labels)
    counts = torch.bincount(val[1], minlength=10) - torch.bincount(test[1], minlength=10)
    assert counts.abs().max() <= 1  # each class split evenly

    def rows(x, y):
        return sorted(tuple(a.flatten().tolist()) + (int(b),) for a, b in zip(x, y))

    # the two halves together are exactly the held-out split (a partition, as multisets of images and labels)
    assert rows(torch.cat([val[0], test[0]]), torch.cat([val[1], test[1]])) == rows(images, labels)


def test_pixel_mlp_judge_is_accurate_on_real_heldout_digits_and_returns_features(halves, mlp_judge):
    images, labels = halves["test"]
    logits, features = mlp_judge(images)
    assert isinstance(mlp_judge, PixelMLPJudge) and logits.shape == (len(labels), 10) and features.shape[1] == 32
    assert (logits.argmax(1) == labels).double().mean() > 0.9
    assert (features >= 0).all()


def test_judge_samples_on_real_digits_reads_them_as_remembered(halves, mlp_judge):
    images, labels = halves["validation"]
    report = judge_samples(mlp_judge, images, labels, halves["test"], forget_classes=[3])
    assert report["forgotten_count"] == int((labels == 3).sum())
    assert report["forgotten_rate"] > 0.8  # real 3s are still 3s: nothing was forgotten
    assert len(report["per_class_accuracy"]) == 10 and sum(report["per_class_count"]) == len(labels)
    noise = torch.rand_like(images) * 2 - 1
    far = judge_samples(mlp_judge, noise, labels, halves["test"], forget_classes=[3])
    assert far["retained_frechet"] > 5 * report["retained_frechet"]
    assert judge_samples(mlp_judge, images, labels, halves["test"])["forgotten_rate"] is None


def test_judge_errors_name_the_argument(halves):
    images, labels = halves["validation"]
    with pytest.raises(ValueError, match="features"):
        judge_samples(lambda x: torch.zeros(len(x), 10), images, labels, halves["test"], [3])
    with pytest.raises(ValueError, match="hidden_size"):
        train_pixel_mlp_judge(images, labels, hidden_size=0)
    with pytest.raises(ValueError, match="images"):
        train_pixel_mlp_judge(images[:, 0], labels)
