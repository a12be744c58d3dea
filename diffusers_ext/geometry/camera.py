r"""Camera conventions, Plücker ray maps and trajectories for multi-view diffusion.

Conventions (OpenCV, as SEVA and diffusers' camera utilities use):

- Camera axes: x right, y down, z forward (the viewing direction). A point in front of a camera has z > 0.
- Extrinsics are **camera-to-world** matrices `c2w` of shape `(..., 4, 4)`: `world = c2w @ [x_cam, 1]`. The
  rotation block must be a proper rotation and the last row `[0, 0, 0, 1]`.
- Intrinsics `K` of shape `(..., 3, 3)` are in pixels, `[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`; pixel `(i, j)`
  (column `i`, row `j`) has its centre at `(i + 0.5, j + 0.5)`.
- A Plücker ray map stores, per pixel, the unit ray direction `d` and the moment `o x d` (origin `o`), in that
  order: 6 channels `[d, o x d]`, usually relative to a reference camera so that a global rigid motion of the
  whole scene leaves it unchanged.
"""

import math

import torch


def _check_matrix(name: str, value: torch.Tensor, shape: tuple[int, int]) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}.")
    if value.ndim < 2 or tuple(value.shape[-2:]) != shape:
        raise ValueError(f"`{name}` has shape {tuple(value.shape)}; expected (..., {shape[0]}, {shape[1]}).")
    if not value.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got {value.dtype}.")


def check_intrinsics(intrinsics: torch.Tensor, name: str = "intrinsics") -> None:
    """Raise a `ValueError` unless `intrinsics` is `(..., 3, 3)` pinhole matrices with positive focal lengths."""
    _check_matrix(name, intrinsics, (3, 3))
    bottom = intrinsics[..., 2, :]
    expected = torch.tensor([0.0, 0.0, 1.0], dtype=intrinsics.dtype, device=intrinsics.device)
    if not torch.allclose(bottom, expected.expand_as(bottom), atol=1e-6):
        raise ValueError(f"`{name}` must have the last row [0, 0, 1]; got {bottom.reshape(-1, 3)[0].tolist()}.")
    if (intrinsics[..., 0, 0] <= 0).any() or (intrinsics[..., 1, 1] <= 0).any():
        raise ValueError(f"`{name}` must have positive focal lengths fx = K[0, 0] and fy = K[1, 1].")


def check_rigid(c2w: torch.Tensor, name: str = "c2w", atol: float = 1e-4) -> None:
    """Raise a `ValueError` unless `c2w` is `(..., 4, 4)` rigid transforms (rotation with det 1, last row 0 0 0 1)."""
    _check_matrix(name, c2w, (4, 4))
    rotation = c2w[..., :3, :3].double()
    identity = torch.eye(3, dtype=rotation.dtype, device=rotation.device)
    orthogonality = (rotation.transpose(-1, -2) @ rotation - identity).abs().amax()
    if orthogonality > atol:
        raise ValueError(
            f"`{name}` is not rigid: its rotation block deviates from orthogonal by {float(orthogonality):.3g}."
        )
    if (torch.linalg.det(rotation) < 0).any():
        raise ValueError(f"`{name}` is not rigid: its rotation block is a reflection (determinant -1).")
    bottom = c2w[..., 3, :].double()
    expected = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=bottom.dtype, device=bottom.device)
    if not torch.allclose(bottom, expected.expand_as(bottom), atol=1e-6):
        raise ValueError(f"`{name}` must have the last row [0, 0, 0, 1].")


def invert_rigid(c2w: torch.Tensor) -> torch.Tensor:
    """Invert rigid transforms `(..., 4, 4)` exactly (transpose the rotation) instead of a general inverse."""
    rotation_t = c2w[..., :3, :3].transpose(-1, -2)
    inverse = torch.zeros_like(c2w)
    inverse[..., :3, :3] = rotation_t
    inverse[..., :3, 3] = -(rotation_t @ c2w[..., :3, 3:4]).squeeze(-1)
    inverse[..., 3, 3] = 1.0
    return inverse


