"""Spatio-temporal epidemic data: the Boston ILI panel, a metapopulation SIR simulator, a CSV loader and windows.

Every source gives an [`EpidemicSeries`]: a `(num_steps, num_nodes)` panel of incidence (counts or rates), a
symmetric `(num_nodes, num_nodes)` 0/1 adjacency (no self loops), node names, and the population each value refers
to. [`chronological_windows`] cuts a panel into `(window, node, time)` forecasting windows split by time.

- [`load_boston_ili`]: weekly emergency-department influenza-like-illness rates per 100k for the 14 Boston
  neighbourhoods (436 weeks, 2017-12-31 to 2026-05-03) and their adjacency list, read from the data files of the
  MIT-licensed `areafluforecast` 1.2.0 wheel (install it with `pip install --no-deps areafluforecast` or the
  `[epidemics]` extra). The package is never imported (its dependencies are heavy): its files are located through its
  installed metadata, or given with `data_dir`. Missing weeks are filled by linear interpolation along the whole
  series and marked in `EpidemicSeries.observed`; forecasting windows must not read that fill (it looks ahead): pass
  `observed=` to [`chronological_windows`], which refills each window from its own past and scores observed targets
  only.
- [`simulate_metapopulation_sir`]: a stochastic SIRS epidemic on a random geometric graph of regions, coupled by a
  gravity model, with piecewise-constant transmission rates that switch regime at random times, observed through
  negative-binomial reporting noise. Its state is returned, so [`simulate_forward`] draws the true predictive
  distribution of any window.
- [`load_counts_csv`]: a user's own CSV of counts (one row per time step, one column per node) plus an adjacency
  (a square matrix CSV or a two-column edge list).
"""

import csv
import importlib.metadata
import math
import os
from dataclasses import dataclass, field

import numpy as np
from diffusers.utils import logging

from ..utils import check_positive_int, is_int, is_number


logger = logging.get_logger(__name__)


AREAFLUFORECAST = "areafluforecast"
BOSTON_FOLDER = ("sample_data", "boston")
INSTALL_HINT = (
    "install its wheel without its heavy dependencies: `pip install --no-deps areafluforecast==1.2.0` "
    '(or `pip install "diffusers-ext[epidemics]"`), or pass `data_dir=` the folder holding its boston `rates.csv` '
    "and `edges.csv`"
)


@dataclass
class EpidemicSeries:
    """A panel of incidence on a graph of regions.

    Args:
        values (`np.ndarray` of shape `(num_steps, num_nodes)`, float64): incidence per step and node (missing
            entries filled, see `observed`).
        adjacency (`np.ndarray` of shape `(num_nodes, num_nodes)`, float64): symmetric 0/1, zero diagonal.
        node_names (`list[str]`): one name per node.
        times (`list[str]`): one label per step (dates, or step numbers).
        observed (`np.ndarray` of shape `(num_steps, num_nodes)`, bool): which entries were observed.
        population (`float`): the population each value refers to (1e5 for rates per 100k).
        extra (`dict`): source-specific arrays (the simulator's states, regimes, ...).
    """

    values: np.ndarray
    adjacency: np.ndarray
    node_names: list
    times: list
    observed: np.ndarray
    population: float
    extra: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return self.values.shape[1]

    @property
    def num_steps(self) -> int:
        return self.values.shape[0]


def _check_adjacency(adjacency: np.ndarray, num_nodes: int, name: str = "adjacency") -> np.ndarray:
    adjacency = np.asarray(adjacency, dtype=np.float64)
    if adjacency.shape != (num_nodes, num_nodes):
        raise ValueError(f"`{name}` must have shape ({num_nodes}, {num_nodes}), got {adjacency.shape}.")
    if not np.all(np.isfinite(adjacency)) or np.any(adjacency < 0):
        raise ValueError(f"`{name}` must hold finite non-negative weights.")
    adjacency = ((adjacency + adjacency.T) > 0).astype(np.float64)
    np.fill_diagonal(adjacency, 0.0)
    return adjacency


def _fill_missing(values: np.ndarray) -> np.ndarray:
    """Linear interpolation along time of each column's NaNs (the ends take the nearest observed value)."""
    filled = values.copy()
    steps = np.arange(values.shape[0])
    for j in range(values.shape[1]):
        known = np.isfinite(values[:, j])
        if not known.any():
            raise ValueError(f"node column {j} has no observed value.")
        filled[:, j] = np.interp(steps, steps[known], values[known, j])
    return filled


