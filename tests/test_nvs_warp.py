import pytest
import torch

from diffusers_ext.geometry.camera import look_at
from diffusers_ext.pipelines.semantic_nvs.warp import forward_warp


SIZE = 32
K = torch.tensor([[30.0, 0.0, SIZE / 2], [0.0, 30.0, SIZE / 2], [0.0, 0.0, 1.0]], dtype=torch.float64)


def _plane_depth(c2w, normal, offset):
    """z-depth of the plane {p : normal . p = offset} (world frame) seen from camera c2w (4, 4)."""
    rows, cols = torch.meshgrid(
        torch.arange(SIZE, dtype=torch.float64) + 0.5, torch.arange(SIZE, dtype=torch.float64) + 0.5, indexing="ij"
    )
    rays_cam = torch.stack([cols, rows, torch.ones_like(cols)], -1) @ torch.linalg.inv(K).T  # z component 1
    rays_world = rays_cam @ c2w[:3, :3].T
    t = (offset - normal @ c2w[:3, 3]) / (rays_world @ normal)  # ray parameter = z-depth (rays have z = 1)
    return t


@pytest.mark.parametrize("mode", ["zbuffer", "softmax"])
def test_identity_camera_returns_the_input_exactly(mode):
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(2, 5, SIZE, SIZE, generator=generator)
    depth = torch.rand(2, 1, SIZE, SIZE, generator=generator) + 1.0
    eye = torch.eye(4).expand(2, 4, 4)
    k = K.float().expand(2, 3, 3)
    warped, valid, warped_depth = forward_warp(source, depth, k, eye, k, eye, mode=mode)
    assert torch.equal(warped, source)
    assert valid.all()
    torch.testing.assert_close(warped_depth, depth)


@pytest.mark.parametrize("mode", ["zbuffer", "softmax"])
def test_warped_depth_matches_the_target_depth_of_a_synthetic_plane(mode):
    normal, offset = torch.tensor([0.2, -0.1, 1.0], dtype=torch.float64), 6.0
    source_pose = torch.eye(4, dtype=torch.float64)
    target_pose = look_at(
        torch.tensor([0.6, -0.3, 0.4], dtype=torch.float64), torch.tensor([0.0, 0.0, 6.0], dtype=torch.float64)
    )
    source_depth = _plane_depth(source_pose, normal, offset)
    target_depth = _plane_depth(target_pose, normal, offset)
    _, valid, warped_depth = forward_warp(
        torch.zeros(1, 1, SIZE, SIZE, dtype=torch.float64),
        source_depth[None, None],
        K[None],
        source_pose[None],
        K[None],
        target_pose[None],
        mode=mode,
    )
    valid = valid[0, 0]
    assert valid.float().mean() > 0.6
    relative_error = ((warped_depth[0, 0] - target_depth).abs() / target_depth)[valid]
    assert relative_error.median() < 1e-3 and relative_error.max() < 0.02


def test_occlusion_resolves_toward_the_nearer_surface():
    # Moving the camera by tx shifts a pixel at depth z by tx * f / z: with tx * f = 8, depth 2 shifts 4 px and
    # depth 4 shifts 2 px, so source pixels 12 (near) and 10 (far) of a row land on the same target pixel 8.
    depth = torch.full((1, 1, SIZE, SIZE), 4.0, dtype=torch.float64)
    depth[0, 0, :, 12] = 2.0
    source = torch.arange(SIZE, dtype=torch.float64).expand(1, 1, SIZE, SIZE).clone()  # feature = source column
    target_pose = torch.eye(4, dtype=torch.float64)
    target_pose[0, 3] = 8.0 / 30.0
    warped, valid, warped_depth = forward_warp(
        source, depth, K[None], torch.eye(4, dtype=torch.float64)[None], K[None], target_pose[None], mode="zbuffer"
    )
    assert valid[0, 0, 5, 8]
    assert warped[0, 0, 5, 8] == 12.0 and warped_depth[0, 0, 5, 8] == 2.0
    # the far pixel's other landing spots are unaffected
    assert warped[0, 0, 5, 7] == 9.0
    # softmax splatting blends, but the near surface dominates
    soft, _, _ = forward_warp(
        source, depth, K[None], torch.eye(4, dtype=torch.float64)[None], K[None], target_pose[None], mode="softmax"
    )
    assert abs(float(soft[0, 0, 5, 8]) - 12.0) < 0.5


