"""What the latent text-to-image training scripts share: the VAE's posteriors encoded once, and caption tokens."""

import torch


@torch.no_grad()
def encode_posteriors(vae, images: torch.Tensor, device, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior means and standard deviations `(N, C, h, w)` each (float32, on the CPU) of uint8 images
    `(N, 3, H, W)`, encoded `batch_size` at a time on `device`; training draws latents `mean + std * noise` from them
    without running the encoder every step."""
    means, stds = [], []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size].to(device).float() / 127.5 - 1
        posterior = vae.encode(x).latent_dist
        means.append(posterior.mean.float().cpu())
        stds.append(posterior.std.float().cpu())
    return torch.cat(means), torch.cat(stds)


def tokenize_captions(tokenizer, captions: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(token_ids (N, max_length), empty_ids (1, max_length))` of `captions` and of the empty prompt, padded to
    `max_length`; a `ValueError` if a caption has a word outside the tokenizer's vocabulary or does not fit."""
    if any(token == tokenizer.unk_token for caption in captions for token in tokenizer.tokenize(caption)):
        raise ValueError("the captions hold words outside the mosaic vocabulary (`mosaic_vocabulary()`).")
    longest = max(len(ids) for ids in tokenizer(captions).input_ids)
    if longest > max_length:
        raise ValueError(f"a caption has {longest} tokens; raise --max_length (now {max_length}).")
    token_ids = tokenizer(captions, padding="max_length", max_length=max_length, return_tensors="pt").input_ids
    empty_ids = tokenizer([""], padding="max_length", max_length=max_length, return_tensors="pt").input_ids
    return token_ids, empty_ids
