r"""
The anti-mimicry protections of [`protections`] aimed at a latent text-to-image model's fine-tuning prompt, and the
inversion-amplification measurement.

On a latent model the protections of `protections.PROTECTIONS` attack the VAE encoder as published: `advdm`, `sds-`
and `mist` ascend (or, for `sds-`, descend) the latent diffusion loss through `E`, `photoguard` and `glaze` pull
`E(x)` toward a target's latent. A mimic fine-tunes on the images with their caption (DreamBooth's instance prompt),
so the diffusion objectives here condition the denoiser on that caption instead of the empty prompt;
[`protect_for_prompt`] does that without changing `protections.protect`.
"""

import torch

from .protections import PROTECTIONS, protect


class _PromptedPipe:
    """A view of a [`DIRPPipeline`] whose `noise_function` conditions on a fixed prompt (everything else is the
    pipeline's own)."""

    def __init__(self, pipe, prompt: str):
        self._pipe, self._prompt = pipe, prompt

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def noise_function(self, batch_size, device, prompt="", unet=None, prompt_embeds=None, **options):
        return self._pipe.noise_function(
            batch_size, device, self._prompt, unet=unet, prompt_embeds=prompt_embeds, **options
        )


def protect_for_prompt(
    pipe, images: torch.Tensor, method: str, prompt: str, eps: float = 16 / 255, num_steps: int = 40, **kwargs
) -> torch.Tensor:
    r"""
    [`protections.protect`] with the denoiser conditioned on `prompt` (the caption the mimic will fine-tune with).

    Args:
        pipe ([`DIRPPipeline`]): a latent pipeline (VAE, text-conditioned UNet, text encoder and tokenizer).
        images (`torch.Tensor` of shape `(B, 3, H, W)`): clean images in [-1, 1].
        method (`str`): one of `protections.PROTECTIONS`.
        prompt (`str`): the fine-tuning caption.
        eps, num_steps, kwargs: as in `protect` (`generator`, `step_size`, method options).

    Returns:
        `torch.Tensor` of the shape of `images`: protected images within `2 * eps` of `images` in L-inf ([-1, 1]).
    """
    if method not in PROTECTIONS:
        raise ValueError(f"`method` must be one of {PROTECTIONS}, got {method!r}.")
    if not isinstance(prompt, str):
        raise TypeError(f"`prompt` must be a str, got {type(prompt).__name__}.")
    return protect(_PromptedPipe(pipe, prompt), images, method, eps=eps, num_steps=num_steps, **kwargs)


@torch.no_grad()
def inversion_amplification(
    pipe,
    clean: torch.Tensor,
    protected: torch.Tensor,
    num_inversion_steps: int = 10,
    inversion_strength: float = 0.5,
    prompt: str = "",
    seed: int = 0,
) -> dict:
    r"""
    How much more a protection raises the DDIM-inversion reconstruction error than random noise of the same size.

    The control is random sign noise with the protection's per-image L-inf radius, rescaled to the protection's
    per-image L2 norm and clipped to the image range. Errors are mean squared, in [-1, 1] units, averaged over
    images.

    Returns:
        `dict`: `recon_error_clean`, `recon_error_protected`, `recon_error_noise`, `amplification` (the protected
        image's excess error over clean divided by the noise's; above 1 means the perturbation is amplified by the
        inversion beyond what its norm explains) and `latent_amplification` (the same ratio for
        `||E(x') - E(x)||`).
    """
    if clean.shape != protected.shape:
        raise ValueError(f"`clean` {tuple(clean.shape)} and `protected` {tuple(protected.shape)} differ in shape.")
    delta = protected - clean
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, delta.shape, generator=generator).to(delta) * 2 - 1
    noise = signs * delta.abs().flatten(1).amax(1).view(-1, 1, 1, 1)
    scale = delta.flatten(1).norm(dim=1) / noise.flatten(1).norm(dim=1).clamp_min(1e-12)
    noisy = (clean + noise * scale.view(-1, 1, 1, 1)).clamp(-1.0, 1.0)
    errors = {
        name: float(pipe.reconstruction_error(x, num_inversion_steps, inversion_strength, prompt=prompt).mean())
        for name, x in (("clean", clean), ("protected", protected), ("noise", noisy))
    }
    latents = {
        name: pipe.encode_images(x.to(pipe._execution_device))
        for name, x in (("c", clean), ("p", protected), ("n", noisy))
    }
    shift_p = float((latents["p"] - latents["c"]).flatten(1).norm(dim=1).mean())
    shift_n = float((latents["n"] - latents["c"]).flatten(1).norm(dim=1).mean())
    excess_noise = errors["noise"] - errors["clean"]
    return {
        "recon_error_clean": errors["clean"],
        "recon_error_protected": errors["protected"],
        "recon_error_noise": errors["noise"],
        "amplification": (errors["protected"] - errors["clean"]) / excess_noise if excess_noise > 0 else float("nan"),
        "latent_amplification": shift_p / shift_n if shift_n > 0 else float("nan"),
    }
