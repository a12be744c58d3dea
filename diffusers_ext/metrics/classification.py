"""Classification metrics, and running a classifier over an image set to evaluate generated samples."""

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ._validation import check_ndim, check_positive_int, to_tensor, to_tensors


def _as_predictions(logits_or_predictions: torch.Tensor, name: str) -> torch.Tensor:
    """(N, num_classes) scores -> argmax; (N,) integer class indices -> themselves."""
    if logits_or_predictions.ndim == 2:
        if logits_or_predictions.shape[1] == 0:
            raise ValueError(
                f"`{name}` has shape {tuple(logits_or_predictions.shape)}; expected logits with at least one class."
            )
        return logits_or_predictions.argmax(dim=1)
    if logits_or_predictions.ndim == 1:
        if logits_or_predictions.dtype.is_floating_point:
            raise TypeError(
                f"`{name}` is 1-D with dtype {logits_or_predictions.dtype}; expected integer class indices of shape "
                "(N,), or logits of shape (N, num_classes)."
            )
        return logits_or_predictions
    raise ValueError(
        f"`{name}` has shape {tuple(logits_or_predictions.shape)}; expected class indices of shape (N,) or logits "
        "of shape (N, num_classes)."
    )


def _check_labels(labels: torch.Tensor, num_samples: int, other: str) -> None:
    check_ndim(labels, "labels", 1, "vector of class indices (N,)")
    if labels.dtype.is_floating_point:
        raise TypeError(f"`labels` has dtype {labels.dtype}; expected an integer dtype (class indices).")
    if labels.shape[0] != num_samples:
        raise ValueError(
            f"`labels` has {labels.shape[0]} entries but `{other}` has {num_samples} samples; expected one label "
            "per sample."
        )
    if num_samples == 0:
        raise ValueError("`labels` is empty; expected at least one sample.")


