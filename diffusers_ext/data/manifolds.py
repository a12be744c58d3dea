"""Point clouds on low-dimensional manifolds embedded in R^D: the test beds of flow matching on manifolds.

Each manifold is a 2-dimensional one drawn in a small space `R^k` and embedded in `R^D` by a random orthonormal map
`B` (`D x k`, `B^T B = I`), so the data lie in the `k`-dim linear subspace `span(B)` through the origin:

- `"ring_mixture"`: a Gaussian mixture in `R^2` (`k = 2`) of `num_components` equal-weight isotropic components
  (std `component_std`) whose means are evenly spaced on a circle of radius `radius`; its flow-matching velocity
  has a closed form (`evaluation.manifold_flow.GaussianMixtureVelocityModel`);
- `"swiss_roll"`: the swiss roll surface in `R^3` (`k = 3`), `(t cos t, h, t sin t) / 5` with `t ~ U(1.5 pi, 4.5 pi)`
  and `h ~ U(-5, 5)`: a curved 2-dim manifold spanning all of `R^3`;
- `"sphere_patch"`: the cap of polar angle at most `max_polar_angle` of the unit sphere in `R^3` (`k = 3`), drawn
  uniformly by area, centred on the third axis (so it does not pass through the origin).

Optional off-manifold noise adds `noise_std * N(0, I_D)` to every point. [`load_point_cloud`] reads a user's `.npy`.
Everything is deterministic given a `torch.Generator` or a seed, and computed in float64.
"""

import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from ..utils import check_positive_int, is_number


MANIFOLDS = ("ring_mixture", "swiss_roll", "sphere_patch")
# the dimension k of the linear span each manifold is drawn in (its intrinsic dimension is 2)
SPAN_DIMS = {"ring_mixture": 2, "swiss_roll": 3, "sphere_patch": 3}


def _generator(seed_or_generator) -> torch.Generator:
    if isinstance(seed_or_generator, torch.Generator):
        return seed_or_generator
    check_positive_int("seed", seed_or_generator, minimum=0)
    return torch.Generator().manual_seed(seed_or_generator)


