"""Brain-network flow: the matrix codecs, the connectivity world, the conditional velocity model and the pipeline."""

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from diffusers_ext import (
    BrainNetworkFlowModel,
    BrainNetworkFlowPipeline,
    CorrelationMatrixCodec,
    SPDMatrixCodec,
)
from diffusers_ext.data.brain_networks import (
    ConnectivityWorld,
    is_brainspace_available,
    load_group_connectivity,
    load_individual_connectivity,
    to_correlation,
)
from diffusers_ext.testing import PipelineConformanceTests


class TestBrainNetworkFlowPipeline(PipelineConformanceTests):
    pipeline_class = BrainNetworkFlowPipeline

    def test_num_images_per_prompt(self):
        pytest.skip("one matrix per row of `covariates`: repeat a row for several draws of one subject's covariates")


def random_correlations(batch, n, seed=0, time_points=None):
    generator = torch.Generator().manual_seed(seed)
    series = torch.randn(batch, time_points or 3 * n, n, generator=generator, dtype=torch.float64)
    return to_correlation(series.transpose(1, 2) @ series)


def random_spd(batch, n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, n, 2 * n, generator=generator, dtype=torch.float64)
    return a @ a.transpose(1, 2) / (2 * n) + 0.1 * torch.eye(n, dtype=torch.float64)


def is_correlation(matrices, atol=1e-9):
    unit = (torch.diagonal(matrices, dim1=1, dim2=2) - 1).abs().max() < atol
    symmetric = (matrices - matrices.transpose(1, 2)).abs().max() < atol
    return bool(unit and symmetric and torch.linalg.eigvalsh(matrices).min() > 0)


