r"""Depth-based forward warping of images and feature maps between cameras (pure torch, batched).

Each source pixel is lifted to 3-D with its depth, moved into the target camera and splatted onto the four
nearest target pixel centres with bilinear weights. Where several source points land on one target pixel,
`mode="zbuffer"` keeps only those within `depth_tolerance` of the nearest one (occlusion resolved toward the
nearer surface); `mode="softmax"` blends all of them with weights `exp(-alpha * z / z_max)` favouring near points
(softmax splatting). Target pixels that receive nothing are marked invalid.

Camera conventions are those of [`~geometry.camera`] (OpenCV axes, camera-to-world, pixel centres
at +0.5).
"""

import torch

from ...geometry.camera import check_intrinsics, check_rigid, invert_rigid
from ...utils import exact_dtype


WARP_MODES = ("zbuffer", "softmax")


def _check_inputs(source, depth, intrinsics_src, c2w_src, intrinsics_tgt, c2w_tgt, mode):
    if not isinstance(source, torch.Tensor) or source.ndim != 4:
        raise ValueError(
            f"`source` must be a (batch, channels, height, width) tensor, got {getattr(source, 'shape', source)}."
        )
    b, _, h, w = source.shape
    if not isinstance(depth, torch.Tensor) or tuple(depth.shape) != (b, 1, h, w):
        raise ValueError(f"`depth` has shape {tuple(getattr(depth, 'shape', ()))}; expected {(b, 1, h, w)}.")
    if not torch.isfinite(depth).all() or (depth <= 0).any():
        raise ValueError(f"`depth` must be finite and positive; its minimum is {float(depth.min()):.4g}.")
    for name, value, shape in (
        ("intrinsics_src", intrinsics_src, (b, 3, 3)),
        ("c2w_src", c2w_src, (b, 4, 4)),
        ("intrinsics_tgt", intrinsics_tgt, (b, 3, 3)),
        ("c2w_tgt", c2w_tgt, (b, 4, 4)),
    ):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            raise ValueError(
                f"`{name}` has shape {tuple(getattr(value, 'shape', ()))}; expected {shape} (one per image)."
            )
    check_intrinsics(intrinsics_src, "intrinsics_src")
    check_intrinsics(intrinsics_tgt, "intrinsics_tgt")
    check_rigid(c2w_src, "c2w_src")
    check_rigid(c2w_tgt, "c2w_tgt")
    if mode not in WARP_MODES:
        raise ValueError(f"`mode` must be one of {WARP_MODES}, got {mode!r}.")


