"""Every committed results file rebuilds with its script's `--from_results` to exactly the targets it records
(benchmarks/README.md, rule 5: the targets are computed from the recorded measurements, so computing them again from
the file gives the same rows).

For each `benchmarks/<method>/results/*.json` with a `summary.targets` list, the script its recorded command names is
loaded in this process (`load_benchmark`) and its `main` runs with `--from_results <file>` and its output option
pointing into `tmp_path`. The rebuilt file must be written there under the committed file's own name (some were
written under another name by a flag, or renamed since), carry the committed targets exactly (names, values,
thresholds, comparisons, verdicts), name the file it was rebuilt from by its hash, and leave the committed record
untouched. A rebuild measures nothing: it reads the file, computes the targets and writes the report.

`test_every_results_file_has_a_script_that_rebuilds_it` fails when a results file names no script, a script without
`--from_results`, or one this test does not know how to point at a scratch folder (then add it to `OUTPUT`).
"""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, all_results_files, load_benchmark


REPO = BENCHMARKS.parent
DIR, JSON, STEM = "folder", "json path", "stem"
# How each script's --from_results is pointed at a scratch folder: its output option, and whether that option takes a
# folder (the file keeps its name in it), a `.json` path or a path stem.
OUTPUT = {
    "brain_network_flow/brain_network_flow.py": ("--output", JSON),
    "brain_network_flow/temporal.py": ("--output", JSON),
    "certified_transfer/certified_transfer.py": ("--output", STEM),
    "certified_transfer/certified_transfer_model_selection.py": ("--output", STEM),
    "connectivity/connectivity.py": ("--output", JSON),
    "consistency/consistency.py": ("--output_dir", DIR),
    "diffusion_lm_cache/diffusion_lm_cache.py": ("--output_dir", DIR),
    "dirp/dirp.py": ("--output_dir", DIR),
    "dirp/latent_world_dirp.py": ("--dirp_output_dir", DIR),
    "dirp/dirp_memory_floor.py": ("--output", JSON),
    "dirp/modern_dirp_memory.py": ("--output_dir", DIR),
    "discrete_flow/discrete_flow.py": ("--output", JSON),
    "divide_and_denoise/divide_and_denoise.py": ("--output_dir", DIR),
    "divide_and_denoise/families_speed.py": ("--output_dir", DIR),
    "divide_and_denoise/latent_world_divide_and_denoise.py": ("--dnd_output_dir", DIR),
    "divide_and_denoise/mosaic_divide_and_denoise.py": ("--output_dir", DIR),
    "doob_guidance/doob_guidance.py": ("--output_dir", DIR),
    "doob_guidance/doob_guidance_digits.py": ("--output_dir", DIR),
    "e2po/e2po.py": ("--output_dir", DIR),
    "e2po/mosaic_e2po.py": ("--output_dir", DIR),
    "epidiff/epidiff.py": ("--output", STEM),
    "federated_recommendation/embedding_assignment_validation.py": ("--output", JSON),
    "federated_recommendation/federated_recommendation.py": ("--output", STEM),
    "graph_grpo/graph_grpo.py": ("--output_dir", DIR),
    "graph_grpo/graph_grpo_molecules.py": ("--output_dir", DIR),
    "lomdm/lomdm.py": ("--output", JSON),
    "manifold_flow/manifold_flow.py": ("--output", JSON),
    "mosaic/latent_world.py": ("--output_dir", DIR),
    "mosaic/mosaic.py": ("--output", JSON),
    "mosaic/mosaic_headroom.py": ("--output_dir", DIR),
    "mosaic/mosaic_mimicry_headroom.py": ("--output_dir", DIR),
    "mosaic/mosaic_rl_headroom.py": ("--output_dir", DIR),
    "scale/demo_timing.py": ("--output_dir", DIR),
    "scale/memory_scaling.py": ("--output_dir", DIR),
    "scale/scale.py": ("--output_dir", DIR),
    "semantic_nvs/semantic_nvs.py": ("--output_dir", DIR),
    "soar/soar.py": ("--output_dir", DIR),
    "spade/spade.py": ("--output_dir", DIR),
    "unlearning/latent_world_unlearning.py": ("--output_dir", DIR),
    "unlearning/modern_unlearning_overhead.py": ("--output_dir", DIR),
    "unlearning/unlearning.py": ("--output_dir", DIR),
    "zoo/zoo.py": ("--output_dir", DIR),
}


