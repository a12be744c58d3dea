"""Demo section: constrained (reverse-KL) unlearning of one digit class from the zoo DDPM, samples before/after."""

import copy
from dataclasses import dataclass

from .plots import pyplot, save_figure, save_image_grid
from .report import Figure, Section


@dataclass(frozen=True)
class UnlearningDemoSettings:
    max_steps: int
    per_device_train_batch_size: int
    samples_per_class: int


# Steps: at 40 (batch 16) half the 3s survive; from 80 on none do (seed 0, 20 samples, zoo classifier).
SETTINGS = {
    "quick": UnlearningDemoSettings(max_steps=80, per_device_train_batch_size=16, samples_per_class=10),
    "default": UnlearningDemoSettings(max_steps=120, per_device_train_batch_size=16, samples_per_class=40),
    "full": UnlearningDemoSettings(max_steps=150, per_device_train_batch_size=32, samples_per_class=100),
}
FORGET_CLASS = 3
SHOWN = 10


def _save_trajectory(history, level, path):
    plt = pyplot()
    fig, left = plt.subplots(figsize=(6, 3), dpi=100)
    steps = [h["step"] for h in history]
    left.plot(steps, [h["lambda"] for h in history], color="#1f77b4", label="lambda")
    left.set_xlabel("step")
    left.set_ylabel("lambda", color="#1f77b4")
    right = left.twinx()
    right.plot(steps, [h["constraint_ema"] for h in history], color="#d62728", label="KL(q || p_u), smoothed")
    right.axhline(level, color="#d62728", linestyle="--", linewidth=1)
    right.set_ylabel("path KL estimate (dashed: level b)", color="#d62728")
    fig.tight_layout()
    save_figure(fig, path)


def unlearning_section(output_dir: str, mode: str, seed: int, device: str) -> Section:
    """Forget digit 3 from the zoo DDPM with the reverse-KL primal-dual trainer; show every class before and after."""
    from accelerate import Accelerator

    from .. import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer, zoo
    from ..evaluation.unlearning import evaluate_concept_unlearning

    settings = SETTINGS[mode]
    pipe = zoo.load("digits-ddpm").to(device)
    pipe.set_progress_bar_config(disable=True)
    classifier = zoo.load("digits-classifier").to(device)
    config = ConstrainedUnlearningConfig(
        constraint="reverse_kl",
        forget_classes=[FORGET_CLASS],
        retain_weight=10.0,
        lambda_max=0.75,
        constraint_level="auto",  # b: how far the retained classes sit from p_u, calibrated at train start
        dual_learning_rate="auto",  # 0.02 / b
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.per_device_train_batch_size,
        stop_patience=settings.max_steps,
        seed=seed,
        save_strategy="no",
        disable_tqdm=True,
    )
    trained = copy.copy(pipe)  # the trainer trains its pipeline's UNet in place; `pipe` stays the pretrained one
    trained.register_modules(unet=copy.deepcopy(pipe.unet))
    trainer = ConstrainedUnlearningTrainer(trained, config, accelerator=Accelerator(cpu=device == "cpu"))
    trainer.train()
    unlearned = trainer.unlearned_pipeline()
    unlearned.unet.eval()

    n = settings.samples_per_class
    reports = {
        name: evaluate_concept_unlearning(p, classifier, [FORGET_CLASS], n, 25, seed=seed)
        for name, p in (("before", pipe), ("after", unlearned))
    }
    for name, report in reports.items():
        shown = report.images.view(10, n, *report.images.shape[1:])[:, :SHOWN]
        grid = ((shown.reshape(-1, *report.images.shape[1:]) + 1) / 2).permute(0, 2, 3, 1).cpu().numpy()
        save_image_grid(grid, f"{output_dir}/unlearning_{name}.png", rows=10, row_labels=[str(c) for c in range(10)])
    _save_trajectory(trainer.history, trainer.constraint_level, f"{output_dir}/unlearning_lambda.png")

    before, after = reports["before"], reports["after"]
    table = [
        {"class": c, "accuracy before": b, "accuracy after": a}
        for c, (b, a) in enumerate(zip(before.per_class_accuracy, after.per_class_accuracy))
    ]
    final = trainer.history[-1]["constraint_ema"] if trainer.history else float("nan")
    reached = final >= trainer.constraint_level
    if after.forgotten_rate <= 0.1:
        row = f"After: row {FORGET_CLASS} no longer draws a {FORGET_CLASS}"
    else:
        row = f"After: row {FORGET_CLASS} still draws {FORGET_CLASS}s (this run is too short to forget)"
    row += f" (the classifier calls {after.forgotten_rate:.0%} of its {n} samples {FORGET_CLASS}; before: "
    row += f"{before.forgotten_rate:.0%})."
    return Section(
        title=f"Constrained unlearning: forgetting the digit {FORGET_CLASS}",
        summary=(
            f"The zoo DDPM was trained for {trainer.global_step} primal-dual steps to keep KL(q || p_{FORGET_CLASS}) "
            f">= {trainer.constraint_level:.3g} (the path KL at which the other digits sit from the {FORGET_CLASS}s) "
            f"while staying close to the unconditional model; lambda ended at {trainer.lambda_:.2f}. Samples "
            f"conditioned on {FORGET_CLASS} that the classifier still calls {FORGET_CLASS}: "
            f"{before.forgotten_rate:.0%} before, {after.forgotten_rate:.0%} after. Largest accuracy drop of a "
            f"retained class: {after.max_retained_accuracy_drop(before):.0%}; retained Fréchet distance "
            f"{before.retained_frechet:.3g} before, {after.retained_frechet:.3g} after."
        ),
        figures=[
            Figure("unlearning_before.png", f"Before: row c holds samples conditioned on the digit c ({SHOWN} each)."),
            Figure("unlearning_after.png", row),
            Figure(
                "unlearning_lambda.png",
                f"The dual variable and the smoothed constraint estimate during training: it ended at {final:.3g}, "
                + ("above" if reached else "below")
                + f" its level {trainer.constraint_level:.3g}"
                + ("." if reached else " (the constraint is not yet met)."),
            ),
        ],
        table=table,
        notes=[
            f"seed {seed}; {n} samples per class; benchmark over seeds and methods: python benchmarks/unlearning/unlearning.py",
        ],
    )
