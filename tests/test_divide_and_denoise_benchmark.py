"""benchmarks/divide_and_denoise/divide_and_denoise.py end to end on a tiny setting: calibrated thresholds, both splits, the oracle
reference, the sweep and a computed targets list whose status phrase the markdown carries (benchmarks/README.md)."""

import json
import os

import pytest
from benchmark_scripts import load_benchmark

from diffusers_ext.evaluation.protocol import targets_status


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_tiny_run_writes_a_protocol_results_file(tmp_path):
    bench = load_benchmark("divide_and_denoise", "dnd_bench")
    bench.main(
        [
            "--experts",
            "2",
            "--val_layouts",
            "1",
            "--test_layouts",
            "1",
            "--disc_images",
            "2",
            "--disc_steps",
            "4",
            "--digit_images",
            "1",
            "--digit_steps",
            "3",
            "--wide_val",
            "1",
            "--wide_test",
            "1",
            "--calibration_images",
            "2",
            "--output_dir",
            str(tmp_path),
        ]
    )
    with open(tmp_path / "divide_and_denoise.json", encoding="utf-8") as f:
        results = json.load(f)
    assert {"validation", "test", "calibration", "sweep", "code_hash"} <= results.keys()
    for split in ("validation", "test"):
        assert set(results[split]["discs"]["2"]) >= set(bench.METHODS) | {"layouts"}
    targets = results["summary"]["targets"]
    assert len(targets) == 5 and all({"name", "value", "threshold", "met"} <= t.keys() for t in targets)
    assert 0.0 < results["calibration"]["disc_threshold"] <= 0.99  # the detector's whole grid (colour_object_scores)
    assert len(results["sweep"]["discs"]["divide_and_denoise"]) == len(results["sweep"]["discs"]["thresholds"])
    markdown = (tmp_path / "divide_and_denoise.md").read_text(encoding="utf-8")
    assert targets_status(targets) in markdown
    assert (tmp_path / "divide_and_denoise.png").is_file() and (tmp_path / "divide_and_denoise_sweep.png").is_file()


def test_bad_arguments_are_refused():
    bench = load_benchmark("divide_and_denoise", "dnd_bench")
    for argv in (["--experts", "4"], ["--test_layouts", "0"], ["--detect_fraction", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
