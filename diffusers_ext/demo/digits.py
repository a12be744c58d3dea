"""Demo section: the digits zoo (class-conditional DDPM judged by the digits classifier)."""

from dataclasses import dataclass

from .plots import save_bar_plot, save_confusion_matrix, save_image_grid
from .report import Figure, Section


@dataclass(frozen=True)
class DigitsDemoSettings:
    samples_per_class: int
    num_inference_steps: int
    guidance_scale: float


SETTINGS = {
    "quick": DigitsDemoSettings(samples_per_class=20, num_inference_steps=25, guidance_scale=1.0),
    "default": DigitsDemoSettings(samples_per_class=60, num_inference_steps=25, guidance_scale=1.0),
    "full": DigitsDemoSettings(samples_per_class=100, num_inference_steps=25, guidance_scale=1.0),
}


def digits_section(output_dir: str, mode: str, seed: int, device: str) -> Section:
    """Sample every digit class from the zoo DDPM, show a grid per class and the classifier's verdicts."""
    from .. import zoo
    from ..evaluation.digits import evaluate_digits_generator

    settings = SETTINGS[mode]
    pipe = zoo.load("digits-ddpm").to(device)
    pipe.set_progress_bar_config(disable=True)
    classifier = zoo.load("digits-classifier").to(device)
    report = evaluate_digits_generator(
        pipe, classifier, settings.samples_per_class, settings.num_inference_steps, settings.guidance_scale, seed
    )

    shown = 10
    per_class = report.images.view(10, settings.samples_per_class, *report.images.shape[1:])[:, :shown]
    grid = ((per_class.reshape(-1, *report.images.shape[1:]) + 1) / 2).permute(0, 2, 3, 1).numpy()
    save_image_grid(grid, f"{output_dir}/digits_grid.png", rows=10, row_labels=[str(c) for c in range(10)])
    accuracy = {str(c): float(a) for c, a in enumerate(report.per_class_accuracy)}
    save_bar_plot(
        accuracy, f"{output_dir}/digits_accuracy.png", "Samples classified as their class", "accuracy", reference=0.9
    )
    save_confusion_matrix(report.confusion, f"{output_dir}/digits_confusion.png", "Classifier verdicts on samples")

    n = settings.samples_per_class
    return Section(
        title="Digits zoo: class-conditional DDPM",
        summary=(
            f"The zoo DDPM sampled {n} digits of each class with {settings.num_inference_steps} DDIM steps and "
            f"classifier-free guidance {settings.guidance_scale}; the zoo classifier judged them. Mean conditional "
            f"accuracy {report.conditional_accuracy:.1%}; Fréchet distance to the held-out real digits in the "
            f"classifier's feature space {report.frechet_distance:.3g}."
        ),
        figures=[
            Figure("digits_grid.png", f"Each row: the first {shown} samples conditioned on that digit."),
            Figure(
                "digits_accuracy.png",
                "Per-class share of samples the classifier assigns to the conditioning "
                "class (dashed: the 90% target).",
            ),
            Figure("digits_confusion.png", "Confusion matrix of conditioning class vs classifier verdict."),
        ],
        table=[{"class": c, "accuracy": a} for c, a in accuracy.items()],
        notes=[
            f"seed {seed}; {n} samples per class; the benchmark with more samples: python benchmarks/zoo/zoo.py",
        ],
    )
