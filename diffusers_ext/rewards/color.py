"""Rewards on an image's mean brightness or colour: cheap, exact targets for testing the RL trainers."""

from collections.abc import Sequence

import torch

from .images import images_to_tensor


class BrightnessReward:
    """Minus the distance of an image's mean brightness (in [0, 1]) from `target`.

    Args:
        target (`float`): the wanted mean brightness in [0, 1].
    """

    def __init__(self, target: float):
        if not 0 <= target <= 1:
            raise ValueError(f"`target` must lie in [0, 1], got {target!r}.")
        self.target = target
        self.__name__ = f"brightness_{target:g}"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        brightness = images_to_tensor(images).mean(dim=(1, 2, 3))
        return (-(brightness - self.target).abs()).tolist()


class ColorReward:
    """Minus the Euclidean distance of an image's mean RGB colour (in [0, 1]) from `target`.

    Args:
        target (`tuple[float, float, float]`): the wanted mean colour.
    """

    def __init__(self, target: Sequence[float]):
        if len(target) != 3 or not all(0 <= c <= 1 for c in target):
            raise ValueError(f"`target` must be three values in [0, 1] (RGB), got {target!r}.")
        self.target = torch.tensor([float(c) for c in target])
        self.__name__ = "color"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        tensor = images_to_tensor(images)
        if tensor.shape[1] != 3:
            raise ValueError(f"ColorReward needs RGB images, got {tensor.shape[1]} channels.")
        return (-(tensor.mean(dim=(2, 3)) - self.target).norm(dim=1)).tolist()
