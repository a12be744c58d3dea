"""ManifoldFlowTransformerModel: the two-head velocity of flow matching on data near a linear `d`-dim subspace of R^D.

Data `x = B z` with `B` (`D x d`) orthonormal, diffusers' flow-matching path `x_sigma = (1 - sigma) x + sigma eps`
(`FlowMatchEulerDiscreteScheduler`, timestep `sigma * num_train_timesteps`) and velocity target `eps - x`. The optimal
velocity `E[eps - x | x_sigma = y] = (y - E[x | y]) / sigma` splits into

    v(y, sigma) = B g(B^T y, sigma) + c(sigma) (I - B B^T) y

- the *tangent head* `g`: the optimal velocity of the `d`-dim flow-matching problem of `z`, a function of the `d`
  numbers `B^T y` only (the orthogonal part of `y` carries no information about `z`, because the noise is isotropic);
  here a small transformer ([`VectorFlowTransformer`]);
- the *orthogonal head* `c(sigma) (I - B B^T) y`, analytic: `c(sigma) = 1 / sigma` for data on the subspace. With
  `orthogonal_noise_std = tau > 0` (data `B z + tau xi`, `xi ~ N(0, I_D)`),
  `c(sigma) = (sigma - (1 - sigma) tau^2) / ((1 - sigma)^2 tau^2 + sigma^2)`, finite at `sigma = 0` (`-1`).

The derivation is in docs/manifold_flow.md. The `sigma -> 0` singularity of `1 / sigma` is handled by evaluating
`c` at `max(sigma, orthogonal_sigma_min)`: on the path, `(I - B B^T) y / sigma = (I - B B^T) eps` stays bounded,
and an Euler step from `sigma` to `sigma'` scales the orthogonal part by `sigma' / sigma` exactly, so the floor
(1e-4 by default, below the smallest nonzero sigma 1e-3 of `FlowMatchEulerDiscreteScheduler`) changes nothing the
scheduler evaluates; it keeps `sigma = 0` finite (zero for points on the subspace) and bounds the gradients of a
learned subspace.
"""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, is_number, public


ORTHONORMAL_ATOL = 1e-4


@public
@dataclass
class ManifoldFlowTransformerOutput(BaseOutput):
    """Output of [`ManifoldFlowTransformerModel`].

    Args:
        sample (`torch.Tensor` of shape `(..., ambient_dim)`): the predicted velocity `noise - x`.
    """

    sample: torch.Tensor


@public
@dataclass
class SubspaceFit:
    """What [`ManifoldFlowTransformerModel.fit_subspace`] found.

    Args:
        explained_fraction (`float`): the share of `sum ||x||^2` inside the fitted subspace (uncentred).
        residual_std (`float`): the RMS of the residual `(I - B B^T) x` per orthogonal coordinate,
            `sqrt(sum ||(I - B B^T) x||^2 / (n (D - d)))`: the estimate of `orthogonal_noise_std`.
        singular_values (`torch.Tensor` of shape `(min(n, D),)`): of the data matrix, descending (float64).
    """

    explained_fraction: float
    residual_std: float
    singular_values: torch.Tensor


