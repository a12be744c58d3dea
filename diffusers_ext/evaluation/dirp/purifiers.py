r"""
The purification baselines DIRP is measured against. Each maps images `(B, C, H, W)` in [-1, 1] to purified images
of the same shape and range.

| name | what it does |
| --- | --- |
| `jpeg` | JPEG re-encoding at `quality` (PIL) |
| `noise` | additive Gaussian noise of standard deviation `sigma` (in [0, 1] units), clipped |
| `diffpure` | DiffPure: noise the (latent) image to timestep `t_star`, then denoise it with deterministic DDIM steps |
| `gridpure` | GrIDPure: DiffPure on overlapping tiles, averaged, blended with the input at `gamma`, iterated |
| `impress` | IMPRESS: minimise the VAE round-trip error `||x - D(E(x))||^2` under the same perceptual hinge as DIRP |

IMPRESS needs a VAE. For pixel-space models, where `D(E(x)) = x`, the documented variant replaces the VAE round trip
by the denoiser's own one-step consistency: a single DDIM inversion step to a low noise level and back
(`num_inversion_steps=1`, `inversion_strength=impress_strength`); this is DIRP's objective with `K = 1` and a shallow inversion.

`TUNING_GRIDS` gives every purifier, DIRP included, the same number of settings to be tuned over on a validation set
(the published default among them where there is one), and [`purify`] runs any purifier at one of its settings.
"""

import io

import numpy as np
import PIL.Image
import torch

from ...pipelines.dirp.ddim_inversion import ddim_reconstruct, noise_levels
from ...pipelines.pipeline_utils import vp_coefficients
from ...utils import check_positive_int


PURIFIERS = ("jpeg", "noise", "diffpure", "gridpure", "impress")

# DIRP and IMPRESS share one optimiser grid (learning rate, Adam iterations, perceptual hinge budget).
OPTIMISER_GRID = tuple(
    {"learning_rate": lr, "num_iterations": 40, "perceptual_budget": budget}
    for lr in (0.003, 0.01)
    for budget in (0.02, 0.05)
)
TUNING_GRIDS = {
    "jpeg": tuple({"quality": q} for q in (95, 75, 50, 25)),  # published: 75 and 25
    "noise": tuple({"sigma": s} for s in (0.01, 0.025, 0.05, 0.1)),  # published: 0.05 to 0.1
    "diffpure": tuple({"t_star": t} for t in (50, 100, 150, 250)),  # published: 0.1 T = 100
    "gridpure": tuple({"t_star": t} for t in (50, 100, 150, 250)),  # published: 0.1 T = 100
    "impress": OPTIMISER_GRID,
    "dirp": OPTIMISER_GRID,
}


