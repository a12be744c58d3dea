"""EpiDiff: epidemic data, the leak-free mechanistic forecast, the spatio-temporal denoiser and the steered pipeline."""

import importlib.metadata
import sys

import numpy as np
import pytest
import torch

from diffusers_ext.data import epidemics
from diffusers_ext.data.epidemics import (
    chronological_windows,
    is_areafluforecast_available,
    load_boston_ili,
    load_counts_csv,
    simulate_forward,
    simulate_metapopulation_sir,
    split_bounds,
)
from diffusers_ext.models.spatiotemporal_denoiser import SpatioTemporalDenoiser
from diffusers_ext.pipelines.epidiff.mechanistic import (
    MechanisticConfig,
    expected_incidence,
    fit_sigma_bounds,
    fit_sir_map,
    laplace_covariance,
    mechanistic_forecast,
    uncertainty_to_sigma,
    unscented_forecast,
)
from diffusers_ext.pipelines.epidiff.pipeline_epidiff import EpiDiffForecastPipeline
from diffusers_ext.testing import PipelineConformanceTests
from diffusers_ext.trainers.epidiff_trainer import build_epidiff_schedulers


# ---- data ------------------------------------------------------------------------------------------------------


def test_simulator_is_seeded_and_well_formed():
    a = simulate_metapopulation_sir(num_nodes=6, num_steps=80, seed=3)
    b = simulate_metapopulation_sir(num_nodes=6, num_steps=80, seed=3)
    c = simulate_metapopulation_sir(num_nodes=6, num_steps=80, seed=4)
    assert a.values.shape == (80, 6) and np.array_equal(a.values, b.values)
    assert not np.array_equal(a.values, c.values)
    assert np.all(a.values >= 0) and a.values.sum() > 0
    adjacency = a.adjacency
    assert np.array_equal(adjacency, adjacency.T) and np.all(np.diag(adjacency) == 0) and adjacency.sum(1).min() >= 1
    mixing = a.extra["model"].mixing
    assert np.allclose(mixing.sum(1), 1.0)
    # gravity coupling only along edges
    assert np.all(mixing[(adjacency == 0) & ~np.eye(6, dtype=bool)] == 0)
    # regime shifts: the transmission rate changes over time
    assert (np.diff(a.extra["beta"], axis=0) != 0).any()
    states = a.extra["states"]
    assert np.all(states.sum(-1) == states[0].sum(-1))  # closed populations


def test_simulator_true_predictive_matches_its_own_mean():
    series = simulate_metapopulation_sir(num_nodes=4, num_steps=60, seed=1, dispersion=50.0)
    draws = simulate_forward(series, origin=40, horizon=1, num_samples=400, seed=0)
    assert draws.shape == (400, 4, 1)
    # the reports' mean is reporting * E[infections]; the realised expected value lies within the draws' spread
    realised = series.values[40]
    low, high = np.percentile(draws[:, :, 0], [0.5, 99.5], axis=0)
    assert np.all(realised >= low - 1) and np.all(realised <= high + 1)
    with pytest.raises(ValueError, match="origin"):
        simulate_forward(series, origin=59, horizon=5)


def test_chronological_windows_split_by_time():
    values = np.arange(100 * 3, dtype=float).reshape(100, 3)
    windows = chronological_windows(values, history=5, horizon=3)
    bounds = split_bounds(100)
    assert bounds == {"train": (0, 60), "validation": (60, 80), "test": (80, 100)}
    train, validation, test = windows["train"], windows["validation"], windows["test"]
    assert train.windows.shape[1:] == (3, 8)
    assert train.origins.min() == 5 and train.origins.max() + 3 <= 60
    assert validation.origins.min() == 60 and validation.origins.max() + 3 <= 80
    assert test.origins.min() == 80 and test.origins.max() + 3 == 100
    o = test.origins[2]
    assert np.array_equal(test.past[2], values[o - 5 : o].T) and np.array_equal(test.future[2], values[o : o + 3].T)
    with pytest.raises(ValueError, match="holds no window"):
        chronological_windows(values[:20], history=10, horizon=3)


