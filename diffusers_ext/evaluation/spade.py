r"""What SPADE is compared with on the offline black-box optimisation tasks (`diffusers_ext.data.offline_bbo`).

Comparison-only code: the baselines the issue names and the runs of SPADE and its ablations, each returning the
`num_candidates` designs a method proposes (Design-Bench's protocol scores them with the task's oracle).

- [`MLPRegressor`], [`fit_regressor`]: a plain MLP on z-scored data (MSE, Adam), the baselines' surrogate.
- [`gradient_ascent`]: Design-Bench's "gradient ascent" baseline: the top offline designs moved uphill on the MLP.
- [`regressor_search`]: SPADE's evolutionary search ([`EAConfig`]) on the MLP's prediction (`"mlp_ea"`) or on the
  lower confidence bound `mean - beta std` of a deep ensemble (`"ensemble_lcb"`).
- [`best_of_offline`]: the top offline designs themselves.
- [`SPADE_VARIANTS`], [`train_spade`], [`spade_search`]: SPADE and the paper's ablations (no calibration, no support,
  neither), trained with [`SpadeTrainer`] and searched with [`OfflineOptimizationPipeline`].
"""

import numpy as np
import torch
from torch import nn

from ..data.offline_bbo import OfflineTask
from ..models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from ..pipelines.spade.pipeline_offline_optimization import OfflineOptimizationPipeline
from ..pipelines.spade.search import EAConfig, evolutionary_search
from ..trainers.spade_config import SpadeConfig
from ..trainers.spade_trainer import SpadeTrainer, spade_schedulers
from ..utils import check_positive_int


# variant -> (calibration_weight, support_weight) of its training
SPADE_VARIANTS = {
    "spade": (1.0, 1.0),
    "spade_no_support": (1.0, 0.0),
    "spade_no_calibration": (0.0, 1.0),
    "spade_neither": (0.0, 0.0),
}


