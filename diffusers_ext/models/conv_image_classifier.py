"""A small convolutional image classifier used to evaluate generators (accuracy and Fréchet features)."""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_finite, public


# The inputs' range is [-1, 1]; the slack admits unclamped samples and the domain-shifted digits (clamped to
# [-1.5, 1.5]), and still refuses [0, 255] pixels, on which the classifier would answer confidently and wrongly.
PIXEL_RANGE_LIMIT = 1.5


def check_pixel_range(pixel_values: torch.Tensor) -> None:
    """Raise a `ValueError` naming `pixel_values` unless it is finite and within [-1.5, 1.5] (images in [-1, 1],
    with slack for unclamped samples): an image in [0, 255] says how to rescale it."""
    check_finite("pixel_values", pixel_values)
    low, high = float(pixel_values.min()), float(pixel_values.max())
    if low < -PIXEL_RANGE_LIMIT or high > PIXEL_RANGE_LIMIT:
        hint = " (pixels in [0, 255]: pass x / 127.5 - 1)" if high > 2 else ""
        raise ValueError(
            f"`pixel_values` holds values in [{low:g}, {high:g}]; expected images in [-1, 1] (the range the "
            f"classifier was trained on; up to +-{PIXEL_RANGE_LIMIT:g} is accepted){hint}."
        )


@public
@dataclass
class ImageClassifierOutput(BaseOutput):
    """
    Output of [`ConvImageClassifier`].

    Args:
        logits (`torch.Tensor` of shape `(batch_size, num_classes)`): unnormalised class scores.
        features (`torch.Tensor` of shape `(batch_size, feature_dim)`): the penultimate-layer features, the space
            in which Fréchet distances between image sets are measured.
    """

    logits: torch.Tensor
    features: torch.Tensor


@public
class ConvImageClassifier(ModelMixin, ConfigMixin):
    r"""
    A VGG-style CNN classifier: per block two 3x3 convolutions with GroupNorm and SiLU, then 2x2 max pooling;
    global average pooling, a feature layer and a linear head.

    Parameters:
        in_channels (`int`, defaults to 1): channels of the input images.
        num_classes (`int`, defaults to 10): number of classes.
        sample_size (`int`, defaults to 16): the square input resolution the classifier was trained on;
            inputs of another size are rejected.
        block_out_channels (`tuple[int]`, defaults to `(32, 64)`): output channels of each block.
        feature_dim (`int`, defaults to 128): size of the penultimate feature vector.
        dropout (`float`, defaults to 0.1): dropout before the head, active in training only.
    """

    @register_to_config
    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        sample_size: int = 16,
        block_out_channels: tuple[int, ...] = (32, 64),
        feature_dim: int = 128,
        dropout: float = 0.1,
    ):
        super().__init__()
        layers = []
        channels = in_channels
        for out_channels in block_out_channels:
            layers += [
                nn.Conv2d(channels, out_channels, 3, padding=1),
                nn.GroupNorm(min(8, out_channels), out_channels),
                nn.SiLU(),
                nn.Conv2d(out_channels, out_channels, 3, padding=1),
                nn.GroupNorm(min(8, out_channels), out_channels),
                nn.SiLU(),
                nn.MaxPool2d(2),
            ]
            channels = out_channels
        self.blocks = nn.Sequential(*layers)
        self.feature = nn.Sequential(nn.Linear(channels, feature_dim), nn.SiLU())
        self.head_dropout = nn.Dropout(dropout)
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, pixel_values: torch.Tensor, return_dict: bool = True) -> ImageClassifierOutput | tuple:
        r"""
        Args:
            pixel_values (`torch.Tensor` of shape `(batch_size, in_channels, sample_size, sample_size)`):
                images scaled to [-1, 1], the same range the diffusion pipelines produce with `output_type="pt"`
                after `2 * x - 1`. Values beyond +-1.5 (e.g. [0, 255] pixels) or NaN are refused.
            return_dict (`bool`, defaults to `True`): return an [`ImageClassifierOutput`] instead of a tuple.
        """
        expected = (self.config.in_channels, self.config.sample_size, self.config.sample_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"`pixel_values` has shape {tuple(pixel_values.shape)}; expected (batch_size, {', '.join(map(str, expected))})."
            )
        check_pixel_range(pixel_values)
        hidden = self.blocks(pixel_values.to(self.dtype)).mean(dim=(2, 3))
        features = self.feature(hidden)
        logits = self.head(self.head_dropout(features))
        if not return_dict:
            return (logits, features)
        return ImageClassifierOutput(logits=logits, features=features)
