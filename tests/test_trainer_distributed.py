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


# ---------------------------------------------------------------------------------------------------------------------
# Parameters replaced by `prepare` (FSDP, ZeRO-3) and saving from sharded parameters, checked by the calls made
# ---------------------------------------------------------------------------------------------------------------------


def _prepare_replacing_parameters(monkeypatch):
    """Make `Accelerator.prepare` return a model whose parameters are new tensors, as FSDP's wrapping does."""
    import copy

    original = Accelerator.prepare

    def prepare(self, *objects, **kwargs):
        prepared = original(self, *objects, **kwargs)
        return tuple(copy.deepcopy(o) if isinstance(o, torch.nn.Module) else o for o in prepared)

    monkeypatch.setattr(Accelerator, "prepare", prepare)


def test_grpo_ema_and_clipping_use_the_prepared_models_parameters(tmp_path, monkeypatch):
    from test_grpo_trainer import tiny_trainer

    _prepare_replacing_parameters(monkeypatch)
    trainer = tiny_trainer(tmp_path, use_ema=True, ema_decay=0.5, ema_update_steps=1)
    prepared = [p for p in trainer.transformer.parameters() if p.requires_grad]
    assert [id(p) for p in trainer.trainable_parameters] == [id(p) for p in prepared]
    with torch.no_grad():
        prepared[0].add_(1.0)
    # the EMA follows the tensors the optimizer updates (its first update copies them: diffusers' decay warm-up)
    trainer.ema.step(trainer.trainable_parameters)
    assert torch.equal(trainer.ema.shadow_params[0], prepared[0].detach())


def test_unlearning_clipping_uses_the_prepared_models_parameters(monkeypatch):
    from test_unlearning_trainer import _trainer

    _prepare_replacing_parameters(monkeypatch)
    trainer = _trainer()
    assert [id(p) for p in trainer.trainable_parameters] == [
        id(p) for p in trainer.unet.parameters() if p.requires_grad
    ]


def _shard_parameters(monkeypatch, trainer, main_process=True, change=0.5):
    """Pretend the run shards its parameters: `get_state_dict` (the gathering collective) is recorded and returns
    the full weights with every trainable value set to `change`, so a saved file shows where it was read from."""
    calls = []

    def get_state_dict(model, unwrap=True):
        calls.append(model)
        trainable = {n for n, p in trainer.accelerator.unwrap_model(model).named_parameters() if p.requires_grad}
        state = trainer.accelerator.unwrap_model(model).state_dict()
        return {k: torch.full_like(v, change) if k in trainable else v.clone() for k, v in state.items()}

    monkeypatch.setattr(DiffusionTrainer, "shards_parameters", property(lambda self: True))
    monkeypatch.setattr(trainer.accelerator, "get_state_dict", get_state_dict)
    monkeypatch.setattr(type(trainer.accelerator), "is_main_process", property(lambda self: main_process))
    return calls


def test_grpo_lora_saved_from_sharded_parameters_comes_from_the_gathered_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from test_grpo_trainer import tiny_trainer

    trainer = tiny_trainer(tmp_path / "run")
    calls = _shard_parameters(monkeypatch, trainer)
    trainer.save_model(str(tmp_path / "out"))
    assert len(calls) == 1
    saved = load_file(tmp_path / "out" / "pytorch_lora_weights.safetensors")
    assert saved and all(torch.all(v == 0.5) for v in saved.values())

    calls = _shard_parameters(monkeypatch, trainer, main_process=False)
    trainer.save_model(str(tmp_path / "other"))
    assert len(calls) == 1, "a process other than the main one must join the gathering collective"
    assert not (tmp_path / "other").exists()


def test_grpo_full_fine_tune_saved_from_sharded_parameters_loads_with_from_pretrained(tmp_path, monkeypatch):
    from diffusers import SD3Transformer2DModel
    from test_grpo_trainer import tiny_trainer

    trainer = tiny_trainer(tmp_path / "run", peft_config=None)
    calls = _shard_parameters(monkeypatch, trainer, change=0.25)
    trainer.save_model(str(tmp_path / "out"))
    assert len(calls) == 1
    loaded = SD3Transformer2DModel.from_pretrained(tmp_path / "out" / "transformer")
    original = trainer.unwrapped_transformer
    assert loaded.state_dict().keys() == original.state_dict().keys()
    assert (loaded.config.num_layers, loaded.config.sample_size) == (
        original.config.num_layers,
        original.config.sample_size,
    )
    assert all(torch.all(p == 0.25) for p in loaded.parameters())


def test_unlearning_saved_from_sharded_parameters_comes_from_the_gathered_weights(tmp_path, monkeypatch):
    from diffusers import UNet2DModel
    from safetensors.torch import load_file
    from test_unlearning_trainer import _lora, _sd_trainer, _trainer

    trainer = _trainer(output_dir=str(tmp_path / "run"))
    calls = _shard_parameters(monkeypatch, trainer)
    trainer.save_model(str(tmp_path / "full"))
    assert len(calls) == 1
    unet = UNet2DModel.from_pretrained(tmp_path / "full" / "unet")
    assert all(torch.all(p == 0.5) for p in unet.parameters())

    trainer, _ = _sd_trainer(peft_config=_lora(2), output_dir=str(tmp_path / "run_lora"))
    calls = _shard_parameters(monkeypatch, trainer)
    trainer.save_model(str(tmp_path / "lora"))
    assert len(calls) == 1
    saved = load_file(tmp_path / "lora" / "pytorch_lora_weights.safetensors")
    assert saved and all(torch.all(v == 0.5) for v in saved.values())


def test_unlearning_refuses_lora_on_a_pixel_unet_with_sharded_parameters_before_training(monkeypatch):
    from test_unlearning_trainer import _lora, _trainer

    monkeypatch.setattr(DiffusionTrainer, "shards_parameters", property(lambda self: True))
    with pytest.raises(ValueError, match="peft_config"):
        _trainer(peft_config=_lora(2))


def test_shards_parameters_reads_the_distributed_type(trainer, monkeypatch):
    assert not trainer.shards_parameters and trainer.gathered_state_dict(torch.nn.Linear(2, 2)) is None
    monkeypatch.setattr(type(trainer.accelerator), "distributed_type", property(lambda self: DistributedType.FSDP))
    assert trainer.shards_parameters