def relative_to(c2w: torch.Tensor, reference_c2w: torch.Tensor) -> torch.Tensor:
    """Express cameras `(..., 4, 4)` in the frame of `reference_c2w` `(4, 4)` (the reference becomes identity)."""
    check_rigid(c2w)
    check_rigid(reference_c2w, "reference_c2w")
    return invert_rigid(reference_c2w) @ c2w


def scale_intrinsics(intrinsics: torch.Tensor, scale_x: float, scale_y: float) -> torch.Tensor:
    """Intrinsics for an image resized by `(scale_x, scale_y)` (pixel-centre convention kept)."""
    scaled = intrinsics.clone()
    scaled[..., 0, :] = scaled[..., 0, :] * scale_x
    scaled[..., 1, :] = scaled[..., 1, :] * scale_y
    return scaled


def pixel_rays(
    intrinsics: torch.Tensor, c2w: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    World-space rays through every pixel centre.

    Args:
        intrinsics (`torch.Tensor` of shape `(V, 3, 3)`): pinhole intrinsics in pixels.
        c2w (`torch.Tensor` of shape `(V, 4, 4)`): camera-to-world transforms.
        height (`int`), width (`int`): image size the intrinsics refer to.

    Returns:
        `(origins, directions)`, both of shape `(V, height, width, 3)`; directions have unit length.
    """
    check_intrinsics(intrinsics)
    check_rigid(c2w)
    if intrinsics.shape[:-2] != c2w.shape[:-2]:
        raise ValueError(
            f"`intrinsics` {tuple(intrinsics.shape)} and `c2w` {tuple(c2w.shape)} describe different numbers of cameras."
        )
    device, dtype = c2w.device, c2w.dtype
    rows, cols = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype) + 0.5,
        torch.arange(width, device=device, dtype=dtype) + 0.5,
        indexing="ij",
    )
    pixels = torch.stack([cols, rows, torch.ones_like(cols)], dim=-1)  # (H, W, 3)
    camera_dirs = torch.einsum("vij,hwj->vhwi", torch.linalg.inv(intrinsics.to(dtype)), pixels)
    directions = torch.einsum("vij,vhwj->vhwi", c2w[..., :3, :3], camera_dirs)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    origins = c2w[..., None, None, :3, 3].expand_as(directions)
    return origins, directions


def plucker_raymap(
    intrinsics: torch.Tensor,
    c2w: torch.Tensor,
    height: int,
    width: int,
    reference_c2w: torch.Tensor | None = None,
    normalize_scale: bool = False,
) -> torch.Tensor:
    r"""
    Plücker ray maps `[d, o x d]` for `V` cameras.

    Args:
        intrinsics (`torch.Tensor` of shape `(V, 3, 3)`): pinhole intrinsics in pixels.
        c2w (`torch.Tensor` of shape `(V, 4, 4)`): camera-to-world transforms.
        height (`int`), width (`int`): the ray map's size (the intrinsics' image size).
        reference_c2w (`torch.Tensor` of shape `(4, 4)`, *optional*): express every camera relative to this one
            (typically the first input view) first, making the map invariant to a global rigid motion.
        normalize_scale (`bool`, defaults to `False`): divide camera positions by the largest distance of a
            camera from the reference origin, making the map invariant to the scene's scale too.

    Returns:
        `torch.Tensor` of shape `(V, 6, height, width)`.
    """
    if reference_c2w is not None:
        c2w = relative_to(c2w, reference_c2w)
    if normalize_scale:
        radius = c2w[..., :3, 3].norm(dim=-1).amax()
        if radius > 0:
            c2w = c2w.clone()
            c2w[..., :3, 3] = c2w[..., :3, 3] / radius
    origins, directions = pixel_rays(intrinsics, c2w, height, width)
    moments = torch.cross(origins, directions, dim=-1)
    return torch.cat([directions, moments], dim=-1).permute(0, 3, 1, 2).contiguous()


def scene_plucker(intrinsics: torch.Tensor, c2w: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Plücker maps `(B, V, 6, H, W)` of `B` scenes' cameras (`(B, V, 3, 3)`, `(B, V, 4, 4)`), each relative to the
    scene's first view and scale-normalised: the conditioning [`SemanticMultiViewUNetModel`] is trained with."""
    return torch.stack(
        [
            plucker_raymap(intrinsics[i], c2w[i], height, width, reference_c2w=c2w[i, 0], normalize_scale=True)
            for i in range(c2w.shape[0])
        ]
    )


