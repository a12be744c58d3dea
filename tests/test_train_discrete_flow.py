"""The discrete flow training script under `accelerate launch`: exact resume, a loadable result, argument errors."""

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from script_launch import accelerate_cpu_launch, assert_world_size


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_discrete_flow.py")
MULTIMASK = ["--source", "multimask", "--num_mask_tokens", "3", "--coupling", "embedding_ot", "--loss_type", "kl"]
TINY = [
    "--vocab_size",
    "4",
    "--sequence_length",
    "6",
    "--hmm_states",
    "2",
    "--num_train_sequences",
    "64",
    "--num_validation_sequences",
    "8",
    "--hidden_size",
    "16",
    "--num_layers",
    "1",
    "--num_heads",
    "2",
    "--train_batch_size",
    "8",
    "--lr_scheduler",
    "constant",
    "--lr_warmup_steps",
    "0",
    "--checkpointing_steps",
    "2",
    "--report_to",
    "none",
    "--seed",
    "3",
    "--bound_samples",
    "2",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


def _launch(output_dir, steps, *extra):
    cmd = [
        *accelerate_cpu_launch(),
        SCRIPT,
        "--output_dir",
        str(output_dir),
        "--max_train_steps",
        str(steps),
        *TINY,
        *MULTIMASK,
        *extra,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def _run_in_process(output_dir, steps, *extra):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_discrete_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra])


def test_tiny_run_saves_a_loadable_pipeline_and_model_card(tmp_path):
    torch.set_num_threads(1)
    _run_in_process(tmp_path, 2, "--source", "uniform", "--coupling", "hamming_ot", "--loss_type", "entropy")
    from diffusers_ext import DiscreteFlowPipeline

    pipe = DiscreteFlowPipeline.from_pretrained(str(tmp_path))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape == (2, 6) and out.nfe == 3
    assert pipe.scheduler.config.source == "uniform"
    metrics = json.loads((tmp_path / "validation_metrics.json").read_text())
    assert metrics["validation entropy perplexity bound"] >= metrics["validation kl perplexity bound"] >= 1.0
    assert "validation perplexity of the true HMM" in metrics
    card = (tmp_path / "README.md").read_text()
    assert "train_discrete_flow.py" in card and "hamming_ot" in card
    assert (tmp_path / "checkpoint-2").is_dir()


@pytest.mark.two_process
@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted_run(tmp_path):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    log = _launch(resumed, 2)
    assert_world_size(log, resumed / "checkpoint-2")
    log = _launch(resumed, 4, "--resume_from_checkpoint", "latest")
    assert "Resuming from" in log and "checkpoint-2" in log
    _launch(straight, 4)
    a, b = _weights(resumed), _weights(straight)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    early = load_file(os.path.join(resumed, "checkpoint-2", "model.safetensors"))
    assert any(not torch.equal(early[k], a[k]) for k in early if k in a)

    from diffusers_ext import DiscreteFlowPipeline, load_pipeline

    for pipe in (load_pipeline(str(resumed)), DiscreteFlowPipeline.from_pretrained(str(resumed))):
        assert type(pipe).__name__ == "DiscreteFlowPipeline"
        pipe.set_progress_bar_config(disable=True)
        out = pipe(batch_size=3, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
        assert out.sequences.shape == (3, 6) and out.sequences.max() < 4 and out.nfe == 4
        assert pipe.scheduler.config.source == "multimask" and pipe.scheduler.num_mask_tokens == 3
    metrics = json.loads((resumed / "validation_metrics.json").read_text())
    assert metrics["validation kl perplexity bound"] >= 1.0
    assert "train_discrete_flow.py" in (resumed / "README.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "multimask"], "--num_mask_tokens"),
        (["--num_mask_tokens", "4"], "--num_mask_tokens"),
        (["--coupling", "hamming_ot", "--train_batch_size", "1"], "--train_batch_size"),
    ],
)
def test_bad_arguments_fail_with_one_line_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        _run_in_process(tmp_path, 1, *args)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in last and "error" in last


def test_missing_checkpoint_is_an_error_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--resume_from_checkpoint"):
        _run_in_process(tmp_path, 1, "--resume_from_checkpoint", "checkpoint-999", "--report_to", "none")


def test_validation_sequences_go_to_the_folder(tmp_path):
    validation = ["--num_validation_images", "2", "--validation_steps", "1", "--validation_inference_steps", "4"]
    _run_in_process(tmp_path, 2, *validation)
    assert sorted(os.listdir(tmp_path / "validation")) == ["step-1.txt", "step-2.txt"]
    outputs = [line for line in (tmp_path / "validation" / "step-2.txt").read_text().splitlines() if "output:" in line]
    assert len(outputs) == 2 and all(
        len(line.split()) == 1 + int(TINY[TINY.index("--sequence_length") + 1]) for line in outputs
    )
