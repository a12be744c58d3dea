"""Per-position utilities: how much each model "wants" each position of the sample, from its own predictions.

- [`x0_saliency`]: how far the model's clean-sample prediction departs from its background there.
- [`guidance_delta`]: the size of the model's classifier-free guidance direction there, `|eps(c) - eps(null)|`.
- Cross-attention maps of concept tokens: [`ConceptAttentionStore`] records them through
  [`ConceptAttentionProcessor`]s installed on the cross-attention layers of a `UNet2DConditionModel`, or through
  [`JointConceptAttentionProcessor`]s on the joint attention of an `SD3Transformer2DModel` (the weights are
  untouched; the processors compute exactly what diffusers' processors compute and keep the probabilities).
  [`ConceptAttentionRecording`] installs them once for a whole sampling loop; a store is attached per forward.

All return non-negative maps of shape `(batch, height, width)` at the sample's resolution.
"""

import contextlib
import math
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention

from ...utils import is_int
from .joint_attention import (
    FluxConceptAttentionProcessor,
    JointConceptAttentionProcessor,
    is_flux_joint_attention,
    is_joint_attention,
)


UTILITIES = ("x0_saliency", "guidance_delta", "cross_attention")


def x0_saliency(x0: torch.Tensor, background: torch.Tensor | float | None = None) -> torch.Tensor:
    """`|x0 - background|` over channels, `(batch, channels, H, W)` -> `(batch, H, W)`.

    Args:
        x0: a model's prediction of the clean sample.
        background: the value of "nothing here"; by default the per-image, per-channel median of `x0` (the
            background, as long as the model's objects cover less than half of the sample).
    """
    if background is None:
        background = x0.flatten(2).median(dim=2).values[..., None, None]
    return (x0 - background).pow(2).sum(dim=1).sqrt()


def guidance_delta(noise_cond: torch.Tensor, noise_uncond: torch.Tensor) -> torch.Tensor:
    """`|eps(c) - eps(null)|` over channels, `(batch, channels, H, W)` -> `(batch, H, W)`."""
    return (noise_cond - noise_uncond).pow(2).sum(dim=1).sqrt()


class ConceptAttentionStore:
    """Accumulates cross-attention probabilities (mean over heads) resized to the sample's resolution.

    `maps` is `(rows, H, W, num_tokens)`: the sum over the recorded layers, divided by their number. Layers are summed
    at their own resolution and resized once per resolution when `maps` is read (bilinear resizing is linear, so
    this is the mean of the resized maps, without resizing every layer's map at every call).

    Args:
        size (`tuple[int, int]`): the sample's `(H, W)`.
        first_row (`int`, defaults to 0): record only the batch rows from this one on (the conditional branch of a
            classifier-free-guided batch, whose maps are the only ones used); the recording processors compute the
            other rows' attention with the fused kernel.
        attn_res (`tuple[int, int]`, *optional*): record only the layers whose attention grid is this `(h, w)`
            (Attend-and-Excite's `attn_res`, `(16, 16)` for Stable Diffusion's 64x64 latents); the other layers keep
            the fused kernel. By default every text-attention layer is recorded.
        tokens (`list[int]`, *optional*): record only the attention to these text-token positions (the concept
            tokens a utility reads); `maps` then has one column per listed position, in this order. By default every
            token is recorded. A few columns cost a few dot products per query on top of the fused kernel, where
            every column costs a second attention.
    """

    def __init__(
        self,
        size: tuple[int, int],
        first_row: int = 0,
        attn_res: tuple[int, int] | None = None,
        tokens: list[int] | None = None,
    ):
        self.size = tuple(size)
        self.first_row = int(first_row)
        self.attn_res = None if attn_res is None else tuple(attn_res)
        if tokens is not None and (
            not isinstance(tokens, (list, tuple)) or not tokens or not all(is_int(i) and i >= 0 for i in tokens)
        ):
            raise ValueError(f"`tokens` must be a non-empty list of non-negative token positions, got {tokens!r}.")
        self.tokens = None if tokens is None else [int(i) for i in tokens]
        self.reset()

    def grid(self, num_queries: int) -> tuple[int, int] | None:
        """The `(h, w)` grid of a layer with `num_queries` image positions, if it tiles the sample; else None."""
        height, width = self.size
        factor = math.sqrt(height * width / num_queries)
        h, w = round(height / factor), round(width / factor)
        return (h, w) if h * w == num_queries else None

    def records(self, num_queries: int) -> bool:
        """Whether a layer with `num_queries` image positions is recorded (its grid tiles the sample, and is
        `attn_res` when that is set)."""
        grid = self.grid(num_queries)
        return grid is not None and (self.attn_res is None or grid == self.attn_res)

    def reset(self) -> None:
        self._sums: dict[tuple[int, int], torch.Tensor] = {}
        self.num_layers = 0

    def record(self, probs: torch.Tensor, batch: int) -> None:
        """`probs` of shape `(batch * heads, queries, tokens)` from one cross-attention layer, for `batch` rows (the
        rows from `first_row` on); `tokens` is `len(self.tokens)` when the store records only those positions."""
        if not self.records(probs.shape[1]):
            return  # a layer whose grid does not tile the sample (odd sizes; skip rather than guess), or not attn_res
        if self.tokens is not None and probs.shape[2] != len(self.tokens):
            raise ValueError(
                f"the store records {len(self.tokens)} token positions {self.tokens}, got probabilities over "
                f"{probs.shape[2]} tokens."
            )
        heads = probs.shape[0] // batch
        probs = probs.reshape(batch, heads, probs.shape[1], probs.shape[2]).mean(dim=1)
        h, w = self.grid(probs.shape[1])
        grid = probs.transpose(1, 2).reshape(batch, probs.shape[2], h, w).float()
        self._sums[(h, w)] = grid if (h, w) not in self._sums else self._sums[(h, w)] + grid
        self.num_layers += 1

    @property
    def maps(self) -> torch.Tensor:
        if not self._sums:
            where = "" if self.attn_res is None else f" at `attn_res` {self.attn_res}"
            raise RuntimeError(
                f"no cross-attention was recorded{where}; does the model have cross-attention layers there?"
            )
        total = None
        for (h, w), grid in self._sums.items():
            if (h, w) != self.size:
                grid = F.interpolate(grid, size=self.size, mode="bilinear", align_corners=False)
            total = grid if total is None else total + grid
        return total.permute(0, 2, 3, 1) / self.num_layers


