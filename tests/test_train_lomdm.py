"""training/train_lomdm.py: argument errors, an in-process tiny run that saves a loadable pipeline, and exact resume
under a two-process accelerate launch."""

import importlib.util
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_lomdm.py")
TINY = [
    "--hidden_size",
    "16",
    "--num_layers",
    "1",
    "--num_heads",
    "2",
    "--intermediate_size",
    "32",
    "--schedule_hidden_size",
    "8",
    "--num_train",
    "64",
    "--train_batch_size",
    "4",
    "--lr_warmup_steps",
    "0",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
]


def _script_module():
    spec = importlib.util.spec_from_file_location("train_lomdm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["--c1", "0.5", "--c2", "0.6"], "--c2"),
        (["--method", "mdlm", "--c2", "0.3"], "mdlm"),
        (["--num_heads", "3"], "--hidden_size"),
        (["--num_mask_samples", "0"], "--num_mask_samples"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, args, message, capsys):
    module = _script_module()
    with pytest.raises(SystemExit):
        module.parse_args(["--output_dir", str(tmp_path), *args])
    assert message in capsys.readouterr().err


def test_tiny_run_saves_a_pipeline_that_samples_with_the_learned_order(tmp_path):
    module = _script_module()
    module.main(["--output_dir", str(tmp_path), "--max_train_steps", "2", *TINY])
    from diffusers_ext import LoMDMPipeline

    pipe = LoMDMPipeline.from_pretrained(str(tmp_path))
    pipe.set_progress_bar_config(disable=True)
    assert pipe.scheduler.config.schedule == "learned" and pipe.reverse_schedule is not None
    out = pipe(prompt="<|bos|>", gen_length=16, num_inference_steps=16, temperature=1.0, eos_early_stop=False)
    assert out.sequences.shape == (1, 16) and not (out.sequences == pipe.tokenizer.mask_token_id).any()
    card = (tmp_path / "README.md").read_text()
    assert "train_lomdm.py" in card and "validation NELBO" in card


def _launch(output_dir, steps, *extra):
    cmd = [
        *accelerate_cpu_launch(),
        SCRIPT,
        "--output_dir",
        str(output_dir),
        "--max_train_steps",
        str(steps),
        *TINY,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": REPO}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _launch(resumed, 2)
    assert_world_size(log, resumed / "checkpoint-2")
    log = _launch(resumed, 4, "--resume_from_checkpoint", "latest")
    assert "Resuming from" in log and "checkpoint-2" in log
    _launch(straight, 4)
    for component in ("model", "forward_schedule", "reverse_schedule"):
        folder = "model" if component == "model" else component
        name = "model.safetensors" if component == "model" else "diffusion_pytorch_model.safetensors"
        a = load_file(os.path.join(resumed, folder, name))
        b = load_file(os.path.join(straight, folder, name))
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{component}.{key} differs after resume")


def test_validation_sequences_go_to_the_folder(tmp_path):
    module = _script_module()
    argv = ["--output_dir", str(tmp_path), "--max_train_steps", "2", *TINY]
    module.main([*argv, "--num_validation_images", "3", "--validation_steps", "1"])
    assert sorted(os.listdir(tmp_path / "validation")) == ["step-1.txt", "step-2.txt"]
    assert (tmp_path / "validation" / "step-2.txt").read_text().count("output: ") == 3