def random_orthonormal_map(span_dim: int, ambient_dim: int, seed_or_generator=0) -> torch.Tensor:
    """A random `(ambient_dim, span_dim)` matrix with orthonormal columns (QR of a Gaussian matrix, the signs of
    `R`'s diagonal made positive: Haar-distributed), float64."""
    check_positive_int("span_dim", span_dim)
    check_positive_int("ambient_dim", ambient_dim)
    if span_dim > ambient_dim:
        raise ValueError(f"`span_dim` ({span_dim}) must be at most `ambient_dim` ({ambient_dim}).")
    gaussian = torch.randn(ambient_dim, span_dim, generator=_generator(seed_or_generator), dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(torch.diagonal(r))


@dataclass
class RingGaussianMixture:
    """An equal-weight Gaussian mixture in `R^2` with means on a circle.

    Args:
        num_components (`int`, defaults to 8): components, the first at angle 0.
        radius (`float`, defaults to 2.0): radius of the circle of means.
        component_std (`float`, defaults to 0.25): std of each isotropic component.
    """

    num_components: int = 8
    radius: float = 2.0
    component_std: float = 0.25

    def __post_init__(self):
        check_positive_int("num_components", self.num_components)
        for name in ("radius", "component_std"):
            value = getattr(self, name)
            if not is_number(value) or not value > 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")

    @property
    def weights(self) -> torch.Tensor:
        return torch.full((self.num_components,), 1.0 / self.num_components, dtype=torch.float64)

    @property
    def means(self) -> torch.Tensor:
        """`(num_components, 2)`."""
        angles = 2 * math.pi * torch.arange(self.num_components, dtype=torch.float64) / self.num_components
        return self.radius * torch.stack([angles.cos(), angles.sin()], -1)

    @property
    def covariances(self) -> torch.Tensor:
        """`(num_components, 2, 2)`."""
        return self.component_std**2 * torch.eye(2, dtype=torch.float64).expand(self.num_components, 2, 2).clone()

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        components = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        noise = torch.randn(n, 2, generator=generator, dtype=torch.float64)
        return self.means[components] + self.component_std * noise


def _swiss_roll(n: int, generator: torch.Generator) -> torch.Tensor:
    t = 1.5 * math.pi * (1 + 2 * torch.rand(n, generator=generator, dtype=torch.float64))
    h = 10 * torch.rand(n, generator=generator, dtype=torch.float64) - 5
    return torch.stack([t * t.cos(), h, t * t.sin()], -1) / 5


def _sphere_patch(n: int, generator: torch.Generator, max_polar_angle: float) -> torch.Tensor:
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    cos_theta = 1 - u * (1 - math.cos(max_polar_angle))  # uniform by area on the cap
    sin_theta = (1 - cos_theta.square()).clamp(min=0).sqrt()
    phi = 2 * math.pi * torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.stack([sin_theta * phi.cos(), sin_theta * phi.sin(), cos_theta], -1)


@dataclass
class EmbeddedManifold:
    """A 2-dim manifold drawn in `R^span_dim` and embedded in `R^ambient_dim` by the orthonormal `basis`.

    Attributes:
        name (`str`): one of `MANIFOLDS`.
        basis (`torch.Tensor` of shape `(ambient_dim, span_dim)`): the orthonormal embedding `B` (float64).
        noise_std (`float`): std of the isotropic off-manifold noise added to every point (0: none).
        mixture ([`RingGaussianMixture`], *optional*): the ring mixture's law (`"ring_mixture"` only).
        max_polar_angle (`float`): the sphere patch's half-angle (radians).
    """

    name: str
    basis: torch.Tensor
    noise_std: float = 0.0
    mixture: RingGaussianMixture | None = None
    max_polar_angle: float = field(default=math.pi / 3)

    @property
    def ambient_dim(self) -> int:
        return self.basis.shape[0]

    @property
    def span_dim(self) -> int:
        """`k`, the dimension of the linear subspace the data lie in (without noise)."""
        return self.basis.shape[1]

    @property
    def intrinsic_dim(self) -> int:
        return 2

    def sample_coordinates(self, n: int, generator) -> torch.Tensor:
        """`n` points `(n, span_dim)` of the manifold in its own space `R^span_dim`, before embedding and noise."""
        check_positive_int("n", n)
        generator = _generator(generator)
        if self.name == "ring_mixture":
            return self.mixture.sample(n, generator)
        if self.name == "swiss_roll":
            return _swiss_roll(n, generator)
        return _sphere_patch(n, generator, self.max_polar_angle)

    def sample(self, n: int, generator) -> torch.Tensor:
        """`n` points `(n, ambient_dim)`: `B z` plus `noise_std * N(0, I_D)` (float64)."""
        generator = _generator(generator)
        points = self.sample_coordinates(n, generator) @ self.basis.T
        if self.noise_std > 0:
            points = points + self.noise_std * torch.randn(points.shape, generator=generator, dtype=torch.float64)
        return points


def make_manifold(
    name: str,
    ambient_dim: int,
    noise_std: float = 0.0,
    seed: int = 0,
    num_components: int = 8,
    radius: float = 2.0,
    component_std: float = 0.25,
    max_polar_angle: float = math.pi / 3,
) -> EmbeddedManifold:
    """The manifold `name` embedded in `R^ambient_dim` by the random orthonormal map of `seed`.

    Args:
        name (`str`): `"ring_mixture"`, `"swiss_roll"` or `"sphere_patch"`.
        ambient_dim (`int`): `D`, at least the manifold's span dimension (2 or 3).
        noise_std (`float`, defaults to 0.0): std of the isotropic off-manifold noise.
        seed (`int`, defaults to 0): seed of the embedding `B`.
        num_components, radius, component_std: the ring mixture's law ([`RingGaussianMixture`]).
        max_polar_angle (`float`, defaults to pi / 3): the sphere patch's half-angle, in (0, pi].
    """
    if name not in MANIFOLDS:
        raise ValueError(f"`name` must be one of {MANIFOLDS}, got {name!r}.")
    check_positive_int("ambient_dim", ambient_dim)
    if ambient_dim < SPAN_DIMS[name]:
        raise ValueError(f"`ambient_dim` must be at least {SPAN_DIMS[name]} for {name!r}, got {ambient_dim}.")
    if not is_number(noise_std) or noise_std < 0:
        raise ValueError(f"`noise_std` must be a number >= 0, got {noise_std!r}.")
    if not is_number(max_polar_angle) or not 0 < max_polar_angle <= math.pi:
        raise ValueError(f"`max_polar_angle` must lie in (0, pi], got {max_polar_angle!r}.")
    basis = random_orthonormal_map(SPAN_DIMS[name], ambient_dim, seed)
    mixture = RingGaussianMixture(num_components, radius, component_std) if name == "ring_mixture" else None
    return EmbeddedManifold(name, basis, float(noise_std), mixture, float(max_polar_angle))


def load_point_cloud(path: str) -> torch.Tensor:
    """A user's point cloud: a `.npy` file holding a finite float `(num_points, dim)` array, as float64.

    Raises a `ValueError` naming the file for anything else (another format, a pickled object, a wrong shape or
    dtype, NaN or inf), before any training.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"the point cloud {path!r} is not a file.")
    if not os.fspath(path).endswith(".npy"):
        raise ValueError(f"the point cloud {path!r} must be a .npy file (numpy.save of a (num_points, dim) array).")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"the point cloud {path!r} is not a plain numpy array: {error}") from error
    if array.ndim != 2 or array.shape[0] < 2 or array.shape[1] < 2:
        raise ValueError(f"the point cloud {path!r} must be a (num_points >= 2, dim >= 2) array, got {array.shape}.")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"the point cloud {path!r} must hold numbers, got dtype {array.dtype}.")
    points = torch.from_numpy(array.astype(np.float64))
    if not torch.isfinite(points).all():
        raise ValueError(f"the point cloud {path!r} holds NaN or inf values.")
    return points