def uncentred_pca(x: torch.Tensor, latent_dim: int) -> tuple[torch.Tensor, SubspaceFit]:
    """The `latent_dim`-dim subspace through 0 that holds most of the points `x` `(n, D)`: the top right singular
    vectors of the data matrix, no mean subtracted (float64). Each column is signed so that its entry of largest
    magnitude is positive.

    Returns:
        `(basis, fit)`: the orthonormal `(D, latent_dim)` basis and its [`SubspaceFit`].
    """
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point():
        raise ValueError(f"`x` must be a float (num_points, dim) matrix, got {getattr(x, 'shape', type(x).__name__)}.")
    check_positive_int("latent_dim", latent_dim)
    if latent_dim >= x.shape[1]:
        raise ValueError(f"`latent_dim` must be smaller than the points' dimension {x.shape[1]}, got {latent_dim}.")
    if len(x) < latent_dim:
        raise ValueError(f"`x` must hold at least latent_dim={latent_dim} points to span the subspace, got {len(x)}.")
    data = x.detach().to(torch.float64)
    if not torch.isfinite(data).all():
        raise ValueError("`x` holds non-finite values.")
    _, singular_values, vh = torch.linalg.svd(data, full_matrices=False)
    basis = vh[:latent_dim].T.clone()
    largest = basis.abs().argmax(dim=0)
    basis = basis * torch.sign(basis[largest, torch.arange(latent_dim)])
    total = float(singular_values.square().sum())
    residual = data - (data @ basis) @ basis.T
    residual_std = float(residual.square().sum().div(len(data) * (x.shape[1] - latent_dim)).sqrt())
    explained = float(singular_values[:latent_dim].square().sum()) / total if total > 0 else 1.0
    return basis, SubspaceFit(explained_fraction=explained, residual_std=residual_std, singular_values=singular_values)


def check_sample_dim(name: str, sample, dim: int) -> None:
    """Raise a `ValueError` naming `name` unless `sample` is a floating tensor of shape `(..., dim)`."""
    if not isinstance(sample, torch.Tensor) or sample.ndim < 1 or sample.shape[-1] != dim:
        shape = tuple(sample.shape) if isinstance(sample, torch.Tensor) else type(sample).__name__
        raise ValueError(f"`{name}` must be a tensor of shape (..., {dim}), got {shape}.")
    if not sample.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {sample.dtype}.")


def broadcast_timestep(timestep, sample: torch.Tensor) -> torch.Tensor:
    """`timestep` (a number, a 0-d tensor, one per leading row or one per sample) expanded to `sample.shape[:-1]`."""
    timestep = torch.as_tensor(timestep, device=sample.device)
    batch_shape = sample.shape[:-1]
    if timestep.ndim == 0:
        return timestep.expand(batch_shape)
    if timestep.shape == batch_shape:
        return timestep
    if timestep.ndim == 1 and len(batch_shape) >= 1 and len(timestep) == batch_shape[0]:
        return timestep.reshape(-1, *([1] * (len(batch_shape) - 1))).expand(batch_shape)
    raise ValueError(
        f"`timestep` must be a scalar, of shape ({batch_shape[0] if batch_shape else 1},) or of shape "
        f"{tuple(batch_shape)}, got {tuple(timestep.shape)}."
    )


