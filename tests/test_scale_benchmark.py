"""benchmarks/scale/scale.py: its plain LLaDA loop decodes what the package does; a tiny run writes a results file."""

import json

import torch
from benchmark_scripts import load_benchmark


scale = load_benchmark("scale", "scale_benchmark")

TINY = [
    "--parts",
    "dlm",
    "--hidden_size",
    "32",
    "--num_layers",
    "1",
    "--vocab_size",
    "300",
    "--prompt_length",
    "6",
    "--gen_length",
    "8",
    "--block_length",
    "4",
    "--steps",
    "8",
    "--soar_steps",
    "2",
    "--repetitions",
    "1",
]


def test_plain_llada_loop_matches_the_package_token_for_token():
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    args = scale.parse_args(TINY)
    model, tokenizer = scale.build_llada_shaped_lm(args)
    prompt = torch.randint(6, 300, (1, 6), generator=torch.Generator().manual_seed(1))
    for steps in (8, 4):  # one token per step, then two
        pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=4, max_beam_size=1), tokenizer)
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            ours = pipe(
                input_ids=prompt,
                gen_length=8,
                block_length=4,
                num_inference_steps=steps,
                eos_early_stop=False,
                output_type="seq",
            ).sequences
            plain = scale.llada_generate_loop(model, prompt, steps, 8, 4, tokenizer.mask_token_id)
        assert ours[:, -8:].tolist() == plain[:, -8:].tolist()
        assert (plain != tokenizer.mask_token_id).all()


def test_a_tiny_run_writes_its_targets(tmp_path):
    results = scale.main([*TINY, "--output_dir", str(tmp_path)])
    written = json.loads((tmp_path / "scale.json").read_text())
    assert written["command"].startswith("python benchmarks/scale/scale.py --parts dlm")
    assert "--output_dir" not in written["command"]
    names = [t["name"] for t in written["summary"]["targets"]]
    assert len(names) == 3 and all(n.startswith("dlm") for n in names)
    assert results["summary"]["dlm"]["tokens_agree"] == {"package": True, "plain_loop": True}
    assert "CPU figures" in (tmp_path / "scale.md").read_text()


def test_sd3_attention_part_records_without_changing_the_layers_output(tmp_path):
    results = scale.main(
        ["--parts", "sd3_attention", "--sd3_image_size", "64", "--repetitions", "1", "--output_dir", str(tmp_path)]
    )
    part = results["summary"]["sd3_attention"]
    assert part["shape"] == {"image_size": 64, "image_tokens": 16, "text_tokens": 333}
    assert part["max_abs_output_difference"] < 1e-5
    assert part["memory_ratio"] > 0 and part["time_ratio"]["median"] > 0
    assert "sd3_attention" in (tmp_path / "scale.md").read_text()


def test_grpo_part_compares_the_trainers_overhead_with_outside_clocks_and_a_replay(tmp_path):
    argv = [
        "--parts",
        "grpo",
        "--grpo_steps",
        "2",
        "--grpo_layers",
        "1",
        "--grpo_width",
        "32",
        "--grpo_repetitions",
        "1",
    ]
    results = scale.main([*argv, "--output_dir", str(tmp_path)])
    part = results["summary"]["grpo"]
    (step,) = part["steps"]
    # every kind of model work was recorded and replayed: sampling and training forwards, text encoders, decode
    assert {"transformer", "text_encoder", "text_encoder_3", "vae_decode", "optimizer_step"} <= step["calls"].keys()
    # the outside figure is not clamped at 0: a replay slower than its step is noise, and shows as such
    assert 0 <= step["trainer_overhead_fraction"] < 1 and -1 < step["outside_overhead_fraction"] < 1
    difference = abs(step["trainer_overhead_fraction"] - step["outside_overhead_fraction"])
    assert abs(part["pooled_overhead_difference"] - difference) < 1e-12
    # the check: the benchmark's own clocks around the same step's model calls and reward
    assert 0 <= step["in_step_outside_overhead_fraction"] < 1
    in_step = abs(step["trainer_overhead_fraction"] - step["in_step_outside_overhead_fraction"])
    assert abs(part["in_step_overhead_difference"]["median"] - in_step) < 1e-12
    (row,) = results["summary"]["targets"]
    assert row["name"] == (
        "grpo: |trainer's overhead fraction - outside measurement in the same step| (median over the steps)"
    )
    assert row["value"] == part["in_step_overhead_difference"]["median"]


def test_grpo_agreement_compares_the_medians_of_steps_and_replays():
    # step by step the outside figure scatters (0.08, -0.02, 0.01) around the trainer's 0.01; the medians agree
    steps = [
        {"step_seconds": s, "replay_seconds": r, "trainer_overhead_fraction": 0.01}
        for s, r in ((5.0, 4.6), (5.2, 5.3), (5.1, 5.05))
    ]
    outside, difference = scale.overhead_agreement(steps)
    assert abs(outside - (1 - 5.05 / 5.1)) < 1e-12
    assert abs(difference - abs(0.01 - outside)) < 1e-12
