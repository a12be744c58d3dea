"""A real trajectory of brain-network connectivity matrices from the `brainspace` wheel's one fMRI run.

[`load_sliding_window_connectivity`]: a real trajectory of matrices. The wheel also ships one real resting-state
fMRI run (one subject, `sub-010188`, 652 volumes, resampled to the fsaverage5 surface, with its confounds) and the
fsaverage5 pial surfaces; its parcellations are on another surface (conte69), so [`parcellate_fsaverage5`] makes
one of its own: k-means of the pial vertex coordinates of each hemisphere's cortex, seeded. The parcels' mean
signals are cleaned of the confounds, z-scored, and cut into overlapping windows whose correlation matrices, shrunk
towards the identity, form the trajectory, indexed by a normalised time in [0, 1]. Reading `.mgz` and `.gii`
files needs `nibabel` (the `brain-networks` extra).
"""

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..utils import check_positive_int, is_number
from .brain_networks import INSTALL_HINT, brainspace_datasets_dir


RUN_NAME = "sub-010188_ses-02_task-rest_acq-AP_run-01"
HEMISPHERES = ("lh", "rh")
NIBABEL_HINT = (
    "reading the run's .mgz and .gii files needs nibabel: `pip install nibabel` (the `brain-networks` extra)"
)
# The parcellation's k-means restarts: the best of this many seeded initialisations is kept.
KMEANS_RESTARTS = 4


def _nibabel():
    try:
        import nibabel
    except ImportError as error:
        raise ImportError(f"{NIBABEL_HINT}.") from error
    return nibabel


def _run_files(data_dir: str | None) -> dict[str, str]:
    """The paths of the run's files (`lh`, `rh`, `confounds`, `surface_lh`, `surface_rh`), checked to exist."""
    folder = brainspace_datasets_dir() if data_dir is None else data_dir
    files = {
        "confounds": os.path.join(folder, "preprocessing", f"{RUN_NAME}_confounds.txt"),
        **{h: os.path.join(folder, "preprocessing", f"{RUN_NAME}.fsa5.{h}.mgz") for h in HEMISPHERES},
        **{f"surface_{h}": os.path.join(folder, "surfaces", f"fsa5.pial.{h}.gii") for h in HEMISPHERES},
    }
    missing = [os.path.relpath(path, folder) for path in files.values() if not os.path.isfile(path)]
    if missing:
        if data_dir is None:
            raise ImportError(f"the installed `brainspace` wheel lacks {missing} under {folder}; {INSTALL_HINT}.")
        raise ValueError(
            f"`data_dir` {data_dir!r} must be the `brainspace` wheel's datasets folder, holding {missing}."
        )
    return files


def run_num_volumes(data_dir: str | None = None) -> int:
    """The number of volumes (time points) of the fsaverage5 run, read from a file header (no data is loaded)."""
    files = _run_files(data_dir)
    return int(_nibabel().load(files["lh"]).shape[-1])


@dataclass
class Fsaverage5Run:
    """The one resting-state fMRI run the `brainspace` wheel ships, on the fsaverage5 surface (one subject).

    Args:
        timeseries (`dict[str, np.ndarray]`): `"lh"`, `"rh"` -> `(10242, volumes)` float32 signal of each vertex.
        confounds (`np.ndarray` of shape `(volumes, 29)`, float64): the nuisance regressors shipped with the run.
        coordinates (`dict[str, np.ndarray]`): `"lh"`, `"rh"` -> `(10242, 3)` float64 pial-surface vertex positions.
    """

    timeseries: dict[str, np.ndarray]
    confounds: np.ndarray
    coordinates: dict[str, np.ndarray]


def load_fsaverage5_run(data_dir: str | None = None) -> Fsaverage5Run:
    """Read the wheel's fsaverage5 run, its confounds and the fsaverage5 pial surfaces ([`Fsaverage5Run`]).

    Args:
        data_dir (`str`, *optional*): the folder holding `preprocessing/` and `surfaces/`; default the installed
            wheel's `brainspace/datasets`.
    """
    files = _run_files(data_dir)
    nibabel = _nibabel()
    timeseries, coordinates = {}, {}
    for h in HEMISPHERES:
        volume = np.asarray(nibabel.load(files[h]).dataobj, dtype=np.float32)
        timeseries[h] = volume.reshape(volume.shape[0], -1)  # (vertices, 1, 1, volumes) -> (vertices, volumes)
        surface = nibabel.load(files[f"surface_{h}"])
        points = [a.data for a in surface.darrays if a.intent == nibabel.nifti1.intent_codes["NIFTI_INTENT_POINTSET"]]
        coordinates[h] = np.asarray(points[0], dtype=np.float64)
        if coordinates[h].shape != (len(timeseries[h]), 3):
            raise ValueError(
                f"{files[f'surface_{h}']!r} has {coordinates[h].shape} vertex positions; the run has "
                f"{len(timeseries[h])} vertices."
            )
    confounds = np.loadtxt(files["confounds"], dtype=np.float64, ndmin=2)
    if len(confounds) != timeseries["lh"].shape[1] or timeseries["lh"].shape != timeseries["rh"].shape:
        raise ValueError(
            f"the run's files disagree: lh {timeseries['lh'].shape}, rh {timeseries['rh'].shape}, confounds "
            f"{confounds.shape}."
        )
    return Fsaverage5Run(timeseries=timeseries, confounds=confounds, coordinates=coordinates)


