"""`diffusers-ext demo`: run each available method on the zoo and write an HTML report."""

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import digits, dirp, divide_and_denoise, e2po, mosaic, semantic_nvs, soar, unlearning
from .report import Section, write_report


MODES = ("quick", "default", "full")

# (name, module, section builder, benchmark name). Each builder is builder(output_dir, mode, seed, device) -> Section,
# and its module holds SETTINGS: mode -> the settings that mode runs with.
SECTIONS: list[tuple[str, object, Callable[[str, str, int, str], Section], str | None]] = [
    ("digits zoo", digits, digits.digits_section, "zoo"),
    ("SOAR decoding", soar, soar.soar_section, "soar"),
    ("divide-and-denoise", divide_and_denoise, divide_and_denoise.divide_and_denoise_section, "divide_and_denoise"),
    ("e2po", e2po, e2po.e2po_section, "e2po"),
    ("SemanticNVS", semantic_nvs, semantic_nvs.semantic_nvs_section, "semantic_nvs"),
    ("constrained unlearning", unlearning, unlearning.unlearning_section, "unlearning"),
    ("DIRP", dirp, dirp.dirp_section, "dirp"),
    ("mosaic", mosaic, mosaic.mosaic_section, "mosaic"),
]

# benchmarks/ of a source checkout, each method's record in benchmarks/<method>/ (absent from an installed wheel: then
# no committed figures are shown). Every benchmark the demo names has its own folder, of its name.
BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def committed_results_file(benchmark: str) -> Path:
    """`benchmarks/<benchmark>/results/<benchmark>.json` of a source checkout (it may not exist)."""
    return BENCHMARKS_DIR / benchmark / "results" / f"{benchmark}.json"


def settings_note(module, mode: str) -> str:
    """One line naming the settings `mode` ran with, e.g. `default settings: samples_per_class=40, ...`."""
    settings = module.SETTINGS[mode]
    values = dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else dict(settings)
    return f"{mode} settings: " + ", ".join(f"{k}={v}" for k, v in values.items())


def committed_results_note(benchmark: str | None) -> str | None:
    """The committed benchmark's computed targets as one line, labelled as committed results (not run now)."""
    path = committed_results_file(benchmark) if benchmark else None
    if path is None or not path.is_file():
        return None
    targets = json.loads(path.read_text(encoding="utf-8")).get("summary", {}).get("targets")
    if not isinstance(targets, list) or not all(isinstance(t, dict) and {"name", "met"} <= t.keys() for t in targets):
        return (
            f"Committed benchmark results (not run now): benchmarks/{benchmark}/results/{benchmark}.md, from "
            f"`python benchmarks/{benchmark}/{benchmark}.py`."
        )
    met = sum(bool(t["met"]) for t in targets)
    listed = "; ".join(f"{t['name']}: {'met' if t['met'] else 'missed'}" for t in targets)
    return (
        f"Committed benchmark results (not run now; `python benchmarks/{benchmark}/{benchmark}.py`, "
        f"benchmarks/{benchmark}/results/{benchmark}.md): {met} of {len(targets)} targets met — {listed}."
    )


class DemoSectionsFailed(RuntimeError):
    """Raised by `run_demo` after it wrote the report, when one or more sections raised.

    Attributes:
        path (`str`): the path of `index.html` (every section is in it; the failed ones are marked).
        seconds (`dict[str, float]`): the wall-clock seconds of each section.
        failures (`dict[str, str]`): section name -> its one-line error.
    """

    def __init__(self, path: str, seconds: dict[str, float], failures: dict[str, str]):
        self.path, self.seconds, self.failures = path, seconds, failures
        super().__init__(
            f"{len(failures)} of {len(seconds)} demo sections failed ({', '.join(failures)}); "
            f"the report {path} marks them"
        )


def one_line_error(error: BaseException) -> str:
    """`error` as one line: its type and the first line of its message, e.g. `ModuleNotFoundError: No module ...`."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


def run_demo(
    output_dir: str, mode: str = "default", seed: int = 0, device: str = "cpu", progress: bool = True
) -> tuple[str, dict[str, float]]:
    """Run every demo section with `mode`'s settings and write `output_dir/index.html`.

    Args:
        output_dir (`str`): the report folder.
        mode (`str`, defaults to `"default"`): `"quick"`, `"default"` or `"full"` (the first releases' defaults).
            `python benchmarks/scale/demo_timing.py` measures the first two (81 s and 37 s on 2 CPU cores).
        seed (`int`): seed of every sample.
        device (`str`): torch device.
        progress (`bool`): show a progress bar over the sections.

    Returns:
        `(path, seconds)`: the path of `index.html` and the wall-clock seconds of each section.

    Raises:
        `DemoSectionsFailed`: after the report is written, when a section raised. The other sections still ran and
            are in the report; each failed one is shown with its one-line error, which is also printed to stderr as
            it happens (`demo section 'NAME' failed: ERROR`).
    """
    from tqdm.auto import tqdm

    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    os.makedirs(output_dir, exist_ok=True)
    sections, seconds, failures = [], {}, {}
    bar = tqdm(SECTIONS, desc="diffusers-ext demo", unit="section", disable=not progress)
    for name, module, build, benchmark in bar:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        try:
            section = build(output_dir, mode, seed, device)
        except Exception as error:  # one failed section must not lose the others' results
            failures[name] = one_line_error(error)
            tqdm.write(f"demo section {name!r} failed: {failures[name]}", file=sys.stderr)
            section = Section(
                title=name,
                summary="This section raised before it finished; nothing of it is shown.",
                error=failures[name],
            )
        seconds[name] = time.perf_counter() - start
        section.notes.append(settings_note(module, mode))
        committed = committed_results_note(benchmark)
        if committed:
            section.notes.append(committed)
        sections.append(section)
    timings = "; ".join(f"{name}: {s:.1f} s" for name, s in seconds.items())
    intro = (
        "What each method of diffusers-ext does on the bundled zoo checkpoints, run just now on this machine "
        f"({mode} settings, device {device}, seed {seed}; each section names its settings). Timings: {timings}. "
        "Lines marked 'committed benchmark results' were not run now: they come from the benchmark files."
    )
    if failures:
        intro += f" {len(failures)} of {len(SECTIONS)} sections failed: {', '.join(failures)} (marked below)."
    path = write_report(output_dir, "diffusers-ext demo", intro, sections)
    if failures:
        raise DemoSectionsFailed(path, seconds, failures)
    return path, seconds