# The CPU flash-attention kernel behind `F.scaled_dot_product_attention` on CPU; it also returns the log of each
# query's softmax normaliser, which turns "record the attention to a few tokens" into a few dot products per query.
_CPU_ATTENTION_WITH_LOGSUMEXP = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attention_with_logsumexp(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`softmax(scale q k^T + mask) v` and the log of each query's softmax normaliser.

    Args:
        query, key, value (`torch.Tensor` of shapes `(rows, queries, d)`, `(rows, keys, d)`, `(rows, keys, d)`):
            one row per batch element and head (diffusers' `head_to_batch_dim` layout).
        mask (`torch.Tensor`, *optional*): an additive mask broadcastable to `(rows, queries, keys)`.
        scale (`float`): the logits' scale.

    Returns:
        `(out, logsumexp)` of shapes `(rows, queries, d)` and `(rows, queries)` (float32 or wider). On CPU without a
        mask both come from the fused kernel `F.scaled_dot_product_attention` runs there, so `out` is exactly its
        output; elsewhere they come from the explicit logits.
    """
    if query.device.type == "cpu" and mask is None and _CPU_ATTENTION_WITH_LOGSUMEXP is not None:
        out, logsumexp = _CPU_ATTENTION_WITH_LOGSUMEXP(query[None], key[None], value[None], scale=scale)
        return out[0], logsumexp[0]
    logits = torch.bmm(query, key.transpose(1, 2)).mul_(scale)
    if mask is not None:
        logits = logits + mask
    logsumexp = logits.float().logsumexp(dim=-1)
    probs = (logits.float() - logsumexp[..., None]).exp_().to(value.dtype)
    return torch.bmm(probs, value), logsumexp


class ConceptAttentionProcessor:
    """diffusers' `AttnProcessor2_0` computation that also hands the attention probabilities to a store.

    With no store (`store=None`, between the recorded forwards of a [`ConceptAttentionRecording`]) or at a layer the
    store does not record, every row takes diffusers' fused kernel. The store's rows take the same attention plus
    the log of its softmax normaliser ([`attention_with_logsumexp`]); the recorded probabilities are then
    `exp(scale q . k_j - logsumexp)` for the store's token positions `j` only.
    """

    def __init__(self, store: ConceptAttentionStore | None = None):
        self.store = store

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query = attn.head_to_batch_dim(query)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)

        store = self.store
        # rows before `split` (an unconditional branch, or every row of a layer the store does not record) take the
        # fused kernel; the recorded rows the same attention with its normaliser
        split = query.shape[0] if store is None or not store.records(query.shape[1]) else store.first_row * attn.heads
        mask = (lambda rows: None) if attention_mask is None else (lambda rows: attention_mask[rows])
        hidden_states = query[:0]  # (0, queries, head_dim): no recorded rows yet
        if split < query.shape[0]:
            recorded = slice(split, None)
            hidden_states, logsumexp = attention_with_logsumexp(
                query[recorded], key[recorded], value[recorded], mask(recorded), attn.scale
            )
            keys = key[recorded] if store.tokens is None else key[recorded][:, store.tokens]
            logits = torch.bmm(query[recorded], keys.transpose(1, 2)).float().mul_(attn.scale)
            if attention_mask is not None:
                logits = logits + (mask(recorded) if store.tokens is None else mask(recorded)[..., store.tokens])
            probs = (logits - logsumexp[..., None]).exp_()  # (recorded rows, queries, recorded tokens)
            store.record(probs, batch_size - store.first_row)
            hidden_states = hidden_states.to(query.dtype)
        if split:
            fused = F.scaled_dot_product_attention(
                query[:split], key[:split], value[:split], attn_mask=mask(slice(None, split)), scale=attn.scale
            )
            hidden_states = torch.cat([fused, hidden_states])
        hidden_states = attn.batch_to_head_dim(hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


# model -> its text-attention layers, found once per model: [(layer, kind)]
_TEXT_ATTENTION_LAYERS: "weakref.WeakKeyDictionary[torch.nn.Module, list[tuple[torch.nn.Module, str]]]" = (
    weakref.WeakKeyDictionary()
)


def text_attention_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """`model`'s layers that attend to text, as `(layer, kind)`: `"cross"` for the cross-attention (`attn2`) layers of
    a `UNet2DConditionModel` (SD 1.x / 2.x, SDXL), `"joint"` for the joint (image + text) attention of an
    `SD3Transformer2DModel`, `"flux"` for the joint attention of a `FluxTransformer2DModel`'s double-stream blocks.
    An `attn2` that attends to no text (SD3.5's second, image-only attention) is not one. Found once per model (the
    walk over every module is what made installing recorders cost milliseconds per call)."""
    layers = _TEXT_ATTENTION_LAYERS.get(model)
    if layers is None:
        layers = []
        for name, module in model.named_modules():
            if is_joint_attention(module):
                layers.append((module, "joint"))
            elif is_flux_joint_attention(module):
                layers.append((module, "flux"))
            elif isinstance(module, Attention) and name.rsplit(".", 1)[-1] == "attn2" and module.is_cross_attention:
                layers.append((module, "cross"))
        _TEXT_ATTENTION_LAYERS[model] = layers
    return layers


class ConceptAttentionRecording:
    """Recording processors on the text-attention layers of one or more models, installed once for a sampling loop.

    A `UNet2DConditionModel`'s cross-attention layers (`attn2`) get a [`ConceptAttentionProcessor`]; the joint
    (image + text) attention layers of an `SD3Transformer2DModel` a [`JointConceptAttentionProcessor`] and those of a
    `FluxTransformer2DModel` a [`FluxConceptAttentionProcessor`], which record the image-to-text block. Set `store`
    before a forward to record it (None: the processors compute the plain attention and record nothing), so one
    installation serves every model call of a loop instead of swapping processors in and out per call. The layers'
    own processors are restored on exit; other layers are not touched.

    Args:
        models (`list[torch.nn.Module]`): the models to record (a model listed twice is installed once).
    """

    def __init__(self, models: list[torch.nn.Module]):
        self.models = []
        for model in models:
            if not any(model is seen for seen in self.models):
                self.models.append(model)
        for model in self.models:
            if not text_attention_layers(model):
                raise ValueError(
                    f"{type(model).__name__} has no cross- or joint-attention layers to read concept-token attention "
                    "from."
                )
        self._processors = {
            "cross": ConceptAttentionProcessor(None),
            "joint": JointConceptAttentionProcessor(None),
            "flux": FluxConceptAttentionProcessor(None),
        }
        self._original = None

    @property
    def store(self) -> ConceptAttentionStore | None:
        return self._processors["cross"].store

    @store.setter
    def store(self, store: ConceptAttentionStore | None) -> None:
        for processor in self._processors.values():
            processor.store = store

    def __enter__(self) -> "ConceptAttentionRecording":
        self._original = []
        for model in self.models:
            for layer, kind in text_attention_layers(model):
                self._original.append((layer, layer.processor))
                layer.set_processor(self._processors[kind])
        return self

    def __exit__(self, *exc_info) -> None:
        for layer, processor in self._original:
            layer.set_processor(processor)
        self._original = None
        self.store = None


@contextlib.contextmanager
def record_cross_attention(model: torch.nn.Module, store: ConceptAttentionStore) -> Iterator[ConceptAttentionStore]:
    """Record every forward of `model` in the block into `store` (a one-model [`ConceptAttentionRecording`])."""
    with ConceptAttentionRecording([model]) as recording:
        recording.store = store
        yield store


def agent_utility_maps(
    utility: str,
    x0: torch.Tensor,
    cond_out: torch.Tensor,
    uncond_out: torch.Tensor | None,
    attention: torch.Tensor | None,
) -> torch.Tensor:
    """Every agent's utility map `(B, K, H, W)`, each normalised to a maximum of 1 per image.

    Args:
        utility (`str`): one of `UTILITIES`.
        x0, cond_out, uncond_out (`torch.Tensor` of shape `(B, K, C, H, W)`): every agent's clean-sample prediction,
            and its conditional and unconditional model outputs (the latter only with `"guidance_delta"`).
        attention (`torch.Tensor` of shape `(B, K, H, W)`): every agent's attention to its concept tokens, averaged
            over them (`"cross_attention"`).
    """
    if utility == "x0_saliency":
        maps = torch.stack([x0_saliency(x0[:, k]) for k in range(x0.shape[1])], dim=1)
    elif utility == "guidance_delta":
        maps = torch.stack(
            [guidance_delta(cond_out[:, k].float(), uncond_out[:, k].float()) for k in range(x0.shape[1])], dim=1
        )
    else:
        maps = attention
    maps = maps.float()
    return maps / maps.flatten(2).amax(dim=2).clamp_min(1e-12)[..., None, None]
