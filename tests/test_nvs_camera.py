import math

import pytest
import torch

from diffusers_ext.geometry.camera import (
    check_rigid,
    forward_trajectory,
    interpolate_trajectory,
    invert_rigid,
    look_at,
    orbit_trajectory,
    pixel_rays,
    plucker_raymap,
    relative_to,
    spiral_trajectory,
)


def _intrinsics(v, f=20.0, size=16):
    return torch.tensor([[f, 0.0, size / 2], [0.0, f, size / 2], [0.0, 0.0, 1.0]], dtype=torch.float64).expand(v, 3, 3)


def _random_rigid(seed):
    generator = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    pose = torch.eye(4, dtype=torch.float64)
    pose[:3, :3], pose[:3, 3] = q, torch.randn(3, generator=generator, dtype=torch.float64) * 3
    return pose


def test_rays_are_unit_and_moments_orthogonal():
    poses = orbit_trajectory(5, 3.0, dtype=torch.float64)
    raymap = plucker_raymap(_intrinsics(5), poses, 16, 16)
    assert raymap.shape == (5, 6, 16, 16)
    directions, moments = raymap[:, :3], raymap[:, 3:]
    torch.testing.assert_close(directions.norm(dim=1), torch.ones(5, 16, 16, dtype=torch.float64))
    assert (directions * moments).sum(dim=1).abs().max() < 1e-12


def test_centre_pixel_ray_is_the_optical_axis():
    pose = _random_rigid(0)[None]
    origins, directions = pixel_rays(_intrinsics(1, size=16), pose, 16, 16)
    # pixel (8, 8) has its centre at (8.5, 8.5), half a pixel off the principal point (8, 8)
    expected = pose[0, :3, :3] @ torch.tensor([0.5 / 20, 0.5 / 20, 1.0], dtype=torch.float64)
    torch.testing.assert_close(directions[0, 8, 8], expected / expected.norm())
    torch.testing.assert_close(origins[0, 3, 5], pose[0, :3, 3])


def test_relative_raymap_is_invariant_to_a_global_rigid_motion():
    poses = orbit_trajectory(4, 2.5, elevation_deg=30, dtype=torch.float64)
    motion = _random_rigid(1)
    moved = motion @ poses
    a = plucker_raymap(_intrinsics(4), poses, 8, 8, reference_c2w=poses[0])
    b = plucker_raymap(_intrinsics(4), moved, 8, 8, reference_c2w=moved[0])
    torch.testing.assert_close(a, b)
    # ... and without making it relative it does change
    assert not torch.allclose(plucker_raymap(_intrinsics(4), poses, 8, 8), plucker_raymap(_intrinsics(4), moved, 8, 8))


def test_normalized_scale_makes_the_raymap_scale_invariant():
    poses = orbit_trajectory(3, 2.0, dtype=torch.float64)
    scaled = poses.clone()
    scaled[:, :3, 3] *= 7.0
    a = plucker_raymap(_intrinsics(3), poses, 8, 8, reference_c2w=poses[0], normalize_scale=True)
    b = plucker_raymap(_intrinsics(3), scaled, 8, 8, reference_c2w=scaled[0], normalize_scale=True)
    torch.testing.assert_close(a, b)


def test_look_at_and_orbit_face_the_target():
    poses = orbit_trajectory(6, 4.0, elevation_deg=25, center=(1.0, 0.0, 2.0), dtype=torch.float64)
    check_rigid(poses)
    centre = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    for pose in poses:
        to_centre = centre - pose[:3, 3]
        assert to_centre.norm().item() == pytest.approx(4.0)
        torch.testing.assert_close(pose[:3, 2], to_centre / to_centre.norm())
        assert pose[1, 3] < 0  # positive elevation puts the camera above (world y points down)
    single = look_at(torch.tensor([0.0, 0.0, -3.0]), torch.zeros(3))
    torch.testing.assert_close(
        single, torch.eye(4).index_put((torch.tensor([2]), torch.tensor([3])), torch.tensor([-3.0]))
    )


def test_trajectories():
    start = _random_rigid(2)
    forward = forward_trajectory(start, 2.0, 5)
    torch.testing.assert_close(forward[-1, :3, 3] - start[:3, 3], 2.0 * start[:3, 2])
    assert torch.equal(forward[:, :3, :3], start[:3, :3].expand(5, 3, 3))

    end = _random_rigid(3)
    path = interpolate_trajectory(start, end, 7)
    check_rigid(path)
    torch.testing.assert_close(path[0], start)
    torch.testing.assert_close(path[-1], end)
    # geodesic: equal rotation angles between consecutive poses
    angles = []
    for a, b in zip(path[:-1], path[1:]):
        relative = a[:3, :3].T @ b[:3, :3]
        angles.append(math.acos(max(-1.0, min(1.0, (float(relative.trace()) - 1) / 2))))
    assert max(angles) - min(angles) < 1e-6

    spiral = spiral_trajectory(start, 9, radius=0.5, depth=1.0, focus_distance=4.0)
    check_rigid(spiral)
    focus = start[:3, 3] + 4.0 * start[:3, 2]
    for pose in spiral:
        to_focus = focus - pose[:3, 3]
        torch.testing.assert_close(pose[:3, 2], to_focus / to_focus.norm())


def test_invert_rigid_and_relative_to():
    pose = _random_rigid(4)
    torch.testing.assert_close(invert_rigid(pose) @ pose, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(relative_to(pose[None], pose)[0], torch.eye(4, dtype=torch.float64))


@pytest.mark.parametrize(
    "matrix, message",
    [
        (torch.eye(3), r"expected \(\.\.\., 4, 4\)"),
        (torch.diag(torch.tensor([2.0, 1.0, 1.0, 1.0])), "not rigid"),
        (torch.diag(torch.tensor([-1.0, 1.0, 1.0, 1.0])), "reflection"),
        (torch.eye(4).index_put((torch.tensor([3]), torch.tensor([0])), torch.tensor([1.0])), "last row"),
    ],
)
def test_non_rigid_cameras_are_rejected(matrix, message):
    with pytest.raises(ValueError, match=message):
        check_rigid(matrix)


def test_bad_intrinsics_and_mismatched_counts():
    with pytest.raises(ValueError, match="focal"):
        pixel_rays(
            torch.zeros(1, 3, 3).index_put(
                (torch.tensor([0]), torch.tensor([2]), torch.tensor([2])), torch.tensor([1.0])
            ),
            torch.eye(4)[None],
            4,
            4,
        )
    with pytest.raises(ValueError, match="different numbers of cameras"):
        pixel_rays(_intrinsics(2).float(), torch.eye(4).expand(3, 4, 4), 4, 4)
