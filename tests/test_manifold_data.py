"""The synthetic manifolds of `diffusers_ext.data.manifolds` and the user's `.npy` point clouds."""

import math

import numpy as np
import pytest
import torch

from diffusers_ext.data.manifolds import (
    MANIFOLDS,
    SPAN_DIMS,
    load_point_cloud,
    make_manifold,
    random_orthonormal_map,
)


def test_random_orthonormal_map_is_orthonormal_and_seeded():
    basis = random_orthonormal_map(3, 40, 7)
    assert basis.shape == (40, 3) and basis.dtype == torch.float64
    torch.testing.assert_close(basis.T @ basis, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(basis, random_orthonormal_map(3, 40, 7))
    assert not torch.allclose(basis, random_orthonormal_map(3, 40, 8))
    with pytest.raises(ValueError, match="span_dim"):
        random_orthonormal_map(5, 4)


@pytest.mark.parametrize("name", MANIFOLDS)
def test_each_manifold_lies_in_its_embedded_span(name):
    manifold = make_manifold(name, 12, seed=1)
    assert manifold.span_dim == SPAN_DIMS[name] and manifold.intrinsic_dim == 2 and manifold.ambient_dim == 12
    x = manifold.sample(500, 0)
    assert x.shape == (500, 12)
    residual = x - (x @ manifold.basis) @ manifold.basis.T
    assert residual.abs().max() < 1e-12
    torch.testing.assert_close(x, manifold.sample(500, 0))  # deterministic given the seed
    # the coordinates do not depend on D: the same draws embedded by another map
    other = make_manifold(name, 30, seed=2)
    torch.testing.assert_close(x @ manifold.basis, other.sample(500, 0) @ other.basis)


def test_the_manifolds_have_their_shapes():
    ring = make_manifold("ring_mixture", 4, seed=0)
    z = ring.sample_coordinates(4000, 0)
    radii = z.norm(dim=-1)
    assert abs(float(radii.mean()) - 2.0) < 0.05
    nearest = torch.cdist(z, ring.mixture.means).argmin(-1)
    assert torch.bincount(nearest, minlength=8).min() > 400  # all 8 components, about equally
    spread = (z - ring.mixture.means[nearest]).std()
    assert abs(float(spread) - 0.25) < 0.02
    sphere = make_manifold("sphere_patch", 5, seed=0, max_polar_angle=math.pi / 4).sample_coordinates(2000, 1)
    torch.testing.assert_close(sphere.norm(dim=-1), torch.ones(2000, dtype=torch.float64))
    assert float(sphere[:, 2].min()) >= math.cos(math.pi / 4) - 1e-12
    roll = make_manifold("swiss_roll", 3, seed=0).sample_coordinates(2000, 2)
    radius = roll[:, [0, 2]].norm(dim=-1) * 5
    assert 1.5 * math.pi - 1e-9 <= float(radius.min()) and float(radius.max()) <= 4.5 * math.pi + 1e-9
    assert float(roll[:, 1].abs().max()) <= 1.0


def test_off_manifold_noise_is_isotropic_with_the_given_std():
    manifold = make_manifold("ring_mixture", 50, noise_std=0.1, seed=0)
    x = manifold.sample(4000, 0)
    residual = x - (x @ manifold.basis) @ manifold.basis.T
    per_coordinate = residual.square().sum(-1).mean() / (50 - 2)
    assert abs(float(per_coordinate.sqrt()) - 0.1) < 0.003


def test_bad_manifold_arguments_are_refused():
    with pytest.raises(ValueError, match="name"):
        make_manifold("torus", 4)
    with pytest.raises(ValueError, match="ambient_dim"):
        make_manifold("swiss_roll", 2)
    with pytest.raises(ValueError, match="noise_std"):
        make_manifold("ring_mixture", 4, noise_std=-0.1)
    with pytest.raises(ValueError, match="component_std"):
        make_manifold("ring_mixture", 4, component_std=0.0)


def test_load_point_cloud(tmp_path):
    points = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
    np.save(tmp_path / "cloud.npy", points)
    loaded = load_point_cloud(str(tmp_path / "cloud.npy"))
    assert loaded.dtype == torch.float64 and loaded.shape == (20, 5)
    np.testing.assert_allclose(loaded.numpy(), points)
    bad = {
        "missing.npy": None,
        "vector.npy": np.zeros(5),
        "nan.npy": np.array([[0.0, np.nan], [1.0, 2.0]]),
        "objects.npy": np.array([[object(), 1], [2, 3]], dtype=object),
        "text.npy": np.array([["a", "b"], ["c", "d"]]),
    }
    for name, array in bad.items():
        if array is not None:
            np.save(tmp_path / name, array, allow_pickle=True)
        with pytest.raises(ValueError, match="point cloud"):
            load_point_cloud(str(tmp_path / name))
    np.savez(tmp_path / "cloud.npz", x=points)
    with pytest.raises(ValueError, match=r"\.npy"):
        load_point_cloud(str(tmp_path / "cloud.npz"))
