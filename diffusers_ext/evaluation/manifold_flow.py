"""The exact judge of flow matching on a Gaussian-mixture manifold, and the baselines it is compared with.

- [`GaussianMixtureVelocityModel`]: the closed-form optimal velocity `E[noise - x | x_sigma]` of data
  `x = B z + tau xi` (`z` a Gaussian mixture in `R^d`, `B` orthonormal `D x d`, `xi ~ N(0, I_D)`) on diffusers'
  flow-matching path, as a velocity model that [`ManifoldFlowPipeline`] samples (the oracle, a floor for every
  sample metric);
- the judges: [`velocity_errors`] (the squared velocity error against the oracle, split along and across the true
  subspace), [`off_manifold_rms`] (the RMS distance of samples to the true subspace) and
  [`manifold_sliced_wasserstein`] (sliced 2-Wasserstein distance of the samples' true subspace coordinates to fresh
  draws');
- the baselines: [`PlainFlowTransformerModel`] (the same transformer on the raw vector: ambient flow matching on
  `x in R^D`, or latent flow matching on PCA coordinates in `R^d`), [`train_velocity_model`] (the benchmark's
  training loop) and [`sample_latent_flow`] (latent flow matching mapped back to `R^D`).

The formulas are derived in docs/manifold_flow.md.
"""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, FlowMatchEulerDiscreteScheduler, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from ..losses.manifold_flow import manifold_flow_loss
from ..metrics import sliced_wasserstein
from ..models.manifold_flow import VectorFlowTransformer, broadcast_timestep, check_sample_dim
from ..pipelines.manifold_flow.pipeline_manifold_flow import ManifoldFlowPipeline
from ..pipelines.pipeline_utils import epsilon_and_x0_to_prediction, prediction_to_epsilon
from ..utils import check_positive_int, is_number


@dataclass
class VelocityOutput(BaseOutput):
    """The velocity `noise - x` a model predicts: `sample` `(..., dim)`."""

    sample: torch.Tensor


