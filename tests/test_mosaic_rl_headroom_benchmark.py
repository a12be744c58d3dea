"""benchmarks/mosaic/mosaic_rl_headroom.py on a tiny untrained StableDiffusion3Pipeline: both parts run, the RL prompts are
the tasks unsaturated on validation, and the targets are computed from what was measured."""

import json

import pytest
from benchmark_scripts import load_benchmark


bench = load_benchmark("mosaic_rl_headroom", "mosaic_rl_headroom_benchmark")


def test_a_tiny_run_measures_both_parts_and_rebuilds(tiny_sd3_pipeline_folder, tmp_path):
    argv = ["--model_path", str(tiny_sd3_pipeline_folder), "--capability_prompts", "8"]
    argv += ["--guidance_grid", "1.0", "3.0"]
    argv += ["--num_inference_steps", "1", "--rl_prompts", "3", "--grpo_steps", "3", "--prompts_per_step", "1"]
    argv += ["--num_generations", "2", "--rollout_steps", "2", "--output_dir", str(tmp_path)]
    results = bench.main(argv)
    summary = results["summary"]
    assert [row["candidate"] for row in summary["capability"]["validation"]] == [1.0, 3.0]
    rl = summary["rl"]
    chosen = next(v for v in summary["capability"]["validation"] if v["candidate"] == rl["guidance_scale"])
    # an untrained model masters nothing: every task it was validated on is an RL task
    assert rl["tasks"] == sorted(chosen["measurement"]["by_task"])
    assert rl["held_out_reward_before"]["n"] == 3 and rl["held_out_reward_after"]["n"] == 3
    assert len(rl["grpo"]["frac_reward_zero_std"]) == 3
    assert all(0 <= f <= 1 for f in rl["grpo"]["frac_reward_zero_std"])
    names = [row["name"] for row in summary["targets"]]
    assert names[:3] == ["capability: single (test)", "capability: count (test)", "capability: relation (test)"]
    assert len(names) == 7
    zero_std = summary["targets"][-2]
    assert zero_std["value"] == rl["grpo"]["last_third_zero_std"] and zero_std["met"] == (zero_std["value"] >= 0.3)
    written = json.loads((tmp_path / "mosaic_rl_headroom.json").read_text())
    assert "--model_path" not in written["command"]
    rebuilt = bench.main(["--from_results", str(tmp_path / "mosaic_rl_headroom.json"), "--output_dir", str(tmp_path)])
    assert [r["value"] for r in rebuilt["summary"]["targets"]] == [r["value"] for r in summary["targets"]]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_generations", "1"], "--num_generations must be >= 2"),
        (["--parts", "rl"], "needs the capability part"),
        (["--saturated_accuracy", "0"], "--saturated_accuracy must be in"),
    ],
)
def test_bad_arguments_are_refused_before_loading(tiny_sd3_pipeline_folder, argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tiny_sd3_pipeline_folder), *argv])
    assert message in capsys.readouterr().err


def test_a_folder_that_is_not_a_pipeline_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model_path", str(tmp_path)])
    assert "is not a pipeline folder" in capsys.readouterr().err
