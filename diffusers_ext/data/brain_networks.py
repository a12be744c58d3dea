"""Brain-network connectivity: real HCP matrices read from the `brainspace` wheel, and a world with a known truth.

- [`load_group_connectivity`], [`load_individual_connectivity`]: the Human Connectome Project resting-state
  functional connectivity (correlation) matrices that the `brainspace` 0.3.0 wheel ships: group means of a main and a
  hold-out group (Schaefer and Vos de Wael parcellations, 100-400 regions) and single subjects' matrices (3 per
  parcellation and size, 24 in all, from 20 subjects). The package is never imported (its dependencies are heavy):
  its files are located through its installed metadata (`pip install --no-deps brainspace==0.3.0`), or given with
  `data_dir`. The data stays in the wheel; nothing is copied into this repository.
- [`ConnectivityWorld`]: subject correlation matrices with a known covariate-dependent law, around a group mean.
  A subject of age `a` in [0, 1] and sex `s` in {0, 1} draws a template, "young" (the group mean) with probability
  `1 - a` and "old" with probability `a`, and its matrix is the sample correlation of `dof(s)` time points drawn
  from `N(0, template)` (a Wishart draw normalised to unit diagonal: what a scan of that many time points
  estimates). The old template is the group mean dedifferentiated, `(1 - lambda) C + lambda C_uniform` with
  `C_uniform` the matrix of its mean off-diagonal correlation (within-network connectivity falls and between-network
  connectivity rises with age); `dof` differs by sex (more time points, less spread). So the conditional law is a
  two-component mixture whose weights move with age and whose spread moves with sex: a conditional mean alone does
  not describe it.
- The real fMRI run's sliding-window trajectory: `diffusers_ext.data.brain_network_trajectory`.
"""

import importlib.metadata
import os
import re
from dataclasses import dataclass

import numpy as np
import torch

from ..utils import check_positive_int, is_number


BRAINSPACE = "brainspace"
MATRICES_FOLDER = "matrices"
PARCELLATIONS = ("schaefer", "vosdewael")
SIZES = (100, 200, 300, 400)
GROUPS = ("main", "holdout")
INSTALL_HINT = (
    "install its wheel without its dependencies: `pip install --no-deps brainspace==0.3.0`, or pass `data_dir=` the "
    "wheel's brainspace/datasets/matrices folder"
)


def is_brainspace_available() -> bool:
    """Whether the `brainspace` wheel is installed (checked through its metadata; nothing is imported)."""
    try:
        importlib.metadata.distribution(BRAINSPACE)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def brainspace_datasets_dir() -> str:
    """The installed `brainspace` wheel's `datasets` folder; an `ImportError` if the wheel is absent."""
    try:
        distribution = importlib.metadata.distribution(BRAINSPACE)
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError(
            f"The HCP matrices and the fsaverage5 run ship in the `brainspace` wheel, which is not installed; "
            f"{INSTALL_HINT}."
        ) from error
    return os.path.join(str(distribution.locate_file(BRAINSPACE)), "datasets")


def brainspace_data_dir() -> str:
    """The installed `brainspace` wheel's `datasets/matrices` folder; an `ImportError` if it is absent."""
    folder = os.path.join(brainspace_datasets_dir(), MATRICES_FOLDER)
    if not os.path.isdir(os.path.join(folder, "main_group")):
        raise ImportError(f"`brainspace` is installed but has no {folder}/main_group; {INSTALL_HINT}.")
    return folder


def _check_parcellation(parcellation: str, num_regions: int) -> None:
    if parcellation not in PARCELLATIONS:
        raise ValueError(f"`parcellation` must be one of {PARCELLATIONS}, got {parcellation!r}.")
    if num_regions not in SIZES:
        raise ValueError(f"`num_regions` must be one of {SIZES}, got {num_regions!r}.")