def _with_targets() -> list[Path]:
    """The committed results files whose `summary.targets` is a list of computed rows."""
    found = []
    for path in all_results_files("*.json"):
        targets = json.loads(path.read_text(encoding="utf-8")).get("summary", {}).get("targets")
        if isinstance(targets, list):
            found.append(path)
    return found


RESULTS = _with_targets()


def script_of(path: Path) -> str | None:
    """The script the file's recorded command runs, relative to benchmarks/ (`"soar/soar.py"`), or `None`."""
    match = re.match(r"python benchmarks/(\S+\.py)", json.loads(path.read_text(encoding="utf-8")).get("command", ""))
    return match.group(1) if match else None


def _id(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.name}"


def _record(folder: Path) -> dict:
    """Every file of a committed results folder with its size and modification time."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_the_record_has_results_files_with_computed_targets():
    assert len(RESULTS) >= 40


@pytest.mark.parametrize("path", RESULTS, ids=_id)
def test_every_results_file_has_a_script_that_rebuilds_it(path):
    script = script_of(path)
    assert script is not None, f"{path}: the recorded command names no benchmarks/<method>/<script>.py"
    source = BENCHMARKS / script
    assert source.is_file(), f"{path}: its recorded script benchmarks/{script} does not exist"
    assert "add_from_results_argument" in source.read_text(encoding="utf-8"), (
        f"{path}: benchmarks/{script} has no --from_results (reporting.add_from_results_argument)"
    )
    assert script in OUTPUT, f"{path}: add benchmarks/{script}'s output option to OUTPUT in {__file__}"


def test_every_known_script_has_a_results_file():
    assert set(OUTPUT) == {script_of(path) for path in RESULTS}


@pytest.mark.parametrize("path", RESULTS, ids=_id)
def test_rebuild_gives_the_committed_targets(path, tmp_path, monkeypatch):
    script = script_of(path)
    if script not in OUTPUT:
        pytest.fail(f"{path}: no rebuilding script (see test_every_results_file_has_a_script_that_rebuilds_it)")
    option, kind = OUTPUT[script]
    target = {DIR: tmp_path, JSON: tmp_path / path.name, STEM: tmp_path / path.stem}[kind]
    # a script may import its neighbours (certified_transfer_model_selection.py imports certified_transfer.py)
    monkeypatch.syspath_prepend(str((BENCHMARKS / script).parent))
    monkeypatch.chdir(REPO)
    module = load_benchmark(Path(script).stem, f"rebuild_{Path(script).stem}")
    committed = path.read_bytes()
    before = _record(path.parent)

    module.main(["--from_results", os.path.relpath(path, REPO), option, str(target)])

    rebuilt_path = tmp_path / path.name
    assert rebuilt_path.is_file(), f"wrote {sorted(p.name for p in tmp_path.iterdir())}, not {path.name}"
    rebuilt = json.loads(rebuilt_path.read_text(encoding="utf-8"))
    recorded = json.loads(committed)
    assert json.dumps(rebuilt["summary"]["targets"], sort_keys=True) == json.dumps(
        recorded["summary"]["targets"], sort_keys=True
    )
    assert rebuilt["rebuilt_from_results"]["sha256"] == hashlib.sha256(committed).hexdigest()
    assert rebuilt["command"] == recorded["command"]
    assert (tmp_path / f"{path.stem}.md").is_file()
    assert path.read_bytes() == committed and _record(path.parent) == before, "the rebuild wrote into the record"
