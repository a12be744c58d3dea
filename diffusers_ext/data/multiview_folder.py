r"""Posed multi-view captures (images, intrinsics, camera-to-world poses, optional depth) for novel view synthesis,
read from a folder or from a 🤗 `datasets` dataset, and served as batches of the same form as the procedural scenes'
([`~data.procedural_scenes.sample_scene_batch`]).

Folder layout, one sub-folder per scene (sorted by name):

```
root/
  scene_a/
    cameras.json
    images/000.png ...
    depths/000.npy ...        (optional)
  scene_b/ ...
```

`cameras.json` lists the scene's views:

```json
{"frames": [{"image": "images/000.png", "intrinsics": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]],
             "c2w": [[...], [...], [...], [0, 0, 0, 1]], "depth": "depths/000.npy"}, ...]}
```

Paths are relative to the scene folder. Conventions are those of [`~geometry.camera`]: OpenCV axes,
camera-to-world `(4, 4)` rigid poses, intrinsics in pixels of the stored image, and depth as positive z-depth
`(H, W)` (`.npy`) at the image's resolution.

A `datasets.Dataset` has one row per scene with the columns `"images"` (a list of images), `"intrinsics"` (a list of
3x3 nested lists), `"c2w"` (a list of 4x4 nested lists) and optionally `"depths"` (a list of `(H, W)` arrays).

Every view is center-cropped to a square and resized to `resolution` (the intrinsics follow the crop and the
resize; depth is resized with nearest-neighbour sampling so that no depth is invented across edges).
"""

import json
import os

import numpy as np
import torch
import torch.nn.functional as F

from ..geometry.camera import check_intrinsics, check_rigid
from ..utils import check_positive_int


CAMERAS_FILE = "cameras.json"
REQUIRED_COLUMNS = ("images", "intrinsics", "c2w")


def _square_view(image: torch.Tensor, intrinsics: torch.Tensor, depth: torch.Tensor | None, resolution: int):
    """Center-crop `(3, H, W)` (and its `(1, H, W)` depth) to a square, resize to `resolution`, adapt `(3, 3)` K."""
    _, h, w = image.shape
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    image = image[:, top : top + side, left : left + side]
    intrinsics = intrinsics.clone()
    intrinsics[0, 2] -= left
    intrinsics[1, 2] -= top
    scale = resolution / side
    intrinsics[:2] *= scale
    if side != resolution:
        image = F.interpolate(
            image[None],
            size=(resolution, resolution),
            mode="bilinear",
            align_corners=False,
            antialias=side > resolution,
        )[0].clamp(0, 1)
    if depth is not None:
        depth = depth[:, top : top + side, left : left + side]
        if side != resolution:
            # nearest at pixel centres: source pixel floor((i + 0.5) * side / resolution)
            index = ((torch.arange(resolution) + 0.5) * side / resolution).long().clamp(max=side - 1)
            depth = depth[:, index][:, :, index]
    return image, intrinsics, depth


