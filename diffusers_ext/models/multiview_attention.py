"""An attention processor that lets every view of a scene attend to every other view (3-D self-attention)."""

import torch
import torch.nn.functional as F


class MultiViewAttnProcessor:
    r"""
    Self-attention over the tokens of all `num_views` views of a scene, for a denoiser that runs views as batch
    items `(batch * num_views, C, H, W)`. Set `num_views` before the forward (the model owning the processor does).

    Works on the 4-D feature maps of diffusers' `Attention` in `UNet2DModel` blocks; cross-attention is not
    supported (multi-view self-attention only).
    """

    def __init__(self):
        self.num_views = 1

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states=None,
        attention_mask=None,
        temb=None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError("MultiViewAttnProcessor handles self-attention without a mask only.")
        if hidden_states.ndim != 4:
            raise ValueError(
                f"MultiViewAttnProcessor expects (batch * views, C, H, W) maps, got {hidden_states.ndim}-D."
            )
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        batch_views, channels, height, width = hidden_states.shape
        if batch_views % self.num_views:
            raise ValueError(f"a batch of {batch_views} maps is not a whole number of {self.num_views}-view scenes.")
        scenes = batch_views // self.num_views

        tokens = hidden_states.reshape(batch_views, channels, height * width).transpose(1, 2)
        if attn.group_norm is not None:
            tokens = attn.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
        tokens = tokens.reshape(scenes, self.num_views * height * width, channels)

        query, key, value = attn.to_q(tokens), attn.to_k(tokens), attn.to_v(tokens)
        head_dim = key.shape[-1] // attn.heads
        query, key, value = (t.view(scenes, -1, attn.heads, head_dim).transpose(1, 2) for t in (query, key, value))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(scenes, -1, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))

        out = (
            out.reshape(batch_views, height * width, -1).transpose(1, 2).reshape(batch_views, channels, height, width)
        )
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor
