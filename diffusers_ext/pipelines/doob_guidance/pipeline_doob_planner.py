"""DoobGuidedPlannerPipeline: plan 2-D trajectories with a `UNet1DModel` (Diffuser-style, like diffusers'
`ValueGuidedRLPipeline`), start and goal imposed by inpainting, obstacles avoided by Doob h-transform guidance."""

from dataclasses import dataclass

import torch
from diffusers import DiffusionPipeline, UNet1DModel
from diffusers.utils import BaseOutput, logging

from ...data.navigation2d import collides, collision_cost
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import check_generator
from .guidance import DoobGuidance, guided_sample


logger = logging.get_logger(__name__)


@public
class ObstacleConstraint:
    """The planner's constraint on model-layout trajectories `(B, 2, H)`: no segment enters an obstacle disc and no
    waypoint leaves `[-1, 1]^2`.

    Args:
        obstacles (`torch.Tensor` of shape `(K, 3)`): discs `(x, y, radius)`.
        margin (`float`, defaults to 0.02): clearance the relaxed `cost` asks for (the indicator asks for none).
    """

    def __init__(self, obstacles: torch.Tensor, margin: float = 0.02):
        self.obstacles = check_obstacles(obstacles)
        self.margin = margin

    def satisfied(self, x0: torch.Tensor) -> torch.Tensor:
        """`(B,)` bool, the exact check."""
        return ~collides(x0.transpose(1, 2), self.obstacles.to(x0))

    def cost(self, x0: torch.Tensor) -> torch.Tensor:
        """`(B,)` differentiable violation, 0 when clear by `margin`."""
        return collision_cost(x0.transpose(1, 2), self.obstacles.to(x0), self.margin)


@dataclass
@public
class DoobGuidedPlannerOutput(BaseOutput):
    """
    Args:
        trajectories (`torch.Tensor` or `np.ndarray` of shape `(B, H, 2)`): the planned waypoints.
        satisfied (`torch.Tensor` of shape `(B,)`): bool, whether each trajectory is collision-free and in the map.
        kl_estimate (`float` or `None`): the guidance's Girsanov KL estimate (with `compute_bound`).
        satisfaction_lower_bound (`float` or `None`): Pinsker's lower bound on the satisfaction probability.
        num_model_evaluations (`int`): sample-evaluations of the UNet per trajectory (forwards and backwards).
    """

    trajectories: torch.Tensor
    satisfied: torch.Tensor
    kl_estimate: float | None
    satisfaction_lower_bound: float | None
    num_model_evaluations: float


def _point(name: str, value, batch_size: int) -> torch.Tensor:
    check_finite(name, value)
    value = torch.as_tensor(value, dtype=torch.float32)
    if value.shape == (2,):
        value = value.expand(batch_size, 2)
    if value.shape != (batch_size, 2):
        raise ValueError(f"`{name}` must have shape (2,) or ({batch_size}, 2), got {tuple(value.shape)}.")
    return value


def check_obstacles(obstacles) -> torch.Tensor:
    """`obstacles` as a float32 `(K, 3)` tensor of discs `(x, y, radius)`, after checking that every centre is finite
    and every radius a finite number > 0 (a NaN or negative disc would make every plan "satisfied")."""
    check_finite("obstacles", obstacles)
    obstacles = torch.as_tensor(obstacles, dtype=torch.float32)
    if obstacles.ndim != 2 or obstacles.shape[1] != 3:
        raise ValueError(f"`obstacles` must have shape (K, 3) of discs (x, y, radius), got {tuple(obstacles.shape)}.")
    check_finite("obstacles[:, 2]", obstacles[:, 2], greater_than=0, expected="radii > 0")
    return obstacles


def downsampling_factor(unet) -> int:
    """What a `UNet1DModel`'s horizon must be a multiple of: 2 to the number of its blocks that halve the length (its
    skip connections are concatenated back at each length, so an odd length at any block fails inside the model)."""
    blocks = [*unet.down_blocks, unet.mid_block]
    halving = sum(getattr(b, "downsample", None) is not None or getattr(b, "down", None) is not None for b in blocks)
    return 2**halving


