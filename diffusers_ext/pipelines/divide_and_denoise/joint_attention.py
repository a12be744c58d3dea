"""Concept-token attention of joint-attention transformers (SD3's MMDiT), for the cross-attention utility.

An `SD3Transformer2DModel` has no separate cross-attention: each joint block concatenates the image tokens and the
text tokens and runs one attention over both. The image-query -> text-key block of that attention plays the role
of a UNet's cross-attention. [`JointConceptAttentionProcessor`] computes what diffusers' `JointAttnProcessor2_0`
computes (the same fused `scaled_dot_product_attention`) and hands that block, renormalised over the text tokens,
to a [`ConceptAttentionStore`].

The renormalised block never needs the full `(N + T) x (N + T)` attention matrix: for image query `i` and text key
`j`, `p_ij / sum_j' p_ij'` (the softmax's shared denominator over all keys cancels) is the softmax over the text keys
alone of the logits `q_i . k_j / sqrt(d)`. So only an `N x T` block (per head, averaged as it goes) is materialised (T is the text length, 77-333
tokens for SD3), where the explicit joint softmax took 5.5x the memory of the fused kernel per block at 768 px.
"""

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention


def is_joint_attention(module: torch.nn.Module) -> bool:
    """Whether `module` is a joint (image + text) attention layer: an `Attention` with added text projections."""
    return isinstance(module, Attention) and getattr(module, "add_k_proj", None) is not None


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
                # one head at a time, averaged here (the store's mean over heads), so that only an N x T block per
                # recorded row is held, not one per head
                to_text = None
                for head in range(attn.heads):
                    image_queries = query[rows, head, :num_image].float()
                    text_keys = key[rows, head, num_image:].float()
                    probs = (image_queries @ text_keys.transpose(-1, -2) * scale).softmax(dim=-1)
                    to_text = probs if to_text is None else to_text.add_(probs)
                to_text = to_text.div_(attn.heads)  # (recorded rows, N, T): the store's head count is 1
                if store.tokens is not None:
                    to_text = to_text[..., store.tokens]  # renormalised over every text token, then selected
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
