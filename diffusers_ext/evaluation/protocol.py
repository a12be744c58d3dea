"""The measurement protocol's small shared pieces (benchmarks/README.md): computed targets, cache keys, error bars.

Every benchmark builds its `summary.targets` rows with [`target`], reports spreads with [`mean_spread`] and
[`binomial_standard_error`], keys any cache with [`settings_code_hash`] and calibrates detectors on real data with
[`calibrate_threshold`], instead of keeping its own near-copy of each.
"""

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence

from ..utils import check_positive_int


COMPARISONS = (">=", "<=")


def target(name: str, value: float, threshold: float, comparison: str = ">=") -> dict:
    """One computed `summary.targets` row: `{"name", "value", "threshold", "comparison", "met"}`.

    `met` is `value >= threshold` (or `<=`), computed here so no script writes a verdict by hand. A non-finite
    `value` (a run that produced no number) is never met.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
    if comparison not in COMPARISONS:
        raise ValueError(f"`comparison` must be one of {COMPARISONS}, got {comparison!r}.")
    value, threshold = float(value), float(threshold)
    if not math.isfinite(threshold):
        raise ValueError(f"`threshold` must be finite, got {threshold!r}.")
    met = math.isfinite(value) and (value >= threshold if comparison == ">=" else value <= threshold)
    return {"name": name, "value": value, "threshold": threshold, "comparison": comparison, "met": bool(met)}


def targets_met(targets: Sequence[dict]) -> tuple[int, int]:
    """`(met, total)` of a `summary.targets` list."""
    for row in targets:
        missing = {"name", "value", "threshold", "met"} - set(row)
        if missing:
            raise ValueError(f"target row {row!r} lacks {sorted(missing)}.")
    return sum(bool(row["met"]) for row in targets), len(targets)


def targets_status(targets: Sequence[dict]) -> str:
    """The phrase a README status line carries for a results file: `"N of M targets met"`."""
    met, total = targets_met(targets)
    return f"{met} of {total} targets met"


def mean_spread(values: Iterable[float]) -> dict:
    """`{"mean", "std", "sem", "n", "values"}` of repeated measurements (seeds, layouts).

    `std` is the sample standard deviation (ddof=1; 0 for one value) and `sem = std / sqrt(n)` the standard error
    of the mean across the repeats.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("`values` must hold at least one number.")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "sem": std / math.sqrt(n), "n": n, "values": values}


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict:
    """The mean difference `a - b` of two methods scored on the same units (seeds, prompts, maps), with the paired
    standard error: the standard error of the per-unit differences, `std(a_i - b_i) / sqrt(n)`.

    Use it whenever unit `i` of both methods shares its randomness (the same seed, generator or input): the shared
    part cancels in `a_i - b_i`, which the unpaired SE ([`unpaired_difference`]) would count twice.

    Returns:
        `{"difference", "sem", "z", "n", "pairing": "paired", "values"}`: `z` is `difference / sem` (+-inf or 0 for a
        zero `sem`), `values` the per-unit differences.
    """
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"`a` and `b` must hold one score per shared unit each, got {len(a)} and {len(b)} scores.")
    spread = mean_spread([x - y for x, y in zip(a, b)])
    return _difference(spread["mean"], spread["sem"], spread["n"], "paired", spread["values"])


def unpaired_difference(a: dict, b: dict) -> dict:
    """The difference of the means of two independent sets of repeats, `a["mean"] - b["mean"]` (each a
    [`mean_spread`] dict), with the unpaired standard error `sqrt(sem_a^2 + sem_b^2)`. For methods whose repeats
    share nothing; where they share seeds or inputs, use [`paired_difference`].

    Returns:
        `{"difference", "sem", "z", "n", "pairing": "unpaired"}` (`n`: the smaller repeat count).
    """
    sem = math.sqrt(a["sem"] ** 2 + b["sem"] ** 2)
    return _difference(a["mean"] - b["mean"], sem, min(a["n"], b["n"]), "unpaired")


def _difference(difference: float, sem: float, n: int, pairing: str, values: list[float] | None = None) -> dict:
    if sem > 0:
        z = difference / sem
    else:
        z = math.inf if difference > 0 else (-math.inf if difference < 0 else 0.0)
    result = {"difference": difference, "sem": sem, "z": z, "n": n, "pairing": pairing}
    if values is not None:
        result["values"] = values
    return result


def binomial_standard_error(rate: float, count: int) -> float:
    """Standard error `sqrt(p (1 - p) / n)` of a success rate `p` measured on `n` independent trials."""
    check_positive_int("count", count)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"`rate` must lie in [0, 1], got {rate!r}.")
    return math.sqrt(rate * (1.0 - rate) / count)


def calibrate_threshold(scores: Iterable[float], detect_fraction: float = 0.95) -> float:
    """The detector threshold that detects `detect_fraction` of real objects.

    `scores` holds, for each real object, the largest threshold at which the detector still finds it; the returned
    threshold is their `1 - detect_fraction` quantile (lower interpolation), so at least `detect_fraction` of the
    real objects score at or above it.
    """
    scores = sorted(float(s) for s in scores)
    if not scores:
        raise ValueError("`scores` must hold at least one real object's score.")
    if not 0.0 < detect_fraction <= 1.0:
        raise ValueError(f"`detect_fraction` must lie in (0, 1], got {detect_fraction!r}.")
    index = int(math.floor((1.0 - detect_fraction) * (len(scores) - 1)))
    return scores[index]


def settings_code_hash(settings: dict, code_paths: Iterable[str | os.PathLike]) -> str:
    """A SHA-256 hex key of every setting and of the source files that produce a result.

    A cache keyed by it is reused only when nothing that could change the result changed: `settings` (any
    JSON-serialisable mapping, keys sorted) and the bytes of each file in `code_paths` (a folder contributes every
    `.py` file under it, in sorted order).
    """
    if not isinstance(settings, dict):
        raise TypeError(f"`settings` must be a dict, got {type(settings).__name__}.")
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode())
    files = []
    for path in code_paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ValueError(f"`code_paths` entry {path!r} is neither a file nor a folder.")
    for path in files:
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()