class MultiViewSceneDataset(torch.utils.data.Dataset):
    r"""
    Posed multi-view scenes for novel view synthesis. Build it with [`~MultiViewSceneDataset.from_folder`] or
    [`~MultiViewSceneDataset.from_dataset`]; `dataset[i]` is scene `i` with all of its views, and
    [`~MultiViewSceneDataset.sample_batch`] draws training batches.

    Args:
        scenes (`list`): one loader per scene, a callable returning `(images, intrinsics, c2w, depths)`: a list of
            `(3, H, W)` float images in [0, 1], `(V, 3, 3)` and `(V, 4, 4)` tensors, and a list of `(1, H, W)`
            depths or `None`.
        resolution (`int`): side of the square views served.
        has_depth (`bool`): whether every scene has depth.
    """

    def __init__(self, scenes: list, resolution: int, has_depth: bool):
        check_positive_int("resolution", resolution)
        if not scenes:
            raise ValueError("`scenes` is empty: a multi-view dataset needs at least one scene.")
        self._scenes = scenes
        self.resolution = resolution
        self.has_depth = has_depth

    # ------------------------------------------------------------------------------------------ builders
    @classmethod
    def from_folder(cls, root: str, resolution: int) -> "MultiViewSceneDataset":
        """Scenes from `root/<scene>/cameras.json` (see the module docstring); scenes are sorted by folder name."""
        if not os.path.isdir(root):
            raise ValueError(f"`root` {root!r} is not a folder.")
        names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, CAMERAS_FILE)))
        if not names:
            raise ValueError(f"`root` {root!r} has no scene folder with a {CAMERAS_FILE}.")
        frames_per_scene = []
        for name in names:
            path = os.path.join(root, name, CAMERAS_FILE)
            with open(path, encoding="utf-8") as f:
                frames = json.load(f).get("frames")
            if not isinstance(frames, list) or not frames:
                raise ValueError(f"{path}: expected a non-empty list under 'frames'.")
            for i, frame in enumerate(frames):
                missing = [k for k in ("image", "intrinsics", "c2w") if k not in frame]
                if missing:
                    raise ValueError(f"{path}: frame {i} lacks {missing}.")
            frames_per_scene.append((os.path.join(root, name), frames))
        with_depth = [all("depth" in frame for frame in frames) for _, frames in frames_per_scene]
        return cls([_FolderScene(folder, frames) for folder, frames in frames_per_scene], resolution, all(with_depth))

    @classmethod
    def from_dataset(cls, dataset, resolution: int) -> "MultiViewSceneDataset":
        """Scenes from a `datasets.Dataset` with one row per scene and the columns `"images"`, `"intrinsics"`,
        `"c2w"` and optionally `"depths"` (see the module docstring)."""
        columns = getattr(dataset, "column_names", None)
        if columns is None:
            raise TypeError(f"`dataset` must be a datasets.Dataset, got {type(dataset).__name__}.")
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"`dataset` lacks the columns {missing}; it has {columns}.")
        if len(dataset) == 0:
            raise ValueError("`dataset` has no rows (scenes).")
        return cls([_RowScene(dataset, i) for i in range(len(dataset))], resolution, "depths" in columns)

    # ------------------------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self._scenes)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Scene `index`: `"images"` `(V, 3, R, R)` in [0, 1], `"intrinsics"` `(V, 3, 3)`, `"c2w"` `(V, 4, 4)` and,
        with depth, `"depths"` `(V, 1, R, R)`."""
        images, intrinsics, c2w, depths = self._scenes[index]()
        where = f"scene {index}"
        if intrinsics.shape != (len(images), 3, 3) or c2w.shape != (len(images), 4, 4):
            raise ValueError(
                f"{where}: {len(images)} images but intrinsics {tuple(intrinsics.shape)} and c2w {tuple(c2w.shape)}; "
                f"expected ({len(images)}, 3, 3) and ({len(images)}, 4, 4)."
            )
        check_intrinsics(intrinsics, f"{where} intrinsics")
        check_rigid(c2w, f"{where} c2w")
        out_images, out_intrinsics, out_depths = [], [], []
        for view, image in enumerate(images):
            depth = None if depths is None else depths[view]
            if depth is not None:
                if depth.shape != (1, *image.shape[1:]):
                    raise ValueError(
                        f"{where}, view {view}: depth {tuple(depth.shape[1:])} does not match the image "
                        f"{tuple(image.shape[1:])}."
                    )
                if not torch.isfinite(depth).all() or (depth <= 0).any():
                    raise ValueError(f"{where}, view {view}: depth must be finite and positive.")
            image, k, depth = _square_view(image, intrinsics[view], depth, self.resolution)
            out_images.append(image)
            out_intrinsics.append(k)
            out_depths.append(depth)
        scene = {"images": torch.stack(out_images), "intrinsics": torch.stack(out_intrinsics), "c2w": c2w}
        if depths is not None:
            scene["depths"] = torch.stack(out_depths)
        return scene

    def sample_batch(self, generator: torch.Generator, batch_size: int, num_views: int) -> dict[str, torch.Tensor]:
        r"""
        Draw `batch_size` scenes (with replacement) and `num_views` distinct views of each, in random order (view 0
        serves as the input view in training), all from `generator`.

        Returns:
            `dict` with `"images"` `(B, num_views, 3, R, R)` in [0, 1], `"intrinsics"` `(B, num_views, 3, 3)`,
            `"c2w"` `(B, num_views, 4, 4)` and, with depth, `"depths"` `(B, num_views, 1, R, R)`.
        """
        if batch_size < 1 or num_views < 1:
            raise ValueError(f"`batch_size` and `num_views` must be >= 1, got {batch_size} and {num_views}.")
        picks = torch.randint(0, len(self), (batch_size,), generator=generator).tolist()
        scenes = []
        for index in picks:
            scene = self[index]
            available = scene["images"].shape[0]
            if available < num_views:
                raise ValueError(f"scene {index} has {available} views; `num_views` is {num_views}.")
            views = torch.randperm(available, generator=generator)[:num_views]
            scenes.append({key: value[views] for key, value in scene.items()})
        return {key: torch.stack([scene[key] for scene in scenes]) for key in scenes[0]}


def _to_image_tensor(image) -> torch.Tensor:
    """A PIL image, or an `(H, W, 3)` array (integers in [0, 255] or floats in [0, 1]), as a `(3, H, W)` float
    tensor in [0, 1]."""
    array = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"an image must be RGB (H, W, 3), got an array of shape {array.shape}.")
    pixels = array.astype(np.float32) / (255.0 if np.issubdtype(array.dtype, np.integer) else 1.0)
    if pixels.min() < 0 or pixels.max() > 1:
        raise ValueError(
            f"image values must lie in [0, 255] (integers) or [0, 1] (floats); got [{pixels.min()}, {pixels.max()}]."
        )
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def _to_depth_tensor(depth) -> torch.Tensor:
    array = np.asarray(depth, dtype=np.float32)
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2:
        raise ValueError(f"a depth map must be (H, W), got an array of shape {array.shape}.")
    return torch.from_numpy(array)[None]


class _FolderScene:
    def __init__(self, folder: str, frames: list[dict]):
        self.folder, self.frames = folder, frames

    def __call__(self):
        from PIL import Image

        images, depths = [], []
        for frame in self.frames:
            with Image.open(os.path.join(self.folder, frame["image"])) as image:
                images.append(_to_image_tensor(image))
            if "depth" in frame:
                depths.append(_to_depth_tensor(np.load(os.path.join(self.folder, frame["depth"]), allow_pickle=False)))
        intrinsics = torch.tensor([frame["intrinsics"] for frame in self.frames], dtype=torch.float32)
        c2w = torch.tensor([frame["c2w"] for frame in self.frames], dtype=torch.float32)
        return images, intrinsics, c2w, (depths if len(depths) == len(images) else None)


class _RowScene:
    def __init__(self, dataset, index: int):
        self.dataset, self.index = dataset, index

    def __call__(self):
        row = self.dataset[self.index]
        images = [_to_image_tensor(image) for image in row["images"]]
        intrinsics = torch.tensor(np.asarray(row["intrinsics"], dtype=np.float32))
        c2w = torch.tensor(np.asarray(row["c2w"], dtype=np.float32))
        depths = row.get("depths")
        return images, intrinsics, c2w, (None if depths is None else [_to_depth_tensor(d) for d in depths])
