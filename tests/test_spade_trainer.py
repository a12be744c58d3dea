"""SPADE: the trainer (three losses, resume) and the offline optimisation pipeline."""

import numpy as np
import pytest
import torch

from diffusers_ext.data.offline_bbo import TFBindLikeTask, from_logits, to_logits
from diffusers_ext.models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from diffusers_ext.pipelines.spade.pipeline_offline_optimization import OfflineOptimizationPipeline
from diffusers_ext.pipelines.spade.search import EAConfig, acquisition
from diffusers_ext.trainers.spade_config import SpadeConfig
from diffusers_ext.trainers.spade_trainer import SpadeTrainer, spade_schedulers


def data(n=40, d=3):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, d)).astype(np.float32)
    return x, (-(x**2).sum(1) + 0.1 * rng.normal(size=n)).astype(np.float32)


def trainer(tmp_path, **kwargs):
    torch.manual_seed(0)
    model = ScalarDiffusionSurrogate(x_dim=3, hidden_size=16, time_embed_dim=8)
    args = SpadeConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, disable_tqdm=True, support_k=3, **kwargs
    )
    return SpadeTrainer(model, args, train_dataset=rows(*data()))


def rows(x, y):
    return [{"x": xi, "y": yi} for xi, yi in zip(x, y)]


def test_trainer_logs_the_three_losses_and_stores_normalisation(tmp_path):
    t = trainer(tmp_path)
    history = t.train()
    assert len(history) == 4 and {"denoising", "calibration", "support", "loss"} <= set(history[-1])
    assert all(np.isfinite(h["loss"]) for h in history)
    x, y = data()
    assert float(t.surrogate().y_mean) == pytest.approx(float(y.mean()), abs=1e-5)
    no_terms = trainer(tmp_path / "plain", calibration_weight=0.0, support_weight=0.0).train()
    assert set(no_terms[-1]) == {"denoising", "loss", "step"}


def test_trainer_resume_matches_uninterrupted_run(tmp_path):
    full = trainer(tmp_path / "full")
    full.train()
    first = trainer(tmp_path / "resumed", save_strategy="steps", save_steps=2)
    first.train(max_steps=2)
    second = trainer(tmp_path / "resumed", save_strategy="steps", save_steps=2, resume_from_checkpoint="latest")
    second.train()
    for a, b in zip(full.surrogate().parameters(), second.surrogate().parameters()):
        torch.testing.assert_close(a, b)


def test_a_datasets_dataset_trains_as_its_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    torch.manual_seed(0)
    model = ScalarDiffusionSurrogate(x_dim=3, hidden_size=16, time_embed_dim=8)
    args = SpadeConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, disable_tqdm=True, support_k=3
    )
    x, y = data()
    history = SpadeTrainer(model, args, train_dataset=datasets.Dataset.from_dict({"x": x, "y": y})).train()
    assert [row["loss"] for row in history] == [row["loss"] for row in trainer(tmp_path / "rows").train()]


def test_trainer_rejects_bad_data(tmp_path):
    model = ScalarDiffusionSurrogate(x_dim=3, hidden_size=8, time_embed_dim=8)
    args = SpadeConfig(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"column 'x' must hold designs of shape \(3,\).*got \(2,\)"):
        SpadeTrainer(model, args, rows(np.zeros((5, 2)), np.zeros(5)))
    with pytest.raises(ValueError, match="support_k"):
        SpadeTrainer(model, args, rows(np.zeros((5, 3)), np.arange(5.0)))
    with pytest.raises(ValueError, match="column 'y' must hold one number per row"):
        SpadeTrainer(model, args, rows(np.zeros((5, 3)), np.zeros((5, 2))))
    with pytest.raises(TypeError, match="`train_dataset` must be a datasets.Dataset.*ndarray"):
        SpadeTrainer(model, args, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="`train_dataset` row 0 must be a dict with columns 'x'.*'y'"):
        SpadeTrainer(model, args, [{"x": np.zeros(3)}] * 5)
    with pytest.raises(ValueError, match="row 1 has a non-numeric 'y'"):
        SpadeTrainer(model, args, [{"x": np.zeros(3), "y": 1.0}, {"x": np.zeros(3), "y": "high"}])


def test_offline_optimisation_returns_a_population_inside_the_bounds(tmp_path):
    t = trainer(tmp_path)
    t.train()
    pipe = OfflineOptimizationPipeline(model=t.surrogate(), scheduler=spade_schedulers()[1])
    x, y = data()
    ea = EAConfig(population_size=8, elite_size=4, num_generations=3)
    bounds = np.array([[-0.5] * 3, [0.5] * 3])
    for kind in ("lcb", "ei", "mvr"):
        out = pipe(
            x,
            y,
            bounds=bounds,
            num_candidates=8,
            acquisition_function=kind,
            num_samples=4,
            num_inference_steps=3,
            ea=ea,
            support_transform=kind == "lcb",
            support_k=3,
            generator=torch.Generator().manual_seed(0),
        )
        assert out.candidates.shape == (8, 3) and out.acquisition.shape == (8,)
        assert (out.candidates >= -0.5 - 1e-5).all() and (out.candidates <= 0.5 + 1e-5).all()
        assert (np.diff(out.acquisition) <= 1e-6).all()
    with pytest.raises(ValueError, match="acquisition_function"):
        pipe(x, y, acquisition_function="ucb")
    with pytest.raises(ValueError, match="bounds"):
        pipe(x, y, bounds=np.zeros((2, 2)))


def test_offline_optimisation_on_discrete_designs_returns_valid_relaxed_tokens(tmp_path):
    task = TFBindLikeTask(offline_size=60)
    torch.manual_seed(0)
    model = ScalarDiffusionSurrogate(x_dim=24, hidden_size=16, time_embed_dim=8)
    args = SpadeConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=16, disable_tqdm=True)
    t = SpadeTrainer(model, args, rows(task.offline_x, task.offline_y))
    t.train()
    pipe = OfflineOptimizationPipeline(model=t.surrogate(), scheduler=spade_schedulers()[1])
    ea = EAConfig(population_size=8, elite_size=4, num_generations=2)
    out = pipe(
        task.offline_x,
        task.offline_y,
        num_candidates=8,
        num_samples=2,
        num_inference_steps=2,
        ea=ea,
        discrete_shape=(8, 4),
    )
    tokens = from_logits(out.candidates, 8, 4)
    np.testing.assert_allclose(out.candidates, to_logits(tokens, 4), atol=1e-6)
    assert task.score_candidates(out.candidates)["p100"] <= 1.0


def test_acquisition_functions():
    samples = torch.tensor([[0.0, 1.0], [2.0, 1.0]])
    torch.testing.assert_close(acquisition(samples, "lcb", beta=0.5), torch.tensor([0.5, 1.0 - 0.5e-8]))
    torch.testing.assert_close(acquisition(samples, "mvr", lam=1.0), torch.tensor([0.0, 1.0]))
    ei = acquisition(samples, "ei", y_best=1.0)
    assert ei[0] > ei[1] >= 0
