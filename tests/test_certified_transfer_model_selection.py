"""benchmarks/certified_transfer/certified_transfer_model_selection.py on a tiny trained folder: the validation report, and with
`--class_sizes` the picked query accuracy by class size, where the upstream prefix as long as the whole set is the
upstream class itself."""

import json
import os
import sys

import pytest
import torch
from benchmark_scripts import benchmark_script, load_benchmark


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_train_parameter_diffusion import _run  # noqa: E402


def selection():
    # the script imports the episode helpers of certified_transfer.py, its neighbour
    sys.path.insert(0, str(benchmark_script("certified_transfer").parent))
    return load_benchmark("certified_transfer_model_selection")


def test_class_sizes_report_reads_one_draw_by_prefix(tmp_path):
    torch.set_num_threads(1)
    model = tmp_path / "tiny"
    _run(model, 2)  # 3 upstream adapters
    stem = tmp_path / "selection"
    selection().main(
        [
            "--model_dirs", str(model), "--num_validation_episodes", "2", "--num_hypotheses", "4",
            "--num_inference_steps", "2", "--class_sizes", "5", "3", "1", "4", "--output", str(stem),
            "--classifier_path", os.path.join(ROOT, "diffusers_ext", "zoo", "digits-classifier"),
        ]
    )  # fmt: skip
    results = json.loads((tmp_path / "selection.json").read_text())
    assert results["settings"]["class_sizes"] == [1, 3, 4, 5]
    by_size = results["models"]["tiny"]["by_class_size"]
    assert sorted(by_size, key=int) == ["1", "3", "4", "5"] and all(0 <= v <= 1 for v in by_size.values())
    (reference,) = results["upstream_references"].values()
    prefix = reference["by_class_size"]["upstream_prefix"]
    assert sorted(prefix, key=int) == ["1", "3"]  # no prefix longer than the 3 upstream adapters
    assert prefix["3"] == pytest.approx(reference["upstream_class_pick"])
    assert sorted(reference["by_class_size"]["gaussian"], key=int) == ["1", "3", "4", "5"]
    assert "| tiny (diffusion) |" in (tmp_path / "selection.md").read_text()
    # every size above the 3 upstream adapters: the prefix row is empty, not the whole class's pick
    selection().main(
        [
            "--model_dirs", str(model), "--num_validation_episodes", "2", "--num_hypotheses", "4",
            "--num_inference_steps", "2", "--class_sizes", "4", "5", "--output", str(tmp_path / "larger"),
            "--classifier_path", os.path.join(ROOT, "diffusers_ext", "zoo", "digits-classifier"),
        ]
    )  # fmt: skip
    (reference,) = json.loads((tmp_path / "larger.json").read_text())["upstream_references"].values()
    assert reference["by_class_size"]["upstream_prefix"] == {}
    assert "| upstream prefix of 3 adapters (tiny) |  |  |" in (tmp_path / "larger.md").read_text()


def test_bad_class_size_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        selection().parse_args(["--model_dirs", str(tmp_path), "--class_sizes", "4", "0"])
    assert "--class_sizes holds 0; expected class sizes >= 1." in capsys.readouterr().err
