r"""An independent judge of novel views of procedural scenes: a small CNN trained here, never by the NVS models.

SemanticNVS conditions on the features of `procedural-semantic-encoder` (a DINOv2-architecture ViT trained to
classify each 4x4 patch of 32x32 views). A Fréchet distance in that space measures the method in the features it
was trained to match, so the benchmark judges in the space of a different network:

- **architecture**: a 4-layer CNN on the 16x16 views the models generate (not a ViT, not on 32x32 views);
- **objective**: whole-view scene composition and geometry (which object classes are visible, the fraction of
  the view each class covers, and a 4x4 map of log depth), not per-patch classification;
- **data**: procedural scenes from a seed range of its own (`EVALUATOR_TRAIN_SEED`), disjoint from the NVS and
  encoder training seeds (small step seeds), from the old held-out range (`10**9`) and from the benchmark's
  validation and test ranges.

Its 32-d penultimate embedding is the Fréchet feature space (as Inception's pool features are for FID), and its
own accuracy on real renders is what [`evaluator_accuracy`] reports.

    >>> judge = train_scene_evaluator(seed=0)
    >>> features = judge.embed(images)  # (N, 3, 16, 16) in [0, 1] -> (N, 32)
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..data.procedural_scenes import OBJECT_CLASSES, sample_scene_batch
from ..utils import check_positive_int


EVALUATOR_TRAIN_SEED = 2_300_000_000
EVALUATOR_HELDOUT_SEED = 2_400_000_000
NUM_OBJECT_CLASSES = len(OBJECT_CLASSES) - 1  # without the floor
NUM_REGIONS = len(OBJECT_CLASSES) + 1  # sky, floor, object classes
PRESENCE_MIN_PIXELS = 3
DEPTH_GRID = 4


class SceneEvaluator(nn.Module):
    r"""
    A CNN over `(N, 3, S, S)` views in [0, 1] (S a multiple of 4) with three heads on a shared embedding:

    - `presence` `(N, 4)`: logits that each object class is visible (at least `PRESENCE_MIN_PIXELS` pixels);
    - `regions` `(N, 6)`: logits of the fraction of the view covered by sky, floor and each object class;
    - `depth` `(N, 4, 4)`: mean log z-depth over a 4x4 grid of the view.
    """

    def __init__(self, size: int = 16, channels: int = 32, embedding_dim: int = 32):
        super().__init__()
        if size % 4 or size < 4:
            raise ValueError(f"`size` must be a positive multiple of 4, got {size}.")
        self.size = size
        self.features = nn.Sequential(
            nn.Conv2d(3, channels // 2, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(channels // 2, channels, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1),
            nn.GELU(),
        )
        self.embedding = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * (size // 4) ** 2, embedding_dim), nn.GELU()
        )
        self.presence = nn.Linear(embedding_dim, NUM_OBJECT_CLASSES)
        self.regions = nn.Linear(embedding_dim, NUM_REGIONS)
        self.depth = nn.Linear(embedding_dim, DEPTH_GRID * DEPTH_GRID)

    def _check(self, images: torch.Tensor) -> None:
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1:] != (3, self.size, self.size):
            got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"`images` must be a (N, 3, {self.size}, {self.size}) tensor, got {got}.")

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The Fréchet feature space: `(N, 3, S, S)` in [0, 1] -> `(N, embedding_dim)`."""
        self._check(images)
        return self.embedding(self.features(images * 2 - 1))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        embedding = self.embed(images)
        return {
            "presence": self.presence(embedding),
            "regions": self.regions(embedding),
            "depth": self.depth(embedding).reshape(-1, DEPTH_GRID, DEPTH_GRID),
        }


def scene_labels(classes: torch.Tensor, depths: torch.Tensor) -> dict[str, torch.Tensor]:
    r"""
    The evaluator's targets from rendered ground truth.

    Args:
        classes (`torch.Tensor` of shape `(N, S, S)`, int): class maps (-1 sky, 0 floor, 1.. object classes).
        depths (`torch.Tensor` of shape `(N, 1, S, S)`): z-depth.

    Returns:
        `{"presence": (N, 4) float 0/1, "regions": (N, 6) fractions summing to 1, "depth": (N, 4, 4) log depth}`.
    """
    if classes.ndim != 3 or depths.shape != (classes.shape[0], 1, *classes.shape[1:]):
        raise ValueError(f"`classes` (N, S, S) and `depths` (N, 1, S, S) disagree: {classes.shape}, {depths.shape}.")
    one_hot = F.one_hot(classes.long() + 1, NUM_REGIONS).float()  # sky -> 0, floor -> 1
    counts = one_hot.sum((1, 2))
    return {
        "presence": (counts[:, 2:] >= PRESENCE_MIN_PIXELS).float(),
        "regions": counts / counts.sum(-1, keepdim=True),
        "depth": F.adaptive_avg_pool2d(depths.clamp_min(1e-3).log(), DEPTH_GRID)[:, 0],
    }


def render_single_views(seed: int, count: int, size: int = 16) -> dict[str, torch.Tensor]:
    """`count` single views of random scenes from generator `seed`: `images` `(N, 3, S, S)` plus `scene_labels`."""
    batch = sample_scene_batch(torch.Generator().manual_seed(seed), count, 1, size, max_azimuth_span_deg=0.0)
    return {"images": batch["images"][:, 0], **scene_labels(batch["classes"][:, 0], batch["depths"][:, 0])}


