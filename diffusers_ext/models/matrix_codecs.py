"""Invertible maps between valid matrices and Euclidean vectors, with a per-feature standardiser: the role a VAE
plays for images, for flow matching over connectivity matrices (as DiffeoCFM does: a diffeomorphism of the matrix
manifold onto R^k, flow matching in R^k, every decoded sample valid by construction).

- [`CorrelationMatrixCodec`]: correlation matrices (symmetric positive definite, unit diagonal) of size `n` <->
  R^{n(n-1)/2}, through the Cholesky factor. `C = L L^T` with `L` lower triangular and rows of unit norm; row `i`'s
  entries are written as canonical partial correlations `z_ij = L_ij / sqrt(1 - sum_{k<j} L_ik^2)` in (-1, 1), and
  the vector holds `atanh(z_ij)` for `j < i` (row by row). Every vector decodes to a valid correlation matrix and
  every correlation matrix encodes to one vector (the parametrisation of the LKJ prior).
- [`SPDMatrixCodec`]: symmetric positive definite matrices <-> R^{n(n+1)/2}, by the log-Euclidean map (the upper
  triangle of `logm(S)`, off-diagonal entries times `sqrt(2)`, so the Euclidean norm of the vector is the Frobenius
  norm of `logm(S)`) or the log-Cholesky map (the strictly lower triangle of the Cholesky factor and the log of its
  diagonal).

Both keep a per-feature standardiser (`mean`, `std` buffers, fitted on training matrices by `fit`), applied after
the map in `encode` and undone before the inverse in `decode`. Maps run in float64 whatever the input dtype; the
round trip is exact to float64 rounding (1e-12 on well-conditioned matrices).
"""

import abc
import math

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from ..utils import check_positive_int, public


SPD_MAPS = ("log_euclidean", "log_cholesky")
# Canonical partial correlations are clamped this far inside (-1, 1) before atanh, so a decoded vector's matrix and
# a nearly singular input stay finite; a valid input is never that close in practice (|z| = 1 - 1e-12 is a matrix
# whose Cholesky diagonal is about 1e-6).
_Z_LIMIT = 1.0 - 1e-12


def _check_matrices(name: str, matrices, size: int, symmetric_atol: float) -> torch.Tensor:
    """`matrices` as a float64 `(batch, n, n)` tensor (a single `(n, n)` gains a batch axis), symmetric to
    `symmetric_atol`; a `ValueError` naming the argument and what was expected otherwise."""
    if not isinstance(matrices, torch.Tensor):
        try:
            matrices = torch.as_tensor(matrices)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"`{name}` must be a tensor or array of shape (batch, {size}, {size}).") from None
    if matrices.ndim == 2:
        matrices = matrices[None]
    if matrices.ndim != 3 or tuple(matrices.shape[1:]) != (size, size):
        raise ValueError(f"`{name}` must have shape (batch, {size}, {size}), got {tuple(matrices.shape)}.")
    if not matrices.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor, got {matrices.dtype}.")
    matrices = matrices.detach().to(torch.float64)
    finite = torch.isfinite(matrices).flatten(1).all(1)
    if not finite.all():
        index = int((~finite).nonzero()[0])
        raise ValueError(f"`{name}[{index}]` holds NaN or inf; expected finite matrices.")
    asymmetry = (matrices - matrices.transpose(1, 2)).abs().flatten(1).amax(1)
    if (asymmetry > symmetric_atol).any():
        index = int((asymmetry > symmetric_atol).nonzero()[0])
        raise ValueError(
            f"`{name}[{index}]` is not symmetric: max |A - A^T| = {float(asymmetry[index]):.3g} > {symmetric_atol:g}."
        )
    return (matrices + matrices.transpose(1, 2)) / 2


def _cholesky(name: str, matrices: torch.Tensor) -> torch.Tensor:
    factor, info = torch.linalg.cholesky_ex(matrices)
    if (info != 0).any():
        index = int((info != 0).nonzero()[0])
        smallest = float(torch.linalg.eigvalsh(matrices[index]).min())
        raise ValueError(
            f"`{name}[{index}]` is not positive definite (smallest eigenvalue {smallest:.3g}); expected positive "
            "definite matrices."
        )
    return factor


