"""benchmarks/mosaic/mosaic_mimicry_headroom.py on a tiny untrained StableDiffusionPipeline: the protections are chosen on
the validation subject alone, the test subject is measured over seeds, and the targets are computed."""

import json

import pytest
from benchmark_scripts import load_benchmark


bench = load_benchmark("mosaic_mimicry_headroom", "mosaic_mimicry_headroom_benchmark")


def test_a_tiny_run_chooses_on_validation_measures_test_over_seeds_and_rebuilds(tiny_sd_pipeline_folder, tmp_path):
    argv = ["--model_path", str(tiny_sd_pipeline_folder), "--output_dir", str(tmp_path), "--num_images", "2"]
    argv += ["--num_reference", "4", "--num_samples", "4", "--pgd_steps", "1"]
    argv += [
        "--mimic_configs",
        "2,1,0.001",
        "4,2,0.001",
        "--sample_steps",
        "1",
        "--seeds",
        "0",
        "1",
        "--feature_steps",
        "2",
    ]
    argv += ["--protections", "advdm", "photoguard"]
    results = bench.main(argv)
    summary = results["summary"]
    validation, test = summary["validation"], summary["test"]
    assert [row["name"] for row in validation["validation"]] == ["advdm", "photoguard"]
    mimics = validation["mimic"]["validation"]
    assert [row["candidate"]["rank"] for row in mimics] == [2, 4]
    assert validation["mimic"]["chosen"]["score"] == min(row["score"] for row in mimics) == validation["clean_fd"]
    assert test["protection"] == validation["chosen"]["candidate"]
    assert validation["subject"] == "tower" and test["subject"] == "rocket"
    assert test["clean_fd"]["n"] == 2 and test["protected_fd"]["n"] == 2
    assert 0 < test["max_linf_255"] <= 16 + 1e-3  # within the 16/255 budget
    ratio = [p / c for p, c in zip(test["protected_fd"]["values"], test["clean_fd"]["values"])]
    assert summary["targets"][1]["value"] == pytest.approx(sum(ratio) / 2)
    assert summary["targets"][0]["value"] == pytest.approx(test["clean_fd"]["mean"] / test["untuned_fd"])
    written = json.loads((tmp_path / "mosaic_mimicry_headroom.json").read_text())
    assert "--model_path" not in written["command"] and "--output_dir" not in written["command"]
    rebuilt = bench.main(
        ["--from_results", str(tmp_path / "mosaic_mimicry_headroom.json"), "--output_dir", str(tmp_path)]
    )
    assert [r["value"] for r in rebuilt["summary"]["targets"]] == [r["value"] for r in summary["targets"]]


@pytest.mark.parametrize(
    "args",
    [
        ["--validation_subject", "rocket"],
        ["--test_subject", "nothing"],
        ["--protections", "nothing"],
        ["--budget", "0"],
        ["--mimic_configs", "8,150"],
        ["--mimic_configs", "0,150,0.003"],
    ],
)
def test_bad_arguments_are_refused_before_loading(tiny_sd_pipeline_folder, args):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tiny_sd_pipeline_folder), *args])


def test_a_folder_that_is_not_a_pipeline_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tmp_path)])
