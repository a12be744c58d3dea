"""EpiDiff: the trainer pair (`EpiDiffConfig` + `EpiDiffTrainer`): loss, exact resume, saving, bad input."""

import numpy as np
import pytest
import torch

from diffusers_ext.data.epidemics import chronological_windows, simulate_metapopulation_sir
from diffusers_ext.pipelines.epidiff.pipeline_epidiff import EpiDiffForecastPipeline
from diffusers_ext.trainers.epidiff_config import EpiDiffConfig
from diffusers_ext.trainers.epidiff_trainer import EpiDiffTrainer, build_epidiff_denoiser


def data():
    series = simulate_metapopulation_sir(num_nodes=4, num_steps=80, seed=0)
    return chronological_windows(series.values, history=5, horizon=3)["train"].windows, series.adjacency


def rows(windows):
    return [{"window": window} for window in windows]


def trainer(output_dir, train_dataset=None, **kwargs):
    windows, adjacency = data()
    settings = {"history": 5, "hidden_size": 8, "num_heads": 2, "num_layers": 1, "dropout": 0.0, "max_steps": 4}
    settings.update(num_train_timesteps=20, per_device_train_batch_size=8, disable_tqdm=True, save_strategy="no")
    args = EpiDiffConfig(output_dir=str(output_dir), **{**settings, **kwargs})
    model = build_epidiff_denoiser(args, windows)
    return EpiDiffTrainer(model, args, train_dataset=train_dataset or rows(windows), adjacency=adjacency)


def test_training_lowers_the_denoising_loss_and_is_seeded(tmp_path):
    history = trainer(tmp_path / "a", max_steps=60).train()
    losses = [row["loss"] for row in history]
    assert len(losses) == 60 and [row["step"] for row in history] == list(range(1, 61))
    assert np.mean(losses[-15:]) < np.mean(losses[:15])
    again = [row["loss"] for row in trainer(tmp_path / "b", max_steps=60).train()]
    assert again == losses  # batches and noise are seeded by (seed, step)
    other = [row["loss"] for row in trainer(tmp_path / "c", max_steps=60, seed=1).train()]
    assert other != losses


def test_resume_matches_an_uninterrupted_run(tmp_path):
    full = trainer(tmp_path / "full", max_steps=6, dropout=0.1)
    full_history = full.train()
    first = trainer(tmp_path / "resumed", max_steps=6, dropout=0.1, save_strategy="steps", save_steps=3)
    first.train(max_steps=3)
    assert (tmp_path / "resumed" / "checkpoint-3" / "epidiff_state.safetensors").is_file()
    second = trainer(
        tmp_path / "resumed",
        max_steps=6,
        dropout=0.1,
        save_strategy="steps",
        save_steps=3,
        resume_from_checkpoint="latest",
    )
    history = second.train()
    assert second.global_step == 6 and [row["step"] for row in history] == [4, 5, 6]
    assert [row["loss"] for row in history] == [row["loss"] for row in full_history[3:]]
    for a, b in zip(full.denoiser().parameters(), second.denoiser().parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_save_model_writes_a_pipeline_folder(tmp_path):
    t = trainer(tmp_path / "run")
    t.train()
    t.save_model(str(tmp_path / "out"))
    pipe = EpiDiffForecastPipeline.from_pretrained(str(tmp_path / "out"))
    assert (tmp_path / "out" / "README.md").is_file()
    for a, b in zip(t.denoiser().parameters(), pipe.denoiser.parameters()):
        torch.testing.assert_close(a, b)
    assert pipe.scheduler.config.num_train_timesteps == 20
    windows, adjacency = data()
    pipe.set_progress_bar_config(disable=True)
    out = pipe(windows[:2, :, :5], adjacency, num_samples=2, num_inference_steps=2, output_type="np")
    assert out.samples.shape == (2, 2, 4, 3) and np.all(np.isfinite(out.samples))


def test_optimizer_is_adam_with_l2_weight_decay(tmp_path):
    t = trainer(tmp_path)
    optimizer = t.optimizer.optimizer if hasattr(t.optimizer, "optimizer") else t.optimizer
    assert type(optimizer) is torch.optim.Adam
    assert optimizer.param_groups[0]["lr"] == 2e-3 and optimizer.param_groups[0]["weight_decay"] == 1e-5


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"history": 0}, "history"),
        ({"hidden_size": 9, "num_heads": 2}, "hidden_size"),
        ({"dropout": 1.0}, "dropout"),
        ({"beta_end": 2.0}, "beta_end"),
        ({"learning_rate": 0.0}, "learning_rate"),
    ],
)
def test_config_rejects_bad_values(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        EpiDiffConfig(output_dir=str(tmp_path), **kwargs)


def test_a_datasets_dataset_trains_as_its_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    windows, _ = data()
    from_rows = [row["loss"] for row in trainer(tmp_path / "rows").train()]
    dataset = datasets.Dataset.from_dict({"window": windows})
    assert [row["loss"] for row in trainer(tmp_path / "dataset", train_dataset=dataset).train()] == from_rows


def test_trainer_rejects_bad_data(tmp_path):
    windows, adjacency = data()
    args = EpiDiffConfig(output_dir=str(tmp_path), history=5, hidden_size=8, num_heads=2, num_layers=1)
    model = build_epidiff_denoiser(args, windows)
    with pytest.raises(ValueError, match="`train_dataset` must hold windows of the model's length 8"):
        EpiDiffTrainer(model, args, rows(windows[..., :6]), adjacency)
    with pytest.raises(ValueError, match="adjacency"):
        EpiDiffTrainer(model, args, rows(windows), adjacency[:3, :3])
    with pytest.raises(ValueError, match="history"):
        EpiDiffTrainer(model, EpiDiffConfig(output_dir=str(tmp_path), history=8), rows(windows), adjacency)
    with pytest.raises(TypeError, match="SpatioTemporalDenoiser"):
        EpiDiffTrainer(torch.nn.Linear(2, 2), args, rows(windows), adjacency)
    # the raw array of the previous shape, a missing column, ragged rows, no data: named before any work
    with pytest.raises(TypeError, match="`train_dataset` must be a datasets.Dataset or a list of dicts.*ndarray"):
        EpiDiffTrainer(model, args, windows, adjacency)
    with pytest.raises(ValueError, match="`train_dataset` row 0 must be a dict with columns 'window'.*'past'"):
        EpiDiffTrainer(model, args, [{"past": w} for w in windows], adjacency)
    with pytest.raises(ValueError, match=r"row 1 has 'window' of shape \(4, 6\), row 0 of shape \(4, 8\)"):
        EpiDiffTrainer(model, args, [{"window": windows[0]}, {"window": windows[1, :, :6]}], adjacency)
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        EpiDiffTrainer(model, args, adjacency=adjacency)
    with pytest.raises(ValueError, match="`train_dataset` is empty"):
        EpiDiffTrainer(model, args, [], adjacency)
