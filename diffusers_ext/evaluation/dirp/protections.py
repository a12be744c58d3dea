r"""
Anti-mimicry protections, reimplemented on diffusers components to evaluate purification honestly.

Each protection is sign-PGD within an L-inf ball of radius `eps` (in [0, 1] image units, so `16 / 255` means 16
grey levels) around the clean images, with the image kept in range. They work on any [`DIRPPipeline`]: its
`encode_images` (the VAE encoder `E`, the identity for pixel models), its `noise_function` (the denoiser `eps_theta`
under the pipeline's condition) and its scheduler's `alphas_cumprod`.

| name | objective (per image) |
| --- | --- |
| `advdm` | ascend the denoising loss `E_t,n ||eps_theta(z_t, t) - n||^2`, `z = E(x)` (AdvDM) |
| `mist` | ascend `denoising loss - textural_weight * ||E(x) - E(target)||^2` (Mist: semantic + textural) |
| `sds+` / `sds-` | the AdvDM gradient without the denoiser's Jacobian, `(eps_theta(z_t, t) - n) dz/dx`, ascended / descended |
| `photoguard` | descend `||E(x) - E(target)||^2` toward a grey target (PhotoGuard's encoder attack) |
| `aspl` | Anti-DreamBooth ASPL: alternate a surrogate denoiser fine-tuned on clean images, PGD against it, and fine-tuning the model on the perturbed images |
| `glaze` | descend `||E(x) - E(style(x_clean))||^2` toward a style-transformed target (Glaze-style, as IMPRESS reimplements it) |

For pixel-space models `E` is the identity, so `photoguard`, `glaze` and the textural half of `mist` pull the image
toward their target image in pixel space; on latent models they attack the VAE encoder as published.
"""

import copy
from collections.abc import Callable

import torch

from ...pipelines.pipeline_utils import vp_coefficients
from ...utils import check_positive_int


PROTECTIONS = ("advdm", "mist", "sds+", "sds-", "photoguard", "aspl", "glaze")


def texture_target(images: torch.Tensor, period: int = 4) -> torch.Tensor:
    """A fixed diagonal-stripe texture in [-1, 1] with the shape of `images` `(B, C, H, W)` (Mist's target image)."""
    h, w = images.shape[-2:]
    rows = torch.arange(h, device=images.device).view(-1, 1)
    cols = torch.arange(w, device=images.device).view(1, -1)
    stripes = torch.cos(2 * torch.pi * (rows + cols).to(images.dtype) / period)
    return stripes.expand_as(images).clone()


def grey_target(images: torch.Tensor) -> torch.Tensor:
    """A mid-grey image (0 in [-1, 1]) of the shape of `images` (PhotoGuard's default target)."""
    return torch.zeros_like(images)


def stripe_style(images: torch.Tensor) -> torch.Tensor:
    """The default Glaze-style target: each image's content re-drawn in the stripe texture (content times texture)."""
    return ((images + 1) * (texture_target(images, period=3) + 1) / 2 - 1).clamp(-1.0, 1.0)


