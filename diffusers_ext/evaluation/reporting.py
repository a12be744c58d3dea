"""The benchmarks' shared reporting: command line, results files, cache, validation grid and worker pool.

Every script in `benchmarks/` measures its method and hands the numbers to these helpers, so the parts that are the
same everywhere are written once (benchmarks/README.md, "The measurement protocol"):

- [`command`]: the `command` string a results file records (`python benchmarks/<script> <argv>`).
- [`write_results`]: `<stem>.json` and `<stem>.md`, the Markdown with the standard header (title, command, date
  and settings line), one targets table ([`targets_table`]) and the script's own sections, plus its figures.
- [`rebuild_results`]: `--from_results PATH` (added by [`add_from_results_argument`]); the script's target rows
  rebuilt from a results file's recorded measurements, without measuring again.
- [`ResultCache`]: a folder of finished work keyed by every setting and the code ([`protocol.settings_code_hash`]).
- [`choose_on_validation`]: measure a grid on the validation split, freeze the best, measure the test split once.
- [`run_jobs`]: run independent jobs in this process or in a pool of spawned worker processes.

Target rows themselves are built by [`protocol.target`]; nothing here decides whether a target is met.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..utils import check_positive_int
from .protocol import settings_code_hash, targets_status


T = TypeVar("T")

JSON_INDENT = 1
_TARGET_FIELDS = ("name", "value", "comparison", "threshold", "met")


def command(script: str, argv: Sequence[str] | None = None, omit: Sequence[str] = ()) -> str:
    """The command a results file records: `"python benchmarks/<method>/<script> <argv...>"`.

    Args:
        script (`str`): the script's path (`__file__`): the part below its `benchmarks` folder is kept
            (`/repo/benchmarks/soar/soar.py` -> `benchmarks/soar/soar.py`); a bare file name is kept as it is.
        argv (`Sequence[str]`, *optional*): the arguments the script was given; `None` reads `sys.argv[1:]`.
        omit (`Sequence[str]`, *optional*): options that only say where files go (e.g. `--output_dir`), left out with
            their value (`--opt VALUE` or `--opt=VALUE`), so the recorded command names no folder of one machine.
    """
    if not isinstance(script, str) or not script.endswith(".py"):
        raise ValueError(f"`script` must be a `.py` file name, got {script!r}.")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not all(isinstance(a, str) for a in argv):
        raise TypeError(f"`argv` must hold strings, got {argv!r}.")
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in omit:
            skip = True
        elif not any(arg.startswith(f"{option}=") for option in omit):
            kept.append(arg)
    return " ".join(["python", _benchmark_path(script), *kept])


def _benchmark_path(script: str) -> str:
    """`benchmarks/<...>/<script>.py`: the path of `script` from its nearest `benchmarks` folder, in `/` form."""
    parts = os.path.abspath(script).split(os.sep)
    if not os.path.dirname(script) or "benchmarks" not in parts:
        return f"benchmarks/{parts[-1]}"
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("benchmarks") :])


def load_script(path: str, name: str | None = None):
    """The benchmark script at `path` as a module (benchmarks/ is not a package), for a script that reuses another's
    measurements or helpers, and for the tests. `name` defaults to the file's base name."""
    import importlib.util

    if not os.path.isfile(path):
        raise ValueError(f"`path` must be a benchmark script, got {path!r} (no such file).")
    name = name or os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_training_script(repo: str, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run `training/<name>.py argv` of the checkout at `repo` in a fresh interpreter from `repo` (as a user runs
    it), with this process's environment (so the same thread limits) updated by `env`; return the script's stderr
    (where its log goes). A failure raises `RuntimeError` with the command and the script's last error lines."""
    import subprocess

    script = os.path.join(repo, "training", f"{name}.py")
    if not os.path.isfile(script):
        raise ValueError(f"`name` must name a script of {os.path.join(repo, 'training')}, got {name!r}.")
    path = os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    environment = {**os.environ, "PYTHONPATH": path, **(env or {})}
    command = [sys.executable, os.path.join("training", f"{name}.py"), *map(str, argv)]
    result = subprocess.run(command, cwd=repo, env=environment, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stderr


def checkout_commit(path: str | os.PathLike) -> str | None:
    """The commit of a reference checkout (a public repository run beside the package, never committed): `git log`,
    or for an exported tree without `.git` the id in a `REVISION` file in it or one of its two parents (e.g.
    `git -C MIRROR log -1 --format=%H > TREE/REVISION`); `None` when neither says."""
    import subprocess

    path = str(path)
    for folder in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        revision = os.path.join(folder, "REVISION")
        if os.path.isfile(revision):
            with open(revision) as f:
                return f.read().strip()
    try:
        return subprocess.run(
            ["git", "-C", path, "log", "-1", "--format=%H"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def without_machine_paths(text: str) -> str:
    """`text` (a recorded command, a folder) with every absolute path token replaced by its last component, so a
    results file names no folder of one machine: `"--output_dir /tmp/runs/x4"` -> `"--output_dir x4"`."""
    return " ".join(os.path.basename(os.path.normpath(t)) if os.path.isabs(t) else t for t in text.split(" "))


def _cell(text: Any) -> str:
    """A Markdown table cell: `|` escaped and newlines flattened, so a name cannot break the table."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _number(value: float) -> str:
    value = float(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def targets_table(targets: Sequence[dict]) -> list[str]:
    """The Markdown lines of one targets table: target, value, the comparison and threshold, met (`yes` / `no`).

    Every row must carry `name, value, comparison, threshold, met` (as [`protocol.target`] builds it).
    """
    lines = ["| target | value | threshold | met |", "| --- | --- | --- | --- |"]
    for row in targets:
        missing = [k for k in _TARGET_FIELDS if k not in row]
        if missing:
            raise ValueError(f"target row {row!r} lacks {missing}; build rows with `protocol.target`.")
        lines.append(
            f"| {_cell(row['name'])} | {_number(row['value'])} | {row['comparison']} {_number(row['threshold'])} "
            f"| {'yes' if row['met'] else 'no'} |"
        )
    return lines


def add_from_results_argument(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add `--<prefix>from_results PATH`: rebuild the targets and the report from a results file, measuring nothing."""
    parser.add_argument(
        f"--{prefix}from_results",
        type=str,
        default=None,
        metavar="PATH",
        help="Measure nothing: rebuild summary.targets and the Markdown report from the measurements recorded in "
        "this results JSON, and write them (with the file's own command, and a `rebuilt_from_results` field).",
    )


def _same_number(a, b) -> bool:
    """Whether a recorded number `a` and a rebuilt one `b` agree; a recorded `None` (no number) is a non-finite `b`."""
    if a is None:
        return not math.isfinite(float(b))
    a, b = float(a), float(b)
    return a == b or (math.isfinite(a) and math.isclose(a, b, rel_tol=1e-12))


def rebuild_results(
    path: str,
    targets_of: Callable[[dict], list[dict]],
    rel_to: str | None = None,
    replaced: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """The results in `path` with `summary.targets` rebuilt by `targets_of(results)` from the recorded measurements.

    The rebuilt rows must give the same `value`, `threshold` and `met` as the recorded ones (row by row, in order,
    by name), so a rebuild only adds what the old rows lacked (e.g. `comparison`; a recorded `None` value becomes the non-finite value
    `protocol.target` never meets; a threshold recorded as text, e.g. `">= 0.99"`, is not compared); anything else raises a `ValueError`. The returned results
    keep their `command` and gain `rebuilt_from_results = {"file", "sha256"}`.

    Args:
        path (`str`): the results JSON to rebuild from.
        targets_of (`Callable[[dict], list[dict]]`): the script's target rows as a function of its results.
        rel_to (`str`, *optional*): the file is recorded relative to this folder (default: as given).
        replaced (`Mapping[str, Sequence[str]]`, *optional*): recorded rows that the script now writes differently
            (e.g. a two-sided condition split into one row per comparison): recorded name to the new rows' names.
            Those rows are not compared; the mapping is recorded in `rebuilt_from_results.replaced_rows`.
    """
    if not os.path.isfile(path):
        raise ValueError(f"`path` must be an existing results JSON, got {path!r}.")
    with open(path, "rb") as f:
        raw = f.read()
    results = json.loads(raw)
    replaced = dict(replaced or {})
    recorded = results.get("summary", {}).get("targets", [])
    new = targets_of(results)
    added = {name for names in replaced.values() for name in names}
    old = [row for row in recorded if row["name"] not in replaced]
    kept = [row for row in new if row["name"] not in added]
    missing = sorted(set(replaced) - {row["name"] for row in recorded}) + sorted(added - {row["name"] for row in new})
    if missing:
        raise ValueError(f"{path}: `replaced` names rows that are not there: {missing}.")
    if [row["name"] for row in kept] != [row["name"] for row in old]:
        raise ValueError(
            f"{path}: rebuilt rows {[r['name'] for r in kept]} differ from the recorded {[r['name'] for r in old]}."
        )
    for before, after in zip(old, kept):
        same = _same_number(before["value"], after["value"]) and (
            isinstance(before["threshold"], str) or _same_number(before["threshold"], after["threshold"])
        )
        if not same or bool(before["met"]) != after["met"]:
            raise ValueError(f"{path}: rebuilt target {after} differs from the recorded {before}.")
    results["summary"]["targets"] = new
    file = os.path.relpath(path, rel_to) if rel_to is not None else path
    results["rebuilt_from_results"] = {"file": file, "sha256": hashlib.sha256(raw).hexdigest()}
    if replaced:
        results["rebuilt_from_results"]["replaced_rows"] = {name: list(names) for name, names in replaced.items()}
    return results


def write_results(
    stem: str,
    results: dict,
    title: str,
    sections: Iterable[str] = (),
    settings_line: str | None = None,
    figures: Mapping[str, Callable[[str], None]] | None = None,
) -> dict:
    """Write `<stem>.json` and `<stem>.md` (and each figure beside them); returns `results`.

    The Markdown is: `# title`, the command (and the `--from_results` rebuild, if any) with the date, the optional
    settings line, `## Targets: N of M targets met` with [`targets_table`] of `results["summary"]["targets"]`, the
    script's own `sections` (Markdown lines), then the figures.

    Args:
        stem (`str`): path without extension, e.g. `benchmarks/soar/results/soar`; its folder is created.
        results (`dict`): JSON-serialisable; `command` and `summary.targets` are required.
        title (`str`): the report's title.
        sections (`Iterable[str]`): the script's own Markdown lines, after the targets table.
        settings_line (`str`, *optional*): one line naming the settings that matter for reading the numbers.
        figures (`Mapping[str, Callable[[str], None]]`, *optional*): file suffix (e.g. `".png"`, `"_sweep.png"`) to
            a function drawing that figure at the path it is given.
    """
    if "command" not in results or "targets" not in results.get("summary", {}):
        raise ValueError("`results` must carry `command` and `summary.targets`.")
    folder = os.path.dirname(os.path.abspath(stem))
    os.makedirs(folder, exist_ok=True)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=JSON_INDENT)
        f.write("\n")
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    header = f"Command: `{results['command']}`"
    rebuilt = results.get("rebuilt_from_results")
    if rebuilt:
        header += f"; report rebuilt with `--from_results {rebuilt['file']}` on {today}"
    else:
        header += f" ({today})"
    lines = [f"# {title}", "", header, ""]
    if settings_line:
        lines += [settings_line, ""]
    targets = results["summary"]["targets"]
    lines += [f"## Targets: {targets_status(targets)}", "", *targets_table(targets), ""]
    lines += list(sections)
    figures = dict(figures or {})
    if figures:
        lines.append("")
    base = os.path.basename(stem)
    for suffix, draw in figures.items():
        draw(stem + suffix)
        lines.append(f"![{base}{suffix}]({base}{suffix})")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    return results


class ResultCache:
    """A folder of finished work (JSON records, weight files) keyed by every setting and the code that made it.

    The key is [`protocol.settings_code_hash`] of `settings` and `code_paths`; entries live in
    `<folder>/<key[:20]>/`, so a changed setting or source file starts an empty cache. `enabled=False` reads
    nothing (every lookup misses) but still writes.

    Args:
        folder (`str`): the cache root (e.g. `benchmarks/.cache/<benchmark>`, ignored by git).
        settings (`dict`): every setting the cached work depends on (JSON-serialisable).
        code_paths (`Iterable[str]`): source files or folders (and weight files) whose bytes the work depends on.
        enabled (`bool`, defaults to `True`): whether lookups may hit.
    """

    def __init__(self, folder: str, settings: dict, code_paths: Iterable[str], enabled: bool = True):
        if not isinstance(folder, str) or not folder:
            raise ValueError(f"`folder` must be a non-empty path, got {folder!r}.")
        self.key = settings_code_hash(settings, list(code_paths))
        self.folder = os.path.join(folder, self.key[:20])
        self.enabled = enabled

    def path(self, name: str) -> str:
        """The file of entry `name` (a file name, e.g. `"judge-0.safetensors"`); the folder is created."""
        if not isinstance(name, str) or not name or os.sep in name:
            raise ValueError(f"`name` must be a plain file name, got {name!r}.")
        os.makedirs(self.folder, exist_ok=True)
        return os.path.join(self.folder, name)

    def has(self, name: str) -> bool:
        """Whether entry `name` exists and lookups are enabled."""
        return self.enabled and os.path.isfile(os.path.join(self.folder, name))

    def load(self, name: str) -> Any | None:
        """The JSON entry `name` (`<name>.json`), or `None` on a miss."""
        if not self.has(name + ".json"):
            return None
        with open(os.path.join(self.folder, name + ".json"), encoding="utf-8") as f:
            return json.load(f)

    def save(self, name: str, value: Any) -> Any:
        """Store `value` (JSON-serialisable) as entry `name`; returns `value`."""
        path = self.path(name + ".json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)
        return value

    def get_or_compute(self, name: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """`(value, from_cache)`: the cached entry `name`, or `compute()` stored under it."""
        value = self.load(name)
        if value is not None:
            return value, True
        return self.save(name, compute()), False


def choose_on_validation(
    candidates: Sequence[T],
    measure: Callable[[T, str], dict],
    score: Callable[[dict], float],
    maximize: bool = True,
    names: Callable[[T], str] = str,
    test: bool = True,
) -> dict:
    """Measure every candidate on `"validation"`, freeze the best, and measure it once on `"test"`.

    Ties go to the earlier candidate. The record (one shape for every benchmark) is
    `{"validation": [{"name", "candidate", "measurement", "score"}, ...], "chosen": {"name", "candidate", "score"},
    "test": measurement}`.

    Args:
        candidates (`Sequence`): the grid (settings, levels, checkpoints ...), in order; JSON-serialisable.
        measure (`Callable[[candidate, split], dict]`): the measurement of a candidate on a split.
        score (`Callable[[dict], float]`): the validation measurement's score.
        maximize (`bool`, defaults to `True`): whether a higher score is better.
        names (`Callable[[candidate], str]`, defaults to `str`): each candidate's name in the record.
        test (`bool`, defaults to `True`): measure the chosen candidate on `"test"` here; `False` when the script
            measures every method's frozen choice on the test split together (paired seeds, a shared reference), in
            which case `"test"` is `None` and `measure` is only called with `"validation"`.
    """
    candidates = list(candidates)
    if not candidates:
        raise ValueError("`candidates` must hold at least one candidate.")
    validation = []
    for candidate in candidates:
        measurement = measure(candidate, "validation")
        validation.append(
            {"name": names(candidate), "candidate": candidate, "measurement": measurement, "score": score(measurement)}
        )
    sign = 1.0 if maximize else -1.0
    best = max(range(len(validation)), key=lambda i: (sign * validation[i]["score"], -i))
    chosen = validation[best]
    return {
        "validation": validation,
        "chosen": {"name": chosen["name"], "candidate": chosen["candidate"], "score": chosen["score"]},
        "test": measure(chosen["candidate"], "test") if test else None,
    }


def run_jobs(function: Callable[..., T], jobs: Sequence[tuple], workers: int = 1) -> list[T]:
    """`[function(*job) for job in jobs]`, in this process for `workers == 1`, else in spawned worker processes.

    Results come back in job order. `function` must be importable by a fresh interpreter (a module-level function)
    when `workers > 1`; at most `len(jobs)` processes are started.
    """
    check_positive_int("workers", workers)
    jobs = [tuple(job) for job in jobs]
    if workers == 1 or len(jobs) <= 1:
        return [function(*job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(function, *job) for job in jobs]
        return [future.result() for future in futures]
