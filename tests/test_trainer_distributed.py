"""What the trainers do under DeepSpeed and FSDP (checked by the calls they make) and with processes whose metrics
differ (a real two-process run: tests/test_trainer_two_processes.py)."""

import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from diffusers_ext.trainers.base_config import DiffusionTrainerConfig
from diffusers_ext.trainers.base_trainer import DiffusionTrainer


class _Trainer(DiffusionTrainer):
    """The base trainer with nothing to train (its shared helpers are what is tested)."""

    def training_step(self):
        return {}

    def _save_weights(self, output_dir):
        raise NotImplementedError("nothing to save in this test")


@pytest.fixture()
def trainer(tmp_path):
    trainer = _Trainer(DiffusionTrainerConfig(output_dir=str(tmp_path), max_grad_norm=1.0))
    trainer.create_accelerator(Accelerator(cpu=True))
    return trainer


def test_deepspeed_returning_no_norm_before_its_first_step_is_nan_not_an_error(trainer, monkeypatch):
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter.grad = torch.ones(3)
    monkeypatch.setattr(trainer.accelerator, "clip_grad_norm_", lambda parameters, max_norm: None)
    assert math.isnan(trainer.clip_gradients([parameter]))


def test_fsdp_clips_over_the_whole_model_so_the_norm_is_the_sharded_one(trainer, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].requires_grad_(False)  # a LoRA-like subset: only the second layer trains
    subset = list(model[1].parameters())
    seen = {}

    def clip(parameters, max_norm):
        seen["parameters"] = list(parameters)
        return torch.tensor(2.0)

    monkeypatch.setattr(trainer.accelerator, "clip_grad_norm_", clip)
    assert trainer.clip_gradients(subset, model=model) == 2.0
    assert [id(p) for p in seen["parameters"]] == [id(p) for p in subset]  # not FSDP: the subset itself
    monkeypatch.setattr(type(trainer.accelerator), "distributed_type", property(lambda self: DistributedType.FSDP))
    trainer.clip_gradients(subset, model=model)
    assert [id(p) for p in seen["parameters"]] == [id(p) for p in model.parameters()]


def test_reduce_metrics_in_one_process_keeps_names_and_values(trainer):
    reduced = trainer.reduce_metrics({"loss": torch.tensor(0.25), "reward": 1.5})
    assert reduced == {"loss": 0.25, "reward": 1.5}
    assert trainer.reduce_metrics({}) == {}