def denoising_loss(
    noise_fn: Callable, latents: torch.Tensor, alphas_cumprod: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    One-sample estimate of the denoising loss of each latent: random `t` and noise `n` per image (from `generator`).

    Returns:
        `(loss, residual)`: `loss` of shape `(B,)` (mean squared noise error), `residual = eps_theta(z_t, t) - n` of
        the latents' shape.
    """
    b = latents.shape[0]
    t = torch.randint(0, len(alphas_cumprod), (b,), generator=generator).to(latents.device)
    noise = torch.randn(latents.shape, generator=generator, dtype=latents.dtype).to(latents.device)
    alpha = alphas_cumprod.to(latents.device, latents.dtype)[t].view(-1, *[1] * (latents.ndim - 1))
    signal, sigma = vp_coefficients(alpha)
    noisy = signal * latents + sigma * noise
    residual = noise_fn(noisy, t) - noise
    return residual.pow(2).flatten(1).mean(1), residual


def _pgd(
    clean: torch.Tensor,
    objective: Callable[[torch.Tensor], torch.Tensor],
    eps: float,
    step_size: float,
    num_steps: int,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sign-PGD *ascending* `objective(x) -> (B,)` within `|x - clean| <= 2 eps` (eps in [0, 1] units, images in
    [-1, 1]); returns the perturbed images, detached."""
    radius, alpha = 2.0 * eps, 2.0 * step_size
    x = (clean if start is None else start).detach().clone()
    for _ in range(num_steps):
        x.requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(objective(x).sum(), x)
        with torch.no_grad():
            x = x + alpha * grad.sign()
            x = torch.min(torch.max(x, clean - radius), clean + radius).clamp(-1.0, 1.0)
    return x.detach()


def _check(images, eps, num_steps, step_size) -> float:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"`images` must be a (B, C, H, W) tensor in [-1, 1], got {type(images).__name__}.")
    if images.min() < -1.0 - 1e-6 or images.max() > 1.0 + 1e-6:
        raise ValueError(f"`images` must lie in [-1, 1], got [{float(images.min()):.3g}, {float(images.max()):.3g}].")
    if not isinstance(eps, (int, float)) or not 0 < eps <= 1:
        raise ValueError(f"`eps` must lie in (0, 1] (image units, e.g. 16 / 255), got {eps!r}.")
    check_positive_int("num_steps", num_steps)
    if step_size is None:
        return 2.5 * eps / num_steps  # Madry et al.'s rule: the walk can cross the ball
    if not isinstance(step_size, (int, float)) or step_size <= 0:
        raise ValueError(f"`step_size` must be a positive number, got {step_size!r}.")
    return float(step_size)


def protect(
    pipe,
    images: torch.Tensor,
    method: str,
    eps: float = 16 / 255,
    num_steps: int = 40,
    step_size: float | None = None,
    generator: torch.Generator | None = None,
    **kwargs,
) -> torch.Tensor:
    r"""
    Protect `images` with `method`.

    Args:
        pipe ([`DIRPPipeline`]): supplies the encoder, the denoiser and the noise schedule.
        images (`torch.Tensor` of shape `(B, C, H, W)`): clean images in [-1, 1].
        method (`str`): one of `PROTECTIONS`.
        eps (`float`, defaults to 16/255): L-inf budget in [0, 1] image units.
        num_steps (`int`, defaults to 40): PGD steps (for `aspl`: per round, see [`aspl`]).
        step_size (`float`, *optional*): PGD step in [0, 1] units; defaults to `2.5 * eps / num_steps`.
        generator (`torch.Generator`, *optional*): draws the timesteps and noises of the diffusion objectives.
        kwargs: method-specific options (`textural_weight` and `target` for `mist`, `target` for `photoguard`,
            `style_fn` for `glaze`, the surrogate settings of [`aspl`]).

    Returns:
        `torch.Tensor` of the shape of `images`: protected images in [-1, 1], within `2 * eps` of `images` in L-inf.
    """
    if method not in PROTECTIONS:
        raise ValueError(f"`method` must be one of {PROTECTIONS}, got {method!r}.")
    step_size = _check(images, eps, num_steps, step_size)
    clean = images.detach().to(pipe._execution_device, torch.float32)
    b = clean.shape[0]
    alphas = pipe.scheduler.alphas_cumprod
    with torch.no_grad():
        if method == "aspl":
            return aspl(pipe, clean, eps, num_steps, step_size, generator, **kwargs)
        noise_fn = pipe.noise_function(b, clean.device)
        if method in ("advdm", "sds+", "sds-"):
            if kwargs:
                raise TypeError(f"`{method}` takes no extra options, got {sorted(kwargs)}.")

            def objective(x):
                latents = pipe.encode_images(x)
                loss, residual = denoising_loss(noise_fn, latents, alphas, generator)
                if method == "advdm":
                    return loss
                # Score distillation: the residual is a constant direction; only the encoder is differentiated.
                surrogate = (residual.detach() * latents).flatten(1).sum(1)
                return surrogate if method == "sds+" else -surrogate

        elif method == "mist":
            textural_weight = kwargs.pop("textural_weight", 1.0)
            target = pipe.encode_images(kwargs.pop("target", texture_target(clean)))
            if kwargs:
                raise TypeError(f"`mist` got unknown options {sorted(kwargs)}.")

            def objective(x):
                latents = pipe.encode_images(x)
                loss, _ = denoising_loss(noise_fn, latents, alphas, generator)
                return loss - textural_weight * (latents - target).pow(2).flatten(1).mean(1)

        else:  # photoguard, glaze: targeted encoder attacks
            if method == "photoguard":
                target_images = kwargs.pop("target", grey_target(clean))
            else:
                target_images = kwargs.pop("style_fn", stripe_style)(clean)
            if kwargs:
                raise TypeError(f"`{method}` got unknown options {sorted(kwargs)}.")
            target = pipe.encode_images(target_images)

            def objective(x):
                return -(pipe.encode_images(x) - target).pow(2).flatten(1).mean(1)

        return _pgd(clean, objective, eps, step_size, num_steps)


