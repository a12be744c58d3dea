"""[`SpadeConfig`]: the options of [`SpadeTrainer`] (SPADE's surrogate training)."""

from dataclasses import dataclass, field

from ..utils import public
from .base_config import DiffusionTrainerConfig


@public
@dataclass
class SpadeConfig(DiffusionTrainerConfig):
    r"""
    Options of [`SpadeTrainer`]. A training step is one optimizer step on one mini-batch of the offline data
    (`per_device_train_batch_size` points): the denoising loss plus `calibration_weight` times the calibration loss
    plus `support_weight` times the support loss, the last two on the Monte-Carlo mean and spread of
    `calibration_num_samples` DDIM samples with `calibration_num_inference_steps` steps, differentiated through the
    sampler. Defaults are the reference's (`learning_rate=1e-3`, batch 64, gradient clip 1.0; its 100 epochs are
    `max_steps = 100 * ceil(N / 64)`).
    """

    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate (the reference's 1e-3)."})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "Offline points per mini-batch."})
    calibration_weight: float = field(default=1.0, metadata={"help": "Weight of the calibration loss (0: off)."})
    calibration_num_samples: int = field(default=4, metadata={"help": "DDIM samples per point for mu and sigma."})
    calibration_num_inference_steps: int = field(default=10, metadata={"help": "DDIM steps of those samples."})
    num_ranking_pairs: int = field(default=32, metadata={"help": "Random pairs of the ranking term per batch."})
    ranking_temperature: float = field(default=1.0, metadata={"help": "Temperature T of softplus(-T (mu_i - mu_j))."})
    support_weight: float = field(default=1.0, metadata={"help": "Weight of the kNN support loss (0: off)."})
    support_k: int = field(default=10, metadata={"help": "Neighbours of the kNN support statistics."})
    tau_a: float = field(default=0.02, metadata={"help": "Mean allowance per log kNN radius."})
    sigma_a0: float = field(default=0.02, metadata={"help": "Spread floor at radius 1."})
    sigma_a1: float = field(default=0.005, metadata={"help": "Spread floor increase per log kNN radius."})
    save_strategy: str = field(default="no", metadata={"help": "'steps' or 'no' (surrogates train in minutes)."})

    def __post_init__(self):
        super().__post_init__()
        for name in ("calibration_num_samples", "calibration_num_inference_steps", "support_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        for name in ("calibration_weight", "support_weight", "num_ranking_pairs"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