@pytest.mark.parametrize("n", [2, 7, 30])
def test_correlation_codec_round_trips_and_every_vector_decodes_to_a_correlation_matrix(n):
    matrices = random_correlations(12, n)
    codec = CorrelationMatrixCodec(n).fit(matrices)
    vectors = codec.encode(matrices)
    assert vectors.shape == (12, n * (n - 1) // 2) and vectors.dtype == torch.float64
    torch.testing.assert_close(codec.decode(vectors), matrices, rtol=0, atol=1e-10)
    # standardised: the training set's features have mean 0 and deviation 1
    torch.testing.assert_close(vectors.mean(0), torch.zeros_like(vectors[0]), rtol=0, atol=1e-10)
    wild = 4 * torch.randn(20, codec.num_features, generator=torch.Generator().manual_seed(1))
    decoded = codec.decode(wild)
    assert is_correlation(decoded)
    torch.testing.assert_close(codec.encode(decoded), wild.double(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("map", ["log_euclidean", "log_cholesky"])
def test_spd_codec_round_trips_and_decodes_to_spd(map):
    matrices = random_spd(10, 6)
    codec = SPDMatrixCodec(6, map=map).fit(matrices)
    assert codec.num_features == 21
    torch.testing.assert_close(codec.decode(codec.encode(matrices)), matrices, rtol=0, atol=1e-10)
    decoded = codec.decode(3 * torch.randn(8, 21, generator=torch.Generator().manual_seed(2)))
    assert torch.linalg.eigvalsh(decoded).min() > 0 and torch.equal(decoded, decoded.transpose(1, 2))


def test_log_euclidean_vectors_are_isometric_to_the_matrix_logarithm():
    matrices = random_spd(3, 5)
    codec = SPDMatrixCodec(5)  # standardiser at identity
    values, vectors = torch.linalg.eigh(matrices)
    logs = vectors @ torch.diag_embed(values.log()) @ vectors.transpose(1, 2)
    torch.testing.assert_close(codec.encode(matrices).norm(dim=1), logs.flatten(1).norm(dim=1))


def test_codecs_refuse_invalid_matrices_naming_the_first_bad_one():
    codec = CorrelationMatrixCodec(4)
    good = random_correlations(3, 4)
    asymmetric = good.clone()
    asymmetric[1, 0, 1] += 0.1
    with pytest.raises(ValueError, match=r"`matrices\[1\]` is not symmetric"):
        codec.encode(asymmetric)
    with pytest.raises(ValueError, match=r"`matrices\[0\]` does not have a unit diagonal"):
        codec.encode(good * 2)
    singular = good.clone()
    singular[2] = torch.ones(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`matrices\[2\]` is not positive definite"):
        codec.encode(singular)
    with pytest.raises(ValueError, match=r"shape \(batch, 4, 4\), got \(3, 5, 5\)"):
        codec.encode(random_correlations(3, 5))
    nan = good.clone()
    nan[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"`matrices\[0\]` holds NaN"):
        codec.encode(nan)
    with pytest.raises(ValueError, match=r"`matrices\[0\]` is not positive definite"):
        SPDMatrixCodec(4).encode(-good[:1])
    with pytest.raises(ValueError, match="`map` must be one of"):
        SPDMatrixCodec(4, map="cholesky")
    with pytest.raises(ValueError, match=r"`vectors` must be a tensor of shape \(batch, 6\)"):
        codec.decode(torch.zeros(2, 5))


def test_codec_saves_and_loads_its_standardiser(tmp_path):
    matrices = random_correlations(6, 5)
    codec = CorrelationMatrixCodec(5).fit(matrices)
    codec.save_pretrained(tmp_path / "codec")
    again = CorrelationMatrixCodec.from_pretrained(tmp_path / "codec")
    torch.testing.assert_close(again.encode(matrices), codec.encode(matrices), rtol=0, atol=0)


@pytest.mark.skipif(not is_brainspace_available(), reason="the brainspace wheel is not installed")
def test_real_hcp_matrices_from_the_wheel_round_trip():
    group = load_group_connectivity("schaefer", 100)
    individuals = load_individual_connectivity("schaefer", 100)
    assert group.shape == (100, 100) and len(individuals) == 3
    matrices = torch.tensor(np.stack([group, load_group_connectivity(group="holdout"), *individuals.values()]))
    codec = CorrelationMatrixCodec(100).fit(matrices)
    assert codec.num_features == 4950
    torch.testing.assert_close(codec.decode(codec.encode(matrices)), matrices, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="`num_regions` must be one of"):
        load_group_connectivity("schaefer", 150)


def test_the_world_draws_valid_matrices_with_its_known_law():
    world = ConnectivityWorld(random_correlations(1, 8, time_points=40)[0], time_points=(60, 20))
    covariates = torch.tensor([[0.0, 0.0]] * 200 + [[1.0, 1.0]] * 200 + [[0.5, 0.0]] * 400)
    draw = world.sample(covariates, torch.Generator().manual_seed(0))
    assert draw.matrices.shape == (800, 8, 8) and is_correlation(draw.matrices)
    assert draw.components[:200].sum() == 0 and draw.components[200:400].sum() == 200
    assert abs(draw.components[400:].float().mean() - 0.5) < 0.1
    # fewer time points for sex 1: more spread around the template
    spread = lambda m, k: (m - world.templates[k]).flatten(1).norm(dim=1).mean()  # noqa: E731
    young = draw.matrices[:200]
    old = draw.matrices[200:400]
    assert spread(old, 1) > 1.3 * spread(young, 0)
    with pytest.raises(ValueError, match=r"`covariates\[:, 1\]` \(sex\) must be 0 or 1"):
        world.sample([[0.5, 2.0]])
    with pytest.raises(ValueError, match="`time_points` must exceed the matrix size 8"):
        ConnectivityWorld(world.templates[0], time_points=(8, 20))


def tiny_pipeline(n=5, covariates=2, seed=0):
    torch.manual_seed(seed)
    codec = CorrelationMatrixCodec(n).fit(random_correlations(8, n, seed=seed))
    model = BrainNetworkFlowModel(codec.num_features, covariates, hidden_size=16, num_layers=2)
    for parameter in model.parameters():  # the output layer starts at zero: give the test a non-trivial velocity
        parameter.data.normal_(0, 0.2)
    pipe = BrainNetworkFlowPipeline(model, codec, FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.support_cell("brain_network_flow", "pack")
def test_pipeline_generates_valid_matrices_and_a_batch_equals_its_single_runs():
    pipe = tiny_pipeline()
    covariates = torch.tensor([[0.1, 0.0], [0.9, 1.0], [0.5, 1.0]])
    batch = pipe(covariates, num_inference_steps=4, generator=[torch.Generator().manual_seed(s) for s in range(3)])
    assert batch.matrices.shape == (3, 5, 5) and is_correlation(batch.matrices)
    for s in range(3):
        single = pipe(covariates[s : s + 1], num_inference_steps=4, generator=torch.Generator().manual_seed(s))
        torch.testing.assert_close(single.matrices[0], batch.matrices[s], rtol=0, atol=1e-6)
    array = pipe(covariates, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np")
    assert isinstance(array.matrices, np.ndarray)
    latent = pipe(covariates, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="latent")
    assert latent.matrices.shape == (3, 10)
    # the covariates matter
    other = pipe(
        [[0.9, 1.0]] * 3, num_inference_steps=4, generator=[torch.Generator().manual_seed(s) for s in range(3)]
    )
    assert not torch.allclose(other.matrices[0], batch.matrices[0])


def test_pipeline_callback_and_save_load_round_trip(tmp_path):
    pipe = tiny_pipeline()
    steps = []

    def callback(pipeline, step, timestep, kwargs):
        steps.append(step)
        return {"latents": kwargs["latents"] * 0} if step == 2 else {}

    out = pipe(
        [[0.3, 0.0]], num_inference_steps=3, generator=torch.Generator().manual_seed(0), callback_on_step_end=callback
    )
    assert steps == [0, 1, 2]
    torch.testing.assert_close(out.matrices, pipe.codec.decode(torch.zeros(1, 10)))  # the callback's latents won
    pipe.save_pretrained(tmp_path / "pipe")
    again = BrainNetworkFlowPipeline.from_pretrained(tmp_path / "pipe")
    again.set_progress_bar_config(disable=True)
    a = pipe([[0.3, 1.0]], num_inference_steps=3, generator=torch.Generator().manual_seed(5)).matrices
    b = again([[0.3, 1.0]], num_inference_steps=3, generator=torch.Generator().manual_seed(5)).matrices
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_pipeline_refuses_bad_calls_before_any_model_work():
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="`covariates` is required"):
        pipe(num_inference_steps=2)
    with pytest.raises(ValueError, match=r"`covariates` must have shape \(batch, 2\), got \(2, 3\)"):
        pipe(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="`covariates`"):
        pipe([[float("nan"), 0.0]])
    with pytest.raises(ValueError, match="`batch_size` is 3 but `covariates` holds 2 rows"):
        pipe(torch.zeros(2, 2), batch_size=3)
    with pytest.raises(ValueError, match=r"`latents` must be a tensor of shape \(batch, num_features\) = \(2, 10\)"):
        pipe(torch.zeros(2, 2), latents=torch.zeros(2, 9))
    with pytest.raises(ValueError, match="`generator` is a list of 1 generators, but `covariates` makes a batch of 2"):
        pipe(torch.zeros(2, 2), generator=[torch.Generator()])
    codec = CorrelationMatrixCodec(4)
    with pytest.raises(ValueError, match="`model` predicts 10 features but `codec` makes 6"):
        BrainNetworkFlowPipeline(pipe.model, codec, FlowMatchEulerDiscreteScheduler())