def aspl(
    pipe,
    clean: torch.Tensor,
    eps: float,
    num_steps: int,
    step_size: float,
    generator: torch.Generator | None,
    num_rounds: int = 8,
    surrogate_steps: int = 3,
    surrogate_lr: float = 5e-4,
    surrogate_batch_size: int = 16,
) -> torch.Tensor:
    r"""
    Anti-DreamBooth's Alternating Surrogate and Perturbation Learning, on a copy of the pipeline's UNet.

    Each of `num_rounds` rounds: copy the model into a surrogate and fine-tune it for `surrogate_steps` on the clean
    images (denoising loss, Adam at `surrogate_lr`); run `num_steps // num_rounds` (at least 1) PGD steps ascending
    the surrogate's denoising loss; fine-tune the model for `surrogate_steps` on the perturbed images (as a mimic
    would). The pipeline's own UNet is not changed.
    """
    device = clean.device
    b = clean.shape[0]
    model = copy.deepcopy(pipe.unet).train()
    pgd_steps = max(1, num_steps // num_rounds)
    alphas = pipe.scheduler.alphas_cumprod

    def fine_tune(unet: torch.nn.Module, images: torch.Tensor) -> None:
        unet.requires_grad_(True)
        optimizer = torch.optim.Adam(unet.parameters(), lr=surrogate_lr)
        with torch.no_grad():
            latents = pipe.encode_images(images)
        for _ in range(surrogate_steps):
            idx = torch.randperm(b, generator=generator)[:surrogate_batch_size].to(device)
            noise_fn = pipe.noise_function(len(idx), device, unet=unet)
            with torch.enable_grad():
                loss = denoising_loss(noise_fn, latents[idx], alphas, generator)[0].mean()
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
        unet.requires_grad_(False)

    perturbed = clean
    for _ in range(num_rounds):
        surrogate = copy.deepcopy(model)
        fine_tune(surrogate, clean)
        surrogate.eval()
        noise_fn = pipe.noise_function(b, device, unet=surrogate)

        def objective(x, noise_fn=noise_fn):
            return denoising_loss(noise_fn, pipe.encode_images(x), alphas, generator)[0]

        perturbed = _pgd(clean, objective, eps, step_size, pgd_steps, start=perturbed)
        fine_tune(model, perturbed)
    return perturbed


def protection_loss(
    pipe, method: str, images: torch.Tensor, clean: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    r"""
    The protection's own objective on `images` `(B, C, H, W)` (clean, protected or purified), per image, with the
    sign that the protection raises: the denoising loss for `advdm`, `sds+`, `sds-` and `aspl` (measured on the
    pipeline's model), Mist's combined loss, and the negative encoder distance to the target for `photoguard` and
    `glaze` (targets built from `clean`). Use the same `generator` seed to compare sets.
    """
    if method not in PROTECTIONS:
        raise ValueError(f"`method` must be one of {PROTECTIONS}, got {method!r}.")
    device = pipe._execution_device
    images, clean = images.to(device, torch.float32), clean.to(device, torch.float32)
    with torch.no_grad():
        latents = pipe.encode_images(images)
        if method in ("photoguard", "glaze"):
            target_images = grey_target(clean) if method == "photoguard" else stripe_style(clean)
            return -(latents - pipe.encode_images(target_images)).pow(2).flatten(1).mean(1).cpu()
        noise_fn = pipe.noise_function(images.shape[0], device)
        loss, _ = denoising_loss(noise_fn, latents, pipe.scheduler.alphas_cumprod, generator)
        if method == "mist":
            target = pipe.encode_images(texture_target(clean))
            loss = loss - (latents - target).pow(2).flatten(1).mean(1)
        return loss.cpu()
