"""ParameterDiffusionModel: a timestep-conditioned MLP denoiser over flattened (standardised) adapter vectors."""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, public


@public
@dataclass
class ParameterDiffusionModelOutput(BaseOutput):
    """Output of [`ParameterDiffusionModel`].

    Args:
        sample (`torch.Tensor` of shape `(batch_size, vector_dim)`): the prediction (noise for the default DDPM
            `prediction_type="epsilon"`).
    """

    sample: torch.Tensor


class _ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, time_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.time = nn.Linear(time_dim, hidden_size)
        self.fc1 = nn.Linear(hidden_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden, time_embedding):
        h = nn.functional.silu(self.fc1(self.norm(hidden)) + self.time(time_embedding))
        return hidden + self.fc2(h)


@public
class ParameterDiffusionModel(ModelMixin, ConfigMixin):
    r"""
    A residual MLP denoiser `eps(x_t, t)` over adapter vectors, for diffusers' `DDPMScheduler` / `DDIMScheduler`.

    The vectors are the standardised flat adapters of an [`AdapterVectorizer`]; the vectoriser's layout and its
    per-coordinate mean and standard deviation are stored with the model (`parameter_names`, `parameter_shapes` in
    the config, `vector_mean` / `vector_std` buffers in the weights), so a saved model decodes its own samples.

    Parameters:
        vector_dim (`int`): length of the adapter vector.
        hidden_size (`int`, defaults to 256): width of the MLP.
        num_layers (`int`, defaults to 3): residual blocks.
        time_embedding_dim (`int`, defaults to 64): sinusoidal timestep embedding size.
        parameter_names (`list[str]`, *optional*): the adapter state dict keys, in vector order.
        parameter_shapes (`list[list[int]]`, *optional*): each key's shape.
    """

    @register_to_config
    def __init__(
        self,
        vector_dim: int,
        hidden_size: int = 256,
        num_layers: int = 3,
        time_embedding_dim: int = 64,
        parameter_names: list[str] | None = None,
        parameter_shapes: list[list[int]] | None = None,
    ):
        super().__init__()
        check_positive_int("vector_dim", vector_dim)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("time_embedding_dim", time_embedding_dim)
        if (parameter_names is None) != (parameter_shapes is None):
            raise ValueError("`parameter_names` and `parameter_shapes` must be given together.")
        if parameter_shapes is not None:
            size = sum(int(torch.Size(shape).numel()) for shape in parameter_shapes)
            if size != vector_dim or len(parameter_names) != len(parameter_shapes):
                raise ValueError(
                    f"`parameter_shapes` hold {size} numbers over {len(parameter_shapes)} tensors for "
                    f"{len(parameter_names)} names; expected `vector_dim` = {vector_dim} numbers, one shape per name."
                )
        self.time_mlp = nn.Sequential(
            nn.Linear(time_embedding_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.proj_in = nn.Linear(vector_dim, hidden_size)
        self.blocks = nn.ModuleList([_ResidualBlock(hidden_size, hidden_size) for _ in range(num_layers)])
        self.norm_out = nn.LayerNorm(hidden_size)
        self.proj_out = nn.Linear(hidden_size, vector_dim)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)
        self.register_buffer("vector_mean", torch.zeros(vector_dim))
        self.register_buffer("vector_std", torch.ones(vector_dim))

    def set_standardization(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Store the vectoriser's per-coordinate `mean` and `std`, each of shape `(vector_dim,)`."""
        for name, value in (("mean", mean), ("std", std)):
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (self.config.vector_dim,):
                raise ValueError(
                    f"`{name}` must have shape ({self.config.vector_dim},), got {getattr(value, 'shape', value)}."
                )
        self.vector_mean.copy_(mean)
        self.vector_std.copy_(std)

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor | int, return_dict: bool = True
    ) -> ParameterDiffusionModelOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch_size, vector_dim)`): noisy standardised adapter vectors.
            timestep (`torch.Tensor` of shape `()` or `(batch_size,)`, or `int`): diffusion timesteps.
            return_dict (`bool`, defaults to `True`): return a [`ParameterDiffusionModelOutput`] or a tuple.
        """
        if sample.ndim != 2 or sample.shape[1] != self.config.vector_dim:
            raise ValueError(
                f"`sample` has shape {tuple(sample.shape)}; expected (batch_size, {self.config.vector_dim})."
            )
        timestep = torch.as_tensor(timestep, device=sample.device).reshape(-1).expand(sample.shape[0])
        embedding = get_timestep_embedding(
            timestep.to(torch.float32), self.config.time_embedding_dim, flip_sin_to_cos=True, downscale_freq_shift=0
        ).to(self.dtype)
        time_embedding = self.time_mlp(embedding)
        hidden = self.proj_in(sample.to(self.dtype))
        for block in self.blocks:
            hidden = block(hidden, time_embedding)
        out = self.proj_out(self.norm_out(hidden))
        if not return_dict:
            return (out,)
        return ParameterDiffusionModelOutput(sample=out)
