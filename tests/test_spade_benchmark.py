"""SPADE's benchmark: the baselines of `evaluation/spade.py`, a tiny run of `benchmarks/spade/spade.py` (every output, the
`--from_results` rebuild) and the committed results recomputed from their recorded runs."""

import json
import os

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

from diffusers_ext.data.offline_bbo import ContinuousTask, TFBindLikeTask
from diffusers_ext.evaluation import spade as ev
from diffusers_ext.pipelines.spade.search import EAConfig


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "spade", "results", "spade.json")


def benchmark():
    return load_benchmark("spade", "spade_benchmark")


@pytest.fixture(scope="module")
def task():
    return ContinuousTask("styblinski_tang", dim=4, num_samples=200, reference_size=1000)


def test_baselines_propose_designs_inside_the_bounds(task):
    torch.manual_seed(0)
    model = ev.fit_regressor(task.offline_x, task.offline_y, hidden_size=16, num_steps=50)
    start = ev.best_of_offline(task, 8)
    assert task.score_candidates(start)["p100"] == pytest.approx(task.offline_best())
    moved = ev.gradient_ascent(model, task, 8, learning_rate=0.1, num_steps=20)
    assert moved.shape == (8, 4)
    assert (moved >= task.bounds[0] - 1e-5).all() and (moved <= task.bounds[1] + 1e-5).all()
    with torch.no_grad():
        z = lambda x: (torch.as_tensor(x, dtype=torch.float32) - model.x_mean) / model.x_std  # noqa: E731
        assert model(z(moved)).mean() > model(z(start)).mean()  # uphill on the surrogate
    ea = EAConfig(population_size=8, elite_size=4, num_generations=3)
    ensemble = [ev.fit_regressor(task.offline_x, task.offline_y, hidden_size=16, num_steps=5, seed=s) for s in (1, 2)]
    for models, beta in (([model], 0.0), (ensemble, 1.0)):
        population = ev.regressor_search(models, task, ea, beta=beta)
        assert population.shape == (8, 4)
        assert (population >= task.bounds[0] - 1e-5).all() and (population <= task.bounds[1] + 1e-5).all()


def test_spade_variants_train_the_named_losses(tmp_path):
    task = TFBindLikeTask(seed=0, offline_size=64)
    for variant, (calibration, support) in ev.SPADE_VARIANTS.items():
        model, history = ev.train_spade(
            task, variant, hidden_size=8, time_embed_dim=8, max_steps=1, output_dir=str(tmp_path / variant)
        )
        assert model.config.x_dim == task.dim
        assert ("calibration" in history[-1]) == (calibration > 0) and ("support" in history[-1]) == (support > 0)
    x = ev.spade_search(model, task, EAConfig(population_size=8, elite_size=4, num_generations=1), num_samples=2)
    assert x.shape == (8, task.dim)
    assert set(np.unique(x).round(4)) <= set(np.unique(task.offline_x).round(4))  # snapped to relaxed one-hots
    assert ev.SPADE_VARIANTS["spade_neither"] == (0.0, 0.0) and ev.SPADE_VARIANTS["spade"] == (1.0, 1.0)


def test_baselines_reject_bad_input(task, tmp_path):
    with pytest.raises(ValueError, match="`x`"):
        ev.fit_regressor(np.zeros((1, 2)), np.zeros(1))
    model = ev.fit_regressor(task.offline_x, task.offline_y, hidden_size=8, num_steps=1)
    with pytest.raises(ValueError, match="learning_rate"):
        ev.gradient_ascent(model, task, 4, learning_rate=0.0)
    with pytest.raises(ValueError, match="models"):
        ev.regressor_search([], task, EAConfig(population_size=4, elite_size=2))
    with pytest.raises(ValueError, match="variant"):
        ev.train_spade(task, "spade_without_everything", output_dir=str(tmp_path))