def look_at(eye: torch.Tensor, target: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    Camera-to-world matrices of cameras at `eye` looking at `target` (OpenCV axes: z toward the target, y down).

    Args:
        eye (`torch.Tensor` of shape `(V, 3)` or `(3,)`), target (same shape): positions in world space.
        up (`torch.Tensor` of shape `(3,)`, *optional*): the world's up direction; defaults to `(0, -1, 0)`, so
            that world y points down as the camera's y does.

    Returns:
        `torch.Tensor` of shape `(V, 4, 4)` (or `(4, 4)` for a single eye).
    """
    single = eye.ndim == 1
    eye, target = torch.atleast_2d(eye), torch.atleast_2d(target).expand_as(torch.atleast_2d(eye))
    up = torch.tensor([0.0, -1.0, 0.0], dtype=eye.dtype, device=eye.device) if up is None else up.to(eye)
    forward = target - eye
    if (forward.norm(dim=-1) == 0).any():
        raise ValueError("`eye` and `target` coincide; a camera needs a viewing direction.")
    forward = forward / forward.norm(dim=-1, keepdim=True)
    right = torch.cross(forward, up.expand_as(forward), dim=-1)
    if (right.norm(dim=-1) < 1e-8).any():
        raise ValueError("`up` is parallel to the viewing direction; choose another `up`.")
    right = right / right.norm(dim=-1, keepdim=True)
    down = torch.cross(forward, right, dim=-1)
    c2w = torch.zeros(eye.shape[0], 4, 4, dtype=eye.dtype, device=eye.device)
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = right, down, forward, eye
    c2w[:, 3, 3] = 1.0
    return c2w[0] if single else c2w


def orbit_trajectory(
    num_views: int,
    radius: float,
    elevation_deg: float = 20.0,
    start_azimuth_deg: float = 0.0,
    sweep_deg: float = 360.0,
    center: tuple[float, float, float] = (0.0, 0.0, 0.0),
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Cameras on a circle around `center` (world y is down, the orbit is in the x-z plane), looking at it.

    Returns `(num_views, 4, 4)` camera-to-world matrices; `sweep_deg` of 360 spaces them over a full turn.
    """
    if num_views < 1 or radius <= 0:
        raise ValueError(f"`num_views` must be >= 1 and `radius` > 0, got {num_views} and {radius}.")
    step = sweep_deg / num_views if abs(sweep_deg) >= 360 else sweep_deg / max(num_views - 1, 1)
    azimuths = torch.tensor(
        [math.radians(start_azimuth_deg + k * step) for k in range(num_views)], dtype=torch.float64
    )
    elevation = math.radians(elevation_deg)
    centre = torch.tensor(center, dtype=torch.float64)
    eye = centre + radius * torch.stack(
        [
            math.cos(elevation) * torch.sin(azimuths),
            torch.full_like(azimuths, -math.sin(elevation)),
            -math.cos(elevation) * torch.cos(azimuths),
        ],
        dim=-1,
    )
    return look_at(eye, centre.expand_as(eye)).to(dtype)


def forward_trajectory(c2w: torch.Tensor, distance: float, num_views: int) -> torch.Tensor:
    """`num_views` cameras moving from `c2w` `(4, 4)` along its viewing axis by up to `distance`, same rotation."""
    check_rigid(c2w)
    if num_views < 2:
        raise ValueError(f"`num_views` must be >= 2, got {num_views}.")
    steps = torch.linspace(0, distance, num_views, dtype=c2w.dtype, device=c2w.device)
    poses = c2w.expand(num_views, 4, 4).clone()
    poses[:, :3, 3] = c2w[:3, 3] + steps[:, None] * c2w[:3, 2]
    return poses


def _slerp_rotation(r0: torch.Tensor, r1: torch.Tensor, t: float) -> torch.Tensor:
    """Geodesic interpolation between rotations `(3, 3)` (axis-angle of the relative rotation, scaled by `t`)."""
    relative = r0.transpose(-1, -2) @ r1
    cos_angle = ((relative.diagonal().sum() - 1) / 2).clamp(-1.0, 1.0)
    angle = torch.arccos(cos_angle)
    if angle < 1e-8:
        return r0.clone()
    axis = torch.stack(
        [relative[2, 1] - relative[1, 2], relative[0, 2] - relative[2, 0], relative[1, 0] - relative[0, 1]]
    )
    if axis.norm() < 1e-8:  # a half turn: take the axis from the symmetric part
        symmetric = (relative + torch.eye(3, dtype=relative.dtype)) / 2
        axis = symmetric[symmetric.diagonal().argmax()]
    axis = axis / axis.norm()
    skew = torch.zeros(3, 3, dtype=r0.dtype)
    skew[0, 1], skew[0, 2], skew[1, 2] = -axis[2], axis[1], -axis[0]
    skew = skew - skew.T
    theta = angle * t
    step = torch.eye(3, dtype=r0.dtype) + torch.sin(theta) * skew + (1 - torch.cos(theta)) * (skew @ skew)
    return r0 @ step


def interpolate_trajectory(c2w_start: torch.Tensor, c2w_end: torch.Tensor, num_views: int) -> torch.Tensor:
    """`num_views` cameras from `c2w_start` to `c2w_end` (both `(4, 4)`): positions linear, rotations geodesic."""
    check_rigid(c2w_start, "c2w_start")
    check_rigid(c2w_end, "c2w_end")
    if num_views < 2:
        raise ValueError(f"`num_views` must be >= 2, got {num_views}.")
    poses = []
    for k in range(num_views):
        t = k / (num_views - 1)
        pose = torch.eye(4, dtype=torch.float64)
        pose[:3, :3] = _slerp_rotation(c2w_start[:3, :3].double(), c2w_end[:3, :3].double(), t)
        pose[:3, 3] = (1 - t) * c2w_start[:3, 3].double() + t * c2w_end[:3, 3].double()
        poses.append(pose)
    return torch.stack(poses).to(c2w_start.dtype)


def spiral_trajectory(
    c2w: torch.Tensor, num_views: int, radius: float, depth: float, turns: float = 1.0, focus_distance: float = 4.0
) -> torch.Tensor:
    """Cameras spiralling around the viewing axis of `c2w` `(4, 4)` while moving `depth` forward, all looking at
    the point `focus_distance` ahead of the start camera. Returns `(num_views, 4, 4)`."""
    check_rigid(c2w)
    if num_views < 2 or radius < 0:
        raise ValueError(f"`num_views` must be >= 2 and `radius` >= 0, got {num_views} and {radius}.")
    c2w64 = c2w.double()
    right, down, forward, origin = c2w64[:3, 0], c2w64[:3, 1], c2w64[:3, 2], c2w64[:3, 3]
    focus = origin + focus_distance * forward
    eyes = []
    for k in range(num_views):
        t = k / (num_views - 1)
        angle = 2 * math.pi * turns * t
        eyes.append(origin + radius * (math.cos(angle) * right + math.sin(angle) * down) + depth * t * forward)
    eyes = torch.stack(eyes)
    return look_at(eyes, focus.expand_as(eyes), up=-down).to(c2w.dtype)