@public
class DoobGuidedPlannerPipeline(DiffusionPipeline):
    """Trajectory planning by a diffusion model over waypoints with Doob h-transform guidance (reconstructed).

    The `unet` denoises `(B, 2, H)` trajectories (x and y channels over `H` waypoints); the first and last waypoints
    are set to `start` and `goal` after every step (inpainting, as Diffuser conditions on the current state). With
    `guidance` (a [`DoobGuidance`] built on an [`ObstacleConstraint`] of the same `obstacles`), the score is tilted
    towards collision-free trajectories.

    Args:
        unet ([`UNet1DModel`]): the trajectory denoiser (`in_channels = out_channels = 2`).
        scheduler: a `DDPMScheduler`, `DDIMScheduler` or `FlowMatchEulerDiscreteScheduler` matching its training.
    """

    model_cpu_offload_seq = "unet"
    _optional_components = []
    _callback_tensor_inputs = ["trajectories"]

    def __init__(self, unet: UNet1DModel, scheduler):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)

    def model_fn(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The UNet as `(x (N, 2, H), t (N,)) -> output (N, 2, H)`."""
        return self.unet(x.to(self.unet.dtype), t).sample.to(x.dtype)

    @staticmethod
    def constraint(obstacles: torch.Tensor, margin: float = 0.02) -> ObstacleConstraint:
        """The [`ObstacleConstraint`] of `obstacles` (`(K, 3)`), to build a [`DoobGuidance`] with."""
        return ObstacleConstraint(torch.as_tensor(obstacles, dtype=torch.float32), margin)

    @staticmethod
    def endpoint_conditioning(start: torch.Tensor, goal: torch.Tensor):
        """The inpainting of the loop: `x (B, 2, H) -> x` with the first waypoint set to `start` and the last to `goal`
        (`(B, 2)` each)."""

        def conditioning(x):
            # rollouts repeat each plan's rows (`repeat_interleave`): repeat its endpoints alike
            repeats = x.shape[0] // start.shape[0]
            x = x.clone()
            x[:, :, 0] = start.repeat_interleave(repeats, 0).to(x)
            x[:, :, -1] = goal.repeat_interleave(repeats, 0).to(x)
            return x

        return conditioning

    @torch.no_grad()
    def __call__(
        self,
        start,
        goal,
        obstacles,
        batch_size: int = 8,
        num_inference_steps: int = 20,
        guidance: DoobGuidance | None = None,
        horizon: int | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
    ):
        """Plan `batch_size` trajectories from `start` to `goal` (`(2,)` or `(batch_size, 2)` each) among `obstacles`
        (`(K, 3)`).

        Gradients are enabled locally where the guidance's estimator needs them (`"tweedie"`, or `"path_integral"`
        with `jacobian="model"`). `latents` (`(batch_size, 2, H)`) replaces the initial noise. `generator` is one CPU
        generator or a list of `batch_size` (plan `b` then draws its noise, its rollouts' included, from `generator[b]`
        alone, so it equals its single run). `start`, `goal`, `obstacles` and `latents` must be finite and every
        radius > 0; `horizon` (default the UNet's `sample_size`) a multiple of what the UNet's blocks halve. Returns a
        [`DoobGuidedPlannerOutput`] (`output_type` `"pt"` or `"np"` for the trajectories) or, with
        `return_dict=False`, the tuple `(trajectories, satisfied, kl_estimate, satisfaction_lower_bound)`.
        """
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in ("pt", "np"):
            raise ValueError(f"`output_type` must be 'pt' or 'np', got {output_type!r}.")
        if guidance is not None and not isinstance(guidance, DoobGuidance):
            raise TypeError(f"`guidance` must be a DoobGuidance or None, got {type(guidance).__name__}.")
        check_generator(generator, batch_size)
        for g in generator if isinstance(generator, list) else [generator] * (generator is not None):
            if g.device.type != "cpu":
                raise ValueError(f"`generator` must be on the CPU (the noise is drawn there), got one on {g.device}.")
        obstacles = check_obstacles(obstacles)
        start, goal = _point("start", start, batch_size), _point("goal", goal, batch_size)
        horizon = horizon or self.unet.config.sample_size
        check_positive_int("horizon", horizon, minimum=4)
        factor = downsampling_factor(self.unet)
        if horizon % factor:
            lower, upper = max(factor, horizon - horizon % factor), horizon - horizon % factor + factor
            raise ValueError(
                f"`horizon` {horizon} cannot be taken by this UNet: it halves the trajectory's length "
                f"{factor.bit_length() - 1} times, so the horizon must be a multiple of {factor} (e.g. {lower} or "
                f"{upper})."
            )
        if latents is not None:
            if not isinstance(latents, torch.Tensor) or tuple(latents.shape) != (batch_size, 2, horizon):
                raise ValueError(
                    f"`latents` must be a tensor of shape (batch_size, 2, horizon) = {(batch_size, 2, horizon)}, got "
                    f"{getattr(latents, 'shape', type(latents).__name__)}."
                )
            check_finite("latents", latents)
        device = self._execution_device
        start, goal = start.to(device), goal.to(device)

        conditioning = self.endpoint_conditioning(start, goal)
        x = guided_sample(
            self.model_fn,
            self.scheduler,
            (batch_size, 2, horizon),
            num_inference_steps,
            guidance=guidance,
            conditioning=conditioning,
            generator=generator,
            latents=latents,
            device=device,
            progress=self.progress_bar,
        )
        trajectories = x.transpose(1, 2).float()
        satisfied = ~collides(trajectories, obstacles.to(trajectories))
        if guidance is None:
            evaluations = float(num_inference_steps)
            kl, bound = None, None
        else:
            evaluations = guidance.num_model_evaluations / batch_size
            kl, bound = guidance.kl_estimate, guidance.satisfaction_lower_bound()
        if output_type == "np":
            trajectories = trajectories.cpu().numpy()
        self.maybe_free_model_hooks()
        if not return_dict:
            return trajectories, satisfied, kl, bound
        return DoobGuidedPlannerOutput(
            trajectories=trajectories,
            satisfied=satisfied,
            kl_estimate=kl,
            satisfaction_lower_bound=bound,
            num_model_evaluations=evaluations,
        )