def _read_panel(path: str) -> tuple[list, list, np.ndarray, list]:
    """`(times, node_names, values, lines)` of a CSV whose first column labels the step and the others are nodes
    (`lines`: each step's row number in the file, the header being row 1). An empty cell, `NA` or `nan` is missing
    (NaN); any other cell must be a finite number, else the error names the file, the row and the column."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or len(rows[0]) < 2:
        raise ValueError(f"{path!r} must hold a header (time, node, ...) and at least one row.")
    header = rows[0]
    body = [(line, r) for line, r in enumerate(rows[1:], start=2) if r]
    if not body:
        raise ValueError(f"{path!r} must hold a header (time, node, ...) and at least one row.")
    values = np.full((len(body), len(header) - 1), np.nan)
    for i, (line, row) in enumerate(body):
        if len(row) != len(header):
            raise ValueError(f"{path!r} row {line} has {len(row)} fields, the header {len(header)}.")
        for j, text in enumerate(row[1:]):
            text = text.strip()
            if not text or text.lower() in ("na", "nan"):
                continue
            where = f"{path!r} row {line}, column {header[j + 1]!r}"
            try:
                value = float(text)
            except ValueError:
                raise ValueError(
                    f"{where}: {text!r} is not a number (leave the cell empty or write NA for a missing value)."
                ) from None
            if not math.isfinite(value):
                raise ValueError(
                    f"{where}: {text!r} is not a finite value (leave the cell empty or write NA if it is missing)."
                )
            values[i, j] = value
    return [r[0] for _, r in body], header[1:], values, [line for line, _ in body]


def _time_positions(labels: list) -> tuple[list, str] | None:
    """Each time label as a number on one scale, and the scale's unit: ISO dates in days (in months when every date
    falls on the same day of the month), integers as steps; None for other labels (names, mixed kinds)."""
    import datetime

    try:
        dates = [datetime.date.fromisoformat(label.strip()) for label in labels]
    except ValueError:
        dates = None
    if dates is not None:
        if len({d.day for d in dates}) == 1 and len(dates) > 1:
            return [d.year * 12 + d.month for d in dates], "month"
        return [d.toordinal() for d in dates], "day"
    try:
        return [int(label) for label in labels], "step"
    except ValueError:
        return None


def _check_panel(path: str, times: list, names: list, values: np.ndarray, lines: list, time_column: str) -> None:
    """The checks of a user's panel beyond its cells: region names present and unique; time labels present, unique,
    in order and evenly spaced (a skipped date is an error: its row is added with empty cells, which are then
    filled and reported); no negative count; no region without any observed count. Each error names the file, the
    row and the column."""
    seen = {}
    for j, name in enumerate(names):
        if not name.strip():
            raise ValueError(f"{path!r} row 1, column {j + 2}: the region name is empty.")
        if name in seen:
            raise ValueError(
                f"{path!r} row 1: columns {seen[name] + 2} and {j + 2} are both named {name!r}; region names must be "
                "unique."
            )
        seen[name] = j
    first = {}
    for label, line in zip(times, lines):
        if not label.strip():
            raise ValueError(f"{path!r} row {line}, column {time_column!r}: the time label is empty.")
        if label in first:
            raise ValueError(
                f"{path!r} rows {first[label]} and {line}, column {time_column!r}: the time {label!r} appears twice."
            )
        first[label] = line
    scale = _time_positions(times)
    if scale is not None and len(times) > 1:
        positions, unit = scale
        gaps = np.diff(positions)
        for k in np.flatnonzero(gaps <= 0):
            raise ValueError(
                f"{path!r} row {lines[k + 1]}, column {time_column!r}: {times[k + 1]!r} is listed after "
                f"{times[k]!r} (row {lines[k]}) but is not later; the rows must be in time order."
            )
        values_, counts = np.unique(gaps, return_counts=True)
        step = int(values_[np.argmax(counts)])  # the panel's step: its most common spacing
        for k in np.flatnonzero(gaps != step):
            gap, here = int(gaps[k]), f"{path!r} row {lines[k + 1]}, column {time_column!r}"
            if gap % step == 0:
                raise ValueError(
                    f"{here}: {times[k + 1]!r} follows {times[k]!r} (row {lines[k]}), skipping {gap // step - 1} "
                    f"step(s) of the panel's {step} {unit}(s); add the missing rows with empty cells (they are filled "
                    "by interpolation)."
                )
            raise ValueError(
                f"{here}: {times[k + 1]!r} is {gap} {unit}(s) after {times[k]!r} (row {lines[k]}), not a multiple of "
                f"the panel's step of {step} {unit}(s)."
            )
    negative = np.argwhere(values < 0)
    if len(negative):
        i, j = negative[0]
        raise ValueError(f"{path!r} row {lines[i]}, column {names[j]!r}: {values[i, j]:g} is a negative count.")
    for j in np.flatnonzero(~np.isfinite(values).any(axis=0)):
        raise ValueError(
            f"{path!r} column {names[j]!r}: the region has no observed count (every row is empty or NA); drop the "
            "column or give at least one count."
        )


def _filled_report(path: str, times: list, names: list, values: np.ndarray, lines: list) -> dict:
    """`{region: [time labels filled]}` of the missing cells of a panel, logged as one warning."""
    filled = {names[j]: [times[i] for i in np.flatnonzero(~np.isfinite(values[:, j]))] for j in range(len(names))}
    filled = {name: labels for name, labels in filled.items() if labels}
    if filled:
        total = sum(len(labels) for labels in filled.values())
        parts = [
            f"{name!r} at {', '.join(map(repr, labels[:5]))}"
            + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
            for name, labels in filled.items()
        ]
        logger.warning(
            f"{path}: filled {total} missing count(s) by linear interpolation along time (before the first or after "
            f"the last observed count: that count): {'; '.join(parts)}."
        )
    return filled


def _read_adjacency(path: str, node_names: list, drop_unknown: bool = False) -> np.ndarray:
    """A square matrix CSV (header = node names, optional row labels) or a two-column edge list of node names; with
    `drop_unknown`, edges to nodes outside `node_names` are dropped instead of refused."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r]
    index = {name: i for i, name in enumerate(node_names)}
    adjacency = np.zeros((len(node_names), len(node_names)))
    if rows and len(rows[0]) == 2 and len(node_names) != 2:
        for a, b in rows[1:]:
            if a not in index or b not in index:
                if drop_unknown:
                    continue
                raise ValueError(f"{path!r} names a node {a!r} or {b!r} that is not among {node_names}.")
            adjacency[index[a], index[b]] = adjacency[index[b], index[a]] = 1.0
        return adjacency
    body = rows[1:] if not _is_float(rows[0][-1]) else rows
    matrix = [[float(x) for x in (r[1:] if not _is_float(r[0]) else r)] for r in body]
    return _check_adjacency(np.asarray(matrix), len(node_names), f"adjacency in {path!r}")


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def is_areafluforecast_available() -> bool:
    """Whether the `areafluforecast` wheel is installed (checked through its metadata; nothing is imported)."""
    try:
        importlib.metadata.distribution(AREAFLUFORECAST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def boston_data_dir() -> str:
    """The installed `areafluforecast` wheel's `sample_data/boston` folder; an `ImportError` if it is absent."""
    try:
        distribution = importlib.metadata.distribution(AREAFLUFORECAST)
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError(
            f"The Boston ILI data ships in the `areafluforecast` wheel, which is not installed; {INSTALL_HINT}."
        ) from error
    folder = os.path.join(str(distribution.locate_file(AREAFLUFORECAST)), *BOSTON_FOLDER)
    if not os.path.isfile(os.path.join(folder, "rates.csv")):
        raise ImportError(f"`areafluforecast` is installed but has no {folder}/rates.csv; {INSTALL_HINT}.")
    return folder


def load_boston_ili(data_dir: str | None = None) -> EpidemicSeries:
    """The weekly ED influenza-like-illness rates per 100k of Boston's 14 neighbourhoods and their adjacency.

    Args:
        data_dir (`str`, *optional*): a folder with `rates.csv` (week, one column per neighbourhood) and `edges.csv`
            (columns `a,b`); default the installed `areafluforecast` wheel's `sample_data/boston`.

    Returns:
        [`EpidemicSeries`] with `values` of shape `(436, 14)` (NaNs filled by interpolation, `observed` marks the
        reported weeks) and `population = 1e5`.
    """
    if data_dir is None:
        data_dir = boston_data_dir()
    elif not isinstance(data_dir, (str, os.PathLike)) or not os.path.isfile(os.path.join(data_dir, "rates.csv")):
        raise ValueError(f"`data_dir` must be a folder holding rates.csv and edges.csv, got {data_dir!r}.")
    times, names, values, _ = _read_panel(os.path.join(data_dir, "rates.csv"))
    # edges.csv also joins the neighbourhoods to 7 anchor nodes (surrounding towns, river, harbour): dropped
    adjacency = _read_adjacency(os.path.join(data_dir, "edges.csv"), names, drop_unknown=True)
    observed = np.isfinite(values)
    return EpidemicSeries(
        values=_fill_missing(values),
        adjacency=_check_adjacency(adjacency, len(names)),
        node_names=names,
        times=times,
        observed=observed,
        population=1e5,
    )


def load_counts_csv(counts_path: str, adjacency_path: str | None = None, population: float = 1e5) -> EpidemicSeries:
    """A user's panel: a CSV of counts (first column the time label, one column per node, empty or `NA` = missing)
    and an adjacency (a square CSV matrix, with or without a header of node names, or a two-column edge list of
    node names with a header). Without `adjacency_path` every pair of nodes is connected.

    The panel is checked before use, each error naming the file, the row and the column: region names present and
    unique; time labels present, unique, in order and (ISO dates or integers) evenly spaced, so a skipped date is
    an error (add its row with empty cells); every cell empty, `NA` or a finite count >= 0 (`inf` and `abc` are
    refused); every region with at least one count. Missing cells are filled by linear interpolation along time,
    logged as a warning and listed in `extra["filled"]` (`{region: [time labels]}`); `observed` marks the others.

    Args:
        counts_path (`str`): the counts CSV.
        adjacency_path (`str`, *optional*): the adjacency CSV.
        population (`float`, defaults to 1e5): the population the counts refer to (the mechanistic prior's `N`).
    """
    if not isinstance(counts_path, (str, os.PathLike)) or not os.path.isfile(counts_path):
        raise ValueError(f"`counts_path` must be an existing CSV file, got {counts_path!r}.")
    if adjacency_path is not None and (
        not isinstance(adjacency_path, (str, os.PathLike)) or not os.path.isfile(adjacency_path)
    ):
        raise ValueError(f"`adjacency_path` must be an existing CSV file or None, got {adjacency_path!r}.")
    if not is_number(population) or population <= 0:
        raise ValueError(f"`population` must be a positive number, got {population!r}.")
    times, names, values, lines = _read_panel(counts_path)
    with open(counts_path, newline="", encoding="utf-8") as f:
        time_column = next(csv.reader(f))[0]
    _check_panel(counts_path, times, names, values, lines, time_column)
    filled = _filled_report(counts_path, times, names, values, lines)
    if adjacency_path is None:
        adjacency = np.ones((len(names), len(names)))
    else:
        adjacency = _read_adjacency(adjacency_path, names)
    return EpidemicSeries(
        values=_fill_missing(values),
        adjacency=_check_adjacency(adjacency, len(names)),
        node_names=names,
        times=times,
        observed=np.isfinite(values),
        population=float(population),
        extra={"filled": filled},
    )


@dataclass
class MetapopulationSIR:
    """The simulator's parameters (what [`simulate_forward`] needs to continue a trajectory).

    Args:
        populations (`np.ndarray` of shape `(V,)`): each region's population.
        mixing (`np.ndarray` of shape `(V, V)`): row-stochastic contact matrix: the share of region `i`'s contacts
            made with region `j` (gravity coupling along graph edges).
        recovery_rate (`float`): per-step recovery probability rate `gamma`.
        waning_rate (`float`): per-step rate at which recovered become susceptible again.
        reporting (`float`): the reported share of new infections.
        dispersion (`float`): the negative-binomial size `k` of reports (variance `mu + mu^2 / k`).
        importation (`float`): expected imported infections per region and step.
    """

    populations: np.ndarray
    mixing: np.ndarray
    recovery_rate: float
    waning_rate: float
    reporting: float
    dispersion: float
    importation: float


def _sir_step(rng, model: MetapopulationSIR, state: np.ndarray, beta: np.ndarray):
    """One stochastic step of every trajectory. `state` `(..., V, 3)` integer (S, I, R); `beta` `(..., V)`.
    Returns `(new_state, new_infections, reports)`."""
    s, i, r = state[..., 0], state[..., 1], state[..., 2]
    prevalence = i / model.populations
    force = beta * (prevalence @ model.mixing.T) + model.importation / model.populations
    infections = rng.binomial(s, 1.0 - np.exp(-force))
    recoveries = rng.binomial(i, 1.0 - math.exp(-model.recovery_rate))
    waning = rng.binomial(r, 1.0 - math.exp(-model.waning_rate))
    new_state = np.stack([s - infections + waning, i + infections - recoveries, r + recoveries - waning], -1)
    mean = model.reporting * infections
    k = model.dispersion
    # negative binomial with mean `mean` and size `k` (a gamma-Poisson mixture)
    reports = rng.poisson(rng.gamma(k, np.maximum(mean, 1e-12) / k))
    return new_state, infections, reports


def simulate_metapopulation_sir(
    num_nodes: int = 10,
    num_steps: int = 300,
    seed: int = 0,
    mean_population: float = 1e5,
    recovery_rate: float = 0.5,
    waning_rate: float = 0.02,
    r0_range: tuple[float, float] = (1.1, 2.2),
    regime_length: int = 40,
    coupling: float = 0.2,
    reporting: float = 0.3,
    dispersion: float = 20.0,
    importation: float = 0.5,
    burn_in: int = 50,
) -> EpidemicSeries:
    """A stochastic SIRS epidemic on a graph of regions, observed through negative-binomial reports.

    Regions sit uniformly in the unit square and are joined when closer than `sqrt(2.5 / num_nodes)` (plus each
    region's nearest neighbour, so none is isolated). Region `i` makes a share `1 - coupling` of its contacts at home
    and `coupling` along its edges, split by a gravity law `P_i P_j / d_ij^2`. Each step, a susceptible of region `i`
    is infected with probability `1 - exp(-beta_i(t) sum_j M_ij I_j / N_j - importation / N_i)`; infected recover at
    rate `recovery_rate` and recovered lose immunity at `waning_rate`. The basic reproduction number
    `beta / recovery_rate` of each region is drawn uniformly from `r0_range` and switches to a new draw at
    geometric times of mean `regime_length` (the regime shifts). Reports are `NB(mean = reporting * infections,
    size = dispersion)`.

    Returns:
        [`EpidemicSeries`] of the reports `(num_steps, num_nodes)` with `population = mean_population`, whose
        `extra` holds `model` ([`MetapopulationSIR`]), `states` `(num_steps + 1, V, 3)` (the state before each
        step), `beta` `(num_steps, V)`, `expected` `(num_steps, V)` (the reports' mean) and `positions` `(V, 2)`.
    """
    check_positive_int("num_nodes", num_nodes, minimum=2)
    check_positive_int("num_steps", num_steps)
    check_positive_int("burn_in", burn_in, minimum=0)
    for name, value in (
        ("mean_population", mean_population),
        ("recovery_rate", recovery_rate),
        ("regime_length", regime_length),
        ("dispersion", dispersion),
    ):
        if not is_number(value) or value <= 0:
            raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
    for name, value in (("coupling", coupling), ("reporting", reporting)):
        if not is_number(value) or not 0 < value <= 1:
            raise ValueError(f"`{name}` must lie in (0, 1], got {value!r}.")
    if len(r0_range) != 2 or not 0 < r0_range[0] <= r0_range[1]:
        raise ValueError(f"`r0_range` must be (low, high) with 0 < low <= high, got {r0_range!r}.")
    rng = np.random.default_rng(seed)
    positions = rng.uniform(size=(num_nodes, 2))
    distance = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    adjacency = distance < math.sqrt(2.5 / num_nodes)
    nearest = np.argsort(distance + np.eye(num_nodes) * 1e9, axis=1)[:, 0]
    adjacency[np.arange(num_nodes), nearest] = True
    adjacency = _check_adjacency(adjacency.astype(float), num_nodes)
    populations = np.round(mean_population * rng.lognormal(0.0, 0.5, num_nodes) / math.exp(0.125))
    gravity = adjacency * populations[:, None] * populations[None] / np.maximum(distance, 1e-3) ** 2
    gravity = gravity / gravity.sum(1, keepdims=True)
    mixing = (1 - coupling) * np.eye(num_nodes) + coupling * gravity
    model = MetapopulationSIR(
        populations=populations,
        mixing=mixing,
        recovery_rate=float(recovery_rate),
        waning_rate=float(waning_rate),
        reporting=float(reporting),
        dispersion=float(dispersion),
        importation=float(importation),
    )
    total = burn_in + num_steps
    r0 = np.empty((total, num_nodes))
    current = rng.uniform(*r0_range, num_nodes)
    for t in range(total):
        switch = rng.uniform(size=num_nodes) < 1.0 / regime_length
        current = np.where(switch, rng.uniform(*r0_range, num_nodes), current)
        r0[t] = current
    beta = r0 * recovery_rate
    infected = np.maximum(1, np.round(populations * 1e-3))
    state = np.stack([populations - infected, infected, np.zeros(num_nodes)], -1).astype(np.int64)
    states, reports, expected = [], [], []
    for t in range(total):
        states.append(state)
        state, infections, observed = _sir_step(rng, model, state, beta[t])
        reports.append(observed)
        expected.append(model.reporting * infections)
    states.append(state)
    keep = slice(burn_in, total)
    values = np.asarray(reports[keep], dtype=np.float64)
    return EpidemicSeries(
        values=values,
        adjacency=adjacency,
        node_names=[f"region_{i}" for i in range(num_nodes)],
        times=[str(t) for t in range(num_steps)],
        observed=np.ones_like(values, dtype=bool),
        population=float(mean_population),
        extra={
            "model": model,
            "states": np.asarray(states[burn_in:]),
            "beta": beta[keep],
            "expected": np.asarray(expected[keep]),
            "positions": positions,
        },
    )


def simulate_forward(
    series: EpidemicSeries, origin: int, horizon: int, num_samples: int = 200, seed: int = 0
) -> np.ndarray:
    """Draws of the true predictive distribution of a simulated panel: `num_samples` continuations of the simulator
    from its state at step `origin` (the first forecast step), with the transmission rates it actually had.

    The regime path is taken as known (it is exogenous to the epidemic); everything else (infections, recoveries,
    waning, reporting) is redrawn. Returns reports of shape `(num_samples, num_nodes, horizon)`.
    """
    if "model" not in series.extra:
        raise ValueError("`series` must come from `simulate_metapopulation_sir` (it carries the simulator state).")
    check_positive_int("horizon", horizon)
    check_positive_int("num_samples", num_samples)
    if not is_int(origin) or not 0 <= origin or origin + horizon > series.num_steps:
        raise ValueError(
            f"`origin` must be an int with 0 <= origin and origin + horizon <= {series.num_steps}, got {origin!r}."
        )
    rng = np.random.default_rng(seed)
    model = series.extra["model"]
    state = np.repeat(series.extra["states"][origin][None], num_samples, 0)
    out = np.empty((num_samples, series.num_nodes, horizon))
    for h in range(horizon):
        state, _, reports = _sir_step(rng, model, state, series.extra["beta"][origin + h])
        out[:, :, h] = reports
    return out


@dataclass
class ForecastWindows:
    """Chronological forecasting windows of one split.

    Args:
        windows (`np.ndarray` of shape `(num_windows, num_nodes, history + horizon)`): each window's values (a
            missing history cell filled from the window's own past only, see [`chronological_windows`]).
        origins (`np.ndarray` of shape `(num_windows,)`, int): the index of each window's first forecast step
            (its history is `values[origin - history:origin]`).
        history (`int`), horizon (`int`): the window's two parts.
        observed (`np.ndarray` of shape `(num_windows, num_nodes, history + horizon)`, bool, *optional*): which of
            the window's cells were observed (`None`: all of them). Scores read only observed targets.
    """

    windows: np.ndarray
    origins: np.ndarray
    history: int
    horizon: int
    observed: np.ndarray | None = None

    def __post_init__(self):
        if self.observed is None:
            self.observed = np.ones(self.windows.shape, dtype=bool)
        elif self.observed.shape != self.windows.shape:
            raise ValueError(
                f"`observed` must have the windows' shape {self.windows.shape}, got {self.observed.shape}."
            )

    def select(self, index) -> "ForecastWindows":
        """The windows at `index` (a slice, or integer or boolean array), with their origins and masks."""
        return ForecastWindows(
            self.windows[index], self.origins[index], self.history, self.horizon, self.observed[index]
        )

    @property
    def future_observed(self) -> np.ndarray:
        """`(num_windows, num_nodes, horizon)` bool: the forecast targets that were observed (the ones to score)."""
        return self.observed[..., self.history :]

    @property
    def past(self) -> np.ndarray:
        """`(num_windows, num_nodes, history)`."""
        return self.windows[..., : self.history]

    @property
    def future(self) -> np.ndarray:
        """`(num_windows, num_nodes, horizon)`."""
        return self.windows[..., self.history :]


SPLITS = ("train", "validation", "test")


def split_bounds(num_steps: int, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> dict:
    """`{split: (start, stop)}`: consecutive time segments of `num_steps` in the proportions `fractions`."""
    if len(fractions) != 3 or any(not is_number(f) or f <= 0 for f in fractions):
        raise ValueError(f"`fractions` must be three positive numbers, got {fractions!r}.")
    total = sum(fractions)
    first = int(round(num_steps * fractions[0] / total))
    second = int(round(num_steps * (fractions[0] + fractions[1]) / total))
    return {"train": (0, first), "validation": (first, second), "test": (second, num_steps)}


def chronological_windows(
    values: np.ndarray,
    history: int,
    horizon: int,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    stride: int = 1,
    observed: np.ndarray | None = None,
) -> dict:
    """Forecast windows split by time: `{"train", "validation", "test"}` -> [`ForecastWindows`].

    The time axis is cut into three consecutive segments (60/20/20 by default). A window belongs to the split whose
    segment holds its whole forecast part; its history is the `history` steps before its origin (a validation or
    test window's history may reach into the earlier segment: it is past, so nothing leaks). Training windows lie
    entirely in the training segment, so training never sees a validation or test value.

    With `observed`, the cells it marks False are missing and are filled per window, from that window's own past:
    a history cell by linear interpolation over `values[:origin]` (observed cells only; after the last observed
    cell before the origin, that cell's value is carried forward), so no input depends on anything at or after the
    origin, whatever a panel-wide fill put there; a missing target cell is filled the same way over
    `values[:origin + horizon]` (for training windows, inside the training segment) and marked unobserved in the
    windows' `observed`, so scores skip it. Without `observed`, every cell counts as observed.

    Args:
        values (`np.ndarray` of shape `(num_steps, num_nodes)`): the panel.
        history (`int`), horizon (`int`): steps of history and of forecast per window.
        fractions (`tuple`, defaults to `(0.6, 0.2, 0.2)`): the segments' proportions.
        stride (`int`, defaults to 1): steps between consecutive origins.
        observed (`np.ndarray` of shape `(num_steps, num_nodes)`, bool, *optional*): which cells were observed
            (e.g. `EpidemicSeries.observed`).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"`values` must have shape (num_steps, num_nodes), got {values.shape}.")
    if observed is not None:
        observed = np.asarray(observed)
        if observed.shape != values.shape or observed.dtype != bool:
            raise ValueError(
                f"`observed` must be a bool array of the panel's shape {values.shape}, got "
                f"{getattr(observed, 'dtype', type(observed))} of shape {observed.shape}."
            )
        if not observed[0].all():
            raise ValueError(
                f"`observed` must mark the panel's first step observed in every node (a window's past has nothing "
                f"to fill from before it); nodes {np.flatnonzero(~observed[0]).tolist()} are missing at step 0."
            )
    check_positive_int("history", history)
    check_positive_int("horizon", horizon)
    check_positive_int("stride", stride)
    bounds = split_bounds(values.shape[0], fractions)
    out = {}
    for split in SPLITS:
        start, stop = bounds[split]
        first = max(start, history)
        origins = np.arange(first, stop - horizon + 1, stride)
        if len(origins) == 0:
            raise ValueError(
                f"the {split} segment [{start}, {stop}) of {values.shape[0]} steps holds no window of history "
                f"{history} and horizon {horizon}."
            )
        if observed is None:
            windows = np.stack([values[o - history : o + horizon].T for o in origins])
            masks = None
        else:
            windows = np.stack([_window_from_past(values, observed, o, history, horizon) for o in origins])
            masks = np.stack([observed[o - history : o + horizon].T for o in origins])
        out[split] = ForecastWindows(
            windows=windows, origins=origins, history=history, horizon=horizon, observed=masks
        )
    return out


def _window_from_past(values: np.ndarray, observed: np.ndarray, origin: int, history: int, horizon: int):
    """`(num_nodes, history + horizon)`: the window at `origin`, its missing history cells filled from
    `values[:origin]` and its missing target cells from `values[:origin + horizon]` (observed cells only)."""
    known = np.where(observed, values, np.nan)
    past = _fill_missing(known[:origin])[origin - history :]
    future = _fill_missing(known[: origin + horizon])[origin:]
    return np.concatenate([past, future]).T
