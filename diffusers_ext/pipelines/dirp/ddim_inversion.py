"""Differentiable K-step DDIM inversion and reconstruction.

Both directions use the same deterministic DDIM move between two noise levels `a_from -> a_to` (cumulative alphas;
`pipeline_utils.ddim_move`):

    x0_hat = (z - sqrt(1 - a_from) * eps) / sqrt(a_from)
    z'     = sqrt(a_to) * x0_hat + sqrt(1 - a_to) * eps

with `eps` the denoiser's noise estimate at the *noisier* of the two levels (the usual inversion approximation, as
in diffusers' `DDIMInverseScheduler`). With the same `eps` on the way up and down the round trip is the identity, so
the reconstruction error measures only how far the denoiser's estimates move between inversion and reconstruction.
Everything is plain tensor arithmetic, so gradients flow through the denoiser; each denoiser call can be
checkpointed so that backpropagating through `2K` calls stores only the `2K` step inputs.
"""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.resnet import Downsample2D, ResnetBlock2D, Upsample2D
from torch.utils.checkpoint import checkpoint

from ..pipeline_utils import EPSILON_PREDICTION_TYPES, ddim_move


try:  # selective activation checkpointing, torch >= 2.4
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:
    CheckpointPolicy = create_selective_checkpoint_contexts = None


NoiseFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`noise_fn(z, t) -> eps`: the denoiser's noise estimate for `z` of shape `(B, C, H, W)` at integer timestep `t`."""

SUPPORTED_PREDICTION_TYPES = EPSILON_PREDICTION_TYPES


def inversion_timesteps(scheduler, num_inversion_steps: int, strength: float = 1.0) -> torch.Tensor:
    r"""
    The `num_inversion_steps` timesteps of a DDIM inversion up to `strength` of the noise schedule, ascending.

    The steps are evenly spaced, `t_k = round(k * strength * (T - 1) / K)` for `k = 1..K` with `T` the scheduler's
    `num_train_timesteps`: `strength=1` inverts to the last timestep, a smaller strength stops at a lower noise level
    (partial inversion) with the same number of steps.

    Args:
        scheduler: a diffusers scheduler with `alphas_cumprod` (DDIM, DDPM, PNDM, ...).
        num_inversion_steps (`int`): `K >= 1`.
        strength (`float`, defaults to 1.0): in (0, 1].

    Returns:
        `torch.LongTensor` of shape `(K,)`, ascending (repeated values are possible when `strength * T < K`).
    """
    last = len(scheduler.alphas_cumprod) - 1
    steps = torch.arange(1, num_inversion_steps + 1, dtype=torch.float64)
    return (steps * strength * last / num_inversion_steps).round().long().clamp(min=1)


def noise_levels(scheduler, timesteps: torch.Tensor) -> torch.Tensor:
    r"""
    The cumulative alphas of the clean image and of each inversion timestep.

    Returns:
        `torch.Tensor` of shape `(K + 1,)`, float64: `[1.0, alphas_cumprod[t_1], ..., alphas_cumprod[t_K]]`.
    """
    alphas = scheduler.alphas_cumprod.double().cpu()[timesteps]
    return torch.cat([torch.ones(1, dtype=torch.float64), alphas])


# Fused attention kernels (each device's) whose outputs a checkpointed call keeps rather than recomputes.
_FUSED_ATTENTION_OPS = tuple(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(torch.ops.aten, name)
)
# Attention over fewer keys than this (a prompt's 77 text tokens, say) is recomputed: it is cheap next to its output.
_MIN_KEYS_TO_KEEP_ATTENTION = 256


def _keep_long_attention(ctx, op, *args, **kwargs):
    """Selective-checkpointing policy: keep the outputs of fused attention over long key sequences (self-attention
    at the denoiser's finer grids: its forward is most of a call's time on CPU, its output one activation), recompute
    everything else."""
    if op in _FUSED_ATTENTION_OPS and args[1].shape[-2] >= _MIN_KEYS_TO_KEEP_ATTENTION:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _keep_long_attention_contexts():
    return create_selective_checkpoint_contexts(_keep_long_attention)


def checkpointed(forward: Callable, *args, **kwargs):
    """`forward(*args, **kwargs)`, recomputed in the backward pass when gradients are being recorded for a tensor
    argument, except the outputs of attention over long key sequences, which are kept (selective checkpointing:
    the recomputation skips the most expensive kernels for a few activations more)."""
    if not (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
        return forward(*args, **kwargs)
    if create_selective_checkpoint_contexts is None:  # torch < 2.4: everything is recomputed
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=_keep_long_attention_contexts, **kwargs)


def _call(noise_fn: NoiseFn, z: torch.Tensor, t: torch.Tensor, use_checkpoint: bool) -> torch.Tensor:
    if use_checkpoint:
        # Recompute the denoiser's activations in the backward pass: memory holds one call's activations at a time.
        return checkpointed(noise_fn, z, t)
    return noise_fn(z, t)


# the VAE layers that recompute their activations in the backward pass, each on its own
_VAE_CHECKPOINTED_LAYERS = (ResnetBlock2D, Downsample2D, Upsample2D, Attention)


def _decoder_output_layers(vae) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module] | None:
    """The `(conv_norm_out, conv_act, conv_out)` layers `vae`'s decoder runs last, in this order (diffusers'
    `Decoder`), when its norm is a plain `GroupNorm`; else None."""
    layers = [getattr(getattr(vae, "decoder", None), name, None) for name in ("conv_norm_out", "conv_act", "conv_out")]
    if isinstance(layers[0], torch.nn.GroupNorm) and all(isinstance(layer, torch.nn.Module) for layer in layers):
        return tuple(layers)
    return None


def _identity(sample: torch.Tensor) -> torch.Tensor:
    return sample


