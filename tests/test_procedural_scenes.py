import pytest
import torch

from diffusers_ext.data.procedural_scenes import (
    SKY_DEPTH,
    Primitive,
    Scene,
    default_intrinsics,
    random_scene,
    render,
    render_orbit,
)
from diffusers_ext.geometry.camera import look_at
from diffusers_ext.pipelines.semantic_nvs.warp import forward_warp


def test_render_is_deterministic_and_well_formed():
    scene = random_scene(torch.Generator().manual_seed(0), num_objects=3)
    a = render_orbit(scene, 3, 32, sweep_deg=90)
    b = render_orbit(random_scene(torch.Generator().manual_seed(0), num_objects=3), 3, 32, sweep_deg=90)
    for key in ("images", "depths", "classes"):
        assert torch.equal(a[key], b[key])
    assert a["images"].shape == (3, 3, 32, 32) and 0 <= a["images"].min() and a["images"].max() <= 1
    assert (a["depths"] > 0).all() and (a["depths"] <= SKY_DEPTH).all()
    assert set(a["classes"].unique().tolist()) >= {0} and a["classes"].max() >= 1


def test_depth_of_a_known_sphere_and_the_floor():
    scene = Scene([Primitive("sphere", (0.0, -0.5, 0.0), (0.5, 0.5, 0.5), 1)])
    c2w = look_at(torch.tensor([0.0, -0.5, -3.0]), torch.tensor([0.0, -0.5, 0.0]))[None]
    out = render(scene, default_intrinsics(1, 33), c2w, 33, 33)
    # the centre pixel looks straight at the sphere: depth = distance to its front surface = 3 - 0.5
    assert out["classes"][0, 16, 16] == 1
    assert float(out["depths"][0, 0, 16, 16]) == pytest.approx(2.5, abs=2e-3)
    # a floor pixel's z-depth puts its 3-D point on the plane y = 0
    row, col = 30, 16
    assert out["classes"][0, row, col] == 0
    k = default_intrinsics(1, 33)[0]
    z = float(out["depths"][0, 0, row, col])
    y_cam = (row + 0.5 - float(k[1, 2])) / float(k[1, 1]) * z
    assert y_cam + float(c2w[0, 1, 3]) == pytest.approx(0.0, abs=1e-4)  # camera axes are aligned with the world here


def test_warped_depth_matches_the_rendered_target_depth():
    scene = random_scene(torch.Generator().manual_seed(1), num_objects=3)
    views = render_orbit(scene, 2, 48, sweep_deg=20)
    source = torch.cat([views["images"], views["classes"][:, None].float()], dim=1)[:1]
    warped, valid, warped_depth = forward_warp(
        source,
        views["depths"][:1],
        views["intrinsics"][:1],
        views["c2w"][:1],
        views["intrinsics"][1:],
        views["c2w"][1:],
    )
    target_depth = views["depths"][1:]
    near = valid & (target_depth < 20)
    assert near.sum() > 0.75 * (target_depth < 20).sum()  # most of the scene (not the sky) is covered
    relative_error = ((warped_depth - target_depth).abs() / target_depth)[near]
    assert relative_error.median() < 0.01
    # the object classes carried along agree with the target's on most visible pixels
    agree = (warped[:, 3:].round() == views["classes"][1:, None].float())[near]
    assert agree.float().mean() > 0.9


def test_bad_scene_arguments():
    with pytest.raises(ValueError, match="num_objects"):
        random_scene(torch.Generator(), num_objects=0)
    with pytest.raises(ValueError, match="'cone'"):
        render(Scene([Primitive("cone", (0, 0, 0), (1, 1, 1), 1)]), default_intrinsics(1, 8), torch.eye(4)[None], 8, 8)