def cortex_mask(timeseries: np.ndarray) -> np.ndarray:
    """`(vertices, volumes)` -> `(vertices,)` bool: the vertices whose signal varies over the run. The run leaves the
    medial wall (no cortex) at a constant 0: 888 of the left and 881 of the right hemisphere's 10,242 vertices, the
    complement of fsaverage5's cortex label."""
    return timeseries.max(1) > timeseries.min(1)


def kmeans_parcellation(coordinates: np.ndarray, mask: np.ndarray, num_parcels: int, seed: int) -> np.ndarray:
    """`(vertices,)` int64 labels: the vertices in `mask` grouped into `num_parcels` parcels by k-means of their
    `coordinates` `(vertices, 3)` (scikit-learn's `KMeans`, the best of `KMEANS_RESTARTS` initialisations seeded by
    `seed`), numbered by their centroids from posterior to anterior (ties: inferior to superior, then x); -1 outside
    `mask`."""
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=num_parcels, n_init=KMEANS_RESTARTS, random_state=seed).fit(coordinates[mask])
    centers = kmeans.cluster_centers_
    order = np.lexsort((centers[:, 0], centers[:, 2], centers[:, 1]))  # last key first: y, then z, then x
    rank = np.empty(num_parcels, dtype=np.int64)
    rank[order] = np.arange(num_parcels)
    labels = np.full(len(coordinates), -1, dtype=np.int64)
    labels[mask] = rank[kmeans.labels_]
    return labels


def _check_num_regions(num_regions) -> None:
    check_positive_int("num_regions", num_regions, minimum=2)
    if num_regions % 2:
        raise ValueError(f"`num_regions` must be even (half per hemisphere), got {num_regions}.")


