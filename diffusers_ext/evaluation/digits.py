"""Measure a class-conditional digits generator with the zoo classifier (shared by benchmark, demo and tests)."""

from dataclasses import dataclass

import numpy as np
import torch

from ..data.digits import NUM_CLASSES, load_digits_images
from ..metrics import classifier_predictions, frechet_distance, per_class_accuracy


@dataclass
class DigitsGeneratorReport:
    r"""
    What the classifier says about generated digits.

    Args:
        images (`torch.Tensor` of shape `(num_classes * samples_per_class, 1, H, W)`): the samples in [-1, 1],
            class-major (all samples of class 0 first).
        labels (`torch.Tensor` of shape `(N,)`): the conditioning class of each sample.
        predictions (`torch.Tensor` of shape `(N,)`): the classifier's verdicts.
        per_class_accuracy (`torch.Tensor` of shape `(num_classes,)`): share of samples classified as their class.
        confusion (`np.ndarray` of shape `(num_classes, num_classes)`): rows conditioning class, columns verdict.
        frechet_distance (`float`): samples vs the held-out real digits, in the classifier's feature space.
    """

    images: torch.Tensor
    labels: torch.Tensor
    predictions: torch.Tensor
    per_class_accuracy: torch.Tensor
    confusion: np.ndarray
    frechet_distance: float

    @property
    def conditional_accuracy(self) -> float:
        """Mean over classes of the per-class accuracy."""
        return float(self.per_class_accuracy.mean())


@torch.no_grad()
def sample_digits(
    pipe, samples_per_class: int, num_inference_steps: int, guidance_scale: float, seed: int, batch_size: int = 500
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `samples_per_class` digits of every class; return `(images in [-1, 1], labels)`, class-major."""
    labels = torch.arange(NUM_CLASSES).repeat_interleave(samples_per_class)
    generator = torch.Generator("cpu").manual_seed(seed)
    chunks = []
    for start in range(0, len(labels), batch_size):
        out = pipe(
            class_labels=labels[start : start + batch_size],
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            generator=generator,
            output_type="pt",
        ).images
        chunks.append(out.cpu() * 2 - 1)
    return torch.cat(chunks), labels


def evaluate_digits_generator(
    pipe,
    classifier,
    samples_per_class: int = 100,
    num_inference_steps: int = 25,
    guidance_scale: float = 1.0,
    seed: int = 0,
) -> DigitsGeneratorReport:
    """Sample every class with `pipe` and judge the samples with `classifier` against the held-out digits."""
    images, labels = sample_digits(pipe, samples_per_class, num_inference_steps, guidance_scale, seed)
    predictions, features = classifier_predictions(classifier, images)
    real_images, _ = load_digits_images("heldout", resolution=images.shape[-1])
    _, real_features = classifier_predictions(classifier, real_images)
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=np.int64)
    np.add.at(confusion, (labels.numpy(), predictions.cpu().numpy()), 1)
    return DigitsGeneratorReport(
        images=images,
        labels=labels,
        predictions=predictions.cpu(),
        per_class_accuracy=per_class_accuracy(predictions.cpu(), labels, NUM_CLASSES),
        confusion=confusion,
        frechet_distance=frechet_distance(features, real_features),
    )