class _StandardizedMatrixCodec(ModelMixin, ConfigMixin, metaclass=abc.ABCMeta):
    """The per-feature standardiser both codecs share: `encode = (map(M) - mean) / std`, `decode` its inverse."""

    def _init_standardizer(self, num_features: int) -> None:
        self.register_buffer("mean", torch.zeros(num_features, dtype=torch.float64))
        self.register_buffer("std", torch.ones(num_features, dtype=torch.float64))

    @property
    def num_features(self) -> int:
        """`k`, the length of an encoded vector."""
        return int(self.mean.numel())

    @abc.abstractmethod
    def to_vectors(self, matrices) -> torch.Tensor:
        """`(batch, n, n)` valid matrices -> `(batch, k)` float64 vectors: the map, without the standardiser."""

    @abc.abstractmethod
    def from_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        """`(batch, k)` float64 vectors -> `(batch, n, n)` valid matrices: the map's inverse."""

    def fit(self, matrices, min_std: float = 1e-6) -> "_StandardizedMatrixCodec":
        """Set the standardiser to the per-feature mean and standard deviation of `matrices` mapped to vectors (a
        floor of `min_std` on the deviation, for features constant in the training set). Returns `self`."""
        vectors = self.to_vectors(matrices)
        if len(vectors) < 2:
            raise ValueError(f"`matrices` must hold at least 2 matrices to fit the standardiser, got {len(vectors)}.")
        self.mean.copy_(vectors.mean(0))
        self.std.copy_(vectors.std(0).clamp_min(min_std))
        return self

    def encode(self, matrices) -> torch.Tensor:
        """`(batch, n, n)` valid matrices -> `(batch, k)` standardised vectors (float64)."""
        return (self.to_vectors(matrices) - self.mean) / self.std

    def decode(self, vectors: torch.Tensor) -> torch.Tensor:
        """`(batch, k)` vectors (any floating dtype) -> `(batch, n, n)` valid matrices (float64)."""
        if not isinstance(vectors, torch.Tensor) or vectors.ndim != 2 or vectors.shape[1] != self.num_features:
            got = tuple(vectors.shape) if isinstance(vectors, torch.Tensor) else type(vectors).__name__
            raise ValueError(f"`vectors` must be a tensor of shape (batch, {self.num_features}), got {got}.")
        vectors = vectors.to(device=self.mean.device, dtype=torch.float64)
        return self.from_vectors(vectors * self.std + self.mean)