def _run_layer_checkpointed(forward: Callable, layers: list, *args, **kwargs):
    """`forward(*args, **kwargs)` with each of `layers` checkpointed on its own for the duration of the call."""
    saved = [layer.__dict__.get("forward") for layer in layers]
    for layer in layers:
        layer.forward = functools.partial(checkpointed, layer.forward)
    try:
        return forward(*args, **kwargs)
    finally:
        for layer, original in zip(layers, saved):
            if original is None:
                del layer.forward
            else:
                layer.forward = original


@contextmanager
def vae_layer_checkpointing(vae, enabled: bool) -> Iterator[None]:
    """Within the block, `vae` (if any) recomputes its activations in the backward pass when `enabled`.

    Every residual block, resampler and attention layer of the decoder is recomputed on its own: the backward holds
    one layer's activations at a time (diffusers' own `AutoencoderKL` checkpointing recomputes a whole up block at
    once, two or three residual blocks at the full image resolution, which made the decoder the peak of a DIRP
    iteration). The decoder's output layers (norm, activation, convolution) are recomputed as one, so it keeps one
    full-resolution input for them instead of three. The encoder is recomputed as a whole (layer by layer, its
    layers' inputs, two at the full resolution, would be held through the denoiser's and the decoder's backward), and
    that recompute is itself checkpointed layer by layer ([`_run_layer_checkpointed`] patches the encoder's layers
    whenever it runs, so also in the backward pass, after this block has restored them): its backward holds one
    layer's activations at a time too. Long attention is kept
    rather than recomputed ([`checkpointed`]). The gradients are the same; diffusers' own setting is left off within
    the block and restored after it."""
    if not enabled or vae is None:
        yield
        return
    encoder = getattr(vae, "encoder", None)
    encoder = encoder if isinstance(encoder, torch.nn.Module) else None
    in_encoder = set() if encoder is None else {id(module) for module in encoder.modules()}
    layers = [
        module
        for module in vae.modules()
        if isinstance(module, _VAE_CHECKPOINTED_LAYERS) and id(module) not in in_encoder
    ]
    tail = _decoder_output_layers(vae)
    patched = layers + list(tail or ()) + ([encoder] if encoder is not None else [])
    was_on = bool(getattr(vae, "is_gradient_checkpointing", False))
    if was_on:
        vae.disable_gradient_checkpointing()
    saved = [layer.__dict__.get("forward") for layer in patched]  # an instance-level forward (an offload hook)
    for layer in layers:
        layer.forward = functools.partial(checkpointed, layer.forward)
    if tail is not None:
        # the output convolution runs all three; the norm and activation pass their input through
        norm, act, conv = tail
        forwards = (norm.forward, act.forward, conv.forward)
        conv.forward = functools.partial(checkpointed, lambda sample, f=forwards: f[2](f[1](f[0](sample))))
        norm.forward = act.forward = _identity
    if encoder is not None:
        # The encoder is recomputed as a whole (its layers' inputs are not held through the rest of the backward),
        # and that recompute checkpoints layer by layer in turn: the wrapper patches the encoder's layers each time
        # it runs, so the recompute in the backward pass, after this block has restored them, still does.
        encoder_layers = [module for module in encoder.modules() if isinstance(module, _VAE_CHECKPOINTED_LAYERS)]
        encoder.forward = functools.partial(
            checkpointed, functools.partial(_run_layer_checkpointed, encoder.forward, encoder_layers)
        )
    try:
        yield
    finally:
        for layer, forward in zip(patched, saved):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
        if was_on:
            vae.enable_gradient_checkpointing()


def ddim_invert(
    noise_fn: NoiseFn, z0: torch.Tensor, timesteps: torch.Tensor, alphas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    r"""
    Deterministic DDIM inversion of clean `z0` up to the last of `timesteps`.

    Args:
        noise_fn: `noise_fn(z, t) -> eps` (see `NoiseFn`).
        z0 (`torch.Tensor` of shape `(B, C, H, W)`): clean samples in the denoiser's space.
        timesteps (`torch.LongTensor` of shape `(K,)`), alphas (`torch.Tensor` of shape `(K + 1,)`): from
            [`inversion_timesteps`] and [`noise_levels`].
        use_checkpoint (`bool`): checkpoint every denoiser call when gradients are being recorded.

    Returns:
        `torch.Tensor` of shape `(B, C, H, W)`: the inverted noise at `timesteps[-1]`.
    """
    z = z0
    for k, t in enumerate(timesteps):
        eps = _call(noise_fn, z, t, use_checkpoint)
        z = ddim_move(z, eps, float(alphas[k]), float(alphas[k + 1]))
    return z


def ddim_reconstruct(
    noise_fn: NoiseFn, zK: torch.Tensor, timesteps: torch.Tensor, alphas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    """Deterministic DDIM sampling (eta 0) of `zK` from `timesteps[-1]` down to clean; the inverse of [`ddim_invert`]
    when the noise estimates agree. Shapes as in [`ddim_invert`]."""
    z = zK
    for k in range(len(timesteps) - 1, -1, -1):
        eps = _call(noise_fn, z, timesteps[k], use_checkpoint)
        z = ddim_move(z, eps, float(alphas[k + 1]), float(alphas[k]))
    return z


def ddim_round_trip(
    noise_fn: NoiseFn, z0: torch.Tensor, timesteps: torch.Tensor, alphas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    """Invert `z0` with [`ddim_invert`] and reconstruct it with [`ddim_reconstruct`]: `2K` denoiser calls."""
    return ddim_reconstruct(
        noise_fn, ddim_invert(noise_fn, z0, timesteps, alphas, use_checkpoint), timesteps, alphas, use_checkpoint
    )
