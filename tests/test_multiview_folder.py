"""Multi-view captures from a folder or a `datasets` dataset: layout, camera bookkeeping of crop and resize, errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from diffusers_ext.data.multiview_folder import MultiViewSceneDataset
from diffusers_ext.data.procedural_scenes import default_intrinsics, random_scene, render
from diffusers_ext.geometry.camera import orbit_trajectory


def _views(seed, height, width, num_views=3):
    """Procedural views rendered at `height` x `width`, with their intrinsics and poses."""
    scene = random_scene(torch.Generator().manual_seed(seed), num_objects=2)
    c2w = orbit_trajectory(num_views, 4.0, 25.0, 10.0 * seed, 60.0, center=(0.0, -0.3, 0.0))
    intrinsics = default_intrinsics(num_views, min(height, width))
    intrinsics[:, 0, 2], intrinsics[:, 1, 2] = width / 2, height / 2
    return scene, intrinsics, c2w, render(scene, intrinsics, c2w, height, width)


def _write_scene(folder, intrinsics, c2w, views, depth=True):
    (folder / "images").mkdir(parents=True)
    (folder / "depths").mkdir()
    frames = []
    for i in range(len(c2w)):
        pixels = (views["images"][i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(folder / "images" / f"{i:03d}.png")
        frame = {"image": f"images/{i:03d}.png", "intrinsics": intrinsics[i].tolist(), "c2w": c2w[i].tolist()}
        if depth:
            np.save(folder / "depths" / f"{i:03d}.npy", views["depths"][i, 0].numpy())
            frame["depth"] = f"depths/{i:03d}.npy"
        frames.append(frame)
    (folder / "cameras.json").write_text(json.dumps({"frames": frames}))


def test_folder_crop_keeps_the_cameras_consistent(tmp_path):
    # A 16x24 capture center-cropped to 16x16 is the 16x16 render with the principal point moved by the crop.
    scene, intrinsics, c2w, wide = _views(0, 16, 24)
    _write_scene(tmp_path / "a", intrinsics, c2w, wide)
    data = MultiViewSceneDataset.from_folder(str(tmp_path), resolution=16)
    assert len(data) == 1 and data.has_depth
    item = data[0]
    assert item["images"].shape == (3, 3, 16, 16) and item["depths"].shape == (3, 1, 16, 16)
    square = render(scene, item["intrinsics"], c2w, 16, 16)
    assert (item["images"] - square["images"]).abs().max() <= 1 / 255 + 1e-6  # PNG quantisation only
    torch.testing.assert_close(item["depths"], square["depths"])
    torch.testing.assert_close(item["c2w"], c2w)


def test_folder_resize_scales_the_intrinsics(tmp_path):
    scene, intrinsics, c2w, big = _views(1, 32, 32)
    _write_scene(tmp_path / "a", intrinsics, c2w, big)
    item = MultiViewSceneDataset.from_folder(str(tmp_path), resolution=16)[0]
    torch.testing.assert_close(item["intrinsics"], default_intrinsics(3, 16))
    small = render(scene, item["intrinsics"], c2w, 16, 16)
    # antialiased downsampling vs point sampling: they agree once the checker's aliasing is averaged out
    pooled = torch.nn.functional.avg_pool2d
    assert (pooled(item["images"], 4) - pooled(small["images"], 4)).abs().mean() < 0.03
    # nearest-neighbour depth sits half a source pixel off the target pixel centre when halving
    assert ((item["depths"] - small["depths"]).abs() / small["depths"]).median() < 0.03
    assert set(item) == {"images", "intrinsics", "c2w", "depths"}


def test_sample_batch_is_seeded_and_views_are_distinct(tmp_path):
    for seed in range(2):
        _, intrinsics, c2w, views = _views(seed, 8, 8, num_views=4)
        _write_scene(tmp_path / f"scene{seed}", intrinsics, c2w, views)
    data = MultiViewSceneDataset.from_folder(str(tmp_path), resolution=8)
    first = data.sample_batch(torch.Generator().manual_seed(3), 5, 3)
    again = data.sample_batch(torch.Generator().manual_seed(3), 5, 3)
    assert first["images"].shape == (5, 3, 3, 8, 8) and first["depths"].shape == (5, 3, 1, 8, 8)
    for key in first:
        torch.testing.assert_close(first[key], again[key])
    positions = first["c2w"][..., :3, 3]
    assert (torch.cdist(positions, positions) + torch.eye(3) > 1e-4).all()  # three different cameras per scene
    with pytest.raises(ValueError, match="has 4 views; `num_views` is 5"):
        data.sample_batch(torch.Generator().manual_seed(0), 1, 5)


def test_datasets_rows_match_the_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    _, intrinsics, c2w, views = _views(2, 8, 8)
    _write_scene(tmp_path / "a", intrinsics, c2w, views)
    folder = MultiViewSceneDataset.from_folder(str(tmp_path), resolution=8)[0]
    images = [Image.open(tmp_path / "a" / "images" / f"{i:03d}.png") for i in range(3)]
    rows = datasets.Dataset.from_dict(
        {
            "images": [images],
            "intrinsics": [intrinsics.tolist()],
            "c2w": [c2w.tolist()],
            "depths": [views["depths"][:, 0].numpy().tolist()],
        }
    )
    row = MultiViewSceneDataset.from_dataset(rows, resolution=8)[0]
    for key in folder:
        torch.testing.assert_close(row[key], folder[key])
    # images as integer arrays (as `datasets` stores them without an Image feature) read the same
    arrays = datasets.Dataset.from_dict(
        {
            "images": [[np.asarray(image).tolist() for image in images]],
            "intrinsics": [intrinsics.tolist()],
            "c2w": [c2w.tolist()],
        }
    )
    torch.testing.assert_close(MultiViewSceneDataset.from_dataset(arrays, resolution=8)[0]["images"], folder["images"])
    no_depth = MultiViewSceneDataset.from_dataset(rows.remove_columns("depths"), resolution=8)
    assert not no_depth.has_depth and "depths" not in no_depth[0]
    with pytest.raises(ValueError, match="lacks the columns \\['c2w'\\]"):
        MultiViewSceneDataset.from_dataset(rows.remove_columns("c2w"), resolution=8)


def test_bad_captures_are_named(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        MultiViewSceneDataset.from_folder(str(tmp_path / "missing"), resolution=8)
    with pytest.raises(ValueError, match="has no scene folder with a cameras.json"):
        MultiViewSceneDataset.from_folder(str(tmp_path), resolution=8)
    _, intrinsics, c2w, views = _views(0, 8, 8)
    c2w = c2w.clone()
    c2w[1, :3, :3] *= 2  # not a rotation
    _write_scene(tmp_path / "a", intrinsics, c2w, views, depth=False)
    data = MultiViewSceneDataset.from_folder(str(tmp_path), resolution=8)
    assert not data.has_depth
    with pytest.raises(ValueError, match="scene 0 c2w"):
        data[0]
    with pytest.raises(ValueError, match="`resolution` must be a positive int"):
        MultiViewSceneDataset.from_folder(str(tmp_path), resolution=0)
    with pytest.raises(TypeError, match="datasets.Dataset"):
        MultiViewSceneDataset.from_dataset([1, 2], resolution=8)
