"""ConnectivityPipeline and ConnectivityFlowModel: conformance suite, the flow-matching sign convention shared by the
loss and diffusers' FlowMatchEulerDiscreteScheduler, the simulated dynamics, save/load."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from diffusers_ext import ConnectivityFlowModel, ConnectivityFlowModelOutput, ConnectivityPipeline
from diffusers_ext.data.lrrnn import simulate_latents
from diffusers_ext.losses.connectivity_flow import connectivity_flow_loss
from diffusers_ext.testing import PipelineConformanceTests


class TestConnectivityPipeline(PipelineConformanceTests):
    pipeline_class = ConnectivityPipeline


POINT = torch.tensor([0.7, -1.3])  # input side (normalised)
OUTPUT_POINT = torch.tensor([2.0, 0.5])


class PointMassVelocity(ConnectivityFlowModel):
    """The exact velocity of a point mass: `E[noise - x | x_sigma] = (x_sigma - point) / sigma`."""

    def forward(self, sample, timestep, condition=None, return_dict=True):
        sigma = torch.as_tensor(timestep, dtype=sample.dtype) / self.config.num_train_timesteps
        sigma = self._timestep(sigma, sample).unsqueeze(-1)
        point = POINT if condition is None else OUTPUT_POINT
        return ConnectivityFlowModelOutput(sample=(sample - point) / sigma)


def test_loss_and_sampler_share_one_sign_convention():
    model = PointMassVelocity(rank=2, hidden_size=4, num_layers=1, time_embedding_dim=4, input_scale=2.0)
    m = (POINT * 2.0).expand(64, 2)
    n = OUTPUT_POINT.expand(64, 2)
    generator = torch.Generator().manual_seed(0)
    assert connectivity_flow_loss(model, m, generator=generator) < 1e-10
    assert connectivity_flow_loss(model, m, n, generator=generator) < 1e-10
    pipe = ConnectivityPipeline(model=model, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    out = pipe(num_neurons=5, num_networks=2, num_inference_steps=4, generator=generator, num_dynamics_steps=3)
    expected = torch.cat([POINT * 2.0, OUTPUT_POINT]).expand(2, 5, 4)
    torch.testing.assert_close(out.loadings, expected, atol=1e-4, rtol=0)
    # the trajectories are the lrRNN of the sampled loadings
    starts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]])
    out = pipe(num_neurons=5, initial_states=starts, num_dynamics_steps=6, generator=generator)
    loadings = out.loadings[0].double()
    expected_trajectories = simulate_latents(loadings[:, :2], loadings[:, 2:], starts.double(), 6, alpha=0.1)
    torch.testing.assert_close(out.trajectories[0].double(), expected_trajectories, atol=1e-5, rtol=0)


@pytest.mark.support_cell("connectivity", "pack")
def test_training_moves_the_input_flow_toward_its_data():
    torch.manual_seed(0)
    model = ConnectivityFlowModel(rank=2, hidden_size=32, num_layers=2, time_embedding_dim=8)
    data = torch.randn(512, 2) * 0.3 + torch.tensor([2.0, -1.0])
    optimizer = torch.optim.Adam(model.input_velocity.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        loss = connectivity_flow_loss(model, data[torch.randint(0, 512, (128,), generator=generator)], None, generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(p.grad is None for p in model.output_velocity.parameters())  # the other head is untouched
    pipe = ConnectivityPipeline(model=model.eval(), scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    sampled = pipe(num_neurons=400, num_inference_steps=10, generator=generator, output_type="latent").loadings[0]
    assert (sampled[:, :2].mean(0) - torch.tensor([2.0, -1.0])).abs().max() < 0.25


def test_model_save_load_round_trip(tmp_path):
    model = ConnectivityFlowModel(rank=2, bias=True, hidden_size=8, num_layers=1, input_scale=1.5, output_scale=3.0)
    model.save_pretrained(tmp_path)
    loaded = ConnectivityFlowModel.from_pretrained(tmp_path)
    assert loaded.input_dim == 3 and loaded.config.output_scale == 3.0
    x, condition = torch.randn(4, 2), torch.randn(4, 3)
    torch.testing.assert_close(loaded(x, 500.0, condition).sample, model(x, 500.0, condition).sample)
