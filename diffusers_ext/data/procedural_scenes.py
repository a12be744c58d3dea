r"""Procedural 3-D scenes rendered from any camera with exact depth: coloured spheres and boxes of known object
classes on a checkered floor, lit by a directional light. Ground truth for novel view synthesis on a CPU.

World frame as the cameras' (OpenCV): y points down, so the floor is the plane `y = 0` and objects sit at `y < 0`.
Rendering is a vectorised ray caster in torch (analytic ray-sphere, ray-box and ray-plane intersections).
"""

from dataclasses import dataclass, field

import torch

from ..geometry.camera import check_intrinsics, check_rigid, orbit_trajectory, pixel_rays


# Object classes: 0 is the floor, the sky is -1 in class maps.
OBJECT_CLASSES = ("floor", "red sphere", "green sphere", "blue box", "yellow box")
CLASS_COLOURS = {1: (0.85, 0.2, 0.15), 2: (0.2, 0.75, 0.25), 3: (0.2, 0.35, 0.9), 4: (0.95, 0.8, 0.15)}
SKY_DEPTH = 50.0
SKY_COLOUR = (0.55, 0.7, 0.9)


@dataclass
class Primitive:
    """A sphere (`kind="sphere"`, `size` = radius) or an axis-aligned box (`kind="box"`, `size` = half extents)."""

    kind: str
    center: tuple[float, float, float]
    size: tuple[float, float, float]
    class_id: int

    @property
    def colour(self) -> tuple[float, float, float]:
        return CLASS_COLOURS[self.class_id]


@dataclass
class Scene:
    """Primitives on the square floor `y = 0`, `|x|, |z| <= floor_extent`, the direction toward the light (y < 0 is
    up), and the floor's checker size."""

    primitives: list[Primitive] = field(default_factory=list)
    light_direction: tuple[float, float, float] = (0.4, -1.0, 0.3)
    checker_size: float = 0.5
    floor_extent: float = 4.0


def random_scene(generator: torch.Generator, num_objects: int = 3, extent: float = 1.2) -> Scene:
    """A scene of `num_objects` random primitives resting on the floor within `[-extent, extent]^2` (x, z)."""
    if num_objects < 1:
        raise ValueError(f"`num_objects` must be >= 1, got {num_objects}.")

    def uniform(low, high):
        return float(low + (high - low) * torch.rand((), generator=generator))

    primitives = []
    for _ in range(num_objects):
        class_id = int(torch.randint(1, len(OBJECT_CLASSES), (), generator=generator))
        x, z = uniform(-extent, extent), uniform(-extent, extent)
        if class_id in (1, 2):
            radius = uniform(0.25, 0.5)
            primitives.append(Primitive("sphere", (x, -radius, z), (radius, radius, radius), class_id))
        else:
            half = (uniform(0.2, 0.45), uniform(0.2, 0.6), uniform(0.2, 0.45))
            primitives.append(Primitive("box", (x, -half[1], z), half, class_id))
    light = (uniform(-0.6, 0.6), -1.0, uniform(-0.6, 0.6))
    return Scene(primitives, light)


def _intersect_sphere(origins, directions, center, radius):
    oc = origins - center
    b = (oc * directions).sum(-1)
    c = (oc * oc).sum(-1) - radius**2
    disc = b * b - c
    sqrt_disc = torch.sqrt(disc.clamp_min(0))
    t = torch.where(-b - sqrt_disc > 1e-6, -b - sqrt_disc, -b + sqrt_disc)
    hit = (disc >= 0) & (t > 1e-6)
    points = origins + t[..., None] * directions
    normals = (points - center) / radius
    return torch.where(hit, t, torch.full_like(t, float("inf"))), normals


