"""The real connectivity trajectory: the `brainspace` wheel's one fsaverage5 run parcellated by the pack's k-means
rule, cleaned of its confounds and cut into shrunk sliding-window correlation matrices; and the benchmark's split of
the run into segments that share no volume."""

import importlib.util

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

from diffusers_ext.data import brain_network_trajectory, brain_networks
from diffusers_ext.data.brain_network_trajectory import (
    cortex_mask,
    load_fsaverage5_run,
    load_sliding_window_connectivity,
    parcellate_fsaverage5,
    sliding_window_starts,
)


pytestmark = pytest.mark.skipif(
    not brain_networks.is_brainspace_available() or importlib.util.find_spec("nibabel") is None,
    reason="the brainspace wheel or nibabel is not installed",
)
VOLUMES = 652  # the run's length


@pytest.fixture(scope="module")
def run():
    return load_fsaverage5_run()


def test_the_run_and_its_cortex_mask(run):
    assert run.timeseries["lh"].shape == run.timeseries["rh"].shape == (10242, VOLUMES)
    assert run.confounds.shape == (VOLUMES, 29) and run.coordinates["lh"].shape == (10242, 3)
    assert brain_network_trajectory.run_num_volumes() == VOLUMES
    lh, rh = cortex_mask(run.timeseries["lh"]), cortex_mask(run.timeseries["rh"])
    # the medial wall the run leaves at a constant 0: the complement of fsaverage5's cortex label
    assert (~lh).sum() == 888 and (~rh).sum() == 881
    assert not run.timeseries["lh"][~lh].any()


def test_parcellation_is_deterministic_and_covers_every_cortex_vertex(run):
    labels = parcellate_fsaverage5(20, seed=0)
    again = parcellate_fsaverage5(20, seed=0)
    for offset, h in enumerate(("lh", "rh")):
        assert np.array_equal(labels[h], again[h])
        mask = cortex_mask(run.timeseries[h])
        assert (labels[h][mask] >= 0).all() and (labels[h][~mask] == -1).all()
        inside = labels[h][mask]
        # each hemisphere owns its half of the regions, and every region has vertices
        assert set(np.unique(inside)) == set(range(10 * offset, 10 * offset + 10))
    other = parcellate_fsaverage5(20, seed=1)
    assert not np.array_equal(other["lh"], labels["lh"])  # the seed is used


def test_sliding_window_matrices_are_valid_correlations_at_times_in_0_1(run):
    matrices, times = load_sliding_window_connectivity(num_regions=20, window=40, step=10, shrinkage=0.1)
    starts = sliding_window_starts(VOLUMES, 40, 10)
    assert matrices.shape == (len(starts), 20, 20) == (62, 20, 20) and times.shape == (62,)
    assert matrices.dtype == torch.float64
    assert torch.equal(matrices, matrices.transpose(1, 2))
    assert torch.equal(torch.diagonal(matrices, dim1=1, dim2=2), torch.ones(62, 20, dtype=torch.float64))
    assert torch.linalg.eigvalsh(matrices).min() > 0.1 - 1e-9  # the shrinkage floors every eigenvalue
    assert times[0] == 0 and times.max() <= 1 and (times.diff() > 0).all()
    torch.testing.assert_close(times, torch.from_numpy(starts / (VOLUMES - 40)))
    # window 5, recomputed independently: numpy's corrcoef of the cleaned region signals, shrunk
    labels = brain_network_trajectory._parcellate(run, 20, 0)
    series = brain_network_trajectory.clean_timeseries(
        brain_network_trajectory.parcel_timeseries(run, labels), run.confounds
    )
    expected = 0.9 * np.corrcoef(series[50:90].T) + 0.1 * np.eye(20)
    np.testing.assert_allclose(matrices[5].numpy(), expected, rtol=0, atol=1e-12)
    again, _ = load_sliding_window_connectivity(num_regions=20, window=40, step=10, shrinkage=0.1)
    assert torch.equal(matrices, again)


def test_the_cleaned_signals_carry_none_of_the_confounds(run):
    series = 0.01 * np.random.default_rng(0).normal(size=(VOLUMES, 3)) + run.confounds[:, :3] @ np.ones((3, 3))
    cleaned = brain_network_trajectory.clean_timeseries(series, run.confounds)
    np.testing.assert_allclose(cleaned.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(cleaned.std(0), 1, atol=1e-10)
    # the cosine of every confound with every cleaned signal is zero (to the rounding of an ill-conditioned design)
    unit = run.confounds / np.linalg.norm(run.confounds, axis=0).clip(min=1e-300)
    np.testing.assert_allclose(unit.T @ cleaned / np.sqrt(VOLUMES), 0, atol=1e-6)
    assert np.abs(np.corrcoef(series.T, run.confounds[:, :3].T)[:3, 3:]).max() > 0.1  # and the raw ones did


def test_bad_input_is_named_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="`window` must be at most the run's 652 volumes, got 700"):
        load_sliding_window_connectivity(window=700)
    with pytest.raises(ValueError, match="`window` must be an int >= 3, got 2"):
        load_sliding_window_connectivity(window=2)
    with pytest.raises(ValueError, match="`step` must be a positive int, got 0"):
        load_sliding_window_connectivity(step=0)
    with pytest.raises(ValueError, match=r"`shrinkage` must be a number in \[0, 1\], got 1.5"):
        load_sliding_window_connectivity(shrinkage=1.5)
    with pytest.raises(ValueError, match="`shrinkage` 0 needs windows longer than `num_regions` 100"):
        load_sliding_window_connectivity(shrinkage=0.0, window=60)
    with pytest.raises(ValueError, match="`num_regions` must be even"):
        load_sliding_window_connectivity(num_regions=21)
    with pytest.raises(ValueError, match="`seed` must be an int >= 0"):
        parcellate_fsaverage5(20, seed=-1)
    with pytest.raises(ValueError, match="`data_dir` .* must be the `brainspace` wheel's datasets folder"):
        load_sliding_window_connectivity(data_dir=str(tmp_path))


def test_the_benchmark_segments_share_no_volume():
    bench = load_benchmark("temporal", "brain_network_temporal_benchmark")
    segments = bench.segment_windows(VOLUMES, 40, 2)
    starts = sliding_window_starts(VOLUMES, 40, 2)
    assert len(segments) == len(starts) and set(np.unique(segments)) == {-1, *range(bench.NUM_SEGMENTS)}
    used = {}
    for start, segment in zip(starts, segments):
        if segment >= 0:
            for volume in range(start, start + 40):
                assert used.setdefault(volume, segment) == segment  # never claimed by two segments
    roles = [s for r in bench.ROLES.values() for s in r]
    assert sorted(roles) == list(range(bench.NUM_SEGMENTS))
