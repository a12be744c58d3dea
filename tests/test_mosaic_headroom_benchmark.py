"""benchmarks/mosaic/mosaic_headroom.py on a tiny untrained StableDiffusionPipeline: every part runs and its targets are
computed from what it measured (an untrained model meets none of the capability targets)."""

import json

import pytest
from benchmark_scripts import load_benchmark


bench = load_benchmark("mosaic_headroom", "mosaic_headroom_benchmark")


def test_a_tiny_run_measures_both_parts_and_rebuilds(tiny_sd_pipeline_folder, tmp_path):
    argv = ["--model_path", str(tiny_sd_pipeline_folder), "--capability_prompts", "4", "--composition_prompts", "2"]
    argv += ["--guidance_grid", "1.0", "3.0", "--num_inference_steps", "1", "--output_dir", str(tmp_path)]
    argv += ["--oracle_configs", "4,1,1.0,2", "2,0,0.0", "--concepts", "red", "circle", "--concept_prompts", "2"]
    results = bench.main(argv)
    summary = results["summary"]
    assert [row["candidate"] for row in summary["capability"]["validation"]] == [1.0, 3.0]
    assert summary["capability"]["test"]["n"] == 4
    for setting in ("2_objects", "3_objects"):
        for method in ("single_prompt", "oracle_layout"):
            assert summary["composition"][setting][method]["test"]["n"] == 2
    names = [row["name"] for row in summary["targets"]]
    assert names[:3] == ["capability: single (test)", "capability: count (test)", "capability: relation (test)"]
    assert [row["name"] for row in summary["concepts"]["validation"]] == ["red", "circle"]
    assert summary["concepts"]["test"]["n"] == 2
    oracle_grid = summary["composition"]["2_objects"]["oracle_layout"]["validation"]
    assert len(oracle_grid) == 4
    assert sorted({row["candidate"]["resampling"] for row in oracle_grid}) == [1, 2]
    assert len(names) == 9
    written = json.loads((tmp_path / "mosaic_headroom.json").read_text())
    assert "--model_path" not in written["command"] and "--output_dir" not in written["command"]
    rebuilt = bench.main(["--from_results", str(tmp_path / "mosaic_headroom.json"), "--output_dir", str(tmp_path)])
    assert [r["value"] for r in rebuilt["summary"]["targets"]] == [r["value"] for r in summary["targets"]]


def test_a_malformed_oracle_config_is_refused(tiny_sd_pipeline_folder):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tiny_sd_pipeline_folder), "--oracle_configs", "16,2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tiny_sd_pipeline_folder), "--oracle_configs", "16,2,1.0,0"])


def test_a_folder_that_is_not_a_pipeline_is_refused_before_loading(tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tmp_path)])
