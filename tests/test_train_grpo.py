"""training/train_grpo.py under `accelerate launch`: exact two-process resume, a loadable LoRA, argument errors."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_grpo.py")
TINY = [
    "--dataset",
    "digits",
    "--reward_funcs",
    "digit_classifier",
    "brightness:0.8",
    "--reward_weights",
    "1",
    "0.5",
    "--height",
    "16",
    "--width",
    "16",
    "--max_sequence_length",
    "8",
    "--num_inference_steps",
    "3",
    "--guidance_scale",
    "1.0",
    "--num_generations",
    "4",
    "--per_device_train_batch_size",
    "4",
    "--gradient_accumulation_steps",
    "2",
    "--lora_rank",
    "4",
    "--lora_alpha",
    "8",
    "--learning_rate",
    "1e-2",
    "--epsilon",
    "0.2",
    "--beta",
    "0.1",
    "--save_steps",
    "2",
    "--seed",
    "3",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": REPO}


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory):
    from diffusers import StableDiffusion3Pipeline

    from diffusers_ext.testing import get_tiny_sd3_components

    folder = tmp_path_factory.mktemp("tiny-sd3")
    StableDiffusion3Pipeline(**get_tiny_sd3_components(0)).save_pretrained(folder)
    return str(folder)


def _launch(model, output_dir, steps, *extra):
    cmd = [
        *accelerate_cpu_launch(),
        SCRIPT,
        "--pretrained_model_name_or_path",
        model,
        "--output_dir",
        str(output_dir),
        "--max_steps",
        str(steps),
        *TINY,
        *extra,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_e2po_resume_equals_uninterrupted_run_and_lora_loads(tmp_path, tiny_sd3):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _launch(tiny_sd3, resumed, 2, "--algorithm", "e2po", "--e2po_num_directions", "1")
    assert_world_size(log, resumed / "checkpoint-2")
    log = _launch(
        tiny_sd3, resumed, 4, "--algorithm", "e2po", "--e2po_num_directions", "1", "--resume_from_checkpoint", "latest"
    )
    assert "Resuming from" in log and "checkpoint-2" in log
    _launch(tiny_sd3, straight, 4, "--algorithm", "e2po", "--e2po_num_directions", "1")

    a = load_file(resumed / "pytorch_lora_weights.safetensors")
    b = load_file(straight / "pytorch_lora_weights.safetensors")
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    early = load_file(resumed / "checkpoint-2" / "model.safetensors")
    lora_keys = [k for k in early if "lora_B" in k]
    assert lora_keys and any(not torch.equal(early[k], torch.zeros_like(early[k])) for k in lora_keys)
    assert "train_grpo.py" in (resumed / "README.md").read_text()

    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(tiny_sd3)
    pipe.load_lora_weights(str(resumed))
    assert any("lora" in name for name, _ in pipe.transformer.named_parameters())


FLAT_DRIVER = os.path.join(REPO, "tests", "grpo_flat_rank_driver.py")


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_grpo_where_one_process_drops_every_image_stays_in_step(tmp_path, tiny_sd3):
    """DDP with `drop_zero_advantage`: at every step one process's only group has zero reward spread, so all its
    images are dropped; it must still join the gradient all-reduce (no collective mismatch) and both processes must
    end with the same LoRA."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\na dog\n")
    records, output_dir = tmp_path / "records", tmp_path / "out"
    settings = TINY[TINY.index("--height") : TINY.index("--gradient_accumulation_steps")]
    cmd = [
        *accelerate_cpu_launch(),
        FLAT_DRIVER,
        "--record_dir",
        str(records),
        "--pretrained_model_name_or_path",
        tiny_sd3,
        "--output_dir",
        str(output_dir),
        "--dataset",
        str(prompts),
        "--reward_funcs",
        "flat_for:a cat",
        *settings,  # one group of 4 images per process per step: the two prompts split over the two processes
        "--gradient_accumulation_steps",
        "1",
        "--drop_zero_advantage",
        "true",
        "--lora_rank",
        "4",
        "--lora_alpha",
        "8",
        "--learning_rate",
        "1e-2",
        "--max_steps",
        "3",
        "--save_steps",
        "3",
        "--seed",
        "3",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_world_size(result.stdout + result.stderr, output_dir / "checkpoint-3")

    import json

    ranks = [json.loads((records / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["world_size"], r["num_processes"]) for r in ranks] == [(2, 2), (2, 2)]
    for step in range(3):
        seen = [r["prompts"][step] for r in ranks]
        assert sorted(seen) == [["a cat"], ["a dog"]], seen  # one group each, the two prompts split
        trained = [r["frac_samples_trained"][step] for r in ranks]
        flat = seen.index(["a cat"])
        assert trained[flat] == 0.0 and trained[1 - flat] == 1.0, trained  # the flat rank lost every image

    first = load_file(records / "rank0_lora.safetensors")
    second = load_file(records / "rank1_lora.safetensors")
    assert first.keys() == second.keys() and any("lora_B" in k for k in first)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in first.items() if "lora_B" in k)  # it trained
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0, msg=f"{name} differs between ranks")
    saved = load_file(output_dir / "pytorch_lora_weights.safetensors")
    assert len(saved) == len(first)


