#!/usr/bin/env python
"""The constrained-unlearning step's time outside its own model calls, on SDXL, SD3 and Flux.

    python benchmarks/unlearning/modern_unlearning_overhead.py

For each family a `ConstrainedUnlearningTrainer` (reverse-KL constraint, LoRA rank 4 on the denoiser's attention,
forget / retain / reference prompts) trains the real diffusers classes at reduced width with 64x64 latents
(`diffusers_ext.models.tiny_components.get_reduced_width_components`; 512 px images through the 8x VAE). After
`--warmup_steps`, each of `--steps` training steps is timed whole (`trainer.training_step()`: drawing, targets,
loss, backward, AdamW, dual step, and the on-policy pool's sampling every `--pool_refresh_steps`), and so is every
call of the model inside it, by wrapping the denoiser's `forward`:

- forward: the wall time of each call (the trained model's, the adapter-disabled reference's and the pool
  sampler's alike);
- backward: from the moment the loss's gradient reaches a forward's output (an identity autograd node the wrapper
  puts there) to the end of `accelerator.backward`, i.e. the model's own backward; the loss's few elementwise
  gradients before it are counted as overhead.

Overhead = (step - forwards - backwards) / step, per step; target per family: its mean over the steps <= 10%.
The families run one after the other in one process; within a family the steps are consecutive.

Writes `benchmarks/unlearning/results/modern_unlearning_overhead.json` and `.md`.
"""