def accuracy(logits_or_predictions: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> float:
    r"""
    Fraction of samples whose predicted class equals the label.

    Args:
        logits_or_predictions (`torch.Tensor` or `np.ndarray`): either scores of shape `(N, num_classes)` (the
            prediction is their argmax) or integer class indices of shape `(N,)`.
        labels (`torch.Tensor` or `np.ndarray` of shape `(N,)`): integer class indices.

    Returns:
        `float` in [0, 1].
    """
    scores, labels = to_tensors(logits_or_predictions=logits_or_predictions, labels=labels)
    predictions = _as_predictions(scores, "logits_or_predictions")
    _check_labels(labels, predictions.shape[0], "logits_or_predictions")
    return (predictions == labels).to(torch.float64).mean().item()


def per_class_accuracy(
    predictions: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, num_classes: int
) -> torch.Tensor:
    r"""
    Accuracy within each true class: for class `k`, the fraction of samples labelled `k` that are predicted `k`.

    Args:
        predictions (`torch.Tensor` or `np.ndarray`): integer class indices of shape `(N,)`, or logits of shape
            `(N, num_classes)`; indices must lie in `[0, num_classes)`.
        labels (`torch.Tensor` or `np.ndarray` of shape `(N,)`): integer class indices in `[0, num_classes)`.
        num_classes (`int`): the number of classes.

    Returns:
        `torch.Tensor` of shape `(num_classes,)`, float64, on the inputs' device; NaN for a class with no samples.
    """
    predictions, labels = to_tensors(predictions=predictions, labels=labels)
    num_classes = check_positive_int(num_classes, "num_classes")
    if predictions.ndim == 2 and predictions.shape[1] != num_classes:
        raise ValueError(
            f"`predictions` are logits of shape {tuple(predictions.shape)} but `num_classes` is {num_classes}; "
            f"expected shape (N, {num_classes})."
        )
    predictions = _as_predictions(predictions, "predictions")
    _check_labels(labels, predictions.shape[0], "predictions")
    for name, values in (("predictions", predictions), ("labels", labels)):
        low, high = values.min().item(), values.max().item()
        if low < 0 or high >= num_classes:
            raise ValueError(
                f"`{name}` holds class indices from {low} to {high}; expected indices in [0, {num_classes}) for "
                f"`num_classes`={num_classes}."
            )

    labels = labels.to(torch.int64)
    totals = torch.bincount(labels, minlength=num_classes).to(torch.float64)
    correct = torch.bincount(labels[predictions == labels], minlength=num_classes).to(torch.float64)
    return correct / totals  # 0 / 0 is NaN: a class with no samples


def _split_output(output, batch_length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits and (optional) features from a classifier's output: a tensor, a `(logits, features)` tuple, or an
    object with `.logits` and optionally `.features` (e.g. [`ImageClassifierOutput`])."""
    if isinstance(output, torch.Tensor):
        logits, features = output, None
    elif hasattr(output, "logits"):
        logits, features = output.logits, getattr(output, "features", None)
    elif isinstance(output, (tuple, list)) and len(output) in (1, 2):
        logits, features = output[0], (output[1] if len(output) == 2 else None)
    else:
        raise TypeError(
            f"`classifier` returned {type(output).__name__}; expected logits (a tensor), a (logits, features) tuple, "
            "or an object with a `.logits` attribute."
        )
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != batch_length:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(
            f"`classifier` returned logits of shape {shape} for a batch of {batch_length}; expected shape "
            f"({batch_length}, num_classes)."
        )
    if features is not None and (
        not isinstance(features, torch.Tensor) or features.ndim != 2 or features.shape[0] != batch_length
    ):
        shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
        raise ValueError(
            f"`classifier` returned features of shape {shape} for a batch of {batch_length}; expected shape "
            f"({batch_length}, feature_dim)."
        )
    return logits, features


def _check_images(images: torch.Tensor) -> None:
    if images.ndim < 2:
        raise ValueError(
            f"`images` has shape {tuple(images.shape)}; expected a batch of shape (N, ...), e.g. (N, C, H, W)."
        )
    if images.shape[0] == 0:
        raise ValueError(f"`images` has shape {tuple(images.shape)}; expected at least one image.")


def classifier_predictions(
    classifier: Callable, images: torch.Tensor | np.ndarray, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""
    Run a classifier over an image set in batches, under `torch.no_grad()`, and collect its predictions and features.

    An `nn.Module` is put in eval mode for the run (its previous mode is restored afterwards), and each batch is
    moved to the device of its first parameter and, for floating images, cast to that parameter's dtype. Any other
    callable receives the batches as they are.

    Args:
        classifier (`Callable`): maps a batch of images to logits of shape `(batch, num_classes)`, to a
            `(logits, features)` tuple, or to an object with `.logits` and optionally `.features` (as
            [`ConvImageClassifier`] does, which expects images in [-1, 1]).
        images (`torch.Tensor` or `np.ndarray` of shape `(N, ...)`, e.g. `(N, C, H, W)`): the images, in the range
            and layout the classifier expects.
        batch_size (`int`, defaults to 256): images per forward pass.

    Returns:
        `tuple(torch.Tensor, torch.Tensor | None)`: the predicted classes (argmax of the logits), int64 of shape
        `(N,)`, and the features of shape `(N, feature_dim)`, or `None` when the classifier returns no features;
        both on the device of `images`.
    """
    if not callable(classifier):
        raise TypeError(f"`classifier` must be callable (e.g. an nn.Module); got {type(classifier).__name__}.")
    images = to_tensor(images, "images")
    _check_images(images)
    batch_size = check_positive_int(batch_size, "batch_size")

    parameter = next(classifier.parameters(), None) if isinstance(classifier, nn.Module) else None
    was_training = classifier.training if isinstance(classifier, nn.Module) else None
    predictions, features = [], []
    try:
        if isinstance(classifier, nn.Module):
            classifier.eval()
        with torch.no_grad():
            for start in range(0, images.shape[0], batch_size):
                batch = images[start : start + batch_size]
                if parameter is not None:
                    dtype = parameter.dtype if batch.dtype.is_floating_point else batch.dtype
                    batch = batch.to(device=parameter.device, dtype=dtype)
                logits, batch_features = _split_output(classifier(batch), batch.shape[0])
                predictions.append(logits.argmax(dim=1).to(images.device))
                features.append(None if batch_features is None else batch_features.to(images.device))
    finally:
        if was_training:
            classifier.train()
    missing = sum(batch_features is None for batch_features in features)
    if missing == len(features):
        return torch.cat(predictions), None
    if missing:
        raise ValueError(f"`classifier` returned features for some batches but not for {missing} others.")
    return torch.cat(predictions), torch.cat(features)


def classifier_accuracy(
    classifier: Callable,
    images: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    batch_size: int = 256,
) -> float:
    r"""
    Accuracy of `classifier` on `images` against `labels`, e.g. how often generated samples of class `k` are
    recognised as class `k`.

    Args:
        classifier (`Callable`): as in [`classifier_predictions`].
        images (`torch.Tensor` or `np.ndarray` of shape `(N, ...)`): the images.
        labels (`torch.Tensor` or `np.ndarray` of shape `(N,)`): integer class indices.
        batch_size (`int`, defaults to 256): images per forward pass.

    Returns:
        `float` in [0, 1].
    """
    images = to_tensor(images, "images")
    labels = to_tensor(labels, "labels")
    _check_images(images)
    _check_labels(labels, images.shape[0], "images")
    predictions, _ = classifier_predictions(classifier, images, batch_size=batch_size)
    return accuracy(predictions, labels.to(predictions.device))
