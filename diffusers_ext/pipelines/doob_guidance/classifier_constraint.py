"""ClassifierConstraint: "an image classifier gives class k probability >= p" as a hard constraint on generated
images, with a differentiable relaxation, for [`DoobGuidance`] on image pipelines."""

import math

import torch

from ...utils import check_positive_int, is_number, public


@public
class ClassifierConstraint:
    """The constraint `softmax(classifier(x0))[target_class] >= min_probability` on images `x0` `(N, C, H, W)`.

    Both methods see the image the pipeline would output: `x0` clamped to `[-1, 1]` (the range the classifier and
    the pipelines' `output_type="pt"` after `2 * x - 1` share).

    Args:
        classifier (`torch.nn.Module`): maps `(N, C, H, W)` images in `[-1, 1]` to logits `(N, num_classes)`, or to an
            output with `.logits` (e.g. a [`ConvImageClassifier`]); it is put in eval mode.
        target_class (`int`): the class asked for.
        min_probability (`float`, defaults to 0.9): the probability threshold, in `(0, 1)`.
    """

    def __init__(self, classifier: torch.nn.Module, target_class: int, min_probability: float = 0.9):
        if not callable(classifier):
            raise TypeError(f"`classifier` must be a callable module, got {type(classifier).__name__}.")
        check_positive_int("target_class", target_class, minimum=0)
        if not is_number(min_probability) or not 0.0 < min_probability < 1.0:
            raise ValueError(f"`min_probability` must be a number in (0, 1), got {min_probability!r}.")
        self.classifier = classifier.eval() if isinstance(classifier, torch.nn.Module) else classifier
        self.target_class = int(target_class)
        self.min_probability = float(min_probability)

    def log_probability(self, x0: torch.Tensor) -> torch.Tensor:
        """`(N,)` log-probability of `target_class` (differentiable in `x0`)."""
        if not isinstance(x0, torch.Tensor) or x0.ndim != 4:
            raise ValueError(f"`x0` must be a (N, C, H, W) tensor, got {getattr(x0, 'shape', x0)!r}.")
        parameter = next(self.classifier.parameters(), None) if isinstance(self.classifier, torch.nn.Module) else None
        images = x0.clamp(-1.0, 1.0)
        if parameter is not None:
            images = images.to(device=parameter.device, dtype=parameter.dtype)
        output = self.classifier(images)
        logits = getattr(output, "logits", output)
        if logits.ndim != 2 or logits.shape[0] != x0.shape[0] or not 0 <= self.target_class < logits.shape[1]:
            raise ValueError(
                f"the classifier must give logits (N, num_classes > {self.target_class}) for N = {x0.shape[0]}, "
                f"got shape {tuple(logits.shape)}."
            )
        return torch.log_softmax(logits.float(), dim=1)[:, self.target_class].to(x0.device)

    def satisfied(self, x0: torch.Tensor) -> torch.Tensor:
        """`(N,)` bool: the exact check."""
        with torch.no_grad():
            return self.log_probability(x0) >= math.log(self.min_probability)

    def cost(self, x0: torch.Tensor) -> torch.Tensor:
        """`(N,)` relaxation `relu(log min_probability - log p)`: 0 on the feasible set, differentiable in `x0`."""
        return torch.relu(math.log(self.min_probability) - self.log_probability(x0))