class PlainFlowTransformerModel(ModelMixin, ConfigMixin):
    """Flow matching with no decomposition: [`VectorFlowTransformer`] on the whole vector of `R^ambient_dim`.

    On `x in R^D` it is *ambient flow matching*; on the PCA coordinates `B^T x in R^d` it is *latent flow matching*
    (then `ambient_dim = d`). Same body, convention and timesteps as [`ManifoldFlowTransformerModel`]'s tangent head.

    Args:
        ambient_dim (`int`, defaults to 16): the vector's size.
        num_tokens, hidden_size, num_layers, num_attention_heads, time_embedding_dim: the transformer's.
        num_train_timesteps (`int`, defaults to 1000): timestep `sigma * num_train_timesteps`.
    """

    @register_to_config
    def __init__(
        self,
        ambient_dim: int = 16,
        num_tokens: int = 4,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_attention_heads: int = 2,
        time_embedding_dim: int = 32,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        check_positive_int("num_train_timesteps", num_train_timesteps)
        self.net = VectorFlowTransformer(
            ambient_dim, num_tokens, hidden_size, num_layers, num_attention_heads, time_embedding_dim
        )

    def forward(self, sample: torch.Tensor, timestep, return_dict: bool = True):
        check_sample_dim("sample", sample, self.config.ambient_dim)
        velocity = self.net(sample, broadcast_timestep(timestep, sample))
        return VelocityOutput(sample=velocity) if return_dict else (velocity,)


class GaussianMixtureVelocityModel(ModelMixin, ConfigMixin):
    r"""The exact optimal velocity of a Gaussian mixture on a linear subspace, with isotropic off-subspace noise.

    Data `x = B z + tau xi`: `z ~ sum_k pi_k N(mu_k, Sigma_k)` in `R^d`, `B` orthonormal `(D, d)`, `xi ~ N(0, I_D)`.
    At `y = x_sigma = (1 - sigma) x + sigma eps`, with `w = B^T y` and `y_perp = (I - B B^T) y`:

        A_k = (1 - sigma)^2 (Sigma_k + tau^2 I) + sigma^2 I,      b = (1 - sigma)^2 tau^2 + sigma^2
        r_k(w) ∝ pi_k N(w; (1 - sigma) mu_k, A_k)
        E[x | y] = B sum_k r_k [mu_k + (1 - sigma) (Sigma_k + tau^2 I) A_k^-1 (w - (1 - sigma) mu_k)]
                   + (1 - sigma) tau^2 / b * y_perp
        v*(y, sigma) = E[eps - x | y] = eps_hat - E[x | y],  eps_hat = (y - (1 - sigma) E[x | y]) / sigma

    computed in float64 (the noise estimate through `pipeline_utils.prediction_to_epsilon`). A velocity model in
    diffusers' convention, so [`ManifoldFlowPipeline`] samples it with the same scheduler as the learned models.

    Build it with [`from_mixture`] or [`from_manifold`]; the mixture is held in buffers (saved with the weights).

    Args:
        ambient_dim (`int`, defaults to 16): `D`.
        latent_dim (`int`, defaults to 2): `d < D`.
        num_components (`int`, defaults to 8): `K`.
        noise_std (`float`, defaults to 0.0): `tau`.
        num_train_timesteps (`int`, defaults to 1000): timestep `sigma * num_train_timesteps`.
    """

    @register_to_config
    def __init__(
        self,
        ambient_dim: int = 16,
        latent_dim: int = 2,
        num_components: int = 8,
        noise_std: float = 0.0,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        check_positive_int("latent_dim", latent_dim)
        check_positive_int(
            "ambient_dim", ambient_dim, minimum=latent_dim + 1, expected=f"an int > latent_dim={latent_dim}"
        )
        check_positive_int("num_components", num_components)
        check_positive_int("num_train_timesteps", num_train_timesteps)
        if not is_number(noise_std) or noise_std < 0:
            raise ValueError(f"`noise_std` must be a number >= 0, got {noise_std!r}.")
        k, d = num_components, latent_dim
        self.register_buffer("weights", torch.full((k,), 1.0 / k, dtype=torch.float64))
        self.register_buffer("means", torch.zeros(k, d, dtype=torch.float64))
        self.register_buffer("covariances", torch.eye(d, dtype=torch.float64).expand(k, d, d).clone())
        self.register_buffer("basis", torch.eye(ambient_dim, d, dtype=torch.float64))

    @classmethod
    def from_mixture(
        cls, weights, means, covariances, basis, noise_std: float = 0.0
    ) -> "GaussianMixtureVelocityModel":
        """The oracle of `sum_k weights[k] N(B means[k], B covariances[k] B^T) * N(0, noise_std^2 I_D)`.

        Args:
            weights (`torch.Tensor` `(K,)`): `pi_k`, nonnegative, summing to 1.
            means (`torch.Tensor` `(K, d)`): `mu_k`.
            covariances (`torch.Tensor` `(K, d, d)`): `Sigma_k`, symmetric positive definite.
            basis (`torch.Tensor` `(D, d)`): `B`, orthonormal.
            noise_std (`float`, defaults to 0.0): `tau`.
        """
        weights, means, covariances, basis = (
            torch.as_tensor(v, dtype=torch.float64) for v in (weights, means, covariances, basis)
        )
        if weights.ndim != 1 or (weights < 0).any() or abs(float(weights.sum()) - 1) > 1e-8:
            raise ValueError(f"`weights` must be K nonnegative numbers summing to 1, got {weights.tolist()}.")
        k = len(weights)
        if means.ndim != 2 or len(means) != k:
            raise ValueError(f"`means` must have shape ({k}, d), got {tuple(means.shape)}.")
        d = means.shape[1]
        if covariances.shape != (k, d, d):
            raise ValueError(f"`covariances` must have shape ({k}, {d}, {d}), got {tuple(covariances.shape)}.")
        if basis.ndim != 2 or basis.shape[1] != d or basis.shape[0] <= d:
            raise ValueError(f"`basis` must have shape (D, {d}) with D > {d}, got {tuple(basis.shape)}.")
        if (basis.T @ basis - torch.eye(d, dtype=torch.float64)).abs().max() > 1e-6:
            raise ValueError("`basis` must have orthonormal columns.")
        torch.linalg.cholesky(covariances)  # raises unless positive definite
        model = cls(ambient_dim=basis.shape[0], latent_dim=d, num_components=k, noise_std=float(noise_std))
        for name, value in (("weights", weights), ("means", means), ("covariances", covariances), ("basis", basis)):
            getattr(model, name).copy_(value)
        return model.eval()

    @classmethod
    def from_manifold(cls, manifold) -> "GaussianMixtureVelocityModel":
        """The oracle of a `"ring_mixture"` [`EmbeddedManifold`] (`diffusers_ext.data.manifolds`)."""
        if manifold.mixture is None:
            raise ValueError(f"the closed form needs a Gaussian-mixture manifold, got {manifold.name!r}.")
        mixture = manifold.mixture
        return cls.from_mixture(
            mixture.weights, mixture.means, mixture.covariances, manifold.basis, manifold.noise_std
        )

    @property
    def ambient_dim(self) -> int:
        return self.config.ambient_dim

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    def posterior_mean(self, sample: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """`E[x | x_sigma = sample]` `(N, D)` for `sample` `(N, D)` and `sigma` `(N,)` (float64)."""
        y = sample.to(torch.float64)
        sigma = sigma.to(torch.float64).reshape(-1, 1)
        signal = 1 - sigma
        tau2 = float(self.config.noise_std) ** 2
        d = self.latent_dim
        eye = torch.eye(d, dtype=torch.float64, device=y.device)
        w = y @ self.basis
        perp = y - w @ self.basis.T
        spread = self.covariances + tau2 * eye  # (K, d, d): the covariance of B^T x per component
        a = signal.reshape(-1, 1, 1, 1).square() * spread + sigma.reshape(-1, 1, 1, 1).square() * eye  # (N, K, d, d)
        centred = w.unsqueeze(1) - signal.unsqueeze(1) * self.means  # (N, K, d)
        cholesky = torch.linalg.cholesky(a)
        solved = torch.cholesky_solve(centred.unsqueeze(-1), cholesky).squeeze(-1)  # A^-1 (w - (1 - s) mu)
        log_det = 2 * torch.diagonal(cholesky, dim1=-2, dim2=-1).log().sum(-1)
        log_resp = self.weights.log() - 0.5 * (log_det + (centred * solved).sum(-1))
        resp = torch.softmax(log_resp, dim=-1)  # (N, K)
        component_mean = self.means + signal.unsqueeze(1) * (spread @ solved.unsqueeze(-1)).squeeze(-1)
        along = (resp.unsqueeze(-1) * component_mean).sum(1)
        b = signal.square() * tau2 + sigma.square()
        return along @ self.basis.T + signal * tau2 / b * perp

    def velocity(self, sample: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """`v*(sample, sigma)` `(N, D)` (float64) for `sigma` `(N,)` in (0, 1]."""
        x0 = self.posterior_mean(sample, sigma)
        signal, noise = (1 - sigma).reshape(-1, 1).to(x0), sigma.reshape(-1, 1).to(x0)
        eps = prediction_to_epsilon(x0, sample.to(x0), signal, noise, "sample", supported=("sample",))
        return epsilon_and_x0_to_prediction(eps, x0, signal, noise, "flow")

    def forward(self, sample: torch.Tensor, timestep, return_dict: bool = True):
        check_sample_dim("sample", sample, self.ambient_dim)
        sigma = broadcast_timestep(timestep, sample).reshape(-1).to(torch.float64) / self.config.num_train_timesteps
        velocity = self.velocity(sample.reshape(-1, self.ambient_dim), sigma).reshape(sample.shape).to(sample.dtype)
        return VelocityOutput(sample=velocity) if return_dict else (velocity,)

    def sample_data(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """`n` fresh data points `(n, D)` (float64)."""
        check_positive_int("n", n)
        components = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(n, self.latent_dim, generator=generator, dtype=torch.float64)
        z = self.means[components] + (torch.linalg.cholesky(self.covariances)[components] @ z.unsqueeze(-1)).squeeze(
            -1
        )
        x = z @ self.basis.T
        if self.config.noise_std > 0:
            x = x + self.config.noise_std * torch.randn(x.shape, generator=generator, dtype=torch.float64)
        return x


# ---------------------------------------------------------------------------------------------------- judges


SIGMA_MIN = 1e-3  # the smallest nonzero noise level FlowMatchEulerDiscreteScheduler evaluates (1 / 1000)


def velocity_errors(
    velocity_fn, oracle: GaussianMixtureVelocityModel, num_points: int, generator, sigma_min: float = SIGMA_MIN
) -> dict:
    """The squared velocity error `E |v(y, sigma) - v*(y, sigma)|^2` on fresh triples (data, noise, sigma).

    `sigma` is stratified on `[sigma_min, 1]` (`sigma_min + (1 - sigma_min) (j + U) / num_points`, shuffled): the
    noise levels a flow-matching sampler evaluates (`FlowMatchEulerDiscreteScheduler` never goes below 1e-3 before
    its last step to 0). Data are fresh draws of the oracle's law and `y = (1 - sigma) x + sigma eps`. The error is
    split along `B` (`|B^T (v - v*)|^2`) and across it (the rest), `B` the oracle's (true) subspace.

    Args:
        velocity_fn (`Callable[[y (N, D), sigma (N,)], (N, D)]`): the velocity to judge ([`model_velocity_fn`] of
            a model); for a flow on subspace coordinates use [`velocity_errors_along`].
        oracle ([`GaussianMixtureVelocityModel`]): the truth.
        num_points (`int`): triples.
        generator (`torch.Generator`): draws them (seed it to judge methods on the same triples).
        sigma_min (`float`, defaults to 1e-3): the lowest noise level judged.

    Returns:
        `{"total", "along", "orthogonal"}` means over the triples, and `"total_se"`, their standard error.
    """
    y, sigma, target = _judge_triples(oracle, num_points, generator, sigma_min)
    difference = velocity_fn(y, sigma).to(torch.float64) - target
    along = (difference @ oracle.basis).square().sum(-1)
    total = difference.square().sum(-1)
    return {
        "total": float(total.mean()),
        "total_se": float(total.std() / math.sqrt(num_points)),
        "along": float(along.mean()),
        "orthogonal": float((total - along).mean()),
    }


def velocity_errors_along(
    coordinate_velocity_fn, basis_hat: torch.Tensor, oracle, num_points: int, generator, sigma_min: float = SIGMA_MIN
) -> dict:
    """For latent flow matching (a flow on the PCA coordinates `B_hat^T y`, with no velocity across its subspace):
    `E |B_hat g(B_hat^T y, sigma) - B B^T v*|^2`, the error of its velocity mapped back, against the true velocity's
    part along the true subspace, on the same triples as [`velocity_errors`] (same generator state)."""
    y, sigma, target = _judge_triples(oracle, num_points, generator, sigma_min)
    basis_hat = basis_hat.to(torch.float64)
    mapped = coordinate_velocity_fn(y @ basis_hat, sigma).to(torch.float64) @ basis_hat.T
    along_true = (target @ oracle.basis) @ oracle.basis.T
    error = (mapped - along_true).square().sum(-1)
    return {"along": float(error.mean()), "along_se": float(error.std() / math.sqrt(num_points))}


def _judge_triples(oracle, num_points: int, generator, sigma_min: float):
    check_positive_int("num_points", num_points)
    if not is_number(sigma_min) or not 0 < sigma_min < 1:
        raise ValueError(f"`sigma_min` must lie in (0, 1), got {sigma_min!r}.")
    x = oracle.sample_data(num_points, generator)
    eps = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    strata = torch.arange(num_points, dtype=torch.float64) + torch.rand(
        num_points, generator=generator, dtype=torch.float64
    )
    sigma = sigma_min + (1 - sigma_min) * strata / num_points
    sigma = sigma[torch.randperm(num_points, generator=generator)]
    y = (1 - sigma).unsqueeze(-1) * x + sigma.unsqueeze(-1) * eps
    return y, sigma, oracle.velocity(y, sigma)


def model_velocity_fn(model, batch_size: int = 4096):
    """`(y, sigma) -> v` of a diffusers-convention velocity model (in its dtype, no gradients), by batches."""

    def velocity(y, sigma):
        dtype = model.dtype
        out = []
        with torch.no_grad():
            for start in range(0, len(y), batch_size):
                part = slice(start, start + batch_size)
                timestep = sigma[part].to(dtype) * model.config.num_train_timesteps
                out.append(model(y[part].to(dtype), timestep).sample.to(torch.float64))
        return torch.cat(out)

    return velocity


def off_manifold_rms(samples: torch.Tensor, basis: torch.Tensor) -> float:
    """`sqrt(mean ||(I - B B^T) x||^2)`: the RMS distance of `samples` `(N, D)` to the subspace of the orthonormal
    `basis` `(D, d)` (0 for points on it)."""
    x = samples.to(torch.float64)
    basis = basis.to(torch.float64)
    perp = x - (x @ basis) @ basis.T
    return float(perp.square().sum(-1).mean().sqrt())


def manifold_sliced_wasserstein(
    samples: torch.Tensor, reference: torch.Tensor, basis: torch.Tensor, num_projections: int = 128, seed: int = 0
) -> float:
    """The sliced 2-Wasserstein distance between the true subspace coordinates `B^T x` of `samples` and of
    `reference` (fresh draws), on `num_projections` random directions of `R^d` drawn with `seed` (the same for
    every method)."""
    basis = basis.to(torch.float64)
    generator = torch.Generator().manual_seed(seed)
    return sliced_wasserstein(
        samples.to(torch.float64) @ basis, reference.to(torch.float64) @ basis, num_projections, generator
    )


# ---------------------------------------------------------------------------------------------------- baselines


def train_velocity_model(
    model,
    data: torch.Tensor,
    steps: int,
    learning_rate: float,
    batch_size: int = 256,
    seed: int = 0,
    warmup_steps: int = 50,
    max_grad_norm: float | None = 1.0,
    covariates: torch.Tensor | None = None,
) -> dict:
    """Train a velocity model with [`manifold_flow_loss`] on `data` `(n, dim)`: AdamW (no weight decay), a cosine
    schedule with warm-up, batches drawn with replacement; the loop of `training/train_manifold_flow.py` without
    accelerate. With `covariates` `(n, c)`, each batch's rows go to the model as `covariates=` (a conditional model,
    e.g. [`BrainNetworkFlowModel`]). Returns `{"final_loss"}` (the mean of the last 10% of the steps' losses)."""
    from diffusers.optimization import get_scheduler

    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    schedule = get_scheduler(
        "cosine", optimizer, num_warmup_steps=min(warmup_steps, steps // 10), num_training_steps=steps
    )
    generator = torch.Generator().manual_seed(seed)
    data = data.to(model.dtype)
    if covariates is not None and len(covariates) != len(data):
        raise ValueError(f"`covariates` must hold one row per data point ({len(data)}), got {len(covariates)}.")
    losses = []
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(data), (batch_size,), generator=generator)
        extra = {} if covariates is None else {"covariates": covariates[index].to(model.dtype)}
        loss = manifold_flow_loss(model, data[index], generator, **extra)
        optimizer.zero_grad()
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-max(1, steps // 10) :]
    return {"final_loss": sum(tail) / len(tail)}


def sample_pipeline(model, noise: torch.Tensor, num_inference_steps: int) -> torch.Tensor:
    """Samples of `model` from the initial `noise` `(N, dim)` through [`ManifoldFlowPipeline`] with diffusers'
    `FlowMatchEulerDiscreteScheduler` (float64 on return)."""
    pipe = ManifoldFlowPipeline(model=model, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    out = pipe(batch_size=len(noise), latents=noise, num_inference_steps=num_inference_steps, output_type="pt")
    return out.samples.to(torch.float64)


def sample_latent_flow(model, basis_hat: torch.Tensor, noise: torch.Tensor, num_inference_steps: int) -> torch.Tensor:
    """Latent flow matching's samples in `R^D`: the `d`-dim flow `model` integrated from `B_hat^T noise` (a standard
    normal in `R^d`, so paired with the `D`-dim noise of the other methods) and mapped back by `B_hat`."""
    basis_hat = basis_hat.to(torch.float64)
    latent = sample_pipeline(model, (noise.to(torch.float64) @ basis_hat).to(model.dtype), num_inference_steps)
    return latent @ basis_hat.T
