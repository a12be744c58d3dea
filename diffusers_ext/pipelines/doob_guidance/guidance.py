"""Doob h-transform guidance for diffusers sampling loops (reconstructed; see docs/doob_guidance.md).

The ideal guided process adds `grad log h_t(x)` to the base model's score, where `h_t(x) = P_base(X_0 in C | X_t = x)`
(hard constraint) or `E_base[exp(-cost(X_0) / temperature) | X_t = x]` (soft constraint). [`DoobGuidance`] estimates
that gradient at every step and shifts the model output of a `DDPMScheduler`, `DDIMScheduler` or
`FlowMatchEulerDiscreteScheduler` loop accordingly; it also accumulates a Girsanov estimate of the KL between the
ideal and the approximate guided path measures, which Pinsker's inequality turns into a lower bound on the
probability of satisfying a hard constraint.

Every formula is written for `x_t = a_t x_0 + b_t eps` ([`NoiseLevels`]): variance-preserving schedulers have
`a_t = sqrt(alpha_bar_t)`, `b_t = sqrt(1 - alpha_bar_t)`; flow matching has `a_t = 1 - sigma_t`, `b_t = sigma_t`.
"""

import math
from collections.abc import Callable

import torch

from ...utils import check_positive_int, is_number, public
from ..pipeline_utils import NoiseLevels as SharedNoiseLevels
from ..pipeline_utils import timestep_index


ESTIMATORS = ("tweedie", "mc", "path_integral")
JACOBIANS = ("model", "identity")
# Below this signal coefficient a_t the state carries (almost) no information on x_0: h_t is constant, grad log h = 0.
MIN_SIGNAL = 1e-2