def _intersect_box(origins, directions, center, half):
    inv = 1.0 / torch.where(directions.abs() < 1e-12, torch.full_like(directions, 1e-12), directions)
    t1, t2 = (center - half - origins) * inv, (center + half - origins) * inv
    t_near, t_far = torch.minimum(t1, t2).amax(-1), torch.maximum(t1, t2).amin(-1)
    t = torch.where(t_near > 1e-6, t_near, t_far)
    hit = (t_near <= t_far) & (t > 1e-6)
    points = origins + t[..., None] * directions
    local = (points - center) / half
    axis = local.abs().argmax(-1, keepdim=True)
    normals = torch.zeros_like(points).scatter_(-1, axis, torch.sign(local.gather(-1, axis)))
    return torch.where(hit, t, torch.full_like(t, float("inf"))), normals


def render(
    scene: Scene, intrinsics: torch.Tensor, c2w: torch.Tensor, height: int, width: int
) -> dict[str, torch.Tensor]:
    r"""
    Render `scene` from `V` cameras.

    Args:
        scene ([`Scene`]): what to render.
        intrinsics (`torch.Tensor` of shape `(V, 3, 3)`), c2w (`torch.Tensor` of shape `(V, 4, 4)`): the cameras.
        height (`int`), width (`int`): image size.

    Returns:
        A dict with `"images"` `(V, 3, H, W)` in [0, 1], `"depths"` `(V, 1, H, W)` (z-depth; the sky at
        `SKY_DEPTH`) and `"classes"` `(V, H, W)` int64 (-1 sky, 0 floor, else the object class).
    """
    check_intrinsics(intrinsics)
    check_rigid(c2w)
    dtype = torch.float64
    origins, directions = pixel_rays(intrinsics.to(dtype), c2w.to(dtype), height, width)
    best_t = torch.full(directions.shape[:-1], float("inf"), dtype=dtype)
    normals = torch.zeros_like(directions)
    colours = torch.tensor(SKY_COLOUR, dtype=dtype).expand_as(directions).clone()
    classes = torch.full(directions.shape[:-1], -1, dtype=torch.long)

    # The floor y = 0, seen from above (y < 0), normal pointing up (-y).
    t_floor = torch.where(
        directions[..., 1] > 1e-9, -origins[..., 1] / directions[..., 1], torch.full_like(best_t, float("inf"))
    )
    floor_points = origins + t_floor.clamp_max(1e6)[..., None] * directions
    on_floor = (
        (t_floor > 1e-6)
        & (floor_points[..., 0].abs() <= scene.floor_extent)
        & (floor_points[..., 2].abs() <= scene.floor_extent)
    )
    t_floor = torch.where(on_floor, t_floor, torch.full_like(t_floor, float("inf")))
    checker = (
        torch.floor(floor_points[..., 0] / scene.checker_size) + torch.floor(floor_points[..., 2] / scene.checker_size)
    ) % 2
    floor_colour = torch.stack([0.55 + 0.3 * checker, 0.55 + 0.3 * checker, 0.5 + 0.3 * checker], -1)
    hit = t_floor < best_t
    best_t = torch.where(hit, t_floor, best_t)
    normals[hit] = torch.tensor([0.0, -1.0, 0.0], dtype=dtype)
    colours[hit], classes[hit] = floor_colour[hit], 0

    for primitive in scene.primitives:
        center = torch.tensor(primitive.center, dtype=dtype)
        size = torch.tensor(primitive.size, dtype=dtype)
        if primitive.kind == "sphere":
            t, n = _intersect_sphere(origins, directions, center, size[0])
        elif primitive.kind == "box":
            t, n = _intersect_box(origins, directions, center, size)
        else:
            raise ValueError(f"primitive kind {primitive.kind!r} is neither 'sphere' nor 'box'.")
        hit = t < best_t
        best_t = torch.where(hit, t, best_t)
        normals[hit] = n[hit]
        colours[hit] = torch.tensor(primitive.colour, dtype=dtype)
        classes[hit] = primitive.class_id

    light = torch.tensor(scene.light_direction, dtype=dtype)
    light = light / light.norm()
    lambert = (normals * light).sum(-1).clamp_min(0)
    shaded = torch.where((classes >= 0)[..., None], colours * (0.35 + 0.65 * lambert[..., None]), colours)

    forward = c2w[:, None, None, :3, 2].to(dtype)
    z_depth = torch.where(
        torch.isfinite(best_t), best_t * (directions * forward).sum(-1), torch.full_like(best_t, SKY_DEPTH)
    )
    return {
        "images": shaded.clamp(0, 1).permute(0, 3, 1, 2).float().contiguous(),
        "depths": z_depth.clamp_max(SKY_DEPTH)[:, None].float().contiguous(),
        "classes": classes,
    }


