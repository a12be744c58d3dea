"""Judges and the comparison baseline of the consistency-training benchmark (digits).

- `ClassifierFeatureDistance`: an LPIPS-like distance built from the zoo digits classifier's activations (unit-
  normalised channels, squared differences averaged over space, summed over layers), the stand-in for LPIPS as the
  distance of a consistency loss. It is a comparison baseline only.
- `train_judge_classifier`: a second, independent digits classifier (another architecture and seed), trained here
  and used by no training loss; its features give the second Fréchet judge.
- `sample_consistency_model`: 1- or 2-step samples from diffusers' own `ConsistencyModelPipeline`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class ClassifierFeatureDistance(nn.Module):
    r"""
    LPIPS-like distance in a [`ConvImageClassifier`]'s activation space (no learned layer weights):

        d(x, y) = sum_l mean_{h,w} || u_l(x)_{:,h,w} - u_l(y)_{:,h,w} ||^2,

    where `u_l` is the output of the `l`-th activation of `classifier.blocks`, normalised to unit length over
    channels at every position. The classifier is frozen.

    Args:
        classifier ([`ConvImageClassifier`]): the network whose activations are compared.
    """

    def __init__(self, classifier: nn.Module):
        super().__init__()
        if not hasattr(classifier, "blocks"):
            raise TypeError(f"`classifier` must be a ConvImageClassifier (with `.blocks`), got {type(classifier)}.")
        self.classifier = classifier.eval().requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self.classifier.eval()
        return self

    def feature_maps(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The activation maps `(B, C_l, H_l, W_l)` of `images` `(B, 1, H, W)` in [-1, 1]."""
        maps, hidden = [], images
        for layer in self.classifier.blocks:
            hidden = layer(hidden)
            if isinstance(layer, nn.SiLU):
                maps.append(hidden)
        return maps

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample distances `(B,)` between image batches `x` and `y` of one shape `(B, 1, H, W)`."""
        if x.shape != y.shape:
            raise ValueError(f"`x` {tuple(x.shape)} and `y` {tuple(y.shape)} must have the same shape.")
        maps = self.feature_maps(torch.cat([x, y]))
        batch, total = x.shape[0], x.new_zeros(x.shape[0])
        for layer in maps:
            unit = F.normalize(layer, dim=1, eps=1e-10)
            total = total + (unit[:batch] - unit[batch:]).square().sum(dim=1).mean(dim=(1, 2))
        return total


def train_judge_classifier(
    images: torch.Tensor,
    labels: torch.Tensor,
    seed: int = 1,
    steps: int = 1500,
    block_out_channels: tuple[int, ...] = (24, 48),
    feature_dim: int = 64,
    batch_size: int = 64,
):
    r"""
    Train a second digits classifier (a [`ConvImageClassifier`] of another size and seed than the zoo judge) with
    random 1-pixel shifts; it is used by no training loss.

    Args:
        images (`torch.Tensor` of shape `(N, 1, H, W)`), labels (`torch.Tensor` of shape `(N,)`): training digits.
        seed (`int`), steps (`int`), block_out_channels, feature_dim, batch_size: the recipe.

    Returns:
        the trained classifier in eval mode.
    """
    from ..models.conv_image_classifier import ConvImageClassifier

    torch.manual_seed(seed)
    model = ConvImageClassifier(
        in_channels=images.shape[1],
        num_classes=int(labels.max()) + 1,
        sample_size=images.shape[-1],
        block_out_channels=block_out_channels,
        feature_dim=feature_dim,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    generator = torch.Generator().manual_seed(seed)
    side = images.shape[-1]
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(images), (batch_size,), generator=generator)
        padded = F.pad(images[index], [1] * 4, value=-1.0)
        dy, dx = torch.randint(0, 3, (2,), generator=generator).tolist()
        batch = padded[:, :, dy : dy + side, dx : dx + side]
        loss = F.cross_entropy(model(batch).logits, labels[index])
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return model.eval()


@torch.no_grad()
def sample_consistency_model(pipe, num_images: int, num_inference_steps: int, seed: int, batch_size: int = 500):
    """`num_images` samples `(N, C, H, W)` in [-1, 1] from a `ConsistencyModelPipeline` (unconditional model)."""
    generator = torch.Generator("cpu").manual_seed(seed)
    chunks = []
    for start in range(0, num_images, batch_size):
        size = min(batch_size, num_images - start)
        out = pipe(batch_size=size, num_inference_steps=num_inference_steps, generator=generator, output_type="pt")
        chunks.append(out.images.cpu() * 2 - 1)
    return torch.cat(chunks)
