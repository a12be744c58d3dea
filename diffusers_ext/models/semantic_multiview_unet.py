"""A camera-conditioned multi-view denoiser with extra inputs for (warped) semantic features."""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin, UNet2DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.attention_processor import Attention
from diffusers.utils import BaseOutput

from ..utils import public
from .multiview_attention import MultiViewAttnProcessor


PLUCKER_CHANNELS = 6


@public
@dataclass
class SemanticMultiViewUNetOutput(BaseOutput):
    """
    Args:
        sample (`torch.Tensor` of shape `(batch, views, channels, height, width)`): the prediction for every view.
    """

    sample: torch.Tensor


@public
class SemanticMultiViewUNetModel(ModelMixin, ConfigMixin):
    r"""
    A multi-view denoiser for novel view synthesis (CAT3D / SEVA style) with semantic conditioning.

    The views of a scene are run as one batch through a diffusers [`UNet2DModel`] whose self-attention layers
    attend across all views ([`MultiViewAttnProcessor`]). Each view's input channels are, in order: the noisy
    sample (`image_channels`), the clean input image for input views and zeros for target views
    (`image_channels`), a 1-channel input-view mask, a 6-channel Plücker ray map `[d, o x d]`, semantic features
    (`semantic_channels`; warped from the input views and/or extracted from the current estimate) and their
    1-channel validity mask.

    Parameters:
        sample_size (`int`, defaults to 32): view resolution (square).
        image_channels (`int`, defaults to 3): channels of the sample (3 for pixels, the latent channels with a VAE).
        semantic_channels (`int`, defaults to 16): channels of the semantic feature map (0 disables the inputs).
        block_out_channels, down_block_types, up_block_types, layers_per_block, norm_num_groups,
        attention_head_dim: the inner [`UNet2DModel`]'s configuration; it needs at least one attention block.
    """

    _supports_gradient_checkpointing = True

    @register_to_config
    def __init__(
        self,
        sample_size: int = 32,
        image_channels: int = 3,
        semantic_channels: int = 16,
        block_out_channels: tuple[int, ...] = (32, 64, 64),
        down_block_types: tuple[str, ...] = ("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types: tuple[str, ...] = ("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        layers_per_block: int = 1,
        norm_num_groups: int = 8,
        attention_head_dim: int = 8,
    ):
        super().__init__()
        if not any("Attn" in block for block in down_block_types + up_block_types):
            raise ValueError("`down_block_types`/`up_block_types` need an attention block for multi-view attention.")
        self.unet = UNet2DModel(
            sample_size=sample_size,
            in_channels=self.conditioning_channels(image_channels, semantic_channels),
            out_channels=image_channels,
            block_out_channels=tuple(block_out_channels),
            down_block_types=tuple(down_block_types),
            up_block_types=tuple(up_block_types),
            layers_per_block=layers_per_block,
            norm_num_groups=norm_num_groups,
            attention_head_dim=attention_head_dim,
        )
        # One shared processor: the model sets its `num_views` before each forward.
        self._multiview_processor = MultiViewAttnProcessor()
        for module in self.unet.modules():
            if isinstance(module, Attention):
                module.set_processor(self._multiview_processor)

    @staticmethod
    def conditioning_channels(image_channels: int, semantic_channels: int) -> int:
        """Input channels of the inner UNet for these sample and semantic channel counts."""
        return 2 * image_channels + 1 + PLUCKER_CHANNELS + semantic_channels + (1 if semantic_channels else 0)

    @classmethod
    def from_single_view_unet(cls, unet: UNet2DModel, semantic_channels: int = 16) -> "SemanticMultiViewUNetModel":
        """Initialise from a pretrained single-view [`UNet2DModel`]: every weight is copied; the new input
        channels of `conv_in` start at zero, so the model first behaves like the single-view one."""
        config = unet.config
        if config.class_embed_type is not None or config.num_class_embeds is not None:
            raise ValueError("`unet` is class-conditional; pass an unconditional UNet2DModel.")
        model = cls(
            sample_size=config.sample_size,
            image_channels=config.in_channels,
            semantic_channels=semantic_channels,
            block_out_channels=tuple(config.block_out_channels),
            down_block_types=tuple(config.down_block_types),
            up_block_types=tuple(config.up_block_types),
            layers_per_block=config.layers_per_block,
            norm_num_groups=config.norm_num_groups,
            attention_head_dim=config.attention_head_dim,
        )
        state = unet.state_dict()
        conv_in = model.unet.conv_in.weight.detach().clone().zero_()
        conv_in[:, : config.in_channels] = state["conv_in.weight"]
        state["conv_in.weight"] = conv_in
        model.unet.load_state_dict(state)
        return model.to(unet.dtype)

    def _check(self, name: str, value: torch.Tensor | None, shape: tuple[int, ...]) -> None:
        if value is None or tuple(value.shape) != shape:
            raise ValueError(f"`{name}` has shape {tuple(getattr(value, 'shape', ())) or None}; expected {shape}.")

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float | int,
        plucker: torch.Tensor,
        input_mask: torch.Tensor,
        input_images: torch.Tensor,
        semantic_features: torch.Tensor | None = None,
        semantic_mask: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> SemanticMultiViewUNetOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(B, V, C, H, W)`): noisy views.
            timestep (`torch.Tensor` of shape `(B,)` or a number): diffusion timestep per scene.
            plucker (`torch.Tensor` of shape `(B, V, 6, H, W)`): Plücker ray maps, relative to a reference view.
            input_mask (`torch.Tensor` of shape `(B, V)`): True for input (known) views.
            input_images (`torch.Tensor` of shape `(B, V, C, H, W)`): the clean input views (zeros elsewhere).
            semantic_features (`torch.Tensor` of shape `(B, V, S, H, W)`, *optional*): zeros when omitted.
            semantic_mask (`torch.Tensor` of shape `(B, V, 1, H, W)`, *optional*): where the features are valid.
            return_dict (`bool`, defaults to `True`): return a [`SemanticMultiViewUNetOutput`] instead of a tuple.
        """
        if sample.ndim != 5:
            raise ValueError(f"`sample` must be (batch, views, channels, height, width), got {tuple(sample.shape)}.")
        b, v, c, h, w = sample.shape
        s = self.config.semantic_channels
        if c != self.config.image_channels:
            raise ValueError(f"`sample` has {c} channels; the model takes {self.config.image_channels}.")
        self._check("plucker", plucker, (b, v, PLUCKER_CHANNELS, h, w))
        self._check("input_mask", input_mask, (b, v))
        self._check("input_images", input_images, (b, v, c, h, w))
        dtype = sample.dtype
        parts = [
            sample,
            input_images.to(dtype),
            input_mask.to(dtype)[..., None, None, None].expand(b, v, 1, h, w),
            plucker.to(dtype),
        ]
        if s:
            if semantic_features is None:
                semantic_features = sample.new_zeros(b, v, s, h, w)
                semantic_mask = sample.new_zeros(b, v, 1, h, w)
            self._check("semantic_features", semantic_features, (b, v, s, h, w))
            self._check("semantic_mask", semantic_mask, (b, v, 1, h, w))
            parts += [semantic_features.to(dtype), semantic_mask.to(dtype)]
        elif semantic_features is not None:
            raise ValueError("`semantic_features` were given to a model with `semantic_channels=0`.")

        self._multiview_processor.num_views = v
        timestep = torch.as_tensor(timestep, device=sample.device)
        timestep = timestep.expand(b) if timestep.ndim == 0 else timestep
        if timestep.shape != (b,):
            raise ValueError(f"`timestep` has shape {tuple(timestep.shape)}; expected a number or ({b},).")
        out = self.unet(torch.cat(parts, dim=2).reshape(b * v, -1, h, w), timestep.repeat_interleave(v)).sample
        out = out.reshape(b, v, c, h, w)
        if not return_dict:
            return (out,)
        return SemanticMultiViewUNetOutput(sample=out)