def default_intrinsics(num_views: int, size: int, fov_deg: float = 50.0) -> torch.Tensor:
    """Square pinhole intrinsics `(num_views, 3, 3)` with horizontal field of view `fov_deg`."""
    focal = size / 2 / torch.tan(torch.deg2rad(torch.tensor(fov_deg / 2)))
    intrinsics = torch.tensor([[float(focal), 0.0, size / 2], [0.0, float(focal), size / 2], [0.0, 0.0, 1.0]])
    return intrinsics.expand(num_views, 3, 3).clone()


def render_orbit(
    scene: Scene,
    num_views: int,
    size: int,
    radius: float = 4.0,
    elevation_deg: float = 25.0,
    start_azimuth_deg: float = 0.0,
    sweep_deg: float = 360.0,
) -> dict[str, torch.Tensor]:
    """Render `num_views` views on an orbit around the scene centre; also returns `"intrinsics"` and `"c2w"`."""
    c2w = orbit_trajectory(num_views, radius, elevation_deg, start_azimuth_deg, sweep_deg, center=(0.0, -0.3, 0.0))
    intrinsics = default_intrinsics(num_views, size)
    return {**render(scene, intrinsics, c2w, size, size), "intrinsics": intrinsics, "c2w": c2w}


def sample_scene_views(
    generator: torch.Generator,
    num_views: int,
    size: int,
    azimuth_offsets_deg: list[float] | None = None,
    max_azimuth_span_deg: float = 90.0,
    num_objects: tuple[int, int] = (2, 4),
) -> dict[str, torch.Tensor]:
    r"""
    A random scene seen from `num_views` cameras on an orbit: view 0 at a random azimuth, the others at
    `azimuth_offsets_deg` from it (or at random offsets within `max_azimuth_span_deg`).

    Returns `render_orbit`'s dict for the views (`images`, `depths`, `classes`, `intrinsics`, `c2w`) plus
    `"azimuth_offsets"` `(num_views,)` in degrees.
    """
    count = int(torch.randint(num_objects[0], num_objects[1] + 1, (), generator=generator))
    scene = random_scene(generator, count)
    start = float(torch.rand((), generator=generator)) * 360.0
    if azimuth_offsets_deg is None:
        signs = torch.where(torch.rand(num_views - 1, generator=generator) < 0.5, -1.0, 1.0)
        offsets = [0.0] + (signs * torch.rand(num_views - 1, generator=generator) * max_azimuth_span_deg).tolist()
    else:
        if len(azimuth_offsets_deg) != num_views:
            raise ValueError(f"`azimuth_offsets_deg` has {len(azimuth_offsets_deg)} entries for {num_views} views.")
        offsets = list(azimuth_offsets_deg)
    elevation = 20.0 + 15.0 * float(torch.rand((), generator=generator))
    c2w = torch.cat(
        [orbit_trajectory(1, 4.0, elevation, start + offset, 0.0, center=(0.0, -0.3, 0.0)) for offset in offsets]
    )
    intrinsics = default_intrinsics(num_views, size)
    views = render(scene, intrinsics, c2w, size, size)
    return {**views, "intrinsics": intrinsics, "c2w": c2w, "azimuth_offsets": torch.tensor(offsets)}


def sample_scene_batch(generator: torch.Generator, batch_size: int, num_views: int, size: int, **kwargs) -> dict:
    """`batch_size` scenes of [`sample_scene_views`], stacked: every tensor gains a leading batch dimension."""
    scenes = [sample_scene_views(generator, num_views, size, **kwargs) for _ in range(batch_size)]
    return {key: torch.stack([scene[key] for scene in scenes]) for key in scenes[0]}
