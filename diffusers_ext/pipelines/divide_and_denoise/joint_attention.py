"""Concept-token attention of joint-attention transformers (SD3's and Flux's MMDiT), for the cross-attention utility.

An `SD3Transformer2DModel` has no separate cross-attention: each joint block concatenates the image tokens and the
text tokens and runs one attention over both. The image-query -> text-key block of that attention plays the role
of a UNet's cross-attention. [`JointConceptAttentionProcessor`] computes what diffusers' `JointAttnProcessor2_0`
computes (the same fused `scaled_dot_product_attention`) and hands that block, renormalised over the text tokens,
to a [`ConceptAttentionStore`].

The renormalised block never needs the full `(N + T) x (N + T)` attention matrix: for image query `i` and text key
`j`, `p_ij / sum_j' p_ij'` (the softmax's shared denominator over all keys cancels) is the softmax over the text keys
alone of the logits `q_i . k_j / sqrt(d)`. So only an `N x T` block (per head, averaged as it goes) is materialised (T is the text length, 77-333
tokens for SD3), where the explicit joint softmax took 5.5x the memory of the fused kernel per block at 768 px.

Flux's double-stream blocks (`FluxAttention` with added text projections) are the same joint attention with the
text tokens first and rotary position embeddings on queries and keys; [`FluxConceptAttentionProcessor`] computes
what diffusers' `FluxAttnProcessor` computes and records the same block. Flux's single-stream blocks run one
attention over the already concatenated sequence and are not recorded (their text/image split is not passed to the
attention), so the utility reads the double-stream blocks, as it reads SD3's joint blocks.
"""

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.attention_processor import Attention
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttention, _get_qkv_projections


def is_joint_attention(module: torch.nn.Module) -> bool:
    """Whether `module` is a joint (image + text) attention layer of SD3: an `Attention` with added text
    projections."""
    return isinstance(module, Attention) and getattr(module, "add_k_proj", None) is not None


def is_flux_joint_attention(module: torch.nn.Module) -> bool:
    """Whether `module` is the joint (text + image) attention of a Flux double-stream block: a `FluxAttention` with
    added text projections (the single-stream blocks' attention has none)."""
    return isinstance(module, FluxAttention) and module.added_kv_proj_dim is not None


def _mean_text_attention(
    query: torch.Tensor, key: torch.Tensor, heads: int, scale: float, tokens: list[int] | None = None
) -> torch.Tensor:
    """The softmax over the text keys of the image queries' logits, averaged over heads, one head at a time (so only
    one `N x T` block per row is held): `query` `(rows, H, N, d)`, `key` `(rows, H, T, d)` -> `(rows, N, T)`, or
    `(rows, N, len(tokens))` at the text positions `tokens` (still normalised over every text key)."""
    to_text = None
    for head in range(heads):
        logits = torch.bmm(query[:, head].float(), key[:, head].float().transpose(-1, -2)).mul_(scale)
        if tokens is None:
            probs = logits.softmax(dim=-1)
        else:
            # the log-normaliser over every text key, computed in place, then only the listed columns are
            # exponentiated: no second (rows, N, T) block is written
            peak = logits.amax(dim=-1, keepdim=True)
            picked = logits[..., tokens] - peak
            probs = picked.sub_(logits.sub_(peak).exp_().sum(dim=-1, keepdim=True).log_()).exp_()
        to_text = probs if to_text is None else to_text.add_(probs)
    return to_text.div_(heads)