def _expand(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`(N,)` -> `(N, 1, ..., 1)` broadcastable against `like`."""
    return values.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)


class NoiseLevels(SharedNoiseLevels):
    """The noise levels of a diffusers scheduler as `x_t = a_t x_0 + b_t eps`, and the model-output conversions: the
    package's [`pipeline_utils.NoiseLevels`] with floors on the divisions at pure noise (`a_t >= MIN_SIGNAL`), and
    the rollouts' level grid and step variance.

    Args:
        scheduler: a scheduler with `alphas_cumprod` (`DDPMScheduler`, `DDIMScheduler`, ...; `prediction_type` of
            `"epsilon"`, `"sample"` or `"v_prediction"`) or a flow-matching one such as
            `FlowMatchEulerDiscreteScheduler` (velocity `v = eps - x_0`; `sigma = timestep / num_train_timesteps`
            between its timesteps).
    """

    min_signal = MIN_SIGNAL
    min_noise = 1e-8

    def rollout_timesteps(self, timestep, steps: int) -> list:
        """`steps` timesteps from `timestep` down towards the clean end (exclusive), evenly spaced, first one
        `timestep`; the clean end (`None`) follows the last one."""
        t = float(torch.as_tensor(timestep).reshape(-1)[0])
        grid = [t * (steps - k) / steps for k in range(steps)]
        if self.kind == "vp":
            grid = sorted({int(round(v)) for v in grid if round(v) >= 1} | {int(round(t))}, reverse=True)
        return grid

    def step_variance(self, a, b, a_next, b_next) -> torch.Tensor:
        """`g^2 ds` between two levels: the variance the forward process adds from the next (less noisy) level to the
        current one, `b_t^2 - (a_t / a_s)^2 b_s^2` (`(N,)`)."""
        return (b**2 - (a / a_next) ** 2 * b_next**2).clamp_min(0)

    def split(self, model_output: torch.Tensor, sample: torch.Tensor, a, b) -> tuple[torch.Tensor, torch.Tensor]:
        """`(eps, x0)` predicted by `model_output` at `sample` (both the sample's shape), for `(N,)` levels `a`, `b`."""
        return super().split(model_output, sample, _expand(a, sample), _expand(b, sample))

    def merge(self, eps: torch.Tensor, x0: torch.Tensor, a, b) -> torch.Tensor:
        """The model output that predicts `(eps, x0)`: the inverse of [`split`]."""
        return super().merge(eps, x0, _expand(a, eps), _expand(b, eps))


def group_noise(shape: tuple[int, ...], generator, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal noise of `shape` on the CPU. With a list of `G` generators the rows form `G` equal groups and
    group `g` (rows `g * shape[0] // G` onwards, e.g. sample `g`'s rollouts) draws from `generator[g]` alone, as one
    `(shape[0] // G, ...)` draw: a batch row then sees the noise of its single run."""
    if not isinstance(generator, (list, tuple)):
        return torch.randn(shape, generator=generator, device="cpu", dtype=dtype)
    rows, groups = shape[0], len(generator)
    if rows % groups:
        raise ValueError(f"{rows} rows cannot be split among a list of {groups} generators.")
    return torch.cat([torch.randn((rows // groups, *shape[1:]), generator=g, dtype=dtype) for g in generator])


def next_timestep(scheduler, timestep):
    """The inference timestep after `timestep` in `scheduler.timesteps`, or `None` after the last one."""
    index = timestep_index(scheduler, timestep)
    return scheduler.timesteps[index + 1] if index + 1 < len(scheduler.timesteps) else None


@public
class DoobGuidance:
    """Training-free guidance towards `X_0 in C` by Doob's h-transform (reconstructed from the paper's abstract).

    At each step it estimates `grad log h_t(x)` and shifts the base score by `scale` times it (`eps <- eps - b_t g`,
    `x0 <- x0 + b_t^2 / a_t g`), then the scheduler steps as usual. Three estimators:

    - `"tweedie"` (DPS-style): `log h ~ -cost(x0_hat(x)) / temperature`, differentiated through the model
      (one forward and one backward pass per sample and step).
    - `"mc"` (Monte-Carlo lookahead): `num_rollouts` base rollouts of `rollout_steps` ancestral jumps from `(x, t)`
      to a clean `X_0` (the last jump samples the Gaussian posterior of variance `data_std^2 b^2 / (a^2 data_std^2 +
      b^2)`); by Tweedie's formula for the conditioned law, `grad log h = a / b^2 (E[X_0 | x, C] - E[X_0 | x])`, both
      means estimated from the same rollouts, the first self-normalised by the weights `1_C(X_0)` (hard) or
      `exp(-cost / temperature)` (soft). No backward pass; `num_rollouts * (rollout_steps - 1)` extra forwards.
    - `"path_integral"` (SOC importance weighting): the same rollouts, but the control is the weighted mean of the
      first jump's noise, `g = J^T sum_m w_m xi_m / sigma_1` (the likelihood-ratio gradient of `h`), with `J` the
      Jacobian of the first jump's mean (`jacobian="model"`: through the network, one backward pass;
      `"identity"`: the network's output held fixed).

    With a hard constraint and no rollout of a sample satisfying it, that sample's weights fall back to the soft
    relaxation `exp(-cost / temperature)` (so `cost` is needed for `"tweedie"` and recommended otherwise).

    The certificate (`compute_bound=True`): at every step a reference estimate (`"mc"` with `reference_rollouts`
    rollouts of `reference_steps` jumps) stands in for the ideal guidance, and
    `kl += 1/2 g^2 ds ||g_ref - g_used||^2` per sample (Girsanov for the SDE with the same marginals; `g^2 ds`
    from [`NoiseLevels.step_variance`]). [`satisfaction_lower_bound`] is Pinsker's `1 - sqrt(mean KL / 2)`. It is an
    estimate: the reference is itself a Monte-Carlo estimate, and it certifies the learned model's own h-transform,
    not the data distribution.

    Args:
        constraint (`Callable[[torch.Tensor], torch.Tensor]`, *optional*): hard constraint, `x0 (N, ...) -> (N,)`
            bool.
        cost (`Callable[[torch.Tensor], torch.Tensor]`, *optional*): `x0 (N, ...) -> (N,)` non-negative,
            differentiable; the soft constraint (without `constraint`) or the hard constraint's relaxation (a
            distance to the feasible set, 0 on it).
        temperature (`float`, defaults to 0.1): of `exp(-cost / temperature)`.
        estimator (`str`, defaults to `"mc"`): one of `"tweedie"`, `"mc"`, `"path_integral"`.
        num_rollouts (`int`, defaults to 8), rollout_steps (`int`, defaults to 1): the lookahead's size.
        scale (`float`, defaults to 1.0): multiplies the estimated `grad log h` (1 is the h-transform).
        data_std (`float`, defaults to 1.0): the data scale of the last jump's Gaussian posterior.
        data_covariance (`torch.Tensor` of shape `(L, L)`, *optional*): instead of `data_std`, the data covariance
            along the sample's last axis (e.g. over a trajectory's waypoints): the last jump then samples the
            Gaussian posterior `(C^-1 + a^2 / b^2)^-1`, whose draws are as smooth as the data.
        max_grad_norm (`float`, *optional*): clip each sample's guidance to this norm.
        jacobian (`str`, defaults to `"model"`): of `"path_integral"`, see above.
        compute_bound (`bool`, defaults to `False`), reference_rollouts (`int`, defaults to 64),
        reference_steps (`int`, *optional*, defaults to `rollout_steps`): the certificate.
    """

    def __init__(
        self,
        constraint: Callable[[torch.Tensor], torch.Tensor] | None = None,
        cost: Callable[[torch.Tensor], torch.Tensor] | None = None,
        temperature: float = 0.1,
        estimator: str = "mc",
        num_rollouts: int = 8,
        rollout_steps: int = 1,
        scale: float = 1.0,
        data_std: float = 1.0,
        data_covariance: torch.Tensor | None = None,
        max_grad_norm: float | None = None,
        jacobian: str = "model",
        compute_bound: bool = False,
        reference_rollouts: int = 64,
        reference_steps: int | None = None,
    ):
        if constraint is None and cost is None:
            raise ValueError("`constraint` (hard) or `cost` (soft) must be given, got neither.")
        for name, value in (("constraint", constraint), ("cost", cost)):
            if value is not None and not callable(value):
                raise TypeError(f"`{name}` must be a callable x0 -> (N,) tensor, got {type(value).__name__}.")
        if estimator not in ESTIMATORS:
            raise ValueError(f"`estimator` must be one of {ESTIMATORS}, got {estimator!r}.")
        if estimator == "tweedie" and cost is None:
            raise ValueError("`estimator='tweedie'` needs `cost` (the indicator has no gradient), got `cost=None`.")
        if jacobian not in JACOBIANS:
            raise ValueError(f"`jacobian` must be one of {JACOBIANS}, got {jacobian!r}.")
        for name, value in (("temperature", temperature), ("data_std", data_std)):
            if not is_number(value) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if not is_number(scale) or scale < 0:
            raise ValueError(f"`scale` must be a number >= 0, got {scale!r}.")
        if max_grad_norm is not None and (not is_number(max_grad_norm) or max_grad_norm <= 0):
            raise ValueError(f"`max_grad_norm` must be a positive number or None, got {max_grad_norm!r}.")
        check_positive_int("num_rollouts", num_rollouts)
        check_positive_int("rollout_steps", rollout_steps)
        check_positive_int("reference_rollouts", reference_rollouts)
        if reference_steps is not None:
            check_positive_int("reference_steps", reference_steps)
        self.constraint = constraint
        self.cost = cost
        self.temperature = float(temperature)
        self.estimator = estimator
        self.num_rollouts = num_rollouts
        self.rollout_steps = rollout_steps
        self.scale = float(scale)
        self.data_std = float(data_std)
        self._eig = None
        if data_covariance is not None:
            cov = torch.as_tensor(data_covariance, dtype=torch.float64)
            if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
                raise ValueError(f"`data_covariance` must be a square (L, L) matrix, got shape {tuple(cov.shape)}.")
            eigenvalues, eigenvectors = torch.linalg.eigh((cov + cov.T) / 2)
            self._eig = (eigenvalues.clamp_min(1e-8), eigenvectors)
        self.max_grad_norm = max_grad_norm
        self.jacobian = jacobian
        self.compute_bound = compute_bound
        self.reference_rollouts = reference_rollouts
        self.reference_steps = reference_steps or rollout_steps
        self.reset()

    @property
    def hard(self) -> bool:
        """Whether the constraint is an indicator (else the soft tilt `exp(-cost / temperature)`)."""
        return self.constraint is not None

    def reset(self) -> None:
        """Forget the previous run: `kl` (per sample), `num_model_evaluations` and `num_reference_evaluations`
        (sample-evaluations: a batch of N through the network counts N, a backward pass counts like a forward)."""
        self.kl = None
        self.num_model_evaluations = 0
        self.num_reference_evaluations = 0

    # ---------------------------------------------------------------- weights and rollouts

    def log_weights(self, x0: torch.Tensor, groups: int) -> torch.Tensor:
        """Unnormalised log-weights `(groups, N // groups)` of clean samples `x0 (N, ...)`, grouped by sample."""
        x0 = x0.detach()
        soft = None if self.cost is None else (-self.cost(x0).double() / self.temperature).view(groups, -1)
        if not self.hard:
            return soft
        satisfied = self.constraint(x0).view(groups, -1).bool()
        log_w = torch.where(satisfied, 0.0, -math.inf).double()
        if soft is not None:
            none = ~satisfied.any(dim=1, keepdim=True)
            log_w = torch.where(none, soft, log_w)
        else:
            log_w = torch.where(satisfied.any(dim=1, keepdim=True), log_w, torch.zeros_like(log_w))
        return log_w

    def _transition(self, x, x0_hat, a, b, a_next, b_next, noise):
        """One ancestral jump from level `(a, b)` to `(a_next, b_next)` given the prediction `x0_hat`:
        returns `(x_next, mean coefficient of x, mean coefficient of x0_hat, std)` (coefficients `(N,)`)."""
        if bool((b_next == 0).all()) and self._eig is not None:
            eigenvalues, eigenvectors = (v.to(x.device) for v in self._eig)
            if x.shape[-1] != len(eigenvalues):
                raise ValueError(
                    f"`data_covariance` is {len(eigenvalues)}x{len(eigenvalues)} but the sample's last axis has "
                    f"{x.shape[-1]} entries."
                )
            lam = eigenvalues[None]
            std = (lam * b[:, None] ** 2 / (a[:, None] ** 2 * lam + b[:, None] ** 2)).sqrt()  # (N, L) eigen-stds
            c_x, c_0 = torch.zeros_like(a), torch.ones_like(a)
            u = eigenvectors.to(x.dtype)
            scaled = (noise @ u) * std.view(std.shape[0], *([1] * (x.ndim - 2)), -1).to(x.dtype)
            return x0_hat + scaled @ u.T, c_x, c_0, std
        if bool((b_next == 0).all()):
            s2 = self.data_std**2
            std = (s2 * b**2 / (a**2 * s2 + b**2)).sqrt()
            c_x, c_0 = torch.zeros_like(a), torch.ones_like(a)
        else:
            alpha = a / a_next
            beta2 = (b**2 - alpha**2 * b_next**2).clamp_min(0)
            c_x = alpha * b_next**2 / b**2
            c_0 = a_next * beta2 / b**2
            std = beta2.sqrt() * b_next / b
        mean = _expand(c_x, x) * x + _expand(c_0, x) * x0_hat
        return mean + _expand(std, x) * noise, c_x, c_0, std

    def _rollouts(self, model_fn, levels, x, timestep, x0_hat, steps, conditioning, generator):
        """Base rollouts from `(x, timestep)` (`x`: `(N, ...)` repeated per rollout) to clean samples; returns
        `(X_0, first noise, first (c_x, c_0, std), forwards used)`."""
        n = x.shape[0]
        grid = levels.rollout_timesteps(timestep, steps) + [None]
        first, used = None, 0
        for k in range(len(grid) - 1):
            a, b = levels.coefficients(grid[k], n, x.device)
            if k > 0:
                t = torch.full((n,), grid[k], dtype=torch.float32 if levels.kind == "flow" else torch.long)
                x0_hat = levels.split(model_fn(x, t.to(x.device)), x, a, b)[1]
                used += n
                if conditioning is not None:
                    x0_hat = conditioning(x0_hat)
            a_next, b_next = levels.coefficients(grid[k + 1], n, x.device)
            noise = group_noise(x.shape, generator, x.dtype).to(x.device)
            x, c_x, c_0, std = self._transition(x, x0_hat, a, b, a_next, b_next, noise)
            if conditioning is not None:
                x = conditioning(x)
            if first is None:
                first = (noise, c_x, c_0, std)
        return x, first, used

    # ---------------------------------------------------------------- estimators

    def estimate(
        self,
        model_fn,
        levels: NoiseLevels,
        sample: torch.Tensor,
        timestep,
        x0_hat: torch.Tensor,
        x0_graph: tuple[torch.Tensor, torch.Tensor] | None = None,
        estimator: str | None = None,
        num_rollouts: int | None = None,
        rollout_steps: int | None = None,
        conditioning=None,
        generator=None,
    ) -> tuple[torch.Tensor, int]:
        """`(grad log h_t(sample), sample-evaluations used)`, the gradient of `sample`'s shape `(B, ...)`.

        `x0_graph = (x, x0)` is the model's `x0` prediction with its graph to a `x` that requires grad (needed by
        `"tweedie"` and by `"path_integral"` with `jacobian="model"`).
        """
        estimator = estimator or self.estimator
        m = num_rollouts or self.num_rollouts
        steps = rollout_steps or self.rollout_steps
        batch = sample.shape[0]
        a, b = levels.coefficients(timestep, batch, sample.device)
        if estimator == "tweedie":
            x, x0 = x0_graph
            with torch.enable_grad():
                x0c = conditioning(x0) if conditioning is not None else x0
                log_h = -self.cost(x0c).sum() / self.temperature
                (grad,) = torch.autograd.grad(log_h, x, retain_graph=True)
            return grad.detach().to(sample.dtype), batch
        repeated = sample.detach().repeat_interleave(m, 0)
        x0_rep = x0_hat.detach().repeat_interleave(m, 0)
        x_end, (noise, c_x, c_0, std), used = self._rollouts(
            model_fn, levels, repeated, timestep, x0_rep, steps, conditioning, generator
        )
        weights = torch.softmax(self.log_weights(x_end, batch), dim=1).to(sample.dtype)  # (B, M)
        shape = (batch, m, *sample.shape[1:])
        w = weights.view(batch, m, *([1] * (sample.ndim - 1)))
        if estimator == "mc":
            ends = x_end.view(shape)
            diff = (w * ends).sum(1) - ends.mean(1)
            grad = _expand(a / b.clamp_min(1e-8) ** 2, sample) * diff
            return grad, used
        # path integral: likelihood-ratio gradient through the first jump's mean
        weighted = (w * noise.view(shape)).sum(1)
        if std.ndim == 2:  # correlated last jump: v = C^-1 (x - mean) = U diag(1 / s) z
            u = self._eig[1].to(sample)
            s = std.view(batch, m, -1)[:, 0].to(sample).view(batch, *([1] * (sample.ndim - 2)), -1)
            v = ((weighted @ u) / s.clamp_min(1e-12)) @ u.T
        else:
            v = weighted / _expand(std.view(batch, m)[:, 0].clamp_min(1e-12), sample)
        cx, c0 = c_x.view(batch, m)[:, 0], c_0.view(batch, m)[:, 0]
        if self.jacobian == "model" and x0_graph is not None:
            x, x0 = x0_graph
            with torch.enable_grad():
                (vjp,) = torch.autograd.grad(x0, x, grad_outputs=v.to(x0.dtype), retain_graph=True)
            grad = _expand(cx, sample) * v + _expand(c0, sample) * vjp.detach()
            return grad, used + batch
        grad = _expand(cx + c0 / a.clamp_min(MIN_SIGNAL), sample) * v
        return grad, used

    # ---------------------------------------------------------------- the hook

    def guide(
        self,
        model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        scheduler,
        timestep,
        sample: torch.Tensor,
        conditioning: Callable[[torch.Tensor], torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The guided model output at `(sample, timestep)`: evaluates the model (`model_fn(x (N, ...), t (N,)) ->
        model output`) itself, estimates `grad log h` and returns the output that predicts the shifted score, ready
        for `scheduler.step`.

        Args:
            model_fn: the base model as `(x, t) -> output` in the scheduler's `prediction_type`.
            scheduler: the loop's `DDPMScheduler`, `DDIMScheduler` or `FlowMatchEulerDiscreteScheduler` (after
                `set_timesteps`).
            timestep: the current entry of `scheduler.timesteps`.
            sample (`torch.Tensor` of shape `(B, ...)`): the current state.
            conditioning (`Callable`, *optional*): re-imposes known entries (inpainting) on states and predictions.
            generator (`torch.Generator` or a list of `B`, *optional*): CPU generator(s) of the rollouts' noise;
                with a list, sample `b`'s rollouts draw from `generator[b]` alone.
        """
        if not isinstance(sample, torch.Tensor) or sample.ndim < 2:
            raise ValueError(f"`sample` must be a (B, ...) tensor, got {getattr(sample, 'shape', sample)!r}.")
        levels = NoiseLevels(scheduler)
        batch = sample.shape[0]
        t = torch.as_tensor(timestep).reshape(-1)[0]
        t_batch = t.expand(batch).to(sample.device)
        a, b = levels.coefficients(t, batch, sample.device)
        needs_graph = self.estimator == "tweedie" or (self.estimator == "path_integral" and self.jacobian == "model")
        x0_graph = None
        if needs_graph:
            with torch.enable_grad():
                x = sample.detach().requires_grad_(True)
                output = model_fn(x, t_batch)
                x0 = levels.split(output, x, a, b)[1]
                x0_graph = (x, x0)
            output = output.detach()
        else:
            output = model_fn(sample, t_batch)
        self.num_model_evaluations += batch
        eps, x0_hat = levels.split(output, sample, a, b)
        x0_hat = x0_hat.detach()
        if conditioning is not None:
            x0_hat = conditioning(x0_hat)
        informative = a >= MIN_SIGNAL  # at (near) pure noise h_t is constant
        if not bool(informative.any()):
            return output
        grad, used = self.estimate(
            model_fn, levels, sample, t, x0_hat, x0_graph, conditioning=conditioning, generator=generator
        )
        self.num_model_evaluations += used
        grad = self.scale * grad * _expand(informative.to(grad.dtype), grad)
        if self.max_grad_norm is not None:
            norms = grad.flatten(1).norm(dim=1).clamp_min(1e-12)
            grad = grad * _expand((self.max_grad_norm / norms).clamp(max=1.0), grad)
        if self.compute_bound:
            reference, ref_used = self.estimate(
                model_fn,
                levels,
                sample,
                t,
                x0_hat,
                estimator="mc",
                num_rollouts=self.reference_rollouts,
                rollout_steps=self.reference_steps,
                conditioning=conditioning,
                generator=generator,
            )
            self.num_reference_evaluations += ref_used
            reference = reference * _expand(informative.to(grad.dtype), grad)
            t_next = next_timestep(scheduler, t)
            a_next, b_next = levels.coefficients(t_next, batch, sample.device)
            g2ds = levels.step_variance(a, b, a_next, b_next)
            step_kl = 0.5 * g2ds * (reference - grad).double().flatten(1).pow(2).sum(1)
            self.kl = step_kl if self.kl is None else self.kl + step_kl
        eps = eps - _expand(b, grad) * grad
        x0_hat = x0_hat + _expand(b**2 / a.clamp_min(MIN_SIGNAL), grad) * grad
        return levels.merge(eps, x0_hat, a, b)

    def step(
        self,
        model_fn,
        scheduler,
        timestep,
        sample: torch.Tensor,
        conditioning=None,
        generator: torch.Generator | None = None,
        **step_kwargs,
    ):
        """`scheduler.step` with the guided model output ([`guide`]); returns the scheduler's output."""
        output = self.guide(model_fn, scheduler, timestep, sample, conditioning=conditioning, generator=generator)
        return scheduler.step(output, timestep, sample, generator=generator, **step_kwargs)

    @property
    def kl_estimate(self) -> float | None:
        """The mean over the run's samples of the accumulated Girsanov KL estimate (`None` before a bounded run)."""
        return None if self.kl is None else float(self.kl.mean())

    def satisfaction_lower_bound(self) -> float | None:
        """Pinsker's lower bound `max(0, 1 - sqrt(KL / 2))` on the probability of satisfying the hard constraint
        (reconstructed; `None` without `compute_bound` or for a soft constraint)."""
        if self.kl is None or not self.hard:
            return None
        return max(0.0, 1.0 - math.sqrt(self.kl_estimate / 2.0))