def evaluator_loss(outputs: dict[str, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
    """Presence BCE + region-fraction cross-entropy + depth MSE."""
    presence = F.binary_cross_entropy_with_logits(outputs["presence"], labels["presence"])
    regions = -(labels["regions"] * F.log_softmax(outputs["regions"], -1)).sum(-1).mean()
    return presence + regions + F.mse_loss(outputs["depth"], labels["depth"])


def train_scene_evaluator(
    seed: int = 0,
    num_views: int = 2048,
    steps: int = 1600,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    size: int = 16,
) -> SceneEvaluator:
    """Train a [`SceneEvaluator`] on `num_views` renders from `EVALUATOR_TRAIN_SEED + seed` (init seeded by `seed`)."""
    for name, value in (("num_views", num_views), ("steps", steps), ("batch_size", batch_size)):
        check_positive_int(name, value, expected="an int >= 1")
    data = render_single_views(EVALUATOR_TRAIN_SEED + seed, num_views, size)
    torch.manual_seed(seed)
    model = SceneEvaluator(size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, num_views, (min(batch_size, num_views),), generator=generator)
        images = data["images"][index]
        flip = torch.rand(len(index), generator=generator) < 0.5  # a mirrored scene is a scene
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        labels = {k: data[k][index] for k in ("presence", "regions")}
        labels["depth"] = torch.where(flip[:, None, None], data["depth"][index].flip(-1), data["depth"][index])
        loss = evaluator_loss(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


@torch.no_grad()
def evaluator_accuracy(model: SceneEvaluator, images: torch.Tensor, labels: dict[str, torch.Tensor]) -> dict:
    r"""
    The judge's own quality on real renders `(N, 3, S, S)` with their [`scene_labels`]:

    - `presence_accuracy`: fraction of (view, class) presence calls that are right;
    - `presence_exact`: fraction of views whose 4 calls are all right;
    - `region_mae`: mean absolute error of the 6 coverage fractions;
    - `depth_r2`: coefficient of determination of the 4x4 log-depth map.
    """
    outputs = model(images)
    presence = (outputs["presence"] > 0).float() == labels["presence"]
    depth_residual = ((outputs["depth"] - labels["depth"]) ** 2).sum()
    depth_total = ((labels["depth"] - labels["depth"].mean()) ** 2).sum()
    return {
        "presence_accuracy": float(presence.float().mean()),
        "presence_exact": float(presence.all(-1).float().mean()),
        "region_mae": float((outputs["regions"].softmax(-1) - labels["regions"]).abs().mean()),
        "depth_r2": float(1 - depth_residual / depth_total),
        "views": int(images.shape[0]),
    }


@torch.no_grad()
def embed_views(model: SceneEvaluator, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """[`SceneEvaluator.embed`] over `(N, 3, S, S)` views in chunks, in float32."""
    return torch.cat([model.embed(chunk.float()) for chunk in images.split(batch_size)])


def bootstrap_frechet(
    generated: torch.Tensor,
    real: torch.Tensor,
    groups: int,
    num_bootstrap: int = 200,
    seed: int = 0,
    reference: torch.Tensor | None = None,
) -> dict:
    r"""
    Fréchet distance between generated and real features, with its standard error over the evaluated scenes.

    Args:
        generated (`torch.Tensor` of shape `(groups * k, D)`), real (`(groups * k, D)`): features of the views of
            `groups` scenes, `k` views each, scene-major; row `i` of both belongs to the same scene.
        groups (`int`): the number of scenes; the bootstrap resamples whole scenes (the views of one scene are not
            independent).
        num_bootstrap (`int`): resamples.
        reference (`torch.Tensor` of the same shape, *optional*): a second generated set (e.g. a baseline's); then
            the result also holds `relative_improvement = (FD_reference - FD) / FD_reference` and its standard
            error, with both distances on the same resampled scenes (a paired bootstrap).

    Returns:
        `{"frechet", "stderr"}` (plus `"reference_frechet"`, `"relative_improvement"`, `"relative_improvement_stderr"`).
    """
    from ..metrics import frechet_distance

    if generated.shape != real.shape or generated.ndim != 2 or generated.shape[0] % groups:
        raise ValueError(
            f"`generated` {tuple(generated.shape)} and `real` {tuple(real.shape)} must be equal "
            f"(groups * k, D) matrices with groups={groups}."
        )
    if reference is not None and reference.shape != generated.shape:
        raise ValueError(f"`reference` has shape {tuple(reference.shape)}, expected {tuple(generated.shape)}.")
    per = generated.shape[0] // groups

    def rows(scene_index):
        return (scene_index[:, None] * per + torch.arange(per)).flatten()

    def stats(index):
        fd = frechet_distance(generated[index], real[index])
        if reference is None:
            return fd, None
        return fd, frechet_distance(reference[index], real[index])

    fd, ref = stats(torch.arange(generated.shape[0]))
    generator = torch.Generator().manual_seed(seed)
    samples, improvements = [], []
    for _ in range(num_bootstrap):
        b_fd, b_ref = stats(rows(torch.randint(0, groups, (groups,), generator=generator)))
        samples.append(b_fd)
        if reference is not None:
            improvements.append((b_ref - b_fd) / b_ref)
    result = {"frechet": fd, "stderr": float(torch.tensor(samples).std())}
    if reference is not None:
        result |= {
            "reference_frechet": ref,
            "relative_improvement": (ref - fd) / ref,
            "relative_improvement_stderr": float(torch.tensor(improvements).std()),
        }
    return result
