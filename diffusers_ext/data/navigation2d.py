"""Navigation2D: a 2-D trajectory world of sparse circular obstacles, random start/goal pairs and smooth demonstrations.

The map is the square `[-1, 1]^2`. A trajectory is `(H, 2)` waypoints joined by straight segments; it collides when a
segment passes within an obstacle's radius of its centre (exact segment-circle distance) or a waypoint leaves the
map. Demonstrations are cubic Bezier curves from start to goal with random lateral bends, kept only where they avoid
the (0-2) training obstacles; test maps place unseen obstacles across the straight start-goal line, in four families
(`TEST_MAP_FAMILIES`: scattered discs, a wall with a gap, a slalom, a boulder).
"""

import heapq
import math

import numpy as np
import torch

from ..utils import check_positive_int


HORIZON = 32
BEND = 0.4  # lateral offset of the Bezier control points, as a fraction of the start-goal distance


def _check_trajectories(name: str, trajectories: torch.Tensor) -> None:
    if not isinstance(trajectories, torch.Tensor) or trajectories.ndim != 3 or trajectories.shape[-1] != 2:
        raise ValueError(f"`{name}` must be a (B, H, 2) tensor, got {getattr(trajectories, 'shape', trajectories)!r}.")


def _check_obstacles(obstacles: torch.Tensor) -> None:
    if not isinstance(obstacles, torch.Tensor) or obstacles.ndim != 2 or obstacles.shape[-1] != 3:
        raise ValueError(
            f"`obstacles` must be a (K, 3) tensor of (x, y, radius), got {getattr(obstacles, 'shape', obstacles)!r}."
        )


def segment_clearance(trajectories: torch.Tensor, obstacles: torch.Tensor) -> torch.Tensor:
    """Signed clearance `(B, H - 1, K)` of every segment to every obstacle: distance from the centre to the segment
    minus the radius (negative: the segment enters the disc). Differentiable in `trajectories` `(B, H, 2)`."""
    _check_trajectories("trajectories", trajectories)
    _check_obstacles(obstacles)
    p, q = trajectories[:, :-1, None, :], trajectories[:, 1:, None, :]
    c, r = obstacles[None, None, :, :2].to(trajectories), obstacles[None, None, :, 2].to(trajectories)
    d = q - p
    s = ((c - p) * d).sum(-1) / (d * d).sum(-1).clamp_min(1e-12)
    closest = p + s.clamp(0, 1)[..., None] * d
    return (c - closest).norm(dim=-1) - r


def collides(trajectories: torch.Tensor, obstacles: torch.Tensor) -> torch.Tensor:
    """`(B,)` bool: whether a segment enters an obstacle or a waypoint leaves the map `[-1, 1]^2` (exact)."""
    outside = (trajectories.abs() > 1).any(-1).any(-1)
    if obstacles.shape[0] == 0:
        return outside
    return outside | (segment_clearance(trajectories, obstacles) < 0).flatten(1).any(1)