def jpeg(images: torch.Tensor, quality: int = 75) -> torch.Tensor:
    """Re-encode each image as a JPEG of `quality` (1-95) and decode it again."""
    if not isinstance(quality, int) or not 1 <= quality <= 95:
        raise ValueError(f"`quality` must be an int in [1, 95], got {quality!r}.")
    out = []
    for image in images.detach().cpu():
        array = ((image.clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()
        mode = "L" if array.shape[-1] == 1 else "RGB"
        buffer = io.BytesIO()
        PIL.Image.fromarray(array[..., 0] if mode == "L" else array, mode=mode).save(buffer, "JPEG", quality=quality)
        decoded = np.asarray(PIL.Image.open(io.BytesIO(buffer.getvalue())).convert(mode), dtype=np.float32)
        decoded = decoded[..., None] if decoded.ndim == 2 else decoded
        out.append(torch.from_numpy(decoded).permute(2, 0, 1) / 127.5 - 1)
    return torch.stack(out).to(images.device, images.dtype)


def gaussian_noise(
    images: torch.Tensor, sigma: float = 0.05, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Add `N(0, sigma^2)` noise (`sigma` in [0, 1] image units) and clip to the image range."""
    if not isinstance(sigma, (int, float)) or sigma <= 0:
        raise ValueError(f"`sigma` must be a positive number, got {sigma!r}.")
    noise = torch.randn(images.shape, generator=generator, dtype=images.dtype).to(images.device)
    return (images + 2 * sigma * noise).clamp(-1.0, 1.0)


@torch.no_grad()
def diffpure(
    pipe, images: torch.Tensor, t_star: int = 150, num_steps: int = 10, generator: torch.Generator | None = None
) -> torch.Tensor:
    r"""
    DiffPure: diffuse `images` to timestep `t_star` (fresh noise from `generator`), then denoise with `num_steps`
    deterministic DDIM steps, through the VAE for latent models.
    """
    num_train = len(pipe.scheduler.alphas_cumprod)
    if not isinstance(t_star, int) or not 0 < t_star < num_train:
        raise ValueError(f"`t_star` must be an int in (0, {num_train}), got {t_star!r}.")
    check_positive_int("num_steps", num_steps)
    device = pipe._execution_device
    latents = pipe.encode_images(images.to(device, torch.float32))
    timesteps = torch.linspace(t_star / num_steps, t_star, num_steps).round().long()
    alphas = noise_levels(pipe.scheduler, timesteps)
    noise = torch.randn(latents.shape, generator=generator, dtype=latents.dtype).to(device)
    signal, sigma = vp_coefficients(float(alphas[-1]))
    noisy = signal * latents + sigma * noise
    noise_fn = pipe.noise_function(latents.shape[0], device)
    return pipe.decode_latents(ddim_reconstruct(noise_fn, noisy, timesteps, alphas)).clamp(-1, 1).to(images.device)


@torch.no_grad()
def gridpure(
    pipe,
    images: torch.Tensor,
    tile_size: int | None = None,
    stride: int | None = None,
    num_iterations: int = 2,
    gamma: float = 0.1,
    t_star: int = 100,
    num_steps: int = 10,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""
    GrIDPure: `num_iterations` times, purify every `tile_size` tile (at `stride`, covering the image) with
    [`diffpure`], average the overlapping tiles, and blend with the previous image: `(1 - gamma) * tiles + gamma * x`.
    Defaults: tiles of the denoiser's native size (its `sample_size` in pixels; GrIDPure uses 256 tiles for a
    256-pixel model) or the whole image if smaller, at a stride of half a tile.
    """
    h, w = images.shape[-2:]
    native = pipe.unet.config.sample_size
    native = (native if isinstance(native, int) else min(native)) * pipe.vae_scale_factor
    tile_size = tile_size or min(native, h, w)
    stride = stride or max(pipe.size_multiple, tile_size // 2)
    if tile_size % pipe.size_multiple or tile_size > min(h, w):
        raise ValueError(
            f"`tile_size` {tile_size} must be a multiple of {pipe.size_multiple} and at most the image side {min(h, w)}."
        )
    if not 0 <= gamma < 1:
        raise ValueError(f"`gamma` must lie in [0, 1), got {gamma!r}.")

    def starts(size: int) -> list[int]:
        positions = list(range(0, size - tile_size + 1, stride))
        return positions if positions[-1] == size - tile_size else positions + [size - tile_size]

    x = images
    for _ in range(num_iterations):
        total, count = torch.zeros_like(x), torch.zeros_like(x)
        for top in starts(h):
            for left in starts(w):
                tile = x[..., top : top + tile_size, left : left + tile_size]
                total[..., top : top + tile_size, left : left + tile_size] += diffpure(
                    pipe, tile, t_star, num_steps, generator
                )
                count[..., top : top + tile_size, left : left + tile_size] += 1
        x = (1 - gamma) * total / count + gamma * x
    return x


def impress(
    pipe,
    images: torch.Tensor,
    num_iterations: int = 100,
    learning_rate: float = 0.003,
    perceptual: str = "ssim",
    perceptual_budget: float = 0.02,
    perceptual_weight: float = 1.0,
    impress_strength: float = 0.05,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""
    IMPRESS with DIRP's optimiser and hinge: the VAE consistency `||x - D(E(x))||^2` when the pipeline has a VAE;
    for pixel models the one-step denoiser consistency described in this module's docstring (one DDIM inversion
    step at `impress_strength`).
    """
    if getattr(pipe, "vae", None) is not None:
        schedule = {"num_inversion_steps": 0}
    else:
        schedule = {"num_inversion_steps": 1, "inversion_strength": impress_strength}
    out = pipe(
        images,
        num_iterations=num_iterations,
        learning_rate=learning_rate,
        perceptual=perceptual,
        perceptual_budget=perceptual_budget,
        perceptual_weight=perceptual_weight,
        generator=generator,
        output_type="pt",
        **schedule,
    )
    return out.images.to(images.device) * 2 - 1


def purify(
    pipe,
    images: torch.Tensor,
    name: str,
    setting: dict | None = None,
    generator: torch.Generator | None = None,
    num_inversion_steps: int = 5,
    inversion_strength: float = 0.5,
    perceptual: str = "ssim",
    prompt: str = "",
) -> torch.Tensor:
    r"""
    Purify `images` `(B, C, H, W)` in [-1, 1] with the purifier `name` (one of `TUNING_GRIDS`) at `setting` (one
    entry of its grid, or any keyword arguments of the purifier; default: the function's own defaults).

    `num_inversion_steps`, `inversion_strength` and `perceptual` fix DIRP's schedule and the perceptual distance of
    DIRP and IMPRESS; they are not tuned. `prompt` is DIRP's condition on a text-conditioned denoiser. Returns purified images of the shape of `images`, in [-1, 1].
    """
    if name not in TUNING_GRIDS:
        raise ValueError(f"`name` must be one of {tuple(TUNING_GRIDS)}, got {name!r}.")
    setting = dict(setting or {})
    if name == "jpeg":
        return jpeg(images, **setting)
    if name == "noise":
        return gaussian_noise(images, generator=generator, **setting)
    if name == "diffpure":
        return diffpure(pipe, images, generator=generator, **setting)
    if name == "gridpure":
        return gridpure(pipe, images, generator=generator, **setting)
    if name == "impress":
        return impress(pipe, images, perceptual=perceptual, generator=generator, **setting)
    out = pipe(
        images,
        prompt=prompt,
        num_inversion_steps=num_inversion_steps,
        inversion_strength=inversion_strength,
        perceptual=perceptual,
        gradient_checkpointing=False,  # the same result, faster on a CPU; memory is measured separately
        generator=generator,
        output_type="pt",
        **setting,
    )
    return out.images.to(images.device) * 2 - 1