def test_tiny_run_writes_every_output_and_rebuilds(tmp_path):
    bench = benchmark()
    tiny = [
        "--seeds", "0", "1", "2", "--offline_size", "60", "--num_candidates", "8", "--train_steps", "2",
        "--num_generations", "1", "--num_samples", "2", "--num_inference_steps", "2",
        "--reference_size", "200", "--hidden_size", "8", "--mlp_hidden_size", "8", "--continuous_dim", "4",
    ]  # fmt: skip
    results = bench.main([*tiny, "--output_dir", str(tmp_path)])
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"spade{suffix}").is_file()
    assert [t["name"] for t in results["summary"]["targets"]][0].startswith("families (of 3)")
    assert set(results["test"]) == set(bench.FAMILIES) and set(results["test"]["tfbind8"]) == {"0", "1", "2"}
    for family in bench.FAMILIES:
        validation = results["validation"][family]
        assert all(len(validation[m]["validation"]) == len(g) for m, g in bench.grids().items())
        assert {len(g) for m, g in bench.grids().items() if m != "best_of_offline"} == {6}  # same tuning budget
    markdown = (tmp_path / "spade.md").read_text()
    assert markdown.index("## Headroom") < markdown.index("## tfbind8")
    rebuilt = bench.main(["--from_results", str(tmp_path / "spade.json"), "--output_dir", str(tmp_path / "again")])
    assert rebuilt["summary"]["targets"] == results["summary"]["targets"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--num_candidates", "200", "--offline_size", "100"])


def test_committed_results_recompute_from_their_runs():
    with open(RESULTS, encoding="utf-8") as f:
        results = json.load(f)
    assert len(results["settings"]["seeds"]) >= 5 and results["settings"]["num_candidates"] == 128
    summary = benchmark().summarise(results)
    assert summary["targets"] == results["summary"]["targets"]
    for family in results["settings"]["families"]:
        recorded = results["summary"]["families"][family]
        assert summary["families"][family]["methods"] == recorded["methods"]
        assert recorded["headroom"]["offline_best"]["mean"] < 1.0


def test_validation_settings_reach_the_searches(monkeypatch, task):
    """Every knob of a grid setting changes the run it names (the EA's mutation std and crossover rate, beta, the
    gradient-ascent step size and step count)."""
    bench = benchmark()
    args = bench.parse_args(["--num_candidates", "8", "--num_generations", "2"])
    seen = []

    def record(name):
        def run(model, task, *rest, **kwargs):
            seen.append((name, rest, kwargs))
            return task.offline_x[:8]

        return run

    for name in ("gradient_ascent", "regressor_search", "spade_search"):
        monkeypatch.setattr(ev, name, record(name))
    runner = bench.Runner(args, task, 0, "unused")
    runner.models = {name: object() for name in ("mlp", "ensemble", "spade")}
    for method, grid in bench.grids().items():
        for setting in grid:
            runner.propose(method, setting)
    calls = {}
    for name, rest, kwargs in seen:
        calls.setdefault(name, []).append((rest, kwargs))
    assert sorted(rest[1:] for rest, _ in calls["gradient_ascent"]) == sorted(
        (s["learning_rate"], s["num_steps"]) for s in bench.grids()["mlp_gradient_ascent"]
    )
    eas = [(rest[0], kwargs.get("beta", 0.0)) for rest, kwargs in calls["regressor_search"] + calls["spade_search"]]
    assert len(eas) == 18 and all(ea.num_generations == 2 and ea.population_size == 8 for ea, _ in eas)
    mlp_ea, ensemble, spade = eas[:6], eas[6:12], eas[12:]
    assert [(ea.mutation_std, ea.crossover_rate) for ea, _ in mlp_ea] == [
        (s["mutation_std"], s["crossover_rate"]) for s in bench.grids()["mlp_ea"]
    ]
    for runs, method in ((ensemble, "ensemble_lcb"), (spade, "spade")):
        assert [(ea.mutation_std, beta) for ea, beta in runs] == [
            (s["mutation_std"], s["beta"]) for s in bench.grids()[method]
        ]
