"""training/train_parameter_diffusion.py: an in-process tiny run (upstream adapters of the zoo digit classifier, then
the diffusion model) saves a pipeline that loads and samples adapters the proxy can score; resuming from a checkpoint
keeps going and equals an uninterrupted run; bad arguments fail with one-line errors."""

import importlib.util
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file
from script_launch import as_command_line, assert_one_line_argument_error, run_bad_arguments


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_parameter_diffusion.py")
CLASSIFIER = os.path.join(REPO, "diffusers_ext", "zoo", "digits-classifier")
TINY = [
    "--classifier_path", CLASSIFIER, "--num_upstream_tasks", "3", "--adapter_steps", "2", "--adapter_batch_size", "8",
    "--hidden_size", "8", "--num_layers", "1", "--num_train_timesteps", "20", "--train_batch_size", "4",
    "--lr_warmup_steps", "0", "--checkpointing_steps", "2", "--report_to", "none", "--seed", "3",
]  # fmt: skip


def _run(output_dir, steps, *extra):
    spec = importlib.util.spec_from_file_location("train_parameter_diffusion", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--output_dir", str(output_dir), "--max_train_steps", str(steps), *TINY, *extra]
    with as_command_line(SCRIPT, argv):
        module.main(argv)


def _weights(folder):
    return load_file(os.path.join(folder, "model", "diffusion_pytorch_model.safetensors"))


def test_tiny_run_resumes_and_saves_a_loadable_pipeline(tmp_path):
    torch.set_num_threads(1)
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    _run(straight, 4)
    assert (straight / "checkpoint-2").is_dir() and (straight / "checkpoint-4").is_dir()
    # interrupted after step 2 of the same 4-step run (the learning-rate schedule spans all 4): resume from there
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    for name in ("upstream_adapters.safetensors", "upstream_tasks.json"):
        shutil.copy(straight / name, resumed / name)
    first_adapters = load_file(resumed / "upstream_adapters.safetensors")["vectors"]
    stamp = os.stat(resumed / "upstream_adapters.safetensors").st_mtime_ns
    _run(resumed, 4, "--resume_from_checkpoint", "latest")
    assert (resumed / "checkpoint-4").is_dir()
    # the saved upstream adapters are reused, not refitted
    assert os.stat(resumed / "upstream_adapters.safetensors").st_mtime_ns == stamp
    a, b = _weights(resumed), _weights(straight)
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"{name} differs after resume")
    assert any(not torch.equal(a[k], _weights_at(resumed / "checkpoint-2")[k]) for k in a if "proj_out" in k)

    from diffusers_ext import SampleThenEvaluatePipeline, load_pipeline
    from diffusers_ext.evaluation.certified_transfer import load_proxy

    proxy = load_proxy(CLASSIFIER)
    tasks = json.loads((resumed / "upstream_tasks.json").read_text())["tasks"]
    assert len(tasks) == 3 and first_adapters.shape == (3, proxy.dim)
    hidden = proxy.trunk(torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    targets, classes = torch.arange(10) % 5, torch.tensor([0, 2, 4, 6, 8])
    for pipe in (SampleThenEvaluatePipeline.from_pretrained(str(resumed)), load_pipeline(str(resumed))):
        assert type(pipe).__name__ == "SampleThenEvaluatePipeline"
        pipe.set_progress_bar_config(disable=True)
        # the stored standardisation is the upstream adapters' own
        torch.testing.assert_close(pipe.model.vector_mean, first_adapters.mean(0))
        out = pipe(
            num_hypotheses=6,
            evaluate_fn=lambda h: proxy.risks(h, hidden, targets, classes),
            num_support=10,
            num_inference_steps=3,
            generator=torch.Generator().manual_seed(0),
        )
        assert out.hypotheses.shape == (6, proxy.dim) and 0 <= out.empirical_risk <= 1
        state = pipe.vectorizer.to_state_dict(out.best_adapter)
        assert set(state) == set(proxy.vectorizer.parameter_names)
    metrics = json.loads((resumed / "training_metrics.json").read_text())
    assert metrics["num_upstream_adapters"] == 3 and metrics["vector_dim"] == proxy.dim
    assert metrics["canonical_lora"] is False
    assert "train_parameter_diffusion.py" in (resumed / "README.md").read_text()


def test_canonical_lora_trains_on_the_canonical_factors_and_keeps_the_raw_adapters(tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path, 1, "--canonical_lora")
    from diffusers_ext import SampleThenEvaluatePipeline
    from diffusers_ext.evaluation.certified_transfer import load_proxy

    proxy = load_proxy(CLASSIFIER)
    raw = load_file(tmp_path / "upstream_adapters.safetensors")["vectors"]
    canonical = proxy.vectorizer.canonicalize_lora(raw)
    assert (canonical - raw).abs().max() > 1e-3  # the saved upstream adapters are the raw fitted factors
    pipe = SampleThenEvaluatePipeline.from_pretrained(str(tmp_path))
    torch.testing.assert_close(pipe.model.vector_mean, canonical.mean(0))
    torch.testing.assert_close(pipe.model.vector_std, canonical.std(0).clamp_min(1e-6))
    assert json.loads((tmp_path / "training_metrics.json").read_text())["canonical_lora"] is True


def _weights_at(checkpoint):
    return load_file(os.path.join(checkpoint, "model.safetensors"))


def test_changed_upstream_settings_in_the_same_folder_fail_with_one_line_error(tmp_path, capsys):
    _run(tmp_path, 1)
    with pytest.raises(SystemExit) as exit_info:
        _run(tmp_path, 2, "--adapter_steps", "3")
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "use a new --output_dir" in last and "'adapter_steps': 2" in last


BAD_ARGUMENTS = [
    (["--num_upstream_tasks", "1"], "--num_upstream_tasks must be >= 2"),
    (["--adapter_learning_rate", "0"], "--adapter_learning_rate must be > 0"),
    (["--hidden_size", "0"], "--hidden_size must be >= 1"),
    (["--classifier_path", "/nonexistent"], "--classifier_path '/nonexistent' is not a folder"),
    (["--resume_from_checkpoint", "checkpoint-9"], "--resume_from_checkpoint"),
]


@pytest.fixture(scope="module")
def bad_argument_runs(tmp_path_factory):
    """Every `BAD_ARGUMENTS` case run as the command line would, all in one interpreter."""
    root = tmp_path_factory.mktemp("bad_arguments")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    return run_bad_arguments(SCRIPT, BAD_ARGUMENTS, root, ["--report_to", "none", "--max_train_steps", "2"], env=env)


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_arguments_fail_with_one_line_error(bad_argument_runs, case):
    assert_one_line_argument_error(bad_argument_runs[case], BAD_ARGUMENTS[case][1])
