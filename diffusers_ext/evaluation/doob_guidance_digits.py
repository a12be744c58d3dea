"""What measures Doob guidance on the digits DDPM independently of its guide (the zoo `digits-classifier`).

- [`PixelDigitJudge`]: a scikit-learn RBF support-vector classifier on raw pixels, trained in-process on the digits'
  train split (deterministic); it shares no weights, features or training run with the guide.
- [`PixelPCAFeatures`]: a principal-component feature space of raw pixels fit on the train split, for a Fréchet
  distance that the guide's features do not define.
"""

import numpy as np
import torch

from ..data.digits import load_digits_images
from ..metrics import frechet_distance


def _pixels(images: torch.Tensor | np.ndarray, resolution: int) -> np.ndarray:
    """`(N, 1, R, R)` images in `[-1, 1]` -> `(N, R * R)` float64 pixels, clamped to `[-1, 1]`."""
    images = torch.as_tensor(images)
    if images.ndim != 4 or tuple(images.shape[1:]) != (1, resolution, resolution):
        raise ValueError(
            f"`images` must have shape (N, 1, {resolution}, {resolution}) in [-1, 1], got {tuple(images.shape)}."
        )
    return images.detach().cpu().double().clamp(-1.0, 1.0).flatten(1).numpy()


class PixelDigitJudge:
    """An RBF support-vector classifier on the raw pixels of the digits' train split (`load_digits_images`).

    Args:
        resolution (`int`, defaults to 8): the image side it is trained and judges at.
        C (`float`, defaults to 10.0): the SVC's regularisation.

    Attributes:
        heldout_accuracy (`float`): its accuracy on the held-out split (reported beside every verdict).
    """

    def __init__(self, resolution: int = 8, C: float = 10.0):
        from sklearn.svm import SVC

        self.resolution = resolution
        images, labels = load_digits_images("train", resolution=resolution)
        self.model = SVC(C=C, kernel="rbf", gamma="scale").fit(_pixels(images, resolution), labels.numpy())
        heldout, heldout_labels = load_digits_images("heldout", resolution=resolution)
        self.heldout_accuracy = float((self.predict(heldout) == heldout_labels).float().mean())
        self.heldout_size = len(heldout_labels)

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """`(N,)` int64 classes of `(N, 1, R, R)` images in `[-1, 1]`."""
        return torch.from_numpy(self.model.predict(_pixels(images, self.resolution))).long()


class PixelPCAFeatures:
    """The top `num_components` principal components of the train split's raw pixels, as a feature extractor.

    Args:
        resolution (`int`, defaults to 8): the image side.
        num_components (`int`, defaults to 16): the feature dimension.
    """

    def __init__(self, resolution: int = 8, num_components: int = 16):
        images, _ = load_digits_images("train", resolution=resolution)
        pixels = _pixels(images, resolution)
        self.resolution = resolution
        self.mean = pixels.mean(axis=0)
        _, _, vt = np.linalg.svd(pixels - self.mean, full_matrices=False)
        self.components = vt[:num_components]

    def __call__(self, images: torch.Tensor) -> np.ndarray:
        """`(N, num_components)` features of `(N, 1, R, R)` images in `[-1, 1]`."""
        return (_pixels(images, self.resolution) - self.mean) @ self.components.T

    def frechet_distance(self, images: torch.Tensor, reference: torch.Tensor) -> float:
        """The Fréchet distance between `images` and `reference` (both `(N, 1, R, R)`, N >= 2) in these features."""
        return frechet_distance(self(images), self(reference))