def test_counts_csv_with_edge_list_and_matrix(tmp_path):
    counts = tmp_path / "counts.csv"
    counts.write_text("week,a,b,c\n1,3,4,\n2,5,NA,1\n3,7,8,2\n")
    edges = tmp_path / "edges.csv"
    edges.write_text("a,b\na,b\nb,c\n")
    series = load_counts_csv(str(counts), str(edges), population=1000)
    assert series.values.shape == (3, 3) and series.node_names == ["a", "b", "c"]
    assert series.values[1, 1] == 6.0 and series.values[0, 2] == 1.0  # interpolated / nearest
    assert series.observed.sum() == 7
    assert series.adjacency.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    matrix = tmp_path / "matrix.csv"
    matrix.write_text("a,b,c\n0,0,1\n0,0,0\n1,0,0\n")
    assert load_counts_csv(str(counts), str(matrix)).adjacency[0, 2] == 1.0
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\na,z\n")
    with pytest.raises(ValueError, match="'z'"):
        load_counts_csv(str(counts), str(bad))
    with pytest.raises(ValueError, match="counts_path"):
        load_counts_csv(str(tmp_path / "missing.csv"))


def test_boston_loader_says_how_to_install_when_the_wheel_is_absent(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(epidemics.importlib.metadata, "distribution", missing)
    assert not is_areafluforecast_available()
    with pytest.raises(ImportError, match="pip install --no-deps areafluforecast"):
        load_boston_ili()


@pytest.mark.skipif(not is_areafluforecast_available(), reason="the areafluforecast wheel is not installed")
def test_boston_ili_from_the_wheel_without_importing_it():
    series = load_boston_ili()
    assert series.values.shape == (436, 14) and series.population == 1e5
    assert series.times[0] == "2017-12-31" and series.times[-1] == "2026-05-03"
    assert int(series.adjacency.sum()) == 2 * 23  # the 23 borders between the 14 neighbourhoods
    assert np.all(np.isfinite(series.values)) and 0.75 < series.observed.mean() < 1.0
    assert "areafluforecast" not in sys.modules


# ---- mechanistic forecast --------------------------------------------------------------------------------------


def _si_series(r0=2.0, duration=4.0, steps=12, first=10.0):
    config = MechanisticConfig(variant="si")
    eta = np.log([[[r0, duration]]])
    return expected_incidence(eta, np.array([first]), steps, config)[0], config


def test_map_recovers_the_growth_rate_of_noise_free_si_data():
    history, config = _si_series(r0=2.0, duration=4.0)
    eta = fit_sir_map(history, config)
    beta, gamma = np.exp(eta[0, 0] - eta[0, 1]), np.exp(-eta[0, 1])
    assert abs((1 + beta - gamma) - 1.25) < 0.02  # only the growth rate 1 + (R0 - 1) / T is identified
    covariance = laplace_covariance(eta, history, config)
    assert covariance.shape == (1, 2, 2) and np.all(np.linalg.eigvalsh(covariance) > 0)
    mean, variance = unscented_forecast(eta, covariance, history, config)
    assert abs(mean[0] / (history[0, -1] * 1.25) - 1) < 0.05 and variance[0] > mean[0]


def test_sir_variant_depletes_susceptibles():
    config = MechanisticConfig(variant="sir", susceptible_fraction=0.5, population=1e5)
    mu = expected_incidence(np.log([[[3.0, 2.0]]]), np.array([5.0]), 80, config)[0, 0]
    assert mu.argmax() not in (0, 79)  # an epidemic curve that rises and falls


def test_sir_variant_on_the_reported_share_of_the_population_gives_the_reports():
    # reports = share * infections of an SIR on N are the SIR on share * N in report units (the benchmark's
    # `--reporting_shares` grid rests on this); the share changes how fast reports deplete the susceptibles
    eta = np.log([[[1.8, 2.0], [2.5, 3.0]]])
    infections = expected_incidence(eta, np.array([40.0]), 30, MechanisticConfig(variant="sir", population=1e5))
    reports = expected_incidence(eta, np.array([12.0]), 30, MechanisticConfig(variant="sir", population=0.3e5))
    np.testing.assert_allclose(reports, 0.3 * infections, rtol=1e-9)
    growing = np.log([[[2.5, 3.0]]])
    share = expected_incidence(growing, np.array([120.0]), 40, MechanisticConfig(variant="sir", population=0.3e5))
    whole = expected_incidence(growing, np.array([120.0]), 40, MechanisticConfig(variant="sir", population=1e5))
    assert share[0, 0].argmax() + 10 < whole[0, 0].argmax()  # the reported share's epidemic peaks much earlier


def _boston_with_future_scrambled(tmp_path, origin: int, seed: int):
    """Boston ILI loaded through `load_boston_ili` from a copy of the wheel's files in which every week from
    `origin` on is noise, half of it left missing."""
    import csv
    import shutil

    source = epidemics.boston_data_dir()
    folder = tmp_path / f"boston-{origin}-{seed}"
    folder.mkdir(exist_ok=True)
    shutil.copy(f"{source}/edges.csv", folder / "edges.csv")
    with open(f"{source}/rates.csv", newline="") as f:
        rows = list(csv.reader(f))
    rng = np.random.default_rng(seed)
    for row in rows[1 + origin :]:
        row[1:] = ["" if rng.random() < 0.5 else f"{rng.uniform(0, 500):.3f}" for _ in row[1:]]
    with open(folder / "rates.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return load_boston_ili(data_dir=str(folder))


@pytest.mark.skipif(not is_areafluforecast_available(), reason="the areafluforecast wheel is not installed")
@pytest.mark.parametrize("horizon", [7, 14])
def test_no_boston_window_input_depends_on_data_at_or_after_its_origin(tmp_path, horizon):
    series = load_boston_ili()
    windows = chronological_windows(series.values, 14, horizon, observed=series.observed)
    test = windows["test"]
    # the test bed has teeth: some test histories hold a missing week, which the series-wide fill interpolated
    # towards a week at or after the origin
    holes = [i for i, mask in enumerate(test.observed[..., :14]) if not mask.all()]
    assert len(holes) >= 5
    leaked = [
        i for i in holes if not np.array_equal(test.past[i], series.values[test.origins[i] - 14 : test.origins[i]].T)
    ]
    assert leaked, "no history differs from the series-wide fill: the test would not see that leak"
    for split in ("validation", "test"):
        for index in sorted({*np.linspace(0, len(windows[split].origins) - 1, 6).astype(int).tolist(), *holes[:4]}):
            if split == "validation" and index >= len(windows[split].origins):
                continue
            origin = int(windows[split].origins[index])
            scrambled = _boston_with_future_scrambled(tmp_path, origin, seed=index)
            again = chronological_windows(scrambled.values, 14, horizon, observed=scrambled.observed)[split]
            position = list(again.origins).index(origin)
            assert np.array_equal(again.past[position], windows[split].past[index]), (split, origin)
            assert np.array_equal(again.observed[position, :, :14], windows[split].observed[index, :, :14])


def test_windows_fill_missing_history_from_the_past_and_mark_missing_targets():
    values = np.arange(40, dtype=np.float64)[:, None].repeat(2, 1)
    observed = np.ones_like(values, dtype=bool)
    observed[30:32, 0] = False  # the last two history weeks of the window at origin 32, node 0
    observed[33, 1] = False  # a target of that window, node 1
    windows = chronological_windows(values, 5, 3, fractions=(0.5, 0.25, 0.25), observed=observed)
    test = windows["test"]
    index = list(test.origins).index(32)
    # the missing history cells carry the last value before them forward (29), never the origin's 32
    np.testing.assert_array_equal(test.past[index, 0], [27, 28, 29, 29, 29])
    np.testing.assert_array_equal(test.past[index, 1], [27, 28, 29, 30, 31])
    assert not test.future_observed[index, 1, 1] and test.future_observed[index].sum() == 5
    with pytest.raises(ValueError, match="`observed` must be a bool array of the panel's shape"):
        chronological_windows(values, 5, 3, observed=observed[:-1])


def test_scores_skip_unobserved_targets():
    from diffusers_ext.evaluation.epidiff import summarize_scores, window_scores

    rng = np.random.default_rng(0)
    samples, target = rng.normal(size=(3, 16, 2, 4)), rng.normal(size=(3, 2, 4))
    observed = np.ones_like(target, dtype=bool)
    observed[1, 0, 2:] = False
    changed = target.copy()
    changed[1, 0, 2:] = 1e6  # a filled-in target's value must not matter
    first = summarize_scores(window_scores(samples, target, observed=observed))
    second = summarize_scores(window_scores(samples, changed, observed=observed))
    assert first == pytest.approx(second)
    everything = summarize_scores(window_scores(samples, target), points_per_window=8)
    assert everything == pytest.approx(
        summarize_scores(window_scores(samples, target, observed=np.ones_like(observed)))
    )
    assert first["mae"] != pytest.approx(everything["mae"])


def test_mechanistic_forecast_is_causal_and_reads_only_the_history():
    series = simulate_metapopulation_sir(num_nodes=4, num_steps=60, seed=2)
    windows = chronological_windows(series.values, history=10, horizon=6)["test"]
    history = windows.past.reshape(-1, 10)
    full = mechanistic_forecast(history, 6)
    short = mechanistic_forecast(history, 3)
    # each step depends on the history and the forecast's own earlier steps only
    assert np.array_equal(full.mean[:, :3], short.mean) and np.array_equal(full.variance[:, :3], short.variance)
    assert full.mean.shape == (history.shape[0], 6) and np.all(full.variance > 0)
    # changing the true future changes nothing: it is never an input
    scrambled = windows.windows.copy()
    scrambled[..., 10:] = 1e6
    again = mechanistic_forecast(scrambled[..., :10].reshape(-1, 10), 6)
    assert np.array_equal(again.mean, full.mean)


def test_rolling_forecast_feeds_on_its_own_predictions():
    history, config = _si_series(steps=12)
    noisy = history * np.array([1.0] * 11 + [1.3])
    result = mechanistic_forecast(noisy, 2, config)
    one = mechanistic_forecast(noisy, 1, config)
    extended = np.concatenate([noisy, one.mean], 1)[:, 1:]  # the fit window keeps its length and slides
    second = unscented_forecast(
        fit_sir_map(extended, config, init=one.parameters),
        laplace_covariance(one.parameters, noisy, config),
        extended,
        config,
    )[0]
    assert np.allclose(result.mean[:, 1], second)


def test_fallback_to_history_mean_on_explosive_forecasts():
    history = np.array([[0.0] * 11 + [60.0]])
    result = mechanistic_forecast(history, 12, MechanisticConfig(r0_bounds=(3.9, 4.0), infectious_bounds=(1.0, 1.1)))
    assert result.fallback.any()
    assert np.allclose(result.mean[result.fallback], history.mean())


def test_sigma_map_is_monotone_and_uses_given_bounds():
    bounds = fit_sigma_bounds(np.exp(np.arange(1, 101, dtype=float)))
    assert bounds == pytest.approx((np.percentile(np.arange(1, 101), 10), np.percentile(np.arange(1, 101), 90)))
    u = np.exp(np.linspace(-5, 120, 50))
    sigma = uncertainty_to_sigma(u, bounds, sigma_min=0.1, sigma_max=1.0)
    assert np.all(np.diff(sigma) >= 0) and sigma.min() == pytest.approx(0.1) and sigma.max() == pytest.approx(1.0)
    assert uncertainty_to_sigma(u, bounds, 0.1, 1.0, tau=2.0) == pytest.approx(2 * sigma)
    with pytest.raises(ValueError, match="train_variance"):
        fit_sigma_bounds(np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="sigma_max"):
        uncertainty_to_sigma(u, bounds, sigma_min=1.0, sigma_max=0.5)


# ---- denoiser and pipeline -------------------------------------------------------------------------------------


def _tiny_pipeline(window=8, seed=0):
    torch.manual_seed(seed)
    model = SpatioTemporalDenoiser(window_length=window, hidden_size=8, num_heads=2, num_layers=1, dropout=0.0)
    _, ddim = build_epidiff_schedulers(num_train_timesteps=20)
    pipe = EpiDiffForecastPipeline(denoiser=model.eval(), scheduler=ddim)
    pipe.set_progress_bar_config(disable=True)
    return pipe


LINE = torch.tensor([[0.0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]])


def test_graph_attention_sees_neighbours_only():
    model = _tiny_pipeline().denoiser
    sample = torch.randn(1, 4, 8)
    mask = torch.ones(8)
    base = model(sample, 3, sample, mask, LINE).sample
    moved = sample.clone()
    moved[0, 3] += 5.0  # node 3 is not adjacent to node 0 or 1
    after = model(moved, 3, moved, mask, LINE).sample
    assert torch.allclose(base[0, :2], after[0, :2], atol=1e-6)
    assert not torch.allclose(base[0, 2], after[0, 2])


@pytest.mark.support_cell("epidiff", "pack")
def test_pipeline_shapes_and_guidance_pulls_to_the_mechanistic_mean():
    pipe = _tiny_pipeline()
    history = torch.rand(2, 4, 5) * 10
    target = torch.full((2, 4, 3), 3.0)
    args = {"num_samples": 3, "num_inference_steps": 5}
    out = pipe(history, LINE, generator=torch.Generator().manual_seed(0), **args)
    assert out.samples.shape == (2, 3, 4, 3) and out.mean.shape == (2, 4, 3)
    assert out.quantiles.shape == (2, 19, 4, 3) and torch.all(out.quantiles[:, 1:] >= out.quantiles[:, :-1])
    steered = pipe(
        history,
        LINE,
        mechanistic_mean=target,
        guidance_scale=50.0,
        constant_sigma=0.05,
        generator=torch.Generator().manual_seed(0),
        **args,
    )
    assert (steered.mean - 3.0).abs().mean() < 0.25 * (out.mean - 3.0).abs().mean()
    # guidance_scale 0 ignores the mechanistic forecast
    off = pipe(history, LINE, mechanistic_mean=target, generator=torch.Generator().manual_seed(0), **args)
    assert torch.equal(off.samples, out.samples)


def test_uncertainty_sets_the_pull_per_point():
    pipe = _tiny_pipeline()
    history = torch.rand(1, 4, 5) * 10
    target = torch.full((1, 4, 3), 3.0)
    variance = torch.ones(1, 4, 3)
    variance[:, :2] = 1e-3  # nodes 0, 1 confident, nodes 2, 3 not
    out = pipe(
        history,
        LINE,
        mechanistic_mean=target,
        mechanistic_var=variance,
        sigma_bounds=(float(np.log(1e-3)), 0.0),
        sigma_min=0.02,
        sigma_max=5.0,
        guidance_scale=20.0,
        num_samples=4,
        num_inference_steps=5,
        generator=torch.Generator().manual_seed(1),
    )
    error = (out.mean - 3.0).abs()
    assert error[0, :2].mean() < error[0, 2:].mean()


def test_generator_list_batch_equals_single_windows():
    pipe = _tiny_pipeline()
    history = torch.rand(2, 4, 5)
    both = pipe(
        history,
        LINE,
        num_samples=2,
        num_inference_steps=3,
        generator=[torch.Generator().manual_seed(s) for s in (0, 1)],
    )
    one = pipe(history[1:], LINE, num_samples=2, num_inference_steps=3, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(both.samples[1], one.samples[0], atol=1e-5)


def test_max_timestep_fraction_starts_lower():
    pipe = _tiny_pipeline()
    assert pipe._timesteps(5, 1.0, "cpu").max() > pipe._timesteps(5, 0.8, "cpu").max()
    assert pipe._timesteps(5, 0.8, "cpu").max() < 16


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"history": torch.zeros(1, 4, 8)}, "history"),
        ({"adjacency": torch.zeros(3, 3)}, "adjacency"),
        ({"mechanistic_mean": torch.zeros(1, 4, 2)}, "mechanistic_mean"),
        (
            {"mechanistic_mean": torch.zeros(1, 4, 3), "mechanistic_var": torch.ones(1, 4, 3), "guidance_scale": 1.0},
            "sigma_bounds",
        ),
        ({"mechanistic_var": torch.ones(1, 4, 3)}, "mechanistic_var"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"sigma_min": 2.0, "sigma_max": 1.0}, "sigma_max"),
        ({"num_samples": 0}, "num_samples"),
        ({"max_timestep_fraction": 0.0}, "max_timestep_fraction"),
        ({"output_type": "pil"}, "output_type"),
        ({"quantile_levels": (0.5, 1.0)}, "quantile_levels"),
        ({"latents": torch.zeros(1, 2, 4, 8)}, "latents"),
    ],
)
def test_bad_inputs_name_the_argument(overrides, name):
    pipe = _tiny_pipeline()
    inputs = {"history": torch.rand(1, 4, 5), "adjacency": LINE, "num_inference_steps": 2, **overrides}
    with pytest.raises(ValueError, match=name):
        pipe(**inputs)


def test_save_load_round_trip(tmp_path):
    pipe = _tiny_pipeline()
    pipe.save_pretrained(tmp_path)
    loaded = EpiDiffForecastPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    history = torch.rand(1, 4, 5)
    a = pipe(history, LINE, num_samples=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    b = loaded(history, LINE, num_samples=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(a.samples, b.samples)


class TestEpiDiffForecastPipeline(PipelineConformanceTests):
    pipeline_class = EpiDiffForecastPipeline

    def test_num_images_per_prompt(self):
        pytest.skip("draws per window are `num_samples` (output dimension 1; windows are dimension 0)")
