"""benchmarks/divide_and_denoise/families_speed.py on a tiny setting: it times D&D against the family's plain
pipeline calls for each family, writes computed targets through the shared reporting, and rebuilds them from its
results file."""

import json

from benchmark_scripts import load_benchmark


def test_a_tiny_run_times_each_family_and_rebuilds_its_targets(tmp_path):
    bench = load_benchmark("families_speed")
    settings = ["--experts", "2", "--latent_size", "8", "--steps", "1", "--repetitions", "2"]
    results = bench.main([*settings, "--output_dir", str(tmp_path)])
    targets = results["summary"]["targets"]
    assert [row["name"].split(":")[0] for row in targets] == ["sdxl", "sd3", "flux"]
    for family in ("sdxl", "sd3", "flux"):
        part = results["summary"][family]
        assert len(part["ratio"]["values"]) == 2 and all(r > 0 for r in part["ratio"]["values"])
        assert part["divide_and_denoise_timings_of_one_call"]["model_forwards"] > 0
    assert results["command"] == "python benchmarks/divide_and_denoise/families_speed.py " + " ".join(settings)
    written = tmp_path / "families_speed.json"
    rebuilt = bench.main(["--from_results", str(written), "--output_dir", str(tmp_path / "rebuilt")])
    assert rebuilt["summary"]["targets"] == json.loads(written.read_text())["summary"]["targets"]
    assert "Targets:" in (tmp_path / "rebuilt" / "families_speed.md").read_text()
