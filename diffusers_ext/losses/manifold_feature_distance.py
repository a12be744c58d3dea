"""The manifold feature distance (MFD) of "Align Your Tangent" (AYT) and its normalised-gradient update."""

from collections.abc import Sequence

import torch
from torch import nn

from ..utils import public


def _feature_maps(network: nn.Module, images: torch.Tensor) -> Sequence[torch.Tensor]:
    output = network(images)
    maps = getattr(output, "feature_maps", output)
    if not isinstance(maps, (list, tuple)) or not all(isinstance(m, torch.Tensor) and m.ndim == 4 for m in maps):
        raise TypeError(
            f"`feature_network` must return a list/tuple of (batch, channels, height, width) maps or an output with "
            f"a `feature_maps` field; got {type(maps).__name__}."
        )
    return maps


@public
class ManifoldFeatureDistance(nn.Module):
    r"""
    A distance between images in the multi-layer feature space of a (frozen) feature network:

        d(x, y) = sum_l w_l sum_c ( sqrt(||phi_l,c(x) - phi_l,c(y)||^2 + eps^2) - eps ),

    where `phi_l,c` is channel `c` of layer `l`'s feature map and the norm runs over its spatial positions: a
    pseudo-Huber distance per channel map, summed over channels and layers. With an [`AugmentationRegressor`] as
    the feature network this is AYT's manifold feature distance: the features respond to the directions along
    which natural images vary (the augmentations), so the distance and its gradient stay close to the data
    manifold.

    The feature network is frozen (`requires_grad_(False)`, eval mode); gradients flow to the images only.

    Args:
        feature_network (`torch.nn.Module`): maps images `(B, C, H, W)` to a sequence of feature maps
            `(B, C_l, H_l, W_l)`, or to an output with a `feature_maps` field (as [`AugmentationRegressor`] does).
        layer_weights (`Sequence[float]`, *optional*): one weight per layer; all 1 if omitted.
        epsilon (`float`, defaults to 1e-5): the pseudo-Huber constant (the distance is smooth at 0).
    """

    def __init__(
        self, feature_network: nn.Module, layer_weights: Sequence[float] | None = None, epsilon: float = 1e-5
    ):
        super().__init__()
        if not isinstance(feature_network, nn.Module):
            raise TypeError(f"`feature_network` must be a torch.nn.Module, got {type(feature_network).__name__}.")
        if epsilon <= 0:
            raise ValueError(f"`epsilon` must be > 0, got {epsilon}.")
        self.feature_network = feature_network.eval().requires_grad_(False)
        self.layer_weights = None if layer_weights is None else [float(w) for w in layer_weights]
        self.epsilon = float(epsilon)

    def train(self, mode: bool = True):
        super().train(mode)
        self.feature_network.eval()  # the feature network is a fixed measuring device
        return self

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r"""
        Args:
            x (`torch.Tensor` of shape `(batch_size, C, H, W)`): images.
            y (`torch.Tensor` of the same shape): the images to compare them with.

        Returns:
            `torch.Tensor` of shape `(batch_size,)`: the distance of each pair (>= 0, 0 for identical images).
        """
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape or x.ndim != 4:
            raise ValueError(
                f"`x` and `y` must be image tensors of one shape (batch_size, C, H, W); got "
                f"{tuple(getattr(x, 'shape', ()))} and {tuple(getattr(y, 'shape', ()))}."
            )
        maps = _feature_maps(self.feature_network, torch.cat([x, y]))
        if self.layer_weights is not None and len(self.layer_weights) != len(maps):
            raise ValueError(
                f"`layer_weights` has {len(self.layer_weights)} entries but the feature network returns "
                f"{len(maps)} layers."
            )
        batch = x.shape[0]
        total = x.new_zeros(batch, dtype=torch.float32)
        for index, layer in enumerate(maps):
            diff = (layer[:batch] - layer[batch:]).float()
            per_channel = (diff.square().sum(dim=(2, 3)) + self.epsilon**2).sqrt() - self.epsilon
            weight = 1.0 if self.layer_weights is None else self.layer_weights[index]
            total = total + weight * per_channel.sum(dim=1)
        return total


def normalized_distance_gradient(distance: nn.Module, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    r"""
    The direction in which `distance(prediction, target)` grows fastest, normalised to unit length per sample.

    This is the update direction of AYT's consistency training: the model output moves along `-g / ||g||`
    whatever the distance's scale, so every sample contributes a step of the same size.

    Args:
        distance (`torch.nn.Module`): maps two image batches to per-sample distances of shape `(batch_size,)`.
        prediction (`torch.Tensor` of shape `(batch_size, C, H, W)`): the point the gradient is taken at; it is
            detached first (nothing flows into the model here).
        target (`torch.Tensor` of the same shape): the images compared with (treated as constants).

    Returns:
        `torch.Tensor` of the shape of `prediction`: `g_i / max(||g_i||, 1e-5)` for each sample `i`, with
        `g_i` the gradient of sample `i`'s distance with respect to `prediction_i`.
    """
    with torch.enable_grad():
        point = prediction.detach().float().requires_grad_(True)
        values = distance(point, target.detach().float())
        if values.shape != (prediction.shape[0],):
            raise ValueError(
                f"`distance` returned shape {tuple(values.shape)}; expected one value per sample "
                f"({prediction.shape[0]},)."
            )
        # Samples do not interact in the distance, so the gradient of the sum holds each sample's own gradient.
        (gradient,) = torch.autograd.grad(values.sum(), point)
    norms = gradient.flatten(1).norm(dim=1).clamp(min=1e-5)
    return (gradient / norms[:, None, None, None]).to(prediction.dtype)