def test_feature_maps_at_another_resolution_and_holes():
    source = torch.ones(1, 3, SIZE, SIZE)
    depth = torch.full((1, 1, SIZE, SIZE), 3.0)
    target_pose = torch.eye(4)
    target_pose[0, 3] = 1.0  # a large sideways move uncovers a band with no source
    k = K.float()[None]
    warped, valid, _ = forward_warp(source, depth, k, torch.eye(4)[None], k, target_pose[None])
    assert not valid.all() and valid.any()
    assert (warped[valid.expand_as(warped)] == 1).all() and (warped[~valid.expand_as(warped)] == 0).all()
    k_small = K.float().clone()
    k_small[:2] /= 2
    small, valid_small, _ = forward_warp(
        source, depth, k, torch.eye(4)[None], k_small[None], torch.eye(4)[None], target_size=(SIZE // 2, SIZE // 2)
    )
    assert small.shape == (1, 3, SIZE // 2, SIZE // 2) and valid_small.all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"depth": torch.zeros(1, 1, 8, 8)}, "positive"),
        ({"depth": torch.ones(1, 1, 4, 8)}, "`depth` has shape"),
        ({"c2w_tgt": torch.eye(4)}, "`c2w_tgt` has shape"),
        ({"c2w_src": 2 * torch.eye(4)[None]}, "not rigid"),
        ({"mode": "nearest"}, "`mode`"),
        ({"source": torch.ones(8, 8)}, "`source`"),
    ],
)
def test_bad_input(overrides, message):
    k = torch.tensor([[8.0, 0, 4], [0, 8.0, 4], [0, 0, 1]])[None]
    args = {
        "source": torch.ones(1, 2, 8, 8),
        "depth": torch.ones(1, 1, 8, 8),
        "intrinsics_src": k,
        "c2w_src": torch.eye(4)[None],
        "intrinsics_tgt": k,
        "c2w_tgt": torch.eye(4)[None],
    }
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        forward_warp(**args)


@pytest.mark.parametrize("mode", ["zbuffer", "softmax"])
def test_float32_geometry_where_the_device_has_no_float64(mode, monkeypatch):
    import diffusers_ext.pipelines.semantic_nvs.warp as warp
    from diffusers_ext.utils import exact_dtype

    assert exact_dtype("mps") == torch.float32 and exact_dtype("cpu") == torch.float64
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(2, 5, SIZE, SIZE, generator=generator)
    depth = torch.rand(2, 1, SIZE, SIZE, generator=generator) + 1.0
    eye = torch.eye(4).expand(2, 4, 4)
    k = K.float().expand(2, 3, 3)
    target = look_at(torch.tensor([0.3, -0.2, 0.1]), torch.tensor([0.0, 0.0, 6.0])).float().expand(2, 4, 4)
    exact = forward_warp(source, depth, k, eye, k, target, mode=mode)
    monkeypatch.setattr(warp, "exact_dtype", lambda device: torch.float32)  # what MPS gets
    identity = forward_warp(source, depth, k, eye, k, eye, mode=mode)
    assert torch.equal(identity[0], source) and identity[1].all()  # still snapped onto the pixel centres
    moved = forward_warp(source, depth, k, eye, k, target, mode=mode)
    both = exact[1] & moved[1]
    assert both.float().mean() > 0.95 * exact[1].float().mean()
    torch.testing.assert_close(
        moved[0][both.expand_as(moved[0])], exact[0][both.expand_as(exact[0])], atol=1e-3, rtol=0
    )