class JointConceptAttentionProcessor:
    """diffusers' `JointAttnProcessor2_0` computation that also records image-to-text attention in a store.

    The store receives probabilities of shape `(batch, image_tokens, text_tokens)` (already averaged over heads): the
    attention of every image token to the text tokens, renormalised to sum to 1 over them, at the store's token
    positions when it lists some. With no store (`store=None`) nothing is recorded.
    """

    def __init__(self, store=None):
        self.store = store

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *args,
        **kwargs,
    ):
        batch_size, num_image = hidden_states.shape[0], hidden_states.shape[1]

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, N, H * D) -> (B, H, N, D)
            return x.view(batch_size, -1, attn.heads, x.shape[-1] // attn.heads).transpose(1, 2)

        query, key, value = (
            heads(attn.to_q(hidden_states)),
            heads(attn.to_k(hidden_states)),
            heads(attn.to_v(hidden_states)),
        )
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if encoder_hidden_states is not None:
            context_query = heads(attn.add_q_proj(encoder_hidden_states))
            context_key = heads(attn.add_k_proj(encoder_hidden_states))
            context_value = heads(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                context_query = attn.norm_added_q(context_query)
            if attn.norm_added_k is not None:
                context_key = attn.norm_added_k(context_key)
            query = torch.cat([query, context_query], dim=2)
            key = torch.cat([key, context_key], dim=2)
            value = torch.cat([value, context_value], dim=2)

        store = self.store
        if encoder_hidden_states is not None and store is not None and store.records(num_image):
            with torch.no_grad():
                scale = query.shape[-1] ** -0.5  # scaled_dot_product_attention's default scale
                # image queries x text keys only: (B, H, N, T), softmax over the text keys (module docstring)
                rows = slice(store.first_row, None)  # only the rows the store records
                # averaged over heads here (the store's mean over heads): (recorded rows, N, T), head count 1
                to_text = _mean_text_attention(
                    query[rows, :, :num_image], key[rows, :, num_image:], attn.heads, scale, store.tokens
                )
            store.record(to_text, to_text.shape[0])
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(batch_size, -1, value.shape[1] * value.shape[-1])
        out = out.to(query.dtype)
        if encoder_hidden_states is not None:
            out, encoder_hidden_states = out[:, :num_image], out[:, num_image:]
            if not attn.context_pre_only:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        out = attn.to_out[1](attn.to_out[0](out))
        return (out, encoder_hidden_states) if encoder_hidden_states is not None else out


class FluxConceptAttentionProcessor:
    """diffusers' `FluxAttnProcessor` computation that also records image-to-text attention in a store.

    Flux's joint attention puts the `T` text tokens first, then the `N` image tokens, and rotates queries and keys
    with the rotary position embedding before the attention; the recorded block is the image-query -> text-key
    block of that attention, renormalised over the text tokens (`(batch, N, T)`, averaged over heads), exactly as
    [`JointConceptAttentionProcessor`] records SD3's. With no store nothing is recorded.
    """

    _attention_backend = None  # diffusers' attention dispatch: its default backend, as `FluxAttnProcessor`'s
    _parallel_config = None

    def __init__(self, store=None):
        self.store = store

    def __call__(
        self,
        attn: FluxAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ):
        query, key, value, text_query, text_key, text_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        # (B, S, heads, head_dim), the layout of diffusers' attention dispatch
        query, key, value = (x.unflatten(-1, (-1, attn.head_dim)) for x in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        num_text = 0
        if attn.added_kv_proj_dim is not None:
            text_query, text_key, text_value = (
                x.unflatten(-1, (-1, attn.head_dim)) for x in (text_query, text_key, text_value)
            )
            text_query, text_key = attn.norm_added_q(text_query), attn.norm_added_k(text_key)
            num_text = text_query.shape[1]
            query = torch.cat([text_query, query], dim=1)
            key = torch.cat([text_key, key], dim=1)
            value = torch.cat([text_value, value], dim=1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        store = self.store
        num_image = query.shape[1] - num_text
        if encoder_hidden_states is not None and store is not None and store.records(num_image):
            with torch.no_grad():
                rows = slice(store.first_row, None)
                image_queries = query[rows, num_text:].transpose(1, 2)  # (rows, heads, N, d)
                text_keys = key[rows, :num_text].transpose(1, 2)  # (rows, heads, T, d)
                to_text = _mean_text_attention(
                    image_queries, text_keys, query.shape[2], query.shape[-1] ** -0.5, store.tokens
                )
            store.record(to_text, to_text.shape[0])

        out = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        out = out.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return out
        text_out, out = out.split_with_sizes([num_text, out.shape[1] - num_text], dim=1)
        out = attn.to_out[1](attn.to_out[0](out.contiguous()))
        return out, attn.to_add_out(text_out.contiguous())
