"""The composition baselines of Divide-and-Denoise: allocations fixed before sampling, whatever the models want.

Pass one as the pipeline's `allocator` to run a baseline through the same sampler, models and guidance as the fair
division, for like-with-like comparisons:

- [`AverageAllocator`]: every model weighted `1/K` everywhere (composable diffusion: the mean of the predictions).
- [`RegionAllocator`]: MultiDiffusion's fixed regions, each model responsible for its own mask (equal vertical
  strips, left to right in model order, by default).

Like [`FairDivisionAllocator`], they give allocations `(batch, K, height, width)` that sum to 1 over the `K` models
at every latent position; unlike it, they read no utility maps, so the pipeline computes none and skips the
alignment step.
"""

import abc

import torch

from ...utils import public


class FixedAllocator(abc.ABC):
    """An allocation that does not depend on the models' predictions; subclasses implement `weights`."""

    def check(self, num_agents: int, height: int, width: int) -> None:
        """Raise a `ValueError` naming the bad argument if this allocation cannot serve `num_agents` models on a
        `height x width` latent grid (called by the pipeline's `check_inputs`, before any model work)."""
        return None  # an optional hook: nothing to do by default

    @abc.abstractmethod
    def weights(self, num_agents: int, height: int, width: int) -> torch.Tensor:
        """The `(num_agents, height, width)` float32 weights, summing to 1 over the models at every position."""

    def allocation(self, batch: int, num_agents: int, height: int, width: int, device=None) -> torch.Tensor:
        """The weights for every image of a batch: `(batch, num_agents, height, width)` on `device`."""
        return self.weights(num_agents, height, width).to(device).unsqueeze(0).expand(batch, -1, -1, -1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@public
class AverageAllocator(FixedAllocator):
    """Every model weighted `1/K` at every position: the composite prediction is the mean of the models' predictions
    (composable diffusion's conjunction at equal weights)."""

    def weights(self, num_agents: int, height: int, width: int) -> torch.Tensor:
        return torch.full((num_agents, height, width), 1.0 / num_agents)


@public
class RegionAllocator(FixedAllocator):
    """MultiDiffusion's fixed regions: model `k` is responsible for the positions its mask covers.

    Masks are normalised over the models at each position; a position no mask covers is shared equally.

    Args:
        regions (`torch.Tensor` of shape `(K, latent_height, latent_width)`, *optional*): non-negative region weights,
            one mask per model, at the latent resolution. Equal vertical strips, left to right in model order, by
            default.
    """

    def __init__(self, regions: torch.Tensor | None = None):
        if regions is not None:
            regions = torch.as_tensor(regions, dtype=torch.float32)
            if regions.ndim != 3:
                raise ValueError(
                    f"`regions` must have shape (num_models, latent height, latent width), got {tuple(regions.shape)}."
                )
            if (regions < 0).any() or not torch.isfinite(regions).all():
                raise ValueError("`regions` must be finite and >= 0.")
        self.regions = regions

    def check(self, num_agents: int, height: int, width: int) -> None:
        if self.regions is not None and self.regions.shape != (num_agents, height, width):
            raise ValueError(
                f"`regions` has shape {tuple(self.regions.shape)}; expected (num_models, latent height, latent "
                f"width) = {(num_agents, height, width)}."
            )

    def weights(self, num_agents: int, height: int, width: int) -> torch.Tensor:
        self.check(num_agents, height, width)
        if self.regions is None:
            columns = torch.arange(width) * num_agents // width
            masks = (columns.view(1, 1, -1) == torch.arange(num_agents).view(-1, 1, 1)).float()
            masks = masks.expand(num_agents, height, width)
        else:
            masks = self.regions
        total = masks.sum(dim=0, keepdim=True)
        return torch.where(total > 0, masks / total.clamp_min(1e-12), torch.full_like(masks, 1.0 / num_agents))

    def __repr__(self) -> str:
        shape = None if self.regions is None else tuple(self.regions.shape)
        return f"RegionAllocator(regions={'strips' if shape is None else shape})"
