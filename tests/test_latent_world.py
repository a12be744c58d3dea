"""benchmarks/mosaic/latent_world.py: one results file over the three latent-world parts, with every part's targets."""

import json
import os

import pytest
from benchmark_scripts import load_benchmark


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def latent_world():
    return load_benchmark("latent_world", "latent_world")


def test_every_part_defines_its_options_without_clashing(latent_world):
    args = latent_world.parse_args([])
    assert args.parts == list(latent_world.PARTS)
    with pytest.raises(SystemExit):
        latent_world.parse_args(["--parts", "soar"])


def test_assembled_file_carries_each_part_summary_and_all_targets(latent_world, tmp_path):
    results = latent_world.main(["--assemble", "--output_dir", str(tmp_path)])
    with open(tmp_path / "latent_world.json") as f:
        written = json.load(f)
    assert written["summary"].keys() == {"dirp", "divide_and_denoise", "unlearning", "targets"}
    part_targets = [t for part in latent_world.PARTS for t in written["summary"][part]["targets"]]
    assert len(written["summary"]["targets"]) == len(part_targets) > 0
    assert all(t["name"].split(": ", 1)[0] in latent_world.PARTS for t in written["summary"]["targets"])
    assert [t["met"] for t in written["summary"]["targets"]] == [t["met"] for t in part_targets]
    assert "assembled" in results["how"] and (tmp_path / "latent_world.md").exists()
    # The committed file is the assembly of the committed parts.
    with open(os.path.join(REPO, "benchmarks", "mosaic", "results", "latent_world.json")) as f:
        committed = json.load(f)
    assert committed["summary"]["targets"] == written["summary"]["targets"]