class MLPRegressor(nn.Module):
    r"""`Linear(D, H) -> ReLU -> Linear(H, H) -> ReLU -> Linear(H, 1)`, on z-scored designs and scores.

    The z-scoring of its training data is stored (`x_mean`, `x_std`, `y_mean`, `y_std` buffers); `forward` takes and
    returns normalised units.
    """

    def __init__(self, x_dim: int, hidden_size: int = 256):
        super().__init__()
        check_positive_int("x_dim", x_dim)
        check_positive_int("hidden_size", hidden_size)
        self.net = nn.Sequential(
            nn.Linear(x_dim, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU()
        )
        self.out = nn.Linear(hidden_size, 1)
        for name, shape in (("x_mean", (x_dim,)), ("x_std", (x_dim,)), ("y_mean", ()), ("y_std", ())):
            self.register_buffer(name, torch.zeros(shape) if name.endswith("mean") else torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised designs `(N, D)` -> normalised predicted scores `(N,)`."""
        return self.out(self.net(x)).squeeze(-1)


def _zscore(x: np.ndarray, y: np.ndarray):
    x_mean, x_std = x.mean(0), x.std(0)
    x_std = np.where(x_std > 1e-8, x_std, 1.0)
    y_mean, y_std = float(y.mean()), float(y.std()) if y.std() > 1e-8 else 1.0
    return x_mean, x_std, y_mean, y_std


def fit_regressor(
    x: np.ndarray,
    y: np.ndarray,
    hidden_size: int = 256,
    num_steps: int = 1000,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> MLPRegressor:
    r"""
    Train an [`MLPRegressor`] on offline data (MSE on z-scored `x` `(N, D)` and `y` `(N,)`, Adam, `num_steps`
    mini-batches of `batch_size` from per-epoch permutations; everything seeded by `seed`). Returns it in eval mode.
    """
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32).reshape(-1)
    if x.ndim != 2 or y.shape[0] != x.shape[0] or x.shape[0] < 2:
        raise ValueError(f"`x` must be (N, D) with N >= 2 and `y` (N,), got {x.shape} and {y.shape}.")
    check_positive_int("num_steps", num_steps)
    check_positive_int("batch_size", batch_size)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MLPRegressor(x.shape[1], hidden_size)
    x_mean, x_std, y_mean, y_std = _zscore(x, y)
    for name, value in (("x_mean", x_mean), ("x_std", x_std), ("y_mean", y_mean), ("y_std", y_std)):
        getattr(model, name).copy_(torch.as_tensor(value, dtype=torch.float32))
    xs = torch.from_numpy((x - x_mean) / x_std).float()
    ys = torch.from_numpy((y - y_mean) / y_std).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    order, position = torch.randperm(len(xs), generator=generator), 0
    for _ in range(num_steps):
        if position >= len(xs):
            order, position = torch.randperm(len(xs), generator=generator), 0
        rows = order[position : position + batch_size]
        position += batch_size
        loss = nn.functional.mse_loss(model(xs[rows]), ys[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _top(x: np.ndarray, y: np.ndarray, count: int) -> np.ndarray:
    return x[np.argsort(-np.asarray(y).reshape(-1), kind="stable")[:count]]


def best_of_offline(task: OfflineTask, num_candidates: int = 128) -> np.ndarray:
    """The `num_candidates` best offline designs `(num_candidates, D)` (their p100 is the offline best)."""
    check_positive_int("num_candidates", num_candidates)
    return _top(task.offline_x, task.offline_y, num_candidates).copy()


def gradient_ascent(
    model: MLPRegressor,
    task: OfflineTask,
    num_candidates: int = 128,
    learning_rate: float = 0.05,
    num_steps: int = 50,
) -> np.ndarray:
    r"""
    Move the top `num_candidates` offline designs uphill on `model` with Adam (`learning_rate`, `num_steps`) in its
    normalised units, clipped to the task's bounds after each step. Returns the final designs `(num_candidates, D)`
    (data units).
    """
    check_positive_int("num_candidates", num_candidates)
    check_positive_int("num_steps", num_steps)
    if learning_rate <= 0:
        raise ValueError(f"`learning_rate` must be > 0, got {learning_rate}.")
    mean, std = model.x_mean, model.x_std
    low = (torch.as_tensor(task.bounds[0]) - mean) / std
    high = (torch.as_tensor(task.bounds[1]) - mean) / std
    start = torch.as_tensor(_top(task.offline_x, task.offline_y, num_candidates), dtype=torch.float32)
    z = ((start - mean) / std).clone().requires_grad_(True)
    optimizer = torch.optim.Adam([z], lr=learning_rate)
    for p in model.parameters():
        p.requires_grad_(False)
    for _ in range(num_steps):
        loss = -model(z).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            z.copy_(torch.maximum(torch.minimum(z, high), low))
    for p in model.parameters():
        p.requires_grad_(True)
    return (z.detach() * std + mean).numpy()


def regressor_search(
    models: list[MLPRegressor],
    task: OfflineTask,
    ea: EAConfig,
    beta: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    r"""
    SPADE's evolutionary search on regressors: maximise `mean - beta std` of the `models`' predictions (one model:
    its prediction, the "EA on an MLP" baseline; a deep ensemble with `beta > 0`: its lower confidence bound). All
    models must share one z-scoring (train them on the same data). Returns the final population
    `(ea.population_size, D)` in data units.
    """
    if not models:
        raise ValueError("`models` must hold at least one MLPRegressor.")
    mean, std = models[0].x_mean, models[0].x_std

    @torch.no_grad()
    def score(population: np.ndarray) -> np.ndarray:
        z = torch.as_tensor(population, dtype=torch.float32)
        predictions = torch.stack([m(z) for m in models])
        spread = predictions.std(0, unbiased=False) if len(models) > 1 else torch.zeros_like(predictions[0])
        return (predictions.mean(0) - beta * spread).numpy()

    bounds = ((torch.as_tensor(task.bounds) - mean) / std).numpy().astype(np.float64)
    x = ((torch.as_tensor(task.offline_x) - mean) / std).numpy()
    population, _, _ = evolutionary_search(score, x, task.offline_y, bounds, ea, np.random.default_rng(seed))
    return (torch.as_tensor(population, dtype=torch.float32) * std + mean).numpy()


def train_spade(
    task: OfflineTask,
    variant: str = "spade",
    hidden_size: int = 128,
    time_embed_dim: int = 32,
    max_steps: int = 300,
    seed: int = 0,
    output_dir: str = "spade_benchmark_output",
    **config,
) -> tuple[ScalarDiffusionSurrogate, list[dict]]:
    r"""
    Train a SPADE surrogate of `variant` (a key of [`SPADE_VARIANTS`]) on `task`'s offline data with
    [`SpadeTrainer`] (`max_steps` mini-batches; extra [`SpadeConfig`] fields in `config`). Returns the surrogate and
    the trainer's history (one dict of losses per step).
    """
    if variant not in SPADE_VARIANTS:
        raise ValueError(f"`variant` must be one of {tuple(SPADE_VARIANTS)}, got {variant!r}.")
    calibration, support = SPADE_VARIANTS[variant]
    torch.manual_seed(seed)
    model = ScalarDiffusionSurrogate(x_dim=task.dim, hidden_size=hidden_size, time_embed_dim=time_embed_dim)
    args = SpadeConfig(
        output_dir=output_dir,
        max_steps=max_steps,
        seed=seed,
        calibration_weight=calibration,
        support_weight=support,
        disable_tqdm=True,
        **config,
    )
    rows = [{"x": x, "y": y} for x, y in zip(task.offline_x, task.offline_y)]
    trainer = SpadeTrainer(model, args, train_dataset=rows)
    history = trainer.train()
    return trainer.surrogate().eval(), history


def spade_search(
    model: ScalarDiffusionSurrogate,
    task: OfflineTask,
    ea: EAConfig | None = None,
    beta: float = 0.1,
    num_samples: int = 32,
    num_inference_steps: int = 10,
    support_transform: bool = False,
    seed: int = 0,
) -> np.ndarray:
    r"""
    SPADE's search on `task`: the EA on the LCB `mu - beta sigma` of `num_samples` DDIM samples with
    `num_inference_steps` (optionally after the kNN support transform; off by default, as in the reference's
    `optimize_spade`). Returns the `ea.population_size` candidates `(P, D)` in data units.
    """
    ea = EAConfig() if ea is None else ea
    pipe = OfflineOptimizationPipeline(model=model, scheduler=spade_schedulers(model.config.num_train_timesteps)[1])
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        task.offline_x,
        task.offline_y,
        bounds=task.bounds,
        num_candidates=ea.population_size,
        acquisition_function="lcb",
        beta=beta,
        num_samples=num_samples,
        num_inference_steps=num_inference_steps,
        ea=ea,
        support_transform=support_transform,
        discrete_shape=(task.seq_len, task.num_classes) if task.discrete else None,
        generator=torch.Generator().manual_seed(seed),
        seed=seed,
    )
    return out.candidates