def _parcellate(run: Fsaverage5Run, num_regions: int, seed: int) -> dict[str, np.ndarray]:
    labels = {}
    for i, h in enumerate(HEMISPHERES):
        mask = cortex_mask(run.timeseries[h])
        if num_regions // 2 > mask.sum():
            raise ValueError(
                f"`num_regions` {num_regions} exceeds twice the {int(mask.sum())} cortex vertices of {h}."
            )
        parcels = kmeans_parcellation(run.coordinates[h], mask, num_regions // 2, seed)
        labels[h] = np.where(parcels >= 0, parcels + i * (num_regions // 2), -1)
    return labels


def parcellate_fsaverage5(num_regions: int = 100, seed: int = 0, data_dir: str | None = None) -> dict[str, np.ndarray]:
    """The pack's parcellation of the fsaverage5 cortex into `num_regions` regions, half per hemisphere.

    Each hemisphere's cortex ([`cortex_mask`] of the run) is cut by [`kmeans_parcellation`] of its pial vertex
    positions; regions `0 .. n/2 - 1` are the left hemisphere's, `n/2 .. n - 1` the right's. Compact, contiguous-ish
    patches of about 190 vertices each at 100 regions; they follow no functional boundary.

    Returns:
        `{"lh": (10242,), "rh": (10242,)}` int64 labels, -1 on the medial wall.
    """
    _check_num_regions(num_regions)
    check_positive_int("seed", seed, minimum=0)
    return _parcellate(load_fsaverage5_run(data_dir), num_regions, seed)


def parcel_timeseries(run: Fsaverage5Run, labels: dict[str, np.ndarray]) -> np.ndarray:
    """`(volumes, num_regions)` float64: each region's mean vertex signal."""
    num_regions = 1 + max(int(labels[h].max()) for h in HEMISPHERES)
    sums = np.zeros((num_regions, run.timeseries["lh"].shape[1]))
    counts = np.zeros(num_regions)
    for h in HEMISPHERES:
        inside = labels[h] >= 0
        one_hot = np.zeros((num_regions, int(inside.sum())))
        one_hot[labels[h][inside], np.arange(int(inside.sum()))] = 1.0
        sums += one_hot @ run.timeseries[h][inside].astype(np.float64)
        counts += one_hot.sum(1)
    return (sums / counts[:, None]).T


def clean_timeseries(series: np.ndarray, confounds: np.ndarray) -> np.ndarray:
    """`(volumes, n)` -> `(volumes, n)`: the residual of a least-squares regression on an intercept, a linear trend
    and the `confounds` `(volumes, c)`, z-scored per column (mean 0, standard deviation 1)."""
    volumes = len(series)
    design = np.column_stack([np.ones(volumes), np.linspace(-1.0, 1.0, volumes), confounds])
    # the shipped confounds hold their own intercept and trends: directions of the design weaker than 1e-9 of its
    # largest are near-repeats and are dropped (kept, they amplify rounding into the residual)
    coefficients, *_ = np.linalg.lstsq(design, series, rcond=1e-9)
    residual = series - design @ coefficients
    std = residual.std(0)
    if (std <= 1e-12 * np.abs(series).max(0).clip(min=1e-300)).any():
        column = int(np.argmin(std))
        raise ValueError(f"region {column}'s signal is explained entirely by the confounds; nothing is left.")
    return (residual - residual.mean(0)) / std


def sliding_window_starts(num_volumes: int, window: int, step: int) -> np.ndarray:
    """The first volume of each window: `0, step, 2 step, ...` while the window fits in `num_volumes`."""
    return np.arange(0, num_volumes - window + 1, step)


def sliding_window_correlations(series: np.ndarray, window: int, step: int, shrinkage: float) -> np.ndarray:
    """`(volumes, n)` -> `(num_windows, n, n)` float64: the correlation matrix `R` of each window of `window` volumes
    (starts [`sliding_window_starts`]), shrunk towards the identity, `(1 - shrinkage) R + shrinkage I`: a window
    shorter than `n + 1` volumes has a singular `R`, and the shrunk matrix keeps the unit diagonal with every
    eigenvalue at least `shrinkage`."""
    starts = sliding_window_starts(len(series), window, step)
    windows = np.stack([series[s : s + window] for s in starts])  # (num_windows, window, n)
    windows = windows - windows.mean(1, keepdims=True)
    covariance = np.einsum("wti,wtj->wij", windows, windows)
    scale = 1.0 / np.sqrt(np.diagonal(covariance, axis1=1, axis2=2))
    correlation = covariance * scale[:, :, None] * scale[:, None, :]
    correlation = (correlation + correlation.transpose(0, 2, 1)) / 2
    n = series.shape[1]
    shrunk = (1 - shrinkage) * correlation + shrinkage * np.eye(n)
    shrunk[:, np.arange(n), np.arange(n)] = 1.0
    return shrunk


def load_sliding_window_connectivity(
    num_regions: int = 100,
    window: int = 40,
    step: int = 2,
    shrinkage: float = 0.1,
    seed: int = 0,
    data_dir: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A real connectivity trajectory: sliding-window correlation matrices of the wheel's one fsaverage5 run (ONE
    subject, one run of 652 volumes), indexed by a normalised time.

    Steps: [`parcellate_fsaverage5`] (`num_regions`, `seed`); each region's mean signal ([`parcel_timeseries`]);
    regression of the shipped confounds, an intercept and a linear trend, then a z-score ([`clean_timeseries`]); the
    correlation matrix of each window of `window` volumes, every `step` volumes, shrunk towards the identity by
    `shrinkage` ([`sliding_window_correlations`]). Window `k` starting at volume `s_k` has time
    `s_k / (volumes - window)`: 0 for the first window, 1 for a window ending on the last volume.

    Args:
        num_regions (`int`, defaults to 100): regions, even (half per hemisphere).
        window (`int`, defaults to 40): volumes per window, at least 3 and at most the run's 652.
        step (`int`, defaults to 2): volumes between window starts.
        shrinkage (`float`, defaults to 0.1): weight of the identity, in [0, 1]; 0 only for windows longer than
            `num_regions` (else the matrices are singular). The default is near the Ledoit-Wolf intensity of this
            run's 40-volume windows of 100 regions (median 0.09, range 0.05-0.13), fixed rather than per window so
            that the shrinkage does not itself vary along the trajectory.
        seed (`int`, defaults to 0): the parcellation's k-means seed.
        data_dir (`str`, *optional*): the wheel's `brainspace/datasets` folder; default the installed wheel's.

    Returns:
        `(matrices, times)`: `(num_windows, num_regions, num_regions)` float64 correlation matrices (symmetric, unit
        diagonal, positive definite) and `(num_windows,)` float64 times in [0, 1], increasing.
    """
    _check_num_regions(num_regions)
    check_positive_int("window", window, minimum=3)
    check_positive_int("step", step)
    check_positive_int("seed", seed, minimum=0)
    if not is_number(shrinkage) or not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"`shrinkage` must be a number in [0, 1], got {shrinkage!r}.")
    if shrinkage == 0 and window <= num_regions:
        raise ValueError(
            f"`shrinkage` 0 needs windows longer than `num_regions` {num_regions} (a window of {window} volumes has a "
            "singular correlation matrix); give a shrinkage > 0."
        )
    volumes = run_num_volumes(data_dir)
    if window > volumes:
        raise ValueError(f"`window` must be at most the run's {volumes} volumes, got {window}.")
    run = load_fsaverage5_run(data_dir)
    labels = _parcellate(run, num_regions, seed)
    series = clean_timeseries(parcel_timeseries(run, labels), run.confounds)
    matrices = sliding_window_correlations(series, window, step, shrinkage)
    starts = sliding_window_starts(volumes, window, step)
    times = starts / (volumes - window) if volumes > window else np.zeros(len(starts))
    return torch.from_numpy(matrices), torch.from_numpy(times.astype(np.float64))
