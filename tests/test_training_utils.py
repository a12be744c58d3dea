import os

import pytest
import torch

from diffusers_ext.training_utils import (
    ResumableBatchSampler,
    backward_and_step,
    checkpoint_step,
    command_line,
    list_checkpoints,
    log_and_checkpoint,
    resolve_resume_checkpoint,
    save_checkpoint,
    write_model_card,
)


def _take(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def test_resumed_sampler_replays_the_uninterrupted_sequence():
    full = _take(ResumableBatchSampler(10, 3, 2, 1, seed=5), 12)
    resumed = _take(ResumableBatchSampler(10, 3, 2, 1, seed=5, start_step=7), 5)
    assert resumed == full[7:]


def test_sampler_covers_each_epoch_once_across_processes():
    # 2 processes x batch 5 = one epoch of 10 per step: the union of both shards is a permutation.
    for step in range(4):
        a = _take(ResumableBatchSampler(10, 5, 2, 0, seed=1, start_step=step), 1)[0]
        b = _take(ResumableBatchSampler(10, 5, 2, 1, seed=1, start_step=step), 1)[0]
        assert sorted(a + b) == list(range(10))
    assert (
        _take(ResumableBatchSampler(10, 5, 2, 0, seed=1), 2)[0]
        != _take(ResumableBatchSampler(10, 5, 2, 0, seed=2), 2)[0]
    )


def test_sampler_rejects_empty_dataset():
    with pytest.raises(ValueError, match="num_samples"):
        ResumableBatchSampler(0, 3, 1, 0, seed=0)


class _FakeAccelerator:
    is_main_process = True

    def __init__(self, fail=False):
        self.fail = fail

    def wait_for_everyone(self):
        pass

    def save_state(self, path):
        os.makedirs(path)
        with open(os.path.join(path, "model.safetensors"), "w") as f:
            f.write("half")
        if self.fail:
            raise RuntimeError("disk full")


def test_failed_save_keeps_the_last_good_checkpoint(tmp_path):
    save_checkpoint(_FakeAccelerator(), str(tmp_path), 10, total_limit=1)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(_FakeAccelerator(fail=True), str(tmp_path), 20, total_limit=1)
    assert list_checkpoints(str(tmp_path)) == ["checkpoint-10"]
    assert resolve_resume_checkpoint(str(tmp_path), "latest").endswith("checkpoint-10")
    save_checkpoint(_FakeAccelerator(), str(tmp_path), 30, total_limit=1)
    assert list_checkpoints(str(tmp_path)) == ["checkpoint-30"]


def test_resolve_resume_checkpoint(tmp_path):
    assert resolve_resume_checkpoint(str(tmp_path), None) is None
    assert resolve_resume_checkpoint(str(tmp_path), "latest") is None
    for step in (2, 10, 9):
        os.makedirs(tmp_path / f"checkpoint-{step}")
    assert resolve_resume_checkpoint(str(tmp_path), "latest").endswith("checkpoint-10")
    assert checkpoint_step(resolve_resume_checkpoint(str(tmp_path), "checkpoint-9")) == 9
    with pytest.raises(ValueError, match="--resume_from_checkpoint 'checkpoint-3'"):
        resolve_resume_checkpoint(str(tmp_path), "checkpoint-3")


def test_model_card(tmp_path):
    path = write_model_card(str(tmp_path), "T", "Desc.", "python x.py --a 1", metrics={"acc": 0.5}, tags=["t"])
    text = open(path).read()
    assert text.startswith("---\nlibrary_name: diffusers")
    assert "python x.py --a 1" in text and "| acc | 0.5 |" in text and "- t" in text


@pytest.mark.parametrize(
    "env, launcher",
    [
        ({}, "python"),
        ({"ACCELERATE_MIXED_PRECISION": "no", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "accelerate launch"),
        (
            {"ACCELERATE_MIXED_PRECISION": "no", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
            "accelerate launch --multi_gpu --num_processes 2",
        ),
        (
            {"ACCELERATE_USE_CPU": "true", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            "ACCELERATE_USE_CPU=true torchrun --standalone --nproc_per_node 2",
        ),
    ],
)
def test_command_line_names_the_launcher_that_ran(monkeypatch, env, launcher):
    for name in ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.argv", ["training/train_ddpm.py", "--output_dir", "out"])
    assert command_line() == f"{launcher} training/train_ddpm.py --output_dir out"


def test_optimizer_flags_build_adamw_and_scaled_schedule():
    import argparse

    from diffusers_ext.training_utils import add_optimizer_arguments, build_optimizer

    parser = argparse.ArgumentParser()
    add_optimizer_arguments(parser, learning_rate=1e-2, lr_scheduler="linear", lr_warmup_steps=2, weight_decay=0.1)
    parser.add_argument("--max_train_steps", type=int, default=10)
    args = parser.parse_args(["--adam_beta1", "0.8"])
    assert args.max_grad_norm == 1.0 and args.adam_epsilon == 1e-8
    optimizer, lr_scheduler = build_optimizer(torch.nn.Linear(2, 2).parameters(), args, num_processes=2)
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert group["betas"] == (0.8, 0.999) and group["weight_decay"] == 0.1
    # Warm-up and length count per-process scheduler steps: 2 warm-up optimizer steps = 4 scheduler steps.
    lrs = []
    for _ in range(20):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        lr_scheduler.step()
    assert lrs[0] == 0.0 and abs(max(lrs) - 1e-2) < 1e-12 and lrs.index(max(lrs)) == 4
    assert lrs[-1] < lrs[5]


class _FakeHub:
    """Stands in for the Hub's API (`HfApi.whoami`, `create_repo`, `upload_folder`; no network in tests), with
    `HF_HUB_OFFLINE` unset for the test. tests/test_hub.py holds the start-up checks."""

    def __init__(self, monkeypatch):
        import types

        import huggingface_hub.constants
        from huggingface_hub import HfApi

        self.calls = []
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

        def whoami(api, token=None, **kwargs):
            self.calls.append(("whoami", api.token))
            return {"name": "user", "auth": {"accessToken": {"role": "write"}}}

        def create_repo(api, repo_id, exist_ok=False, token=None, **kwargs):
            self.calls.append(("create_repo", repo_id, exist_ok, token))
            return types.SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"user/{repo_id}")

        def upload_folder(api, repo_id, folder_path, token=None, ignore_patterns=None, **kwargs):
            self.calls.append(("upload_folder", repo_id, folder_path, token, ignore_patterns))
            self.uploaded = sorted(os.listdir(folder_path))

        monkeypatch.setattr(HfApi, "whoami", whoami)
        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


def test_push_to_hub_creates_the_repo_and_uploads_the_folder_without_checkpoints(tmp_path, monkeypatch):
    from diffusers_ext.training_utils import push_to_hub

    hub = _FakeHub(monkeypatch)
    out = tmp_path / "my-model"
    out.mkdir()
    assert push_to_hub(str(out), None, "tok") == "user/my-model"
    assert hub.calls[0] == ("create_repo", "my-model", True, "tok")
    name, repo_id, folder, token, ignore = hub.calls[1]
    assert (name, repo_id, folder, token) == ("upload_folder", "user/my-model", str(out), "tok")
    assert "checkpoint-*" in ignore and "logs/*" in ignore


def test_training_script_pushes_its_result_when_asked(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))
    try:
        import train_classifier
    finally:
        sys.path.pop(0)
    hub = _FakeHub(monkeypatch)
    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--max_train_steps", "1", "--report_to", "none", "--push_to_hub"]
    train_classifier.main([*argv, "--hub_model_id", "me/digits-classifier", "--hub_token", "tok"])
    assert [call[0] for call in hub.calls] == ["whoami", "create_repo", "upload_folder"]  # checked at the start
    assert hub.calls[2][1:4] == ("me/digits-classifier", str(out), "tok")
    assert "README.md" in hub.uploaded and "config.json" in hub.uploaded
    hub.calls.clear()
    train_classifier.main(["--output_dir", str(tmp_path / "local"), "--max_train_steps", "1", "--report_to", "none"])
    assert hub.calls == []  # no --push_to_hub, no upload


def test_model_card_licence_is_the_base_models(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: openrail++\nlibrary_name: diffusers\n---\n# Base\n")
    card = open(write_model_card(str(tmp_path / "a"), "T", "D.", "cmd", base_model=str(base))).read()
    assert "license: openrail++" in card and f"base_model: {base}" in card
    (base / "README.md").unlink()
    card = open(write_model_card(str(tmp_path / "b"), "T", "D.", "cmd", base_model=str(base))).read()
    assert "license: other" in card  # a base model whose card names no licence
    card = open(write_model_card(str(tmp_path / "c"), "T", "D.", "cmd")).read()
    assert "license: apache-2.0" in card  # trained from scratch by the pack's scripts


def _tensorboard_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [root for root, _, files in os.walk(folder) if any(f.startswith("events.out") for f in files)]
    assert runs, f"no tensorboard event file under {folder}"
    events = EventAccumulator(runs[0], size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    return events


def test_validation_images_go_to_tensorboard_and_to_output_dir(tmp_path):
    from diffusers_ext.training_utils import build_accelerator, log_validation_images

    accelerator = build_accelerator(str(tmp_path), report_to="tensorboard")
    accelerator.init_trackers("test")
    images = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    folder = log_validation_images(accelerator, images, ["zero", "one", "a b/c"], step=7, output_dir=str(tmp_path))
    accelerator.end_training()
    assert folder == os.path.join(str(tmp_path), "validation", "step-7")
    assert sorted(os.listdir(folder)) == ["00-zero.png", "01-one.png", "02-a_b_c.png"]
    events = _tensorboard_events(tmp_path / "logs")
    assert events.Tags()["images"], events.Tags()
    assert [e.step for e in events.Images(events.Tags()["images"][0])] == [7]


class _FakeWandbTracker:
    name = "wandb"

    def __init__(self):
        self.logged, self.tables = [], []

    def log(self, values, step=None):
        self.logged.append((values, step))

    def log_table(self, table_name, columns=None, data=None, step=None):
        self.tables.append((table_name, columns, data, step))


class _OtherTracker:
    name = "comet_ml"


def test_validation_logs_wandb_images_with_captions_and_skips_other_trackers(tmp_path, monkeypatch):
    import sys
    import types

    from diffusers_ext.training_utils import log_validation_images, log_validation_texts

    fake_wandb = types.ModuleType("wandb")
    fake_wandb.Image = lambda array, caption=None: ("image", array.shape, caption)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    tracker = _FakeWandbTracker()
    accelerator = types.SimpleNamespace(trackers=[tracker, _OtherTracker()])
    log_validation_images(accelerator, torch.zeros(2, 3, 4, 4), ["x", "y"], step=3, output_dir=str(tmp_path))
    ((values, step),) = tracker.logged
    assert step == 3 and values["validation"] == [("image", (4, 4, 3), "x"), ("image", (4, 4, 3), "y")]
    path = log_validation_texts(accelerator, ["12", "34"], ["1+1=", "3+3="], step=5, output_dir=str(tmp_path))
    assert open(path, encoding="utf-8").read().count("output:") == 2
    assert tracker.tables == [("validation", ["prompt", "output"], [("1+1=", "12"), ("3+3=", "34")], 5)]
    with pytest.raises(ValueError, match="captions"):
        log_validation_images(accelerator, torch.zeros(2, 3, 4, 4), ["x"], step=3, output_dir=str(tmp_path))


def test_validation_texts_go_to_tensorboard(tmp_path):
    from diffusers_ext.training_utils import build_accelerator, log_validation_texts

    accelerator = build_accelerator(str(tmp_path), report_to="tensorboard")
    accelerator.init_trackers("test")
    log_validation_texts(accelerator, ["abc"], ["a"], step=2, output_dir=str(tmp_path))
    accelerator.end_training()
    events = _tensorboard_events(tmp_path / "logs")
    assert any("validation" in tag for tag in events.Tags()["tensors"]), events.Tags()


def test_validation_flags_and_schedule():
    import argparse

    from diffusers_ext.training_utils import add_validation_arguments, check_validation_arguments, validation_due

    parser = argparse.ArgumentParser()
    add_validation_arguments(parser, "prompt")
    args = parser.parse_args(["--validation_prompts", "a cat", "--validation_steps", "5"])
    assert args.validation_prompt == ["a cat"] and args.num_validation_images == 4
    assert [s for s in range(1, 12) if validation_due(args, s)] == [5, 10] and validation_due(args, 11, final=True)
    off = parser.parse_args([])
    assert not validation_due(off, 5) and not validation_due(off, 5, final=True)
    with pytest.raises(SystemExit):
        check_validation_arguments(parser.parse_args(["--validation_steps", "5"]), parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--num_validation_images", "0"])
    labels = argparse.ArgumentParser()
    add_validation_arguments(labels, "class_label")
    only_labels = labels.parse_args(["--validation_class_labels", "3"])
    assert not validation_due(only_labels, 5) and validation_due(only_labels, 5, final=True)


def test_option_aliases_share_the_destination_and_keep_the_default():
    import argparse

    from diffusers_ext.training_utils import add_option_aliases

    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--use_lora", action="store_true")
    add_option_aliases(parser, {"--max_train_steps": "--max_steps"})
    assert parser.parse_args([]).max_steps == 100
    assert parser.parse_args(["--max_train_steps", "7"]).max_steps == 7
    with pytest.raises(ValueError, match="--nope"):
        add_option_aliases(parser, {"--x": "--nope"})


class _LoggingAccelerator(_FakeAccelerator):
    def __init__(self):
        super().__init__()
        self.logged = []

    def log(self, logs, step):
        self.logged.append(step)


def test_log_and_checkpoint_follows_the_step_options_and_always_ends_with_both(tmp_path):
    from types import SimpleNamespace

    args = SimpleNamespace(
        logging_steps=2, checkpointing_steps=3, max_train_steps=7, output_dir=str(tmp_path), checkpoints_total_limit=2
    )
    accelerator = _LoggingAccelerator()
    saved = [log_and_checkpoint(accelerator, args, step, {"loss": 0.0}) for step in range(1, 8)]
    assert accelerator.logged == [2, 4, 6, 7]
    assert [checkpoint_step(p) for p in saved if p is not None] == [3, 6, 7]
    assert [checkpoint_step(p) for p in list_checkpoints(str(tmp_path))] == [6, 7]  # the total limit holds


class _RecordingAccelerator:
    """What `backward_and_step` asks of an accelerator, recorded."""

    def __init__(self, sync_gradients):
        self.sync_gradients = sync_gradients
        self.clipped = []

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        self.clipped.append(max_norm)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


@pytest.mark.parametrize("sync, max_grad_norm, clipped", [(True, 0.5, [0.5]), (False, 0.5, []), (True, None, [])])
def test_backward_and_step_clips_only_at_synchronisation_and_steps_everything(sync, max_grad_norm, clipped):
    weight = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    accelerator = _RecordingAccelerator(sync)
    backward_and_step(accelerator, (weight**2).sum() / 2, [weight], optimizer, lr_scheduler, max_grad_norm)
    assert accelerator.clipped == clipped
    # the gradient is the weight (norm 5): clipped to 0.5 it moves the weight by a tenth of itself
    expected = [2.7, 3.6] if clipped else [0.0, 0.0]
    torch.testing.assert_close(weight.detach(), torch.tensor(expected))
    assert weight.grad is None or not weight.grad.any()  # zero_grad ran
    assert lr_scheduler.get_last_lr() == [0.5]
