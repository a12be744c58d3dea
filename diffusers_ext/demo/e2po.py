"""Demo section: E2PO aligns the digits-sd3 zoo model to the zoo classifier (samples before and after)."""

import tempfile
from dataclasses import dataclass

from .plots import pyplot, save_bar_plot, save_figure, save_image_grid
from .report import Figure, Section


@dataclass(frozen=True)
class E2PODemoSettings:
    steps: int
    prompts_per_step: int
    samples_per_digit: int


SETTINGS = {
    "quick": E2PODemoSettings(steps=4, prompts_per_step=2, samples_per_digit=4),
    "default": E2PODemoSettings(steps=12, prompts_per_step=3, samples_per_digit=12),
    "full": E2PODemoSettings(steps=30, prompts_per_step=4, samples_per_digit=16),
}
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def t5_window(tokenizer, prompt: str, max_sequence_length: int) -> str:
    """The text of `prompt` that a T5 encoder with `max_sequence_length` tokens sees.

    digits-sd3 was trained with `max_sequence_length=8`, so its T5 branch sees only a prompt's first characters (the
    digit's name reaches the model through the CLIP encoders). Given as `prompt_3`, this text yields the same T5 token
    ids as the whole prompt, without the pipeline warning that it truncated the rest. Returns `prompt` itself when the
    window does not tokenize back to the same ids.
    """
    ids = tokenizer(prompt, max_length=max_sequence_length, truncation=True).input_ids
    window = tokenizer.decode(ids, skip_special_tokens=True)
    return window if tokenizer(window, max_length=max_sequence_length, truncation=True).input_ids == ids else prompt