def _read_matrix(path: str) -> np.ndarray:
    matrix = np.loadtxt(path, delimiter=",", dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{path!r} does not hold a square matrix (shape {matrix.shape}).")
    return (matrix + matrix.T) / 2


def load_group_connectivity(
    parcellation: str = "schaefer", num_regions: int = 100, group: str = "main", data_dir: str | None = None
) -> np.ndarray:
    """The HCP group-mean functional connectivity, `(num_regions, num_regions)` float64, a correlation matrix.

    Args:
        parcellation (`str`, defaults to `"schaefer"`): `"schaefer"` or `"vosdewael"`.
        num_regions (`int`, defaults to 100): 100, 200, 300 or 400.
        group (`str`, defaults to `"main"`): `"main"` or `"holdout"` (two disjoint groups of subjects).
        data_dir (`str`, *optional*): the folder holding `main_group/` etc.; default the installed wheel's.
    """
    _check_parcellation(parcellation, num_regions)
    if group not in GROUPS:
        raise ValueError(f"`group` must be one of {GROUPS}, got {group!r}.")
    folder = brainspace_data_dir() if data_dir is None else data_dir
    return _read_matrix(
        os.path.join(folder, f"{group}_group", f"{parcellation}_{num_regions}_mean_connectivity_matrix.csv")
    )


def load_individual_connectivity(
    parcellation: str = "schaefer", num_regions: int = 100, data_dir: str | None = None
) -> dict[str, np.ndarray]:
    """The single HCP subjects' functional connectivity matrices of one parcellation: `{"HCP_<id>_<rank>":
    (num_regions, num_regions) float64}` (three subjects per parcellation and size, named by the wheel's files)."""
    _check_parcellation(parcellation, num_regions)
    folder = os.path.join(brainspace_data_dir() if data_dir is None else data_dir, "individual")
    pattern = re.compile(rf"^(HCP_\d+_[a-z]+)_{parcellation}_{num_regions}\.csv$")
    out = {}
    for name in sorted(os.listdir(folder)):
        match = pattern.match(name)
        if match:
            out[match.group(1)] = _read_matrix(os.path.join(folder, name))
    if not out:
        raise ValueError(f"no individual matrix for {parcellation}_{num_regions} in {folder!r}.")
    return out


def to_correlation(covariance: torch.Tensor) -> torch.Tensor:
    """`(..., n, n)` covariance -> correlation (unit diagonal, symmetric)."""
    scale = torch.diagonal(covariance, dim1=-2, dim2=-1).rsqrt()
    correlation = covariance * scale[..., :, None] * scale[..., None, :]
    return (correlation + correlation.transpose(-1, -2)) / 2


@dataclass
class WorldDraw:
    """Draws of [`ConnectivityWorld.sample`].

    Args:
        matrices (`torch.Tensor` of shape `(batch, n, n)`, float64): correlation matrices.
        covariates (`torch.Tensor` of shape `(batch, 2)`, float32): `(age, sex)` of each.
        components (`torch.Tensor` of shape `(batch,)`, long): the template drawn (0 young, 1 old).
    """

    matrices: torch.Tensor
    covariates: torch.Tensor
    components: torch.Tensor


class ConnectivityWorld:
    """The known conditional law of subject correlation matrices given `(age, sex)` (module docstring).

    Args:
        group_mean (`np.ndarray` or `torch.Tensor` of shape `(n, n)`): the young template, a correlation matrix
            (e.g. [`load_group_connectivity`]).
        dedifferentiation (`float`, defaults to 0.5): `lambda` of the old template.
        time_points (`tuple[int, int]`, defaults to `(300, 150)`): `dof` for sex 0 and sex 1 (each > n).
    """

    def __init__(self, group_mean, dedifferentiation: float = 0.5, time_points: tuple[int, int] = (300, 150)):
        young = torch.as_tensor(np.asarray(group_mean), dtype=torch.float64)
        n = young.shape[0]
        if young.ndim != 2 or young.shape != (n, n):
            raise ValueError(f"`group_mean` must be a square matrix, got shape {tuple(young.shape)}.")
        if not is_number(dedifferentiation) or not 0.0 <= dedifferentiation <= 1.0:
            raise ValueError(f"`dedifferentiation` must lie in [0, 1], got {dedifferentiation!r}.")
        if len(time_points) != 2:
            raise ValueError(f"`time_points` must hold two counts (sex 0, sex 1), got {time_points!r}.")
        for count in time_points:
            check_positive_int("time_points", count)
            if count <= n:
                raise ValueError(f"`time_points` must exceed the matrix size {n} (a singular draw), got {count}.")
        young = to_correlation(young)
        mean_off = (young.sum() - n) / (n * (n - 1))
        uniform = torch.full_like(young, float(mean_off))
        uniform.fill_diagonal_(1.0)
        old = (1 - dedifferentiation) * young + dedifferentiation * uniform
        self.templates = torch.stack([young, old])  # (2, n, n)
        self.factors = torch.linalg.cholesky(self.templates)
        self.time_points = tuple(int(c) for c in time_points)
        self.num_regions = n

    def old_probability(self, age: torch.Tensor) -> torch.Tensor:
        """`P(old template | age)`: the age itself (ages in [0, 1])."""
        return age.clamp(0.0, 1.0)

    def check_covariates(self, covariates) -> torch.Tensor:
        covariates = torch.as_tensor(covariates, dtype=torch.float32)
        if covariates.ndim != 2 or covariates.shape[1] != 2:
            raise ValueError(f"`covariates` must have shape (batch, 2) of (age, sex), got {tuple(covariates.shape)}.")
        age, sex = covariates[:, 0], covariates[:, 1]
        if not torch.isfinite(age).all() or (age < 0).any() or (age > 1).any():
            raise ValueError("`covariates[:, 0]` (age) must lie in [0, 1].")
        if not ((sex == 0) | (sex == 1)).all():
            raise ValueError("`covariates[:, 1]` (sex) must be 0 or 1.")
        return covariates

    def sample(self, covariates, generator: torch.Generator | None = None) -> WorldDraw:
        """One subject per row of `covariates` `(batch, 2)`: `(age in [0, 1], sex in {0, 1})`."""
        covariates = self.check_covariates(covariates)
        batch, n = len(covariates), self.num_regions
        components = (torch.rand(batch, generator=generator, dtype=torch.float64) < covariates[:, 0].double()).long()
        matrices = torch.empty(batch, n, n, dtype=torch.float64)
        for i in range(batch):
            count = self.time_points[int(covariates[i, 1])]
            series = torch.randn(count, n, generator=generator, dtype=torch.float64) @ self.factors[components[i]].T
            series = series - series.mean(0)
            matrices[i] = to_correlation(series.T @ series)
        return WorldDraw(matrices=matrices, covariates=covariates, components=components)

    def random_covariates(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`(batch, 2)` covariates: age uniform on [0, 1], sex a fair coin."""
        check_positive_int("batch", batch)
        age = torch.rand(batch, generator=generator)
        sex = (torch.rand(batch, generator=generator) < 0.5).float()
        return torch.stack([age, sex], dim=1)


MATRICES_FILE = "matrices.npy"
COVARIATES_FILE = "covariates.csv"


def load_matrix_folder(folder: str) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """A user's folder of connectivity matrices: `matrices.npy`, a finite float `(N, n, n)` array (N >= 2), and
    optionally `covariates.csv`, a header of covariate names and one row of numbers per matrix, in the same order.

    Returns:
        `(matrices (N, n, n) float64, covariates (N, c) float32 or None, covariate names)`. Anything else is a
        `ValueError` naming the file and what was expected, before any training (whether the matrices are valid
        correlation or SPD matrices is the codec's check).
    """
    import csv

    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        raise ValueError(f"the matrix folder {folder!r} is not a folder.")
    path = os.path.join(folder, MATRICES_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{folder!r} must hold {MATRICES_FILE}: a numpy.save of an (N, n, n) array of matrices.")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{path!r} is not a plain numpy array: {error}") from error
    if array.ndim != 3 or array.shape[1] != array.shape[2] or array.shape[0] < 2 or array.shape[1] < 2:
        raise ValueError(f"{path!r} must hold an (N >= 2, n, n) array of square matrices, got shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
        raise ValueError(f"{path!r} must hold finite floating-point values (dtype {array.dtype}).")
    matrices = torch.from_numpy(array.astype(np.float64))
    path = os.path.join(folder, COVARIATES_FILE)
    if not os.path.isfile(path):
        return matrices, None, []
    with open(path, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if row]
    if not rows or not all(name.strip() for name in rows[0]):
        raise ValueError(f"{path!r} must start with a header naming each covariate.")
    names, body = [name.strip() for name in rows[0]], rows[1:]
    if len(body) != len(matrices):
        raise ValueError(f"{path!r} has {len(body)} rows but {MATRICES_FILE} holds {len(matrices)} matrices.")
    values = np.empty((len(body), len(names)), dtype=np.float32)
    for i, row in enumerate(body):
        if len(row) != len(names):
            raise ValueError(f"{path!r} row {i + 2} has {len(row)} fields, the header {len(names)}.")
        for j, text in enumerate(row):
            try:
                values[i, j] = float(text)
            except ValueError:
                raise ValueError(f"{path!r} row {i + 2}, column {names[j]!r}: {text!r} is not a number.") from None
    if not np.isfinite(values).all():
        raise ValueError(f"{path!r} holds NaN or inf covariates.")
    return matrices, torch.from_numpy(values), names
