"""DDPO's JPEG rewards: minus (or plus) the JPEG size of an image, a proxy for its simplicity (or detail)."""

import io

import PIL.Image
import torch

from .images import images_to_tensor


def _jpeg_sizes_kb(images, quality: int) -> list[float]:
    array = (images_to_tensor(images).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    sizes = []
    for image in array:
        buffer = io.BytesIO()
        PIL.Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
            buffer, format="JPEG", quality=quality
        )
        sizes.append(buffer.tell() / 1000)
    return sizes


def jpeg_compressibility(prompts, images, quality: int = 95, **kwargs) -> list[float]:
    """Minus the JPEG size in kB (DDPO's compressibility reward): simpler images score higher."""
    return [-size for size in _jpeg_sizes_kb(images, quality)]


def jpeg_incompressibility(prompts, images, quality: int = 95, **kwargs) -> list[float]:
    """The JPEG size in kB (DDPO's incompressibility reward): detailed images score higher."""
    return _jpeg_sizes_kb(images, quality)