import argparse
import os
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
FAMILIES = ("sdxl", "sd3", "flux")
OVERHEAD_THRESHOLD = 0.10
RESOLUTION = 512  # 64x64 latents through the 8x VAE


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--steps", type=int, default=4, help="Timed training steps per family.")
    parser.add_argument("--warmup_steps", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=2, help="Per part (forget, retain) of a step.")
    parser.add_argument("--pool_refresh_steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=RESULTS, help="Where modern_unlearning_overhead.json/.md go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    from diffusers_ext.utils import check_positive_int

    for name in ("steps", "batch_size", "pool_refresh_steps"):
        check_positive_int(name, getattr(args, name))
    check_positive_int("warmup_steps", args.warmup_steps, minimum=0)
    return args


class ModelCallTimer:
    """Times every call of `model.forward` (wrapped in place) and the backward through its outputs."""

    def __init__(self, model):
        import torch

        self.forward_seconds = 0.0
        self.backward_starts: list[float] = []
        self.calls = 0
        timer = self

        class MarkBackwardStart(torch.autograd.Function):
            @staticmethod
            def forward(ctx, tensor):
                return tensor.view_as(tensor)

            @staticmethod
            def backward(ctx, grad):
                timer.backward_starts.append(time.perf_counter())
                return grad

        original = model.forward

        def timed_forward(*args, **kwargs):
            start = time.perf_counter()
            out = original(*args, **kwargs)
            self.forward_seconds += time.perf_counter() - start
            self.calls += 1
            if torch.is_grad_enabled():
                if isinstance(out, tuple):
                    out = (MarkBackwardStart.apply(out[0]), *out[1:])
                else:
                    out.sample = MarkBackwardStart.apply(out.sample)
            return out

        model.forward = timed_forward


def measure_family(family: str, args) -> dict:
    import torch
    from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline
    from peft import LoraConfig

    from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
    from diffusers_ext.models.tiny_components import get_reduced_width_components

    classes = {"sdxl": StableDiffusionXLPipeline, "sd3": StableDiffusion3Pipeline, "flux": FluxPipeline}
    pipe = classes[family](**get_reduced_width_components(family, args.seed))
    with tempfile.TemporaryDirectory() as output_dir:
        config = ConstrainedUnlearningConfig(
            output_dir=output_dir,
            forget_prompts=["a photo of a cat"],
            retain_prompts=["a photo of a dog"],
            constraint="reverse_kl",
            constraint_level=10.0,
            lambda_init=0.3,
            per_device_train_batch_size=args.batch_size,
            pool_size=args.batch_size,
            pool_sampling_steps=2,
            pool_refresh_steps=args.pool_refresh_steps,
            resolution=RESOLUTION,
            max_sequence_length=16,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = ConstrainedUnlearningTrainer(pipe, config, peft_config=LoraConfig(r=4, lora_alpha=4))
        denoiser = trainer.family.denoiser
        timer = ModelCallTimer(denoiser)
        backward_ends = []
        backward = trainer.accelerator.backward

        def timed_backward(loss, **kwargs):
            backward(loss, **kwargs)
            backward_ends.append(time.perf_counter())

        trainer.accelerator.backward = timed_backward
        trainer.on_train_begin()
        total = args.warmup_steps + args.steps
        steps = []
        for step in range(total):
            timer.forward_seconds, timer.calls, timer.backward_starts[:] = 0.0, 0, []
            backward_ends.clear()
            start = time.perf_counter()
            logs = trainer.training_step()
            seconds = time.perf_counter() - start
            trainer.finish_step(logs, total)
            if len(timer.backward_starts) != len(backward_ends):
                raise RuntimeError(
                    f"{len(timer.backward_starts)} model backwards for {len(backward_ends)} loss backwards in a step."
                )
            backward_seconds = sum(end - begin for begin, end in zip(timer.backward_starts, backward_ends))
            if step >= args.warmup_steps:
                model = timer.forward_seconds + backward_seconds
                steps.append(
                    {
                        "step_seconds": seconds,
                        "forward_seconds": timer.forward_seconds,
                        "backward_seconds": backward_seconds,
                        "model_calls": timer.calls,
                        "overhead_fraction": (seconds - model) / seconds,
                        "loss": float(logs["loss"]),
                    }
                )
        return {
            "denoiser": type(denoiser).__name__,
            "denoiser_parameters": sum(p.numel() for p in denoiser.parameters()),
            "trainable_parameters": sum(p.numel() for p in denoiser.parameters() if p.requires_grad),
            "sample_shape": list(trainer.sample_shape),
            "steps": steps,
            "mean_overhead_fraction": sum(s["overhead_fraction"] for s in steps) / len(steps),
            "finite_losses": all(torch.isfinite(torch.tensor(s["loss"])) for s in steps),
        }


def overhead_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            f"{family}: time outside the model's forwards and backwards / the step",
            summary[family]["mean_overhead_fraction"],
            OVERHEAD_THRESHOLD,
            "<=",
        )
        for family in FAMILIES
        if family in summary
    ]


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = [
        "## Per family (CPU, float32, 64x64 latents, means over the timed steps)",
        "",
        "| family | denoiser (parameters, LoRA) | model calls per step | step s | forwards s | backwards s | overhead |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        if family not in summary:
            continue
        row = summary[family]
        n = len(row["steps"])

        def mean(key, row=row, n=n):
            return sum(s[key] for s in row["steps"]) / n

        lines.append(
            f"| {family} | {row['denoiser']} ({row['denoiser_parameters'] / 1e6:.2f} M, "
            f"{row['trainable_parameters'] / 1e3:.0f} k) | {mean('model_calls'):.1f} | {mean('step_seconds'):.2f} | "
            f"{mean('forward_seconds'):.2f} | {mean('backward_seconds'):.2f} | {row['mean_overhead_fraction']:.1%} |"
        )
    return lines


def main(argv=None) -> dict:
    import platform

    import torch

    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: overhead_targets(r["summary"]), rel_to=REPO)
    else:
        torch.manual_seed(args.seed)
        start = time.perf_counter()
        summary = {}
        for family in args.families:
            summary[family] = measure_family(family, args)
            print(f"{family}: overhead {summary[family]['mean_overhead_fraction']:.1%}", file=sys.stderr)
        summary["targets"] = overhead_targets(summary)
        summary["sanity"] = {f"{family}: finite losses": summary[family]["finite_losses"] for family in args.families}
        results = {
            "command": command(__file__, argv, omit=("--output_dir",)),
            "settings": {k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results")},
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
            },
            "dtype": "float32",
            "resolution": RESOLUTION,
            "wall_seconds": time.perf_counter() - start,
            "summary": summary,
        }
    settings = results["settings"]
    write_results(
        os.path.join(args.output_dir, "modern_unlearning_overhead"),
        results,
        "Constrained unlearning on SDXL, SD3 and Flux: the step's time outside its model calls",
        report_sections(results),
        settings_line=(
            f"Settings: reverse-KL constraint, LoRA rank 4, batch {settings['batch_size']} per part, "
            f"{settings['steps']} timed steps after {settings['warmup_steps']} warm-up, on-policy pool redrawn every "
            f"{settings['pool_refresh_steps']} steps, {results['resolution']} px (64x64 latents)."
        ),
    )
    return results


if __name__ == "__main__":
    main()