def collision_cost(trajectories: torch.Tensor, obstacles: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """`(B,)` distance-like violation: summed penetration `relu(margin - clearance)` of every segment and obstacle,
    plus how far waypoints leave the map; 0 exactly when collision-free with `margin`. Differentiable."""
    cost = torch.relu(trajectories.abs() - 1).sum((1, 2))
    if obstacles.shape[0]:
        cost = cost + torch.relu(margin - segment_clearance(trajectories, obstacles)).sum((1, 2))
    return cost


def path_length(trajectories: torch.Tensor) -> torch.Tensor:
    """`(B,)` polyline length."""
    return (trajectories[:, 1:] - trajectories[:, :-1]).norm(dim=-1).sum(1)


def jerk(trajectories: torch.Tensor) -> torch.Tensor:
    """`(B,)` mean squared third difference of the waypoints (smoothness; lower is smoother)."""
    return trajectories.diff(n=3, dim=1).pow(2).sum(-1).mean(1)


def bezier_paths(start: torch.Tensor, goal: torch.Tensor, bends: torch.Tensor, horizon: int = HORIZON) -> torch.Tensor:
    """Cubic Bezier paths `(B, horizon, 2)` from `start` to `goal` (`(B, 2)` each), the control points at 1/3 and 2/3
    of the line pushed sideways by `bends` `(B, 2)` times the start-goal distance."""
    line = goal - start
    normal = torch.stack([-line[:, 1], line[:, 0]], dim=1)
    p1 = start + line / 3 + bends[:, :1] * normal
    p2 = start + 2 * line / 3 + bends[:, 1:] * normal
    s = torch.linspace(0, 1, horizon)[None, :, None]
    return (
        (1 - s) ** 3 * start[:, None]
        + 3 * (1 - s) ** 2 * s * p1[:, None]
        + 3 * (1 - s) * s**2 * p2[:, None]
        + s**3 * goal[:, None]
    )


def random_start_goal(count: int, generator: torch.Generator, min_distance: float = 0.8):
    """`(start, goal)`, `(count, 2)` each, uniform in `[-0.9, 0.9]^2` and at least `min_distance` apart."""
    starts, goals = [], []
    while sum(len(s) for s in starts) < count:
        s = torch.rand(4 * count, 2, generator=generator) * 1.8 - 0.9
        g = torch.rand(4 * count, 2, generator=generator) * 1.8 - 0.9
        keep = (g - s).norm(dim=1) >= min_distance
        starts.append(s[keep])
        goals.append(g[keep])
    return torch.cat(starts)[:count], torch.cat(goals)[:count]


def make_demonstrations(num: int, horizon: int = HORIZON, seed: int = 0, max_obstacles: int = 2) -> torch.Tensor:
    """`num` smooth demonstrations `(num, horizon, 2)`: Bezier paths between random start/goal pairs, each in its own
    sparse map of 0..`max_obstacles` random discs it avoids (bends resampled until collision-free)."""
    check_positive_int("num", num)
    generator = torch.Generator().manual_seed(seed)
    start, goal = random_start_goal(num, generator)
    out = torch.empty(num, horizon, 2)
    todo = torch.arange(num)
    counts = torch.randint(0, max_obstacles + 1, (num,), generator=generator)
    centres = torch.rand(num, max_obstacles, 2, generator=generator) * 1.6 - 0.8
    discs = torch.cat([centres, 0.08 + 0.1 * torch.rand(num, max_obstacles, 1, generator=generator)], -1)
    for _ in range(50):
        bends = (torch.rand(len(todo), 2, generator=generator) * 2 - 1) * BEND
        paths = bezier_paths(start[todo], goal[todo], bends, horizon)
        ok = ~(paths.abs() > 1).any(-1).any(-1)
        for k in range(max_obstacles):
            active = counts[todo] > k
            centre, radius = discs[todo, k, :2], discs[todo, k, 2]
            p, q = paths[:, :-1], paths[:, 1:]
            d = q - p
            s = ((centre[:, None] - p) * d).sum(-1) / (d * d).sum(-1).clamp_min(1e-12)
            dist = (centre[:, None] - (p + s.clamp(0, 1)[..., None] * d)).norm(dim=-1).min(1).values
            ok &= ~active | (dist > radius)
        out[todo[ok]] = paths[ok]
        todo = todo[~ok]
        if len(todo) == 0:
            break
    if len(todo):  # start or goal inside a disc: keep the obstacle-free bend
        out[todo] = bezier_paths(start[todo], goal[todo], torch.zeros(len(todo), 2), horizon)
    return out


def demonstration_statistics(count: int = 2000, seed: int = 12345) -> tuple[float, torch.Tensor]:
    """The scale of `count` demonstrations ([`make_demonstrations`] with `seed`): `(std, covariance (H, H))`, the
    covariance over the waypoints with both coordinates pooled (float64). They are the last-jump prior of
    `DoobGuidance`'s rollouts (`data_std`, or `data_covariance` for draws as smooth as the demonstrations)."""
    demos = make_demonstrations(count, seed=seed)  # (N, H, 2)
    rows = demos.transpose(1, 2).reshape(-1, demos.shape[1]).double()
    rows = rows - rows.mean(0)
    return float(demos.std()), rows.T @ rows / (len(rows) - 1)


TEST_MAP_FAMILIES = ("discs", "wall", "slalom", "boulder")
"""The test map families (every obstacle a disc, every map with the straight start-goal line blocked and a feasible
path): `"discs"`, `num_obstacles` discs (radius 0.1-0.2) scattered near the line; `"wall"`, a barrier of small
discs across the whole map, perpendicular to the line, with one gap away from the line; `"slalom"`, four discs
(radius 0.10-0.14) along the line, alternately just left and right of it; `"boulder"`, one large disc (radius
0.3-0.4) on the line with a smaller disc against one of its flanks, so the two ways round differ in length."""


def make_test_map(
    generator: torch.Generator, num_obstacles: int = 3, min_clearance: float = 0.08, family: str = "discs"
):
    """One test map of `family` (see `TEST_MAP_FAMILIES`): `(start (2,), goal (2,), obstacles (K, 3))`, unseen
    obstacles that block the straight start-goal line, clear of start and goal by `min_clearance`, inside the map
    (the wall may leave it), with a collision-free path (`shortest_path_length` finite) for every family but
    `"discs"` (whose maps keep the first releases' draws). `num_obstacles` is read by `"discs"` only."""
    if family not in TEST_MAP_FAMILIES:
        raise ValueError(f"`family` must be one of {TEST_MAP_FAMILIES}, got {family!r}.")
    check_positive_int("num_obstacles", num_obstacles)
    while True:
        start, goal = random_start_goal(1, generator, min_distance=1.2)
        start, goal = start[0], goal[0]
        line = goal - start
        normal = torch.stack([-line[1], line[0]]) / line.norm()
        if family == "discs":
            obstacles = _scattered_discs(generator, start, line, normal, num_obstacles)
        elif family == "wall":
            obstacles = _wall_with_gap(generator, start, line, normal)
        elif family == "slalom":
            obstacles = _slalom(generator, start, line, normal)
        else:
            obstacles = _boulder(generator, start, line, normal)
        centres, radii = obstacles[:, :2], obstacles[:, 2]
        ends = torch.stack([start, goal])
        clear = ((ends[:, None] - centres[None]).norm(dim=-1) - radii[None]).min() > min_clearance
        if family == "wall":  # the wall runs off the map on purpose; its gap must lie inside
            inside = True
        else:
            inside = bool((centres.abs() + radii[:, None] < 1).all())
        if not (clear and inside):
            continue
        if family != "discs":
            blocked = bool(collides(torch.stack([start, goal])[None], obstacles)[0])
            if not blocked or not math.isfinite(shortest_path_length(start, goal, obstacles)):
                continue
        return start, goal, obstacles


def _uniform(generator: torch.Generator, low: float, high: float, size: int = 1) -> torch.Tensor:
    return low + (high - low) * torch.rand(size, generator=generator)


def _scattered_discs(generator, start, line, normal, num_obstacles):
    fractions = 0.25 + 0.5 * torch.rand(num_obstacles, generator=generator)
    offsets = (torch.rand(num_obstacles, generator=generator) * 2 - 1) * 0.1
    radii = 0.1 + 0.1 * torch.rand(num_obstacles, generator=generator)
    centres = start + fractions[:, None] * line + offsets[:, None] * normal
    return torch.cat([centres, radii[:, None]], dim=1)


def _wall_with_gap(generator, start, line, normal, radius: float = 0.06, spacing: float = 0.09, gap: float = 0.14):
    """Discs every `spacing` along the normal through a point at 40-60% of the line, over the whole map, except a gap
    of half-width `gap` (clear width about 0.16) centred 0.25-0.6 to one side of the line."""
    fraction = _uniform(generator, 0.4, 0.6)
    side = 1.0 if torch.rand(1, generator=generator).item() < 0.5 else -1.0
    gap_offset = side * _uniform(generator, 0.25, 0.6)
    offsets = torch.arange(-3.0, 3.0 + 1e-6, spacing)
    offsets = offsets[(offsets - gap_offset).abs() > gap + radius]
    centres = start + fraction * line + offsets[:, None] * normal
    on_map = (centres.abs() - radius < 1).all(dim=1)
    centres = centres[on_map]
    return torch.cat([centres, torch.full((len(centres), 1), radius)], dim=1)


def _slalom(generator, start, line, normal):
    fractions = torch.tensor([0.2, 0.4, 0.6, 0.8]) + _uniform(generator, -0.03, 0.03, 4)
    first = 1.0 if torch.rand(1, generator=generator).item() < 0.5 else -1.0
    sides = first * torch.tensor([1.0, -1.0, 1.0, -1.0])
    offsets = sides * _uniform(generator, 0.06, 0.1, 4)
    radii = _uniform(generator, 0.10, 0.14, 4)
    centres = start + fractions[:, None] * line + offsets[:, None] * normal
    return torch.cat([centres, radii[:, None]], dim=1)


def _boulder(generator, start, line, normal):
    radius = _uniform(generator, 0.3, 0.4)
    centre = start + _uniform(generator, 0.4, 0.6) * line + _uniform(generator, -0.1, 0.1) * normal
    side = 1.0 if torch.rand(1, generator=generator).item() < 0.5 else -1.0
    flank_radius = _uniform(generator, 0.12, 0.18)
    flank = centre + side * (radius + 0.5 * flank_radius) * normal
    return torch.stack([torch.cat([centre, radius]), torch.cat([flank, flank_radius])])


def shortest_path_length(start, goal, obstacles, resolution: int = 161) -> float:
    """Length of the shortest collision-free path (A* on an 8-connected `resolution^2` grid of `[-1, 1]^2`, then
    greedy line-of-sight shortcutting with the exact segment check); `inf` when the grid has no path."""
    start, goal = torch.as_tensor(start, dtype=torch.float64), torch.as_tensor(goal, dtype=torch.float64)
    obstacles = torch.as_tensor(obstacles, dtype=torch.float64)
    axis = np.linspace(-1, 1, resolution)
    xx, yy = np.meshgrid(axis, axis, indexing="ij")
    free = np.ones_like(xx, dtype=bool)
    for cx, cy, r in obstacles.tolist():
        free &= (xx - cx) ** 2 + (yy - cy) ** 2 > r**2
    to_cell = lambda p: tuple(int(round((float(v) + 1) / 2 * (resolution - 1))) for v in p)  # noqa: E731
    s, g = to_cell(start), to_cell(goal)
    h = lambda c: math.dist(c, g)  # noqa: E731
    best, parent, queue = {s: 0.0}, {s: None}, [(h(s), s)]
    moves = [(dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1) if dx or dy]
    while queue:
        _, cell = heapq.heappop(queue)
        if cell == g:
            break
        for dx, dy in moves:
            n = (cell[0] + dx, cell[1] + dy)
            if not (0 <= n[0] < resolution and 0 <= n[1] < resolution) or not free[n]:
                continue
            cost = best[cell] + math.hypot(dx, dy)
            if cost < best.get(n, math.inf):
                best[n], parent[n] = cost, cell
                heapq.heappush(queue, (cost + h(n), n))
    if g not in parent:
        return math.inf
    cells = []
    while g is not None:
        cells.append(g)
        g = parent[g]
    points = [start] + [torch.tensor([axis[i], axis[j]]) for i, j in reversed(cells[1:-1])] + [goal]
    path, i = [points[0]], 0
    while i < len(points) - 1:
        j = len(points) - 1
        while j > i + 1:
            segment = torch.stack([points[i], points[j]])[None]
            if not collides(segment, obstacles)[0]:
                break
            j -= 1
        path.append(points[j])
        i = j
    return float(path_length(torch.stack(path)[None])[0])