def forward_warp(
    source: torch.Tensor,
    depth: torch.Tensor,
    intrinsics_src: torch.Tensor,
    c2w_src: torch.Tensor,
    intrinsics_tgt: torch.Tensor,
    c2w_tgt: torch.Tensor,
    target_size: tuple[int, int] | None = None,
    mode: str = "zbuffer",
    depth_tolerance: float = 0.05,
    alpha: float = 20.0,
    min_weight: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""
    Warp `source` (images or feature maps) from source cameras to target cameras by depth.

    Args:
        source (`torch.Tensor` of shape `(B, C, H, W)`): what to warp, at the resolution of `depth`.
        depth (`torch.Tensor` of shape `(B, 1, H, W)`): z-depth (distance along the camera's z axis), > 0.
        intrinsics_src (`torch.Tensor` of shape `(B, 3, 3)`): source intrinsics for an `H x W` image.
        c2w_src (`torch.Tensor` of shape `(B, 4, 4)`): source camera-to-world transforms.
        intrinsics_tgt (`torch.Tensor` of shape `(B, 3, 3)`): target intrinsics for the target size.
        c2w_tgt (`torch.Tensor` of shape `(B, 4, 4)`): target camera-to-world transforms.
        target_size (`tuple[int, int]`, *optional*): `(height, width)` of the target; defaults to `(H, W)`.
        mode (`str`, defaults to `"zbuffer"`): `"zbuffer"` (hard occlusion test) or `"softmax"` (soft blend).
        depth_tolerance (`float`, defaults to 0.05): z-buffer: relative depth margin within which splats of one
            surface are blended rather than discarded.
        alpha (`float`, defaults to 20.0): softmax: how strongly near points dominate far ones.
        min_weight (`float`, defaults to 1e-3): target pixels with less total splat weight are invalid.

    Returns:
        `(warped, valid, warped_depth)`: `warped` `(B, C, Ht, Wt)` (0 where invalid), `valid` `(B, 1, Ht, Wt)`
        boolean, and `warped_depth` `(B, 1, Ht, Wt)`, the target-camera z-depth of what landed there (0 where
        invalid).
    """
    _check_inputs(source, depth, intrinsics_src, c2w_src, intrinsics_tgt, c2w_tgt, mode)
    b, c, h, w = source.shape
    ht, wt = target_size if target_size is not None else (h, w)
    device = source.device
    # float64: exact enough that an identity warp lands on pixel centres exactly (float32 on MPS, no float64 there)
    geometry = exact_dtype(device)
    snap = 1e-9 if geometry == torch.float64 else 1e-4

    rows, cols = torch.meshgrid(
        torch.arange(h, device=device, dtype=geometry) + 0.5,
        torch.arange(w, device=device, dtype=geometry) + 0.5,
        indexing="ij",
    )
    pixels = torch.stack([cols, rows, torch.ones_like(cols)], dim=0).reshape(3, -1)  # (3, N)
    points_src = (torch.linalg.inv(intrinsics_src.to(geometry)) @ pixels) * depth.to(geometry).reshape(b, 1, -1)
    src_to_tgt = invert_rigid(c2w_tgt.to(geometry)) @ c2w_src.to(geometry)
    points_tgt = src_to_tgt[:, :3, :3] @ points_src + src_to_tgt[:, :3, 3:4]  # (B, 3, N)
    z = points_tgt[:, 2]
    in_front = z > 1e-6
    projected = intrinsics_tgt.to(geometry) @ points_tgt
    # Continuous pixel index (the centre of pixel i is at i), snapped to the grid within round-off.
    x = projected[:, 0] / z.clamp_min(1e-6) - 0.5
    y = projected[:, 1] / z.clamp_min(1e-6) - 0.5
    x = torch.where((x - x.round()).abs() < snap, x.round(), x)
    y = torch.where((y - y.round()).abs() < snap, y.round(), y)

    batch_offset = torch.arange(b, device=device)[:, None] * (ht * wt)
    x0, y0 = torch.floor(x), torch.floor(y)
    taps = []  # per bilinear tap: (flat target index (B, N), weight (B, N); 0 where the tap misses)
    for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
        xi, yi = x0 + dx, y0 + dy
        weight = (1 - (x - xi).abs()) * (1 - (y - yi).abs())
        hit = in_front & (xi >= 0) & (xi < wt) & (yi >= 0) & (yi < ht)
        index = batch_offset + yi.clamp(0, ht - 1).long() * wt + xi.clamp(0, wt - 1).long()
        taps.append((index, torch.where(hit, weight, torch.zeros_like(weight))))

    num_targets = b * ht * wt
    if mode == "zbuffer":
        nearest = torch.full((num_targets,), float("inf"), dtype=geometry, device=device)
        for index, weight in taps:
            hit = weight > 0
            nearest.scatter_reduce_(0, index[hit], z[hit], reduce="amin")
        taps = [(index, weight * (z <= nearest[index] * (1 + depth_tolerance))) for index, weight in taps]
    else:
        z_max = torch.where(in_front, z, torch.zeros_like(z)).amax(dim=1, keepdim=True)
        near_bias = torch.exp(-alpha * (z / z_max - 1))
        taps = [(index, weight * near_bias) for index, weight in taps]

    total = torch.zeros(num_targets, dtype=geometry, device=device)
    depth_sum = torch.zeros(num_targets, dtype=geometry, device=device)
    for index, weight in taps:
        total.index_add_(0, index.reshape(-1), weight.reshape(-1))
        depth_sum.index_add_(0, index.reshape(-1), (weight * z).reshape(-1))
    valid = total > min_weight
    safe_total = torch.where(valid, total, torch.ones_like(total))

    # Normalise each splat by its target's total weight before accumulating: a target fed by one point gets it
    # with weight exactly 1 (an identity warp is an exact copy), and the features never leave their dtype.
    values = source.permute(0, 2, 3, 1).reshape(b * h * w, c)
    warped = torch.zeros(num_targets, c, dtype=source.dtype, device=device)
    for index, weight in taps:
        index = index.reshape(-1)
        share = (weight.reshape(-1) / safe_total[index]).to(source.dtype)
        warped.index_add_(0, index, values * share[:, None])
    warped = torch.where(valid[:, None], warped, torch.zeros_like(warped)).reshape(b, ht, wt, c).permute(0, 3, 1, 2)
    warped_depth = torch.where(valid, depth_sum / safe_total, torch.zeros_like(depth_sum))
    return warped, valid.reshape(b, 1, ht, wt), warped_depth.reshape(b, 1, ht, wt).to(source.dtype)


def warp_to_targets(
    features: torch.Tensor,
    depths: torch.Tensor,
    input_intrinsics: torch.Tensor,
    input_c2w: torch.Tensor,
    target_intrinsics: torch.Tensor,
    target_c2w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    Warp the features of every input view of every scene to every target view (z-buffer); where several input
    views reach a pixel, the nearest surface wins.

    Args:
        features (`torch.Tensor` of shape `(B, V_in, S, H, W)`): per-input-view feature maps at the depth's size.
        depths (`torch.Tensor` of shape `(B, V_in, 1, H, W)`): input z-depth.
        input_intrinsics (`(B, V_in, 3, 3)`), input_c2w (`(B, V_in, 4, 4)`): input cameras.
        target_intrinsics (`(B, V_t, 3, 3)`), target_c2w (`(B, V_t, 4, 4)`): target cameras (same image size).

    Returns:
        `(warped, valid)`: `(B, V_t, S, H, W)` features and a `(B, V_t, 1, H, W)` boolean coverage mask.
    """
    b, v_in, s, h, w = features.shape
    v_t = target_c2w.shape[1]
    best_depth = torch.full((b, v_t, 1, h, w), float("inf"), device=features.device)
    warped = features.new_zeros(b, v_t, s, h, w)
    k_tgt, c_tgt = target_intrinsics.reshape(-1, 3, 3).float(), target_c2w.reshape(-1, 4, 4).float()
    for i in range(v_in):
        per_target = [
            x[:, i, None].expand(b, v_t, *x.shape[2:]).reshape(b * v_t, *x.shape[2:]).float()
            for x in (features, depths, input_intrinsics, input_c2w)
        ]
        out, valid, out_depth = forward_warp(*per_target, k_tgt, c_tgt)
        out, valid, out_depth = (t.reshape(b, v_t, *t.shape[1:]) for t in (out, valid, out_depth))
        nearer = valid & (out_depth < best_depth)
        warped = torch.where(nearer, out, warped)
        best_depth = torch.where(nearer, out_depth, best_depth)
    return warped, torch.isfinite(best_depth)
