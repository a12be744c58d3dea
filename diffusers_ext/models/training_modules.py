"""The one-forward training modules of a latent text-to-image model: a VAE's and a text-conditioned UNet's training
forwards as single modules, so that data-parallel training syncs all of their gradients in one backward."""

import torch


class AutoencoderStep(torch.nn.Module):
    """An `AutoencoderKL`'s training forward as one module (one forward, so that data-parallel training syncs all
    of its gradients)."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, images: torch.Tensor, eps: torch.Tensor):
        """`images` `(B, 3, H, W)` in [-1, 1], `eps` `(B, C, h, w)` -> reconstructions `(B, 3, H, W)` of the
        reparameterised latents and the per-sample KL `(B,)` to the standard normal."""
        posterior = self.vae.encode(images).latent_dist
        reconstruction = self.vae.decode(posterior.mean + posterior.std * eps).sample
        return reconstruction, posterior.kl()


class TextConditionedDenoiser(torch.nn.Module):
    """A text encoder and a `UNet2DConditionModel` trained together, as one module (one forward for data-parallel
    training)."""

    def __init__(self, unet, text_encoder):
        super().__init__()
        self.unet = unet
        self.text_encoder = text_encoder

    def forward(self, noisy: torch.Tensor, timesteps: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """`noisy` `(B, C, h, w)`, `timesteps` `(B,)`, `input_ids` `(B, L)` -> the UNet's prediction `(B, C, h, w)`."""
        return self.unet(noisy, timesteps, self.text_encoder(input_ids)[0]).sample
