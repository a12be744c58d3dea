"""Navigation2D world, DoobGuidedPlannerPipeline (tiny UNet1DModel) and training/train_trajectory_diffusion.py."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler

from diffusers_ext import DoobGuidance, DoobGuidedPlannerPipeline
from diffusers_ext.data import navigation2d as nav


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "training", "train_trajectory_diffusion.py")


def _script():
    spec = importlib.util.spec_from_file_location("train_trajectory_diffusion", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exact_collision_check_and_cost():
    obstacles = torch.tensor([[0.0, 0.0, 0.2]])
    through = torch.tensor([[[-0.5, 0.0], [0.5, 0.0]]])  # the segment crosses the disc, no waypoint inside
    beside = torch.tensor([[[-0.5, 0.25], [0.5, 0.25]]])
    outside = torch.tensor([[[-0.5, 0.5], [1.2, 0.5]]])
    assert nav.collides(through, obstacles).tolist() == [True]
    assert nav.collides(beside, obstacles).tolist() == [False]
    assert nav.collides(outside, obstacles).tolist() == [True]
    assert torch.allclose(nav.segment_clearance(beside, obstacles), torch.tensor([[[0.05]]]), atol=1e-6)
    assert nav.collision_cost(beside, obstacles).item() == 0.0
    assert nav.collision_cost(through, obstacles).item() == pytest.approx(0.2)
    # straight line when free; around the disc (longer than straight, shorter than a wide detour) otherwise
    free = nav.shortest_path_length([-0.8, 0.0], [0.8, 0.0], torch.zeros(0, 3))
    around = nav.shortest_path_length([-0.8, 0.0], [0.8, 0.0], obstacles)
    assert free == pytest.approx(1.6, abs=1e-6)
    assert 1.6 < around < 1.75


def test_demonstrations_are_smooth_in_the_map_and_test_maps_block_the_straight_line():
    demos = nav.make_demonstrations(64, seed=0)
    assert demos.shape == (64, nav.HORIZON, 2)
    assert (demos.abs() <= 1).all()
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        start, goal, obstacles = nav.make_test_map(generator)
        straight = torch.stack([start, goal])[None]
        assert nav.collides(straight, obstacles).item()
        assert nav.shortest_path_length(start, goal, obstacles) < float("inf")


@pytest.mark.parametrize("family", nav.TEST_MAP_FAMILIES)
def test_every_test_map_family_blocks_the_line_leaves_a_path_and_clears_the_ends(family):
    generator = torch.Generator().manual_seed(3)
    shapes = set()
    for _ in range(4):
        start, goal, obstacles = nav.make_test_map(generator, family=family)
        straight = torch.stack([start, goal])[None]
        assert nav.collides(straight, obstacles).item()
        assert nav.shortest_path_length(start, goal, obstacles) < float("inf")
        ends = torch.stack([start, goal])
        assert ((ends[:, None] - obstacles[None, :, :2]).norm(dim=-1) - obstacles[:, 2]).min() > 0.08
        shapes.add(len(obstacles))
    # the families differ in kind: a wall is many small discs, a slalom four, a boulder two of different size
    if family == "wall":
        assert min(shapes) >= 10 and (obstacles[:, 2] == 0.06).all()
    elif family == "slalom":
        assert shapes == {4}
        normal = torch.stack([-(goal - start)[1], (goal - start)[0]]) / (goal - start).norm()
        sides = torch.sign((obstacles[:, :2] - start) @ normal)
        assert (sides[1:] * sides[:-1] < 0).all()  # alternately left and right of the line
    elif family == "boulder":
        assert shapes == {2} and obstacles[0, 2] >= 0.3 > obstacles[1, 2]
    again = nav.make_test_map(torch.Generator().manual_seed(3), family=family)
    first = nav.make_test_map(torch.Generator().manual_seed(3), family=family)
    assert all(torch.equal(a, b) for a, b in zip(again, first))


def test_an_unknown_map_family_is_refused_by_name():
    with pytest.raises(ValueError, match="`family` must be one of .*got 'maze'"):
        nav.make_test_map(torch.Generator().manual_seed(0), family="maze")


def test_demonstration_statistics_are_the_pooled_std_and_the_waypoint_covariance():
    std, covariance = nav.demonstration_statistics(count=64, seed=5)
    demos = nav.make_demonstrations(64, seed=5)  # (N, H, 2)
    horizon = demos.shape[1]
    assert std == pytest.approx(float(demos.std()))
    assert covariance.shape == (horizon, horizon) and covariance.dtype == torch.float64
    # the covariance of waypoints i and j over every demonstration and both coordinates
    rows = demos.transpose(1, 2).reshape(-1, horizon).double()
    torch.testing.assert_close(covariance, torch.cov(rows.T))
    assert torch.linalg.eigvalsh(covariance).min() > -1e-10  # a covariance: symmetric, positive semi-definite


def tiny_pipe(scheduler):
    unet = _script().build_unet(16, [8, 16])
    return DoobGuidedPlannerPipeline(unet=unet, scheduler=scheduler).to("cpu")


@pytest.mark.parametrize(
    "scheduler",
    [
        DDPMScheduler(num_train_timesteps=100, clip_sample=False),
        DDIMScheduler(num_train_timesteps=100, clip_sample=False),
        FlowMatchEulerDiscreteScheduler(num_train_timesteps=100),
    ],
    ids=["ddpm", "ddim", "flow"],
)
@pytest.mark.parametrize("estimator", ["tweedie", "mc", "path_integral"])
@pytest.mark.support_cell("doob_guidance", "pack")
def test_planner_runs_every_estimator_on_every_scheduler(scheduler, estimator):
    pipe = tiny_pipe(scheduler)
    pipe.set_progress_bar_config(disable=True)
    obstacles = torch.tensor([[0.0, 0.0, 0.2]])
    constraint = pipe.constraint(obstacles)
    guidance = DoobGuidance(
        constraint=constraint.satisfied,
        cost=constraint.cost,
        estimator=estimator,
        num_rollouts=3,
        rollout_steps=2,
        compute_bound=True,
        reference_rollouts=4,
    )
    start, goal = torch.tensor([-0.8, 0.1]), torch.tensor([0.8, -0.1])
    out = pipe(start, goal, obstacles, batch_size=2, num_inference_steps=3, guidance=guidance)
    assert out.trajectories.shape == (2, 16, 2)
    assert torch.allclose(out.trajectories[:, 0], start.expand(2, 2)) and torch.allclose(
        out.trajectories[:, -1], goal.expand(2, 2)
    )
    assert out.satisfied.dtype == torch.bool and out.satisfied.shape == (2,)
    assert 0.0 <= out.satisfaction_lower_bound <= 1.0 and out.kl_estimate >= 0
    assert out.num_model_evaluations > 3


def test_planner_refuses_bad_inputs():
    pipe = tiny_pipe(DDPMScheduler(num_train_timesteps=100))
    with pytest.raises(ValueError, match="`obstacles` must have shape"):
        pipe([0, 0], [1, 1], torch.zeros(3))
    with pytest.raises(ValueError, match="`start` must have shape"):
        pipe([0, 0, 0], [1, 1], torch.zeros(0, 3))
    with pytest.raises(TypeError, match="`guidance` must be a DoobGuidance"):
        pipe([0, 0], [1, 1], torch.zeros(0, 3), guidance="mc")


def test_script_trains_saves_a_loadable_pipeline_and_resumes(tmp_path):
    out = tmp_path / "run"
    base = [
        sys.executable,
        SCRIPT,
        "--output_dir",
        str(out),
        "--horizon",
        "16",
        "--num_train_samples",
        "64",
        "--block_out_channels",
        "8",
        "16",
        "--train_batch_size",
        "8",
        "--checkpointing_steps",
        "2",
        "--lr_warmup_steps",
        "0",
        "--report_to",
        "none",
        "--num_validation_images",
        "2",
        "--eval_inference_steps",
        "2",
        "--save_fp16",
    ]
    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run([*base, "--max_train_steps", "2"], check=True, env=env, capture_output=True)
    subprocess.run(
        [*base, "--max_train_steps", "4", "--resume_from_checkpoint", "latest", "--validation_steps", "4"],
        check=True,
        env=env,
        capture_output=True,
    )
    assert (out / "checkpoint-4").is_dir()
    card = (out / "README.md").read_text()
    assert "train_trajectory_diffusion.py" in card and "validation_jerk" in card
    pipe = DoobGuidedPlannerPipeline.from_pretrained(str(out), torch_dtype=torch.float32)
    assert pipe.unet.dtype == torch.float32
    plans = pipe([-0.5, 0.0], [0.5, 0.0], torch.zeros(0, 3), batch_size=2, num_inference_steps=2).trajectories
    assert plans.shape == (2, 16, 2)


def test_script_refuses_a_bad_horizon(capsys):
    with pytest.raises(SystemExit):
        _script().parse_args(["--output_dir", "x", "--horizon", "10"])
    assert "--horizon" in capsys.readouterr().err
