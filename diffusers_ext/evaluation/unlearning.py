"""Measure unlearning on the digits zoo: forgotten-class rate, retained quality, membership parity of forgotten data."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..data.digits import NUM_CLASSES, load_digits_images
from ..metrics import classifier_predictions, frechet_distance, per_class_accuracy
from ..utils import check_positive_int
from .digits import sample_digits


@dataclass
class ConceptUnlearningReport:
    r"""
    What the classifier says about a class-conditional digits generator after forgetting `forget_classes`.

    Args:
        forget_classes (`list[int]`): the forgotten classes.
        forgotten_rate (`float`): share of samples conditioned on a forgotten class that the classifier still
            assigns to that class.
        per_class_accuracy (`list[float]`): per conditioning class, the share classified as that class.
        retained_frechet (`float`): Fréchet distance (classifier features) between the samples of the retained
            classes and the held-out real digits of those classes.
        images (`torch.Tensor`): the samples in [-1, 1], class-major.
    """

    forget_classes: list[int]
    forgotten_rate: float
    per_class_accuracy: list[float]
    retained_frechet: float
    images: torch.Tensor

    def retained_accuracy(self) -> dict[int, float]:
        return {c: a for c, a in enumerate(self.per_class_accuracy) if c not in self.forget_classes}

    def max_retained_accuracy_drop(self, pretrained: "ConceptUnlearningReport") -> float:
        """The largest drop of a retained class's accuracy below the pretrained model's (0 if none dropped)."""
        mine, theirs = self.retained_accuracy(), pretrained.retained_accuracy()
        return max(0.0, max(theirs[c] - mine[c] for c in mine))


@torch.no_grad()
def evaluate_concept_unlearning(
    pipe,
    classifier,
    forget_classes: Sequence[int],
    samples_per_class: int = 100,
    num_inference_steps: int = 25,
    guidance_scale: float = 1.0,
    seed: int = 0,
) -> ConceptUnlearningReport:
    """Sample every digit class with `pipe`, judge with `classifier`; retained Fréchet against held-out digits."""
    forget = [int(c) for c in forget_classes]
    images, labels = sample_digits(pipe, samples_per_class, num_inference_steps, guidance_scale, seed)
    predictions, features = classifier_predictions(classifier, images)
    predictions = predictions.cpu()
    accuracy = per_class_accuracy(predictions, labels, NUM_CLASSES).tolist()
    forgotten = torch.isin(labels, torch.tensor(forget))
    if not forget:
        raise ValueError("`forget_classes` is empty; expected the classes that were unlearned.")
    forgotten_rate = float((predictions[forgotten] == labels[forgotten]).double().mean())
    real, real_labels = load_digits_images("heldout", resolution=images.shape[-1])
    _, real_features = classifier_predictions(classifier, real[~torch.isin(real_labels, torch.tensor(forget))])
    retained_frechet = frechet_distance(features[~forgotten.to(features.device)], real_features)
    return ConceptUnlearningReport(forget, forgotten_rate, accuracy, retained_frechet, images)


@torch.no_grad()
def denoising_losses(
    unet,
    noise_scheduler,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    num_draws: int = 32,
    seed: int = 0,
    batch_size: int = 512,
) -> torch.Tensor:
    r"""
    Per-example denoising loss E_{t, eps} ||eps_theta(x_t, t, y) - eps||² (mean over pixels), the quantity whose
    gap between training members and held-out non-members reveals membership.

    The `num_draws` timesteps are stratified over [0, T) and the noise is drawn from `seed`, identically for every
    example and every model, so two models (or members vs non-members) are compared on the same draws.

    Returns:
        `torch.Tensor` of shape `(N,)`, float64.
    """
    device = next(unet.parameters()).device
    num_train_timesteps = noise_scheduler.config.num_train_timesteps
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.rand(num_draws, generator=generator)
    timesteps = ((torch.arange(num_draws) + offsets) * num_train_timesteps / num_draws).long()
    noise = torch.randn((num_draws, *images.shape[1:]), generator=generator)
    totals = torch.zeros(len(images), dtype=torch.float64)
    was_training = unet.training
    unet.eval()
    for k in range(num_draws):
        for start in range(0, len(images), batch_size):
            x0 = images[start : start + batch_size].to(device)
            eps = noise[k].expand_as(x0).to(device)
            t = timesteps[k].expand(len(x0)).to(device)
            x_t = noise_scheduler.add_noise(x0, eps, t)
            kwargs = {} if labels is None else {"class_labels": labels[start : start + batch_size].to(device)}
            pred = unet(x_t, t, **kwargs).sample
            totals[start : start + batch_size] += ((pred - eps) ** 2).flatten(1).mean(1).double().cpu()
    unet.train(was_training)
    return totals / num_draws


def membership_summary(forget_losses: torch.Tensor, heldout_losses: torch.Tensor) -> dict[str, float]:
    """Mean loss of the forgotten examples vs mean and spread of held-out non-members'.

    `forget_within_spread` holds when the forgotten mean lies within one standard deviation of the held-out
    per-example losses; `forget_mean_z` is the forgotten mean's distance from the held-out mean in units of the
    standard error of a mean of as many held-out examples (a two-sample test of parity).
    """
    f, h = forget_losses.double(), heldout_losses.double()
    std = float(h.std())
    z = (float(f.mean()) - float(h.mean())) / (std / float(np.sqrt(len(f))))
    return {
        "forget_loss": float(f.mean()),
        "heldout_loss_mean": float(h.mean()),
        "heldout_loss_std": std,
        "forget_within_spread": bool(abs(float(f.mean()) - float(h.mean())) <= std),
        "forget_mean_z": z,
    }


class PixelMLPJudge(torch.nn.Module):
    r"""
    A second digits judge, independent of the zoo `ConvImageClassifier`: a one-hidden-layer perceptron on the raw
    pixels (no convolutions, no shift augmentation), fitted by scikit-learn's L2-regularised `MLPClassifier`
    ([`train_pixel_mlp_judge`]). Called on images `(N, 1, H, W)` in [-1, 1] it returns `(logits, features)` with
    `logits` of shape `(N, num_classes)` and `features` the hidden ReLU activations `(N, hidden_size)`, the pair
    [`classifier_predictions`] reads.
    """

    def __init__(self, num_pixels: int, hidden_size: int, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.hidden = torch.nn.Linear(num_pixels, hidden_size)
        self.out = torch.nn.Linear(hidden_size, num_classes)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.hidden(images.flatten(1)))
        return self.out(features), features


def train_pixel_mlp_judge(
    images: torch.Tensor, labels: torch.Tensor, hidden_size: int = 64, seed: int = 0, max_iter: int = 400
) -> PixelMLPJudge:
    """Fit [`PixelMLPJudge`] on `images` `(N, 1, H, W)` in [-1, 1] and `labels` `(N,)` with scikit-learn (Adam,
    L2 penalty 1e-2, at most `max_iter` epochs) and copy the fitted weights into the torch module."""
    if images.ndim != 4 or len(images) != len(labels):
        raise ValueError(
            f"`images` must be (N, C, H, W) with one label each; got {tuple(images.shape)} and {len(labels)} labels."
        )
    check_positive_int("hidden_size", hidden_size)
    from sklearn.neural_network import MLPClassifier

    x = images.flatten(1).double().numpy()
    mlp = MLPClassifier(hidden_layer_sizes=(hidden_size,), alpha=1e-2, max_iter=max_iter, random_state=seed)
    mlp.fit(x, labels.numpy())
    if list(mlp.classes_) != list(range(NUM_CLASSES)):
        raise ValueError(f"`labels` must cover the classes 0..{NUM_CLASSES - 1}, got {list(mlp.classes_)}.")
    judge = PixelMLPJudge(x.shape[1], hidden_size)
    with torch.no_grad():
        judge.hidden.weight.copy_(torch.from_numpy(mlp.coefs_[0].T))
        judge.hidden.bias.copy_(torch.from_numpy(mlp.intercepts_[0]))
        judge.out.weight.copy_(torch.from_numpy(mlp.coefs_[1].T))
        judge.out.bias.copy_(torch.from_numpy(mlp.intercepts_[1]))
    return judge.eval()


def heldout_halves(resolution: int = 8, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The held-out digits split in two class-stratified halves, `{"validation": ..., "test": ...}`, each
    `(images (N, 1, r, r) in [-1, 1], labels (N,))`: choices are made against one, the other is used once."""
    from sklearn.model_selection import train_test_split

    images, labels = load_digits_images("heldout", resolution=resolution)
    val, test = train_test_split(np.arange(len(labels)), test_size=0.5, stratify=labels.numpy(), random_state=seed)
    val, test = torch.from_numpy(np.sort(val)), torch.from_numpy(np.sort(test))
    return {"validation": (images[val], labels[val]), "test": (images[test], labels[test])}


