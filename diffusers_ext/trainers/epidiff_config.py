"""[`EpiDiffConfig`]: the options of [`EpiDiffTrainer`] (EpiDiff's spatio-temporal denoiser)."""

from dataclasses import dataclass, field

from ..utils import check_positive_int, is_number, public
from .base_config import DiffusionTrainerConfig


@public
@dataclass
class EpiDiffConfig(DiffusionTrainerConfig):
    r"""
    Options of [`EpiDiffTrainer`]. A training step is one Adam step on `per_device_train_batch_size` windows per
    process, drawn with replacement from the training windows: the epsilon-prediction MSE of the whole window
    (history + horizon), noised by a `"scaled_linear"` DDPM schedule and conditioned on the history (future zeroed)
    and its mask. Defaults follow DiffSTG / EpiDiff (hidden 32, 4 heads, 200 DDPM steps with `beta_end` 0.1, Adam
    with learning rate 2e-3 and weight decay 1e-5, batch 8, no gradient clipping), with 2 blocks and dropout 0.1 for
    the small CPU data sets.
    """

    history: int = field(default=14, metadata={"help": "History steps of each window (the rest is the horizon)."})
    hidden_size: int = field(default=32, metadata={"help": "Width of the denoiser."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads of the denoiser."})
    num_layers: int = field(default=2, metadata={"help": "Temporal + graph attention blocks of the denoiser."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout of the denoiser."})
    log_transform: bool = field(default=True, metadata={"help": "Model log1p of the incidence."})
    num_train_timesteps: int = field(default=200, metadata={"help": "DDPM steps of the training schedule."})
    beta_end: float = field(default=0.1, metadata={"help": "Last beta of the scaled_linear schedule."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Adam learning rate (constant)."})
    weight_decay: float = field(default=1e-5, metadata={"help": "Adam (L2) weight decay, as DiffSTG's."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping norm (<= 0: none, DiffSTG's)."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps."})
    save_steps: int = field(default=500, metadata={"help": "Save a resumable checkpoint every N steps."})

    def __post_init__(self):
        super().__post_init__()
        for name in ("history", "hidden_size", "num_heads", "num_layers", "num_train_timesteps"):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be a multiple of `num_heads` ({self.num_heads})."
            )
        if not is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise ValueError(f"`dropout` must lie in [0, 1), got {self.dropout!r}.")
        if not is_number(self.beta_end) or not 1e-4 < self.beta_end < 1:
            raise ValueError(f"`beta_end` must lie in (1e-4, 1) (beta_start is 1e-4), got {self.beta_end!r}.")
        if not is_number(self.learning_rate) or self.learning_rate <= 0:
            raise ValueError(f"`learning_rate` must be a positive number, got {self.learning_rate!r}.")