class VectorFlowTransformer(nn.Module):
    """A small transformer velocity network on vectors: `R^dim x [0, T] -> R^dim`.

    The vector is embedded linearly into `num_tokens` tokens of width `hidden_size` (plus a learned position
    embedding and the timestep's embedding, added to every token), runs through `num_layers` pre-norm transformer
    encoder layers, and the flattened tokens are read out linearly. The body (tokens, width, depth) does not depend
    on `dim`; only the two linear maps at its ends do, so the same network runs on `x in R^D` (ambient flow
    matching) and on `B^T x in R^d` (the tangent head, latent flow matching).

    Args:
        dim (`int`): the input (and output) size.
        num_tokens (`int`): tokens the vector is embedded into.
        hidden_size (`int`): token width (divisible by `num_attention_heads`).
        num_layers (`int`): transformer layers.
        num_attention_heads (`int`): attention heads.
        time_embedding_dim (`int`): sinusoidal embedding size of the timestep (even).
    """

    def __init__(
        self,
        dim: int,
        num_tokens: int = 4,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_attention_heads: int = 2,
        time_embedding_dim: int = 32,
    ):
        super().__init__()
        for name, value in (
            ("dim", dim),
            ("num_tokens", num_tokens),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
            ("num_attention_heads", num_attention_heads),
        ):
            check_positive_int(name, value)
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({hidden_size}) must be divisible by `num_attention_heads` ({num_attention_heads})."
            )
        check_positive_int("time_embedding_dim", time_embedding_dim, minimum=2)
        if time_embedding_dim % 2:
            raise ValueError(f"`time_embedding_dim` must be even, got {time_embedding_dim}.")
        self.dim, self.num_tokens, self.hidden_size = dim, num_tokens, hidden_size
        self.time_embedding_dim = time_embedding_dim
        self.embed = nn.Linear(dim, num_tokens * hidden_size)
        self.position = nn.Parameter(torch.zeros(num_tokens, hidden_size))
        nn.init.normal_(self.position, std=0.02)
        self.time_mlp = nn.Sequential(
            nn.Linear(time_embedding_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                hidden_size,
                num_attention_heads,
                dim_feedforward=2 * hidden_size,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden_size)
        self.readout = nn.Linear(num_tokens * hidden_size, dim)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        """`sample` `(..., dim)`, `timestep` of shape `sample.shape[:-1]` -> velocity `(..., dim)`."""
        batch_shape = sample.shape[:-1]
        flat = sample.reshape(-1, self.dim)
        embedding = get_timestep_embedding(
            timestep.reshape(-1).to(torch.float32),
            self.time_embedding_dim,
            flip_sin_to_cos=True,
            downscale_freq_shift=0,
        ).to(flat.dtype)
        tokens = self.embed(flat).reshape(-1, self.num_tokens, self.hidden_size)
        tokens = tokens + self.position.to(flat.dtype) + self.time_mlp(embedding).unsqueeze(1)
        for layer in self.layers:
            tokens = layer(tokens)
        out = self.readout(self.norm(tokens).reshape(len(flat), -1))
        return out.reshape(*batch_shape, self.dim)


@public
class ManifoldFlowTransformerModel(ModelMixin, ConfigMixin):
    r"""The two-head velocity model of flow matching on a linear `latent_dim`-dim subspace of `R^ambient_dim`.

    `v(x, sigma) = B g(B^T x, sigma) + c(sigma) (I - B B^T) x`: a transformer tangent head `g` on the `d` subspace
    coordinates and the analytic orthogonal head (see the module docstring and docs/manifold_flow.md). `B` is the
    `subspace` buffer `(ambient_dim, latent_dim)`, orthonormal: set it with [`fit_subspace`] (uncentred PCA of the
    training points, so the subspace passes through 0) or [`set_subspace`], or learn it (`learn_subspace=True`:
    then `subspace` is a parameter and `B` its QR orthonormalisation). Output in diffusers' flow-matching convention
    (velocity `noise - x` at `x_sigma = (1 - sigma) x + sigma noise`, timestep `sigma * num_train_timesteps`), so it
    samples with `FlowMatchEulerDiscreteScheduler` through [`ManifoldFlowPipeline`].

    Args:
        ambient_dim (`int`, defaults to 16): `D`, the data's dimension.
        latent_dim (`int`, defaults to 2): `d < D`, the subspace's dimension (the tangent head's input size).
        num_tokens (`int`, defaults to 4): tokens of the tangent head's transformer.
        hidden_size (`int`, defaults to 32): its token width.
        num_layers (`int`, defaults to 2): its layers.
        num_attention_heads (`int`, defaults to 2): its attention heads.
        time_embedding_dim (`int`, defaults to 32): its sinusoidal timestep embedding size.
        learn_subspace (`bool`, defaults to `False`): make `subspace` a trained parameter.
        orthogonal_noise_std (`float`, defaults to 0.0): `tau`, the data's std off the subspace per coordinate (0:
            data on the subspace); [`fit_subspace`] can estimate it.
        orthogonal_sigma_min (`float`, defaults to 1e-4): the floor of `sigma` in the orthogonal head.
        num_train_timesteps (`int`, defaults to 1000): the timestep of noise level `sigma` is
            `sigma * num_train_timesteps` (the scheduler's `num_train_timesteps`).
    """

    @register_to_config
    def __init__(
        self,
        ambient_dim: int = 16,
        latent_dim: int = 2,
        num_tokens: int = 4,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_attention_heads: int = 2,
        time_embedding_dim: int = 32,
        learn_subspace: bool = False,
        orthogonal_noise_std: float = 0.0,
        orthogonal_sigma_min: float = 1e-4,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        check_positive_int("ambient_dim", ambient_dim, minimum=2)
        check_positive_int("latent_dim", latent_dim)
        if latent_dim >= ambient_dim:
            raise ValueError(
                f"`latent_dim` must be smaller than `ambient_dim`: the subspace of dimension {latent_dim} must lie in "
                f"R^{ambient_dim} with a nonzero orthogonal complement, got latent_dim={latent_dim} >= "
                f"ambient_dim={ambient_dim}."
            )
        check_positive_int("num_train_timesteps", num_train_timesteps)
        if not isinstance(learn_subspace, bool):
            raise TypeError(f"`learn_subspace` must be a bool, got {learn_subspace!r}.")
        self._check_noise_std(orthogonal_noise_std)
        if not is_number(orthogonal_sigma_min) or not 0 < orthogonal_sigma_min < 1:
            raise ValueError(f"`orthogonal_sigma_min` must lie in (0, 1), got {orthogonal_sigma_min!r}.")
        self.tangent_head = VectorFlowTransformer(
            latent_dim, num_tokens, hidden_size, num_layers, num_attention_heads, time_embedding_dim
        )
        initial = torch.eye(ambient_dim, latent_dim)  # the first d coordinate axes until a subspace is fitted
        if learn_subspace:
            self.subspace = nn.Parameter(initial)
        else:
            self.register_buffer("subspace", initial)

    @staticmethod
    def _check_noise_std(value) -> None:
        if not is_number(value) or value < 0 or value == float("inf"):
            raise ValueError(f"`orthogonal_noise_std` must be a finite number >= 0, got {value!r}.")

    # the subspace ----------------------------------------------------------------------------------------------------

    @property
    def ambient_dim(self) -> int:
        return self.config.ambient_dim

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    @property
    def basis(self) -> torch.Tensor:
        """The orthonormal `B` `(ambient_dim, latent_dim)`: the `subspace` buffer, or the QR orthonormalisation of the
        learned `subspace` parameter (columns signed so that `R`'s diagonal is positive; differentiable)."""
        if not self.config.learn_subspace:
            return self.subspace
        q, r = torch.linalg.qr(self.subspace)
        signs = torch.sign(torch.diagonal(r))
        return q * torch.where(signs == 0, torch.ones_like(signs), signs)

    def _check_data(self, name: str, x) -> None:
        check_sample_dim(name, x, self.config.ambient_dim)

    @torch.no_grad()
    def set_subspace(self, basis: torch.Tensor) -> None:
        """Set `B` to `basis`, an orthonormal `(ambient_dim, latent_dim)` matrix (`B^T B = I` within 1e-4)."""
        shape = (self.config.ambient_dim, self.config.latent_dim)
        if not isinstance(basis, torch.Tensor) or tuple(basis.shape) != shape:
            got = tuple(basis.shape) if isinstance(basis, torch.Tensor) else type(basis).__name__
            raise ValueError(f"`subspace` must be a tensor of shape (ambient_dim, latent_dim) = {shape}, got {got}.")
        basis = basis.detach().to(torch.float64)
        if not torch.isfinite(basis).all():
            raise ValueError("`subspace` holds non-finite values.")
        gram = basis.T @ basis
        error = float((gram - torch.eye(shape[1], dtype=torch.float64)).abs().max())
        if error > ORTHONORMAL_ATOL:
            raise ValueError(
                f"`subspace` must have orthonormal columns (B^T B = I), but B^T B differs from I by up to {error:.3g}; "
                "orthonormalise it first (torch.linalg.qr)."
            )
        self.subspace.copy_(basis.to(self.subspace))

    @torch.no_grad()
    def fit_subspace(
        self, x: torch.Tensor, latent_dim: int | None = None, estimate_noise: bool = False
    ) -> SubspaceFit:
        """Fit `B` by uncentred PCA of the points `x` ([`uncentred_pca`]): the top `latent_dim` right singular vectors
        of the data matrix (no mean is subtracted, so the subspace passes through 0 as the decomposition assumes).

        Args:
            x (`torch.Tensor` of shape `(n, ambient_dim)`): training points.
            latent_dim (`int`, *optional*): must equal the model's `latent_dim` (the tangent head's input size).
            estimate_noise (`bool`, defaults to `False`): also set `orthogonal_noise_std` to the residual's RMS per
                orthogonal coordinate (`SubspaceFit.residual_std`).
        """
        self._check_data("x", x)
        if x.ndim != 2:
            raise ValueError(f"`x` must be a (num_points, {self.config.ambient_dim}) matrix, got {tuple(x.shape)}.")
        d = self.config.latent_dim if latent_dim is None else latent_dim
        check_positive_int("latent_dim", d)
        if d >= self.config.ambient_dim:
            raise ValueError(f"`latent_dim` must be smaller than ambient_dim={self.config.ambient_dim}, got {d}.")
        if d != self.config.latent_dim:
            raise ValueError(
                f"`latent_dim` {d} differs from the model's latent_dim {self.config.latent_dim} (the tangent head's "
                f"input size); build a model with latent_dim={d}."
            )
        basis, fit = uncentred_pca(x, d)
        self.set_subspace(basis)
        if estimate_noise:
            self.register_to_config(orthogonal_noise_std=fit.residual_std)
        return fit

    def set_orthogonal_noise_std(self, value: float) -> None:
        """Set `orthogonal_noise_std` (`tau`) in the config."""
        self._check_noise_std(value)
        self.register_to_config(orthogonal_noise_std=float(value))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The subspace coordinates `B^T x` `(..., latent_dim)` of points `(..., ambient_dim)`."""
        self._check_data("x", x)
        return x @ self.basis.to(x.dtype)

    def embed(self, z: torch.Tensor) -> torch.Tensor:
        """The points `B z` `(..., ambient_dim)` of subspace coordinates `(..., latent_dim)`."""
        check_sample_dim("z", z, self.config.latent_dim)
        return z @ self.basis.to(z.dtype).T

    # the two heads ---------------------------------------------------------------------------------------------------

    def orthogonal_coefficient(self, sigma: torch.Tensor) -> torch.Tensor:
        """`c(sigma)` of the orthogonal head, at `max(sigma, orthogonal_sigma_min)`: `1 / sigma` for `tau = 0`, else
        `(sigma - (1 - sigma) tau^2) / ((1 - sigma)^2 tau^2 + sigma^2)`."""
        sigma = sigma.clamp(min=self.config.orthogonal_sigma_min)
        tau2 = float(self.config.orthogonal_noise_std) ** 2
        if tau2 == 0:
            return 1.0 / sigma
        return (sigma - (1 - sigma) * tau2) / ((1 - sigma).square() * tau2 + sigma.square())

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor | float, return_dict: bool = True
    ) -> ManifoldFlowTransformerOutput | tuple:
        """The velocity `B g(B^T x, sigma) + c(sigma) (I - B B^T) x` at noisy points `sample`.

        Args:
            sample (`torch.Tensor` of shape `(..., ambient_dim)`): `x_sigma`.
            timestep (`torch.Tensor` or `float`): `sigma * num_train_timesteps`; a scalar, one per leading row, or
                one per sample (`sample.shape[:-1]`).
            return_dict (`bool`, defaults to `True`): return a [`ManifoldFlowTransformerOutput`] or a tuple.
        """
        self._check_data("sample", sample)
        timestep = broadcast_timestep(timestep, sample)
        basis = self.basis.to(sample.dtype)
        coordinates = sample @ basis
        orthogonal = sample - coordinates @ basis.T
        tangent = self.tangent_head(coordinates, timestep) @ basis.T
        sigma = (timestep.to(sample.dtype) / self.config.num_train_timesteps).unsqueeze(-1)
        velocity = tangent + self.orthogonal_coefficient(sigma) * orthogonal
        return ManifoldFlowTransformerOutput(sample=velocity) if return_dict else (velocity,)
