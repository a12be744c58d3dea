"""Rewards from an image classifier: the confidence (or correctness) of the class a prompt asks for."""

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .images import images_to_tensor


def _classifier_inputs(classifier, images) -> torch.Tensor:
    """Images in [0, 1] mapped to the classifier's input: its channels (grey = channel mean), size, [-1, 1]."""
    tensor = images_to_tensor(images)
    config = classifier.config
    if config.in_channels == 1 and tensor.shape[1] != 1:
        tensor = tensor.mean(dim=1, keepdim=True)
    if tensor.shape[-1] != config.sample_size or tensor.shape[-2] != config.sample_size:
        tensor = F.interpolate(tensor, size=(config.sample_size,) * 2, mode="bilinear", antialias=True)
    device = next(classifier.parameters()).device
    return (tensor * 2 - 1).to(device)


@torch.no_grad()
def _class_probabilities(classifier, images) -> torch.Tensor:
    was_training = classifier.training
    classifier.eval()
    logits = classifier(_classifier_inputs(classifier, images)).logits.float().cpu()
    classifier.train(was_training)
    return logits.softmax(dim=-1)


def digit_accuracy(classifier, images, labels: Sequence[int]) -> list[float]:
    """1.0 where the classifier's top class is the given label, else 0.0 (one entry per image)."""
    predictions = _class_probabilities(classifier, images).argmax(dim=-1)
    return (predictions == torch.as_tensor(list(labels))).float().tolist()


class ClassifierReward:
    """Classifier confidence of the class a prompt asks for.

    The class comes from a dataset column passed as a keyword (TRL's convention: `label_key`, one per image).

    Args:
        classifier: a model whose output has `.logits` and whose config has `in_channels` and `sample_size`, e.g.
            the zoo's [`ConvImageClassifier`] (`zoo.load("digits-classifier")`).
        label_key (`str`, defaults to `"label"`): the keyword holding the wanted class of every image.
        mode (`str`, defaults to `"probability"`): `"probability"` (softmax probability of the class),
            `"log_probability"`, or `"correct"` (1 if the top class is the wanted one, else 0; GenEval-like).
    """

    MODES = ("probability", "log_probability", "correct")

    def __init__(self, classifier, label_key: str = "label", mode: str = "probability"):
        if mode not in self.MODES:
            raise ValueError(f"`mode` must be one of {self.MODES}, got {mode!r}.")
        self.classifier, self.label_key, self.mode = classifier, label_key, mode
        self.__name__ = f"classifier_{mode}"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        if self.label_key not in kwargs:
            raise ValueError(
                f"ClassifierReward needs the wanted class of every image in the dataset column {self.label_key!r}; "
                f"the trainer passed the columns {sorted(kwargs)}."
            )
        labels = torch.as_tensor([int(label) for label in kwargs[self.label_key]])
        probabilities = _class_probabilities(self.classifier, images)
        if self.mode == "correct":
            return (probabilities.argmax(dim=-1) == labels).float().tolist()
        chosen = probabilities.gather(1, labels[:, None]).squeeze(1)
        return (chosen.clamp_min(1e-12).log() if self.mode == "log_probability" else chosen).tolist()
