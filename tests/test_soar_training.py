"""training/train_masked_lm.py: the masked-diffusion loss, argument errors, and exact resume under accelerate."""

import importlib.util
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_masked_lm.py")
TINY = [
    "--hidden_size",
    "16",
    "--num_layers",
    "1",
    "--num_heads",
    "2",
    "--intermediate_size",
    "32",
    "--num_digits",
    "2",
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
    spec = importlib.util.spec_from_file_location("train_masked_lm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": REPO}


def test_sudoku_task_batches_are_puzzles_of_their_grids():
    module = _script_module()
    args = module.parse_args(
        ["--output_dir", "unused", "--task", "sudoku", "--pool_size", "8", "--min_givens", "10", "--max_givens", "12"]
    )
    from diffusers_ext.data.sudoku import is_valid_grid
    from diffusers_ext.testing import get_tiny_lm_tokenizer

    task = module.SudokuTask(args, get_tiny_lm_tokenizer())
    prompts, answers = task.batch(task.data[:4], torch.Generator().manual_seed(0))
    assert prompts.shape == (4, task.prompt_length) and answers.shape == (4, task.gen_length) == (4, 36)
    grids = task.encoder.decode(answers)
    puzzles = task.encoder.decode(prompts[:, 1:-1])
    assert all(is_valid_grid(g) for g in grids.tolist())
    assert bool(((puzzles == 0) | (puzzles == grids)).all()) and (puzzles > 0).sum(1).tolist() <= [12] * 4


def test_loss_weights_masked_tokens_by_inverse_masking_probability():
    module = _script_module()
    logits = torch.zeros(2, 3, 5)
    targets = torch.tensor([[0, 1, 2], [3, 4, 0]])
    masked = torch.tensor([[True, False, False], [True, True, False]])
    mask_prob = torch.tensor([0.5, 0.25])
    ce = torch.log(torch.tensor(5.0))  # uniform logits
    expected = (ce / 0.5 + 2 * ce / 0.25) / 6
    assert module.masked_diffusion_loss(logits, targets, masked, mask_prob).item() == pytest.approx(expected.item())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_digits", "5"], "--num_digits"),
        (["--gen_length", "2"], "--gen_length"),
        (["--num_heads", "3"], "--hidden_size"),
        (["--task", "sudoku", "--min_givens", "30", "--max_givens", "10"], "--min_givens"),
        (["--task", "chess"], "--task"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, args, message):
    module = _script_module()
    with pytest.raises(SystemExit):
        module.parse_args(["--output_dir", str(tmp_path), *args])


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
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
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
    a = load_file(os.path.join(resumed, "model", "model.safetensors"))
    b = load_file(os.path.join(straight, "model", "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")

    from diffusers_ext import DiffusionLMPipeline

    pipe = DiffusionLMPipeline.from_pretrained(str(resumed))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="<|bos|>12+34=", gen_length=7, eos_early_stop=False)
    assert out.sequences.shape == (1, 7)
    assert "train_masked_lm.py" in (resumed / "README.md").read_text()


@pytest.mark.parametrize("task", ["addition", "sudoku"])
def test_validation_texts_reach_the_tracker_and_the_folder(tmp_path, task):
    from test_training_utils import _tensorboard_events

    out = tmp_path / "out"
    extra = ["--pool_size", "8"] if task == "sudoku" else []
    validation = ["--num_validation_images", "3", "--validation_steps", "1"]
    _script_module().main(
        ["--output_dir", str(out), "--task", task, "--max_train_steps", "2", *TINY, *extra, *validation]
        + ["--report_to", "tensorboard"]
    )
    assert sorted(os.listdir(out / "validation")) == ["step-1.txt", "step-2.txt"]
    text = (out / "validation" / "step-2.txt").read_text()
    assert text.count("prompt: ") == 3 and text.count("output: ") == 3
    events = _tensorboard_events(out / "logs")
    assert any("validation" in tag for tag in events.Tags()["tensors"]), events.Tags()