@torch.no_grad()
def sample_labels(pipe, labels: torch.Tensor, num_inference_steps: int, seed: int, batch_size: int = 500):
    """Samples of `pipe` in [-1, 1], one per entry of `labels` `(N,)`, from one generator seeded with `seed`."""
    generator = torch.Generator("cpu").manual_seed(seed)
    chunks = []
    for start in range(0, len(labels), batch_size):
        out = pipe(
            class_labels=labels[start : start + batch_size],
            num_inference_steps=num_inference_steps,
            generator=generator,
            output_type="pt",
        ).images
        chunks.append(out.cpu() * 2 - 1)
    return torch.cat(chunks)


@torch.no_grad()
def judge_samples(
    judge, images: torch.Tensor, labels: torch.Tensor, real: tuple, forget_classes: Sequence[int] = ()
) -> dict:
    """What one judge says about generated `images` `(N, 1, H, W)` conditioned on `labels` `(N,)`.

    Returns `{"forgotten_rate", "forgotten_count", "per_class_accuracy", "per_class_count", "retained_frechet"}`:
    the share of the forgotten classes' samples the judge still assigns to their class (None without forgotten
    classes), per conditioning class the share classified as that class, and the Fréchet distance in the judge's
    features between the retained classes' samples and the real images `real = (images, labels)` of those classes.
    """
    forget = torch.tensor([int(c) for c in forget_classes], dtype=torch.long)
    predictions, features = classifier_predictions(judge, images)
    predictions = predictions.cpu()
    if features is None:
        raise ValueError(f"`judge` {type(judge).__name__} returns no features; a Fréchet distance needs them.")
    forgotten = torch.isin(labels, forget)
    counts = torch.bincount(labels, minlength=NUM_CLASSES)
    rate = float((predictions[forgotten] == labels[forgotten]).double().mean()) if forgotten.any() else None
    real_images, real_labels = real
    _, real_features = classifier_predictions(judge, real_images[~torch.isin(real_labels, forget)])
    return {
        "forgotten_rate": rate,
        "forgotten_count": int(forgotten.sum()),
        "per_class_accuracy": per_class_accuracy(predictions, labels, NUM_CLASSES).tolist(),
        "per_class_count": counts.tolist(),
        "retained_frechet": frechet_distance(features[~forgotten.to(features.device)], real_features),
    }