def guided_sample(
    model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scheduler,
    shape: tuple[int, ...],
    num_inference_steps: int,
    guidance: DoobGuidance | None = None,
    conditioning: Callable[[torch.Tensor], torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
    latents: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable | None = None,
    **step_kwargs,
) -> torch.Tensor:
    """Sample `shape` (`(B, ...)`) with `scheduler` from `model_fn`, guided by `guidance` (`None`: the base model).

    The loop every pipeline of this room runs: `set_timesteps`, start from `latents` (default: Gaussian noise times
    `scheduler.init_noise_sigma`), at each step [`DoobGuidance.step`] (or the plain model output and
    `scheduler.step`), `conditioning` re-imposed after each step. Returns the final `(B, ...)` sample.
    """
    check_positive_int("num_inference_steps", num_inference_steps)
    scheduler.set_timesteps(num_inference_steps, device=device)
    if latents is None:
        latents = group_noise(shape, generator, dtype).to(device)
        latents = latents * getattr(scheduler, "init_noise_sigma", 1.0)
    elif tuple(latents.shape) != tuple(shape):
        raise ValueError(f"`latents` must have shape {tuple(shape)}, got {tuple(latents.shape)}.")
    x = latents.to(device=device, dtype=dtype)
    if guidance is not None:
        guidance.reset()
    if conditioning is not None:
        x = conditioning(x)
    timesteps = scheduler.timesteps if progress is None else progress(scheduler.timesteps)
    for t in timesteps:
        if guidance is not None:
            x = guidance.step(model_fn, scheduler, t, x, conditioning, generator, **step_kwargs).prev_sample
        else:
            t_batch = torch.as_tensor(t).reshape(-1)[0].expand(x.shape[0]).to(device)
            x = scheduler.step(model_fn(x, t_batch), t, x, generator=generator, **step_kwargs).prev_sample
        if conditioning is not None:
            x = conditioning(x)
    return x
