"""training/train_grpo.py under `accelerate launch`: exact two-process resume, a loadable LoRA, argument errors."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_grpo.py")
TINY = [
    "--dataset", "digits", "--reward_funcs", "digit_classifier", "brightness:0.8", "--reward_weights", "1", "0.5",
    "--height", "16", "--width", "16", "--max_sequence_length", "8", "--num_inference_steps", "3",
    "--guidance_scale", "1.0", "--num_generations", "4", "--per_device_train_batch_size", "4",
    "--gradient_accumulation_steps", "2", "--lora_rank", "4", "--lora_alpha", "8", "--learning_rate", "1e-2",
    "--epsilon", "0.2", "--beta", "0.1", "--save_steps", "2", "--seed", "3",
]  # fmt: skip


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
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT,
           "--pretrained_model_name_or_path", model, "--output_dir", str(output_dir), "--max_steps", str(steps),
           *TINY, *extra]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_two_process_e2po_resume_equals_uninterrupted_run_and_lora_loads(tmp_path, tiny_sd3):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _launch(tiny_sd3, resumed, 2, "--algorithm", "e2po", "--e2po_num_directions", "1")
    assert (resumed / "checkpoint-2").is_dir()
    log = _launch(tiny_sd3, resumed, 4, "--algorithm", "e2po", "--e2po_num_directions", "1",
                  "--resume_from_checkpoint", "latest")  # fmt: skip
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "ppo"], "--algorithm 'ppo' unknown"),
        (["--algorithm", "grpo", "--e2po_max_scale", "0.5"], "--e2po_max_scale is an E2PO option"),
        (["--reward_funcs", "aesthetics"], "--reward_funcs 'aesthetics' unknown"),
        (["--dataset", "/nonexistent/prompts.txt"], "--dataset '/nonexistent/prompts.txt'"),
        (["--num_generations", "1"], "num_generations` must be >= 2"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, tiny_sd3, args, message):
    cmd = [sys.executable, SCRIPT, "--pretrained_model_name_or_path", tiny_sd3, "--output_dir", str(tmp_path),
           "--max_steps", "1", *TINY, *args]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert message in last and "error" in last, last
    assert "Traceback" not in result.stderr


def test_prompt_files_and_reward_names(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "training"))
    try:
        import train_grpo
    finally:
        sys.path.pop(0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a cat", "label": 1}\n\n{"prompt": "a dog", "label": 2}\n')
    assert train_grpo.load_prompts(str(prompts)) == [{"prompt": "a cat", "label": 1}, {"prompt": "a dog", "label": 2}]
    text = tmp_path / "prompts.txt"
    text.write_text("a cat\n a dog \n")
    assert train_grpo.load_prompts(str(text)) == ["a cat", "a dog"]
    with pytest.raises(ValueError, match="needs a model path"):
        train_grpo.build_reward("clip_score")