def committed_regime_curves(results_path, path: str) -> str | None:
    """Plot the committed benchmark's GRPO and E2PO eval curves (regime part); the caption, or None without them.

    `results_path` is benchmarks/e2po/results/e2po.json of a source checkout (absent from an installed wheel).
    """
    import json

    if results_path is None or not results_path.is_file():
        return None
    results = json.loads(results_path.read_text(encoding="utf-8"))
    summary = results.get("summary", {})
    curve = summary.get("regime_eval_curve")
    if not isinstance(curve, dict) or not {"steps", "grpo", "e2po"} <= curve.keys():
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    for name, colour in (("grpo", "#4a78b5"), ("e2po", "#c33")):
        ax.plot(curve["steps"], curve[name], marker="o", color=colour, label=name.upper())
    ax.set_xlabel("training step")
    ax.set_ylabel("eval reward (test noises)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    seeds = summary.get("num_seeds", len(results.get("settings", {}).get("seeds", [])))
    return (
        "Committed benchmark (not run now; benchmarks/e2po/results/e2po.md, `python benchmarks/e2po/e2po.py`): GRPO and E2PO "
        "on the hard digit prompts, eval reward (thresholded classifier confidence) on fixed test noises, mean over "
        f"{seeds} seeds; both rise from {curve['grpo'][0]:.2f} to {curve['grpo'][-1]:.2f} (GRPO) and "
        f"{curve['e2po'][-1]:.2f} (E2PO) in {curve['steps'][-1]} steps."
    )


def _samples(trainer, samples_per_digit: int, seed: int):
    """Clean-prompt samples of every digit (Euler sampling, fixed seeds) and whether the classifier agrees."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from ..rewards import digit_accuracy

    components = dict(trainer.pipeline.components)
    components["scheduler"] = FlowMatchEulerDiscreteScheduler.from_config(
        {
            k: v
            for k, v in trainer.pipeline.scheduler.config.items()
            if k not in ("noise_level", "sde_type", "sde_window")
        }
    )
    pipe = StableDiffusion3Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    images, hits = [], []
    with torch.no_grad():
        for label, name in enumerate(DIGIT_NAMES):
            prompt = f"a handwritten digit {name}"
            out = pipe(
                [prompt] * samples_per_digit,
                prompt_3=[t5_window(pipe.tokenizer_3, prompt, 8)] * samples_per_digit,
                height=8,
                width=8,
                num_inference_steps=trainer.args.num_inference_steps,
                guidance_scale=1.0,
                max_sequence_length=8,
                generator=torch.Generator().manual_seed(seed * 100 + label),
                output_type="pt",
            ).images
            images.append(out)
            hits += digit_accuracy(trainer.classifier, out, [label] * samples_per_digit)
    return torch.cat(images), sum(hits) / len(hits)


def e2po_section(output_dir: str, mode: str, seed: int, device: str) -> Section:
    """Train an E2PO LoRA on digits-sd3 for a few steps; show samples and accuracy before and after."""
    from peft import LoraConfig

    from .. import E2POConfig, E2POTrainer, zoo
    from ..rewards import ClassifierReward

    settings = SETTINGS[mode]
    classifier = zoo.load("digits-classifier").to(device)
    with tempfile.TemporaryDirectory() as scratch:
        config = E2POConfig(
            output_dir=scratch,
            max_steps=settings.steps,
            seed=seed,
            num_generations=8,
            per_device_train_batch_size=8 * settings.prompts_per_step,
            num_inference_steps=6,
            guidance_scale=1.0,
            height=8,
            width=8,
            max_sequence_length=8,
            learning_rate=1e-3,
            epsilon=0.2,
            timestep_fraction=1.0,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        pipeline = zoo.load("digits-sd3")
        prompts = [f"a handwritten digit {name}" for name in DIGIT_NAMES]
        rows = [
            {"prompt": prompt, "prompt_3": t5_window(pipeline.tokenizer_3, prompt, 8), "label": label}
            for label, prompt in enumerate(prompts)
        ]
        trainer = E2POTrainer(
            pipeline,
            [ClassifierReward(classifier, mode="correct")],
            config,
            train_dataset=rows,
            peft_config=LoraConfig(r=8, lora_alpha=16, init_lora_weights="gaussian"),
        )
        trainer.classifier = classifier
        before, accuracy_before = _samples(trainer, settings.samples_per_digit, seed)
        history = trainer.train()
        after, accuracy_after = _samples(trainer, settings.samples_per_digit, seed)

    shown = min(8, settings.samples_per_digit)
    for name, images in (("before", before), ("after", after)):
        grid = images.view(10, settings.samples_per_digit, *images.shape[1:])[:, :shown].reshape(-1, *images.shape[1:])
        save_image_grid(
            grid.permute(0, 2, 3, 1).numpy(),
            f"{output_dir}/e2po_{name}.png",
            rows=10,
            row_labels=[str(c) for c in range(10)],
        )
    save_bar_plot(
        {"before": accuracy_before, "after": accuracy_after},
        f"{output_dir}/e2po_accuracy.png",
        "Clean-prompt samples showing the prompted digit",
        "accuracy",
    )
    scales = [log["e2po/scale"] for log in history]
    from . import committed_results_file

    committed = committed_regime_curves(committed_results_file("e2po"), f"{output_dir}/e2po_committed_curves.png")
    pixel_change = (after - before).abs().mean().item()
    if accuracy_after != accuracy_before:
        outcome = f"accuracy {accuracy_before:.1%} -> {accuracy_after:.1%}"
    else:
        outcome = f"accuracy unchanged at {accuracy_before:.1%}"
    outcome += f", mean pixel change {pixel_change:.3f} of the [0, 1] range"
    summary = (
        f"The zoo's tiny SD3 model (digits-sd3) was trained with E2POTrainer for {settings.steps} steps of "
        f"{settings.prompts_per_step} prompts x 8 images, reward 1 when the zoo classifier sees the digit the "
        f"prompt names. Samples from the same seeds before and after: {outcome} "
        f"({10 * settings.samples_per_digit} samples). A run this short shows that the trainer runs, not what it "
        "achieves: "
        + (
            "the committed benchmark's curves below show the training runs the method's claims rest on."
            if committed
            else "benchmarks/e2po/e2po.py measures GRPO and E2PO over seeds."
        )
    )
    figures = [
        Figure("e2po_before.png", f"Before: each row the first {shown} samples of one digit prompt."),
        Figure("e2po_after.png", "After E2PO training, same prompts and seeds."),
        Figure("e2po_accuracy.png", "Share of samples the classifier assigns to the prompted digit."),
    ]
    if committed:
        figures.append(Figure("e2po_committed_curves.png", committed))
    return Section(
        title="E2PO: RL alignment of a text-to-image model",
        summary=summary,
        figures=figures,
        table=[
            {
                "step": int(log["step"]),
                "train reward": log["reward"],
                "frac_reward_zero_std": log["frac_reward_zero_std"],
                "e2po/scale": log["e2po/scale"],
            }
            for log in history
        ],
        notes=[f"seed {seed}; perturbation scale over training {min(scales):.3f} - {max(scales):.3f}"],
    )
