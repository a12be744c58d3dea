"""A VGG-style network that regresses which augmentations were applied to an image (the AYT feature network)."""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import public


@public
@dataclass
class AugmentationRegressorOutput(BaseOutput):
    """
    Output of [`AugmentationRegressor`].

    Args:
        predictions (`torch.Tensor` of shape `(batch_size, num_labels)`): the regressed augmentation parameters.
        feature_maps (`tuple[torch.Tensor]`): one map per pooling stage, `(batch_size, C_i, H_i, W_i)`, followed by
            the predictions as a `(batch_size, num_labels, 1, 1)` map: the layers a
            [`ManifoldFeatureDistance`] compares.
    """

    predictions: torch.Tensor
    feature_maps: tuple[torch.Tensor, ...]


@public
class AugmentationRegressor(ModelMixin, ConfigMixin):
    r"""
    A VGG-style CNN (per stage `layers_per_block` 3x3 convolutions with GroupNorm and ReLU, then 2x2 max pooling;
    global average pooling and a linear head) trained by mean squared error to regress the parameters of the
    augmentations applied to its input. Its multi-layer feature maps define the manifold feature distance of
    "Align Your Tangent" (AYT): they are sensitive to the directions along which natural images vary (the
    augmentations) and so keep a consistency-training signal on the data manifold.

    Parameters:
        in_channels (`int`, defaults to 1): channels of the input images.
        sample_size (`int`, defaults to 8): the square input resolution; other sizes are rejected.
        block_out_channels (`tuple[int]`, defaults to `(32, 64)`): channels of each stage.
        layers_per_block (`int`, defaults to 2): convolutions per stage.
        num_labels (`int`, defaults to 9): number of regressed augmentation parameters.
        label_names (`tuple[str]`, *optional*): their names, saved with the config for the record.
    """

    @register_to_config
    def __init__(
        self,
        in_channels: int = 1,
        sample_size: int = 8,
        block_out_channels: tuple[int, ...] = (32, 64),
        layers_per_block: int = 2,
        num_labels: int = 9,
        label_names: tuple[str, ...] | None = None,
    ):
        super().__init__()
        if sample_size % (2 ** len(block_out_channels)):
            raise ValueError(
                f"`sample_size` {sample_size} must be divisible by 2**{len(block_out_channels)} for "
                f"{len(block_out_channels)} pooling stages."
            )
        if label_names is not None and len(label_names) != num_labels:
            raise ValueError(f"`label_names` has {len(label_names)} names but `num_labels` is {num_labels}.")
        self.stages = nn.ModuleList()
        channels = in_channels
        for out_channels in block_out_channels:
            layers = []
            for _ in range(layers_per_block):
                layers += [
                    nn.Conv2d(channels, out_channels, 3, padding=1),
                    nn.GroupNorm(min(8, out_channels), out_channels),
                    nn.ReLU(),
                ]
                channels = out_channels
            layers.append(nn.MaxPool2d(2))
            self.stages.append(nn.Sequential(*layers))
        self.head = nn.Linear(channels, num_labels)

    def forward(self, pixel_values: torch.Tensor, return_dict: bool = True) -> AugmentationRegressorOutput | tuple:
        r"""
        Args:
            pixel_values (`torch.Tensor` of shape `(batch_size, in_channels, sample_size, sample_size)`): images in
                [-1, 1].
            return_dict (`bool`, defaults to `True`): return an [`AugmentationRegressorOutput`] instead of a tuple.
        """
        expected = (self.config.in_channels, self.config.sample_size, self.config.sample_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"`pixel_values` has shape {tuple(pixel_values.shape)}; expected (batch_size, "
                f"{', '.join(map(str, expected))})."
            )
        hidden = pixel_values.to(self.dtype)
        maps = []
        for stage in self.stages:
            hidden = stage(hidden)
            maps.append(hidden)
        predictions = self.head(hidden.mean(dim=(2, 3)))
        maps.append(predictions[:, :, None, None])
        if not return_dict:
            return (predictions, tuple(maps))
        return AugmentationRegressorOutput(predictions=predictions, feature_maps=tuple(maps))