@public
class CorrelationMatrixCodec(_StandardizedMatrixCodec):
    r"""
    Correlation matrices of size `num_regions` <-> vectors of `num_regions (num_regions - 1) / 2` numbers, through
    the Cholesky factor's canonical partial correlations and `atanh` (module docstring), then the standardiser.

    Parameters:
        num_regions (`int`): the matrix size `n`.
        symmetric_atol (`float`, defaults to 1e-6): largest `|C - C^T|` accepted (the input is then symmetrised).
        diagonal_atol (`float`, defaults to 1e-6): largest `|C_ii - 1|` accepted.
    """

    @register_to_config
    def __init__(self, num_regions: int, symmetric_atol: float = 1e-6, diagonal_atol: float = 1e-6):
        super().__init__()
        check_positive_int("num_regions", num_regions)
        if num_regions < 2:
            raise ValueError(f"`num_regions` must be at least 2, got {num_regions}.")
        rows, cols = torch.tril_indices(num_regions, num_regions, offset=-1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self._init_standardizer(len(rows))

    def check_matrices(self, matrices, name: str = "matrices") -> torch.Tensor:
        """`matrices` as float64 `(batch, n, n)` after checking they are correlation matrices (symmetric, unit
        diagonal, positive definite); a `ValueError` naming the first bad one otherwise."""
        n = self.config.num_regions
        matrices = _check_matrices(name, matrices, n, self.config.symmetric_atol)
        off = (torch.diagonal(matrices, dim1=1, dim2=2) - 1).abs().amax(1)
        if (off > self.config.diagonal_atol).any():
            index = int((off > self.config.diagonal_atol).nonzero()[0])
            raise ValueError(
                f"`{name}[{index}]` does not have a unit diagonal: max |C_ii - 1| = {float(off[index]):.3g} > "
                f"{self.config.diagonal_atol:g}; expected correlation matrices."
            )
        _cholesky(name, matrices)
        return matrices

    def to_vectors(self, matrices) -> torch.Tensor:
        matrices = self.check_matrices(matrices)
        factor = _cholesky("matrices", matrices.to(self.mean.device))
        factor = factor / factor.norm(dim=2, keepdim=True)  # rows of unit norm (exactly so for a unit diagonal)
        # remaining squared norm before column j: 1 - sum_{k<j} L_ik^2 (exclusive cumulative sum along the row)
        remaining = (1 - (factor**2).cumsum(2) + factor**2).clamp_min(1e-300)
        z = factor / remaining.sqrt()
        z = z[:, self.rows, self.cols].clamp(-_Z_LIMIT, _Z_LIMIT)
        return torch.atanh(z)

    def from_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        n = self.config.num_regions
        z = torch.zeros(len(vectors), n, n, dtype=torch.float64, device=vectors.device)
        z[:, self.rows, self.cols] = torch.tanh(vectors).clamp(-_Z_LIMIT, _Z_LIMIT)
        # row i: L_ij = z_ij sqrt(1 - sum_{k<j} L_ik^2), L_ii = sqrt(1 - sum_{k<i} L_ik^2); column by column
        factor = torch.zeros_like(z)
        remaining = torch.ones(len(vectors), n, dtype=torch.float64, device=vectors.device)
        for j in range(n):
            factor[:, j + 1 :, j] = z[:, j + 1 :, j] * remaining[:, j + 1 :].sqrt()
            factor[:, j, j] = remaining[:, j].sqrt()
            remaining = remaining - factor[:, :, j] ** 2
        matrices = factor @ factor.transpose(1, 2)
        # exact unit diagonal and symmetry (the rows have unit norm up to rounding)
        scale = torch.diagonal(matrices, dim1=1, dim2=2).rsqrt()
        matrices = matrices * scale[:, :, None] * scale[:, None, :]
        return (matrices + matrices.transpose(1, 2)) / 2


@public
class SPDMatrixCodec(_StandardizedMatrixCodec):
    r"""
    Symmetric positive definite matrices of size `size` <-> vectors of `size (size + 1) / 2` numbers, by the
    log-Euclidean or the log-Cholesky map (module docstring), then the standardiser.

    Parameters:
        size (`int`): the matrix size `n`.
        map (`str`, defaults to `"log_euclidean"`): `"log_euclidean"` or `"log_cholesky"`.
        symmetric_atol (`float`, defaults to 1e-6): largest `|S - S^T|` accepted (the input is then symmetrised).
    """

    @register_to_config
    def __init__(self, size: int, map: str = "log_euclidean", symmetric_atol: float = 1e-6):
        super().__init__()
        check_positive_int("size", size)
        if map not in SPD_MAPS:
            raise ValueError(f"`map` must be one of {SPD_MAPS}, got {map!r}.")
        rows, cols = torch.triu_indices(size, size) if map == "log_euclidean" else torch.tril_indices(size, size)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        weights = torch.where(rows == cols, 1.0, math.sqrt(2.0)).to(torch.float64)
        self.register_buffer("weights", weights, persistent=False)
        self._init_standardizer(len(rows))

    def check_matrices(self, matrices, name: str = "matrices") -> torch.Tensor:
        """`matrices` as float64 `(batch, n, n)` after checking they are symmetric positive definite."""
        matrices = _check_matrices(name, matrices, self.config.size, self.config.symmetric_atol)
        _cholesky(name, matrices)
        return matrices

    def to_vectors(self, matrices) -> torch.Tensor:
        matrices = self.check_matrices(matrices).to(self.mean.device)
        if self.config.map == "log_euclidean":
            values, vectors = torch.linalg.eigh(matrices)
            log = vectors @ torch.diag_embed(values.log()) @ vectors.transpose(1, 2)
            return log[:, self.rows, self.cols] * self.weights
        factor = _cholesky("matrices", matrices)
        factor = (
            factor
            - torch.diag_embed(torch.diagonal(factor, dim1=1, dim2=2))
            + torch.diag_embed(torch.diagonal(factor, dim1=1, dim2=2).log())
        )
        return factor[:, self.rows, self.cols]

    def from_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        n = self.config.size
        out = torch.zeros(len(vectors), n, n, dtype=torch.float64, device=vectors.device)
        if self.config.map == "log_euclidean":
            out[:, self.rows, self.cols] = vectors / self.weights
            log = out + out.transpose(1, 2) - torch.diag_embed(torch.diagonal(out, dim1=1, dim2=2))
            values, basis = torch.linalg.eigh(log)
            matrices = basis @ torch.diag_embed(values.exp()) @ basis.transpose(1, 2)
        else:
            out[:, self.rows, self.cols] = vectors
            diagonal = torch.diagonal(out, dim1=1, dim2=2)
            factor = out - torch.diag_embed(diagonal) + torch.diag_embed(diagonal.exp())
            matrices = factor @ factor.transpose(1, 2)
        return (matrices + matrices.transpose(1, 2)) / 2