def _script_module():
    sys.path.insert(0, os.path.join(REPO, "training"))
    try:
        import train_grpo
    finally:
        sys.path.pop(0)
    return train_grpo


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "ppo"], "--algorithm 'ppo' unknown"),
        (["--algorithm", "grpo", "--e2po_max_scale", "0.5"], "--e2po_max_scale is an E2PO option"),
        (["--num_generations", "1"], "num_generations` must be >= 2"),
        (["--not_an_option", "1"], "unrecognized arguments: --not_an_option 1"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, args, message):
    train_grpo = _script_module()
    with pytest.raises(ValueError, match=message):
        train_grpo.parse_args(["--pretrained_model_name_or_path", "x", "--output_dir", str(tmp_path), *args])
    with pytest.raises(ValueError, match="--pretrained_model_name_or_path is required"):
        train_grpo.parse_args(["--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--reward_funcs 'aesthetics' unknown"):
        train_grpo.build_reward("aesthetics")


def test_yaml_config_and_algorithm(tmp_path):
    train_grpo = _script_module()
    config = tmp_path / "run.yaml"
    config.write_text(
        "algorithm: e2po\nnum_generations: 6\nper_device_train_batch_size: 12\ne2po_num_directions: 2\nbeta: 0.04\n"
    )
    script_args, args, lora = train_grpo.parse_args(["--config", str(config), "--pretrained_model_name_or_path", "x"])
    assert script_args.algorithm == "e2po" and type(args).__name__ == "E2POConfig"
    assert (args.num_generations, args.e2po_num_directions, args.beta) == (6, 2, 0.04)
    assert (lora.use_lora, lora.lora_rank, lora.lora_alpha) == (True, 32, 64)  # this script's LoRA defaults
    _, grpo, lora = train_grpo.parse_args(
        ["--pretrained_model_name_or_path", "x", "--scale_rewards", "batch", "--use_lora", "false"]
    )
    assert type(grpo).__name__ == "DiffusionGRPOConfig" and grpo.scale_rewards == "batch"
    assert lora.to_peft_config() is None


def test_script_errors_are_one_line(tmp_path):
    cmd = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(tmp_path),
        "--pretrained_model_name_or_path",
        "x",
        "--dataset",
        "/nonexistent/prompts.txt",
        "--reward_funcs",
        "brightness:0.5",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "train_grpo.py: error:" in last and "--dataset '/nonexistent/prompts.txt'" in last, last
    assert "Traceback" not in result.stderr


def test_prompt_files_and_reward_names(tmp_path):
    train_grpo = _script_module()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a cat", "label": 1}\n\n{"prompt": "a dog", "label": 2}\n')
    assert train_grpo.load_prompts(str(prompts)) == [{"prompt": "a cat", "label": 1}, {"prompt": "a dog", "label": 2}]
    text = tmp_path / "prompts.txt"
    text.write_text("a cat\n a dog \n")
    assert train_grpo.load_prompts(str(text)) == ["a cat", "a dog"]
    with pytest.raises(ValueError, match="needs a model path"):
        train_grpo.build_reward("clip_score")


def test_bad_jsonl_line_names_the_file_and_its_line(tmp_path):
    train_grpo = _script_module()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a cat"}\n\n{"prompt": "a dog"}\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl' line 4 is not JSON"):
        train_grpo.load_prompts(str(prompts))
    prompts.write_text('{"prompt": "a cat"}\n["a dog"]\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl' line 2: expected an object with a 'prompt' string"):
        train_grpo.load_prompts(str(prompts))
    prompts.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        train_grpo.load_prompts(str(prompts))


def _main_without_loading(train_grpo, monkeypatch, model, *extra, output_dir):
    def no_loading(path):
        raise AssertionError("the pipeline was loaded before the bad input was found")

    monkeypatch.setattr(train_grpo, "load_pipeline", no_loading)
    argv = ["--pretrained_model_name_or_path", model, "--output_dir", str(output_dir), "--reward_funcs", "brightness"]
    train_grpo.main([*argv, *extra])


def test_non_flow_model_is_refused_before_loading(tmp_path, monkeypatch):
    from diffusers import DDIMScheduler

    from diffusers_ext import ClassConditionalDDPMPipeline
    from diffusers_ext.testing import get_tiny_pixel_unet

    folder = tmp_path / "ddpm"
    ClassConditionalDDPMPipeline(
        get_tiny_pixel_unet(seed=0, num_class_embeds=11), DDIMScheduler(), 10
    ).save_pretrained(folder)
    train_grpo = _script_module()
    with pytest.raises(ValueError, match="is a ClassConditionalDDPMPipeline; train_grpo.py trains flow-matching"):
        _main_without_loading(train_grpo, monkeypatch, str(folder), output_dir=tmp_path / "out")
    with pytest.raises(ValueError, match="--pretrained_model_name_or_path '/nonexistent' is not a diffusers pipeline"):
        _main_without_loading(train_grpo, monkeypatch, "/nonexistent", output_dir=tmp_path / "out")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--height", "7"], "--height 7 does not fit"),
        (["--width", "10"], r"--width 10 does not fit .*multiple of 4 \(VAE downsampling 2 x patch size 2\)"),
    ],
)
def test_geometry_the_model_can_not_take_is_refused_before_loading(tmp_path, monkeypatch, tiny_sd3, args, message):
    train_grpo = _script_module()
    with pytest.raises(ValueError, match=message):
        _main_without_loading(train_grpo, monkeypatch, tiny_sd3, *args, output_dir=tmp_path / "out")
    train_grpo.check_model(tiny_sd3, 16, 12)  # multiples of 4 fit


def test_output_dir_that_is_a_file_fails_before_loading(tmp_path):
    train_grpo = _script_module()
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(ValueError, match="`output_dir` .* is an existing file, not a folder"):
        train_grpo.parse_args(["--pretrained_model_name_or_path", "x", "--output_dir", str(target)])


def test_validation_images_reach_the_tracker_and_the_folder(tmp_path, tiny_sd3):
    from test_training_utils import _tensorboard_events

    out = tmp_path / "out"
    argv = ["--pretrained_model_name_or_path", tiny_sd3, "--output_dir", str(out), "--max_train_steps", "2", *TINY]
    validation = ["--validation_prompt", "a handwritten digit one", "--num_validation_images", "2"]
    _script_module().main([*argv, *validation, "--validation_steps", "1", "--report_to", "tensorboard"])
    assert sorted(os.listdir(out / "validation")) == ["step-1", "step-2"]
    assert sorted(os.listdir(out / "validation" / "step-2")) == [
        f"{i:02d}-a_handwritten_digit_one.png" for i in (0, 1)
    ]
    events = _tensorboard_events(out / "logs")
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [1, 2]
    with pytest.raises(ValueError, match="--validation_prompt"):
        _script_module().parse_args([*argv, "--validation_steps", "1"])
