"""Flux's latent layout: a `FluxTransformer2DModel` takes its latents packed into 2x2 patches, with position ids.

The pipeline keeps its latents unpacked, `(batch, channels, height, width)` as every other family's (the allocation,
the utilities and the alignment step read positions on that grid); only the Flux forward sees the packed sequence
`(batch, (height / 2) * (width / 2), 4 * channels)`, in `FluxPipeline`'s patch order, so that noise drawn unpacked
and packed here is the noise `FluxPipeline` draws.
"""

import torch


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """`(B, C, H, W)` -> `(B, (H / 2) * (W / 2), 4 C)`: each 2x2 patch one token (channel-major within a token)."""
    batch, channels, height, width = latents.shape
    patches = latents.view(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_latents(packed: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of [`pack_latents`]: `(B, (H / 2) * (W / 2), 4 C)` -> `(B, C, H, W)`."""
    batch, _, features = packed.shape
    patches = packed.view(batch, height // 2, width // 2, features // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(batch, features // 4, height, width)


def latent_image_ids(height: int, width: int, device, dtype) -> torch.Tensor:
    """The `((H / 2) * (W / 2), 3)` position ids of the packed tokens of `H x W` latents: `(0, row, column)` of each
    2x2 patch, the ids Flux's rotary embedding reads (the text tokens' ids are zeros)."""
    rows = torch.arange(height // 2, device=device).view(-1, 1).expand(-1, width // 2)
    columns = torch.arange(width // 2, device=device).view(1, -1).expand(height // 2, -1)
    ids = torch.stack([torch.zeros_like(rows), rows, columns], dim=-1)
    return ids.reshape(-1, 3).to(dtype)
