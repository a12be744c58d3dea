#!/usr/bin/env python
"""Divide-and-Denoise on the latent text-to-image model `mosaic-t2i`: LoRA experts on disjoint shapes, composed.

    python benchmarks/divide_and_denoise/latent_world_divide_and_denoise.py

Writes `benchmarks/divide_and_denoise/results/latent_world_divide_and_denoise.json`, `.md` and `.png`. The lead's
`benchmarks/mosaic/latent_world.py` calls `add_arguments` and `run` and puts the returned dict under
`summary.divide_and_denoise` of `latent_world.json`.

- **Experts.** Each expert is a LoRA fine-tune (`diffusers_ext.evaluation.mosaic_finetune`, rank-`r` adapters on the
  UNet attention projections, fused) of the zoo model on mosaic scenes of ONE shape only, in every colour: the
  circle expert never saw a square or a triangle during its fine-tune, and so on (disjoint concept sets). The two
  expert setting uses the circle and square experts, the three expert setting all three. Fine-tunes are repeated
  for every `--seeds` value (the experts are cached under `benchmarks/.cache/`, keyed by the settings and code).
- **Prompts that need every expert.** Two experts: "a <c1> circle and a <c2> square" (order and distinct colours
  drawn at random); three experts: a circle, a square and a triangle in three colours. Each expert's sub-prompt
  names its own object ("a <c1> circle").
- **Methods** (one process, the same initial latents for every method): the base model and each expert alone on
  the full prompt; composable diffusion (the base model, the sub-prompts' guided predictions averaged);
  averaging (the experts' guided predictions averaged); MultiDiffusion with its default layout (equal vertical
  strips, in expert order) and with an oracle layout (each expert's object box from a real mosaic placement: an
  upper reference, it is told where objects go); Divide-and-Denoise (`DivideAndDenoisePipeline`).
- **Protocol.** Every choice is made on validation prompts with the first seed's experts: the guidance scale of
  every method (same grid), plus one second knob for the methods that have one (averaging and MultiDiffusion:
  sub-prompts or the full prompt for every expert; D&D: its utility). The test prompts are judged once with the
  frozen choices, for every seed. Judge: the exact `MosaicEvaluator`, per skill (object, colour, overall).
"""

import argparse
import json
import os
import time

import numpy as np
import torch

from diffusers_ext.evaluation.divide_and_denoise.mosaic_composition import make_prompts, oracle_regions


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
NAME = "latent_world_divide_and_denoise"
SHAPE_ORDER = ("circle", "square", "triangle")
SETTINGS_EXPERTS = {"2_experts": ("circle", "square"), "3_experts": ("circle", "square", "triangle")}
SPLIT_SEEDS = {"validation": 1000, "test": 2000}
COMPOSITE_BASELINES = ("composable", "averaging", "multidiffusion")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("divide_and_denoise")
    group.add_argument("--dnd_seeds", type=int, nargs="+", default=[0, 1], help="Expert fine-tune seeds.")
    group.add_argument("--dnd_finetune_samples", type=int, default=800, help="Mosaic scenes per expert.")
    group.add_argument("--dnd_finetune_steps", type=int, default=150, help="LoRA optimisation steps per expert.")
    group.add_argument("--dnd_finetune_batch", type=int, default=16, help="Batch size of the fine-tunes.")
    group.add_argument("--dnd_rank", type=int, default=8, help="LoRA rank.")
    group.add_argument("--dnd_lr", type=float, default=3e-3, help="LoRA learning rate.")
    group.add_argument("--dnd_steps", type=int, default=20, help="DDIM sampling steps.")
    group.add_argument("--dnd_guidance_grid", type=float, nargs="+", default=[3.0, 6.0], help="Guidance grid.")
    group.add_argument(
        "--dnd_utilities",
        nargs="+",
        default=["cross_attention", "guidance_delta"],
        help="D&D utilities tried on validation.",
    )
    group.add_argument("--dnd_val_prompts", type=int, default=4, help="Validation prompts per setting.")
    group.add_argument("--dnd_test_prompts", type=int, default=8, help="Test prompts per setting and seed.")
    group.add_argument("--dnd_images", type=int, default=4, help="Images per prompt.")
    group.add_argument("--dnd_sanity_images", type=int, default=2, help="Images per single-object sanity prompt.")
    group.add_argument(
        "--dnd_cache_dir", default=os.path.join(ROOT, "benchmarks", ".cache", NAME), help="Expert cache folder."
    )
    group.add_argument("--dnd_output_dir", default=RESULTS, help="Where the results files go (main() only).")


# ---------------------------------------------------------------------------------------------------------------------
# prompts and layouts
# ---------------------------------------------------------------------------------------------------------------------


def initial_latents(prompt_index: int, split_seed: int, images: int, shape: tuple) -> torch.Tensor:
    generator = torch.Generator().manual_seed(split_seed * 1000 + prompt_index)
    return torch.randn((images, *shape), generator=generator)


# ---------------------------------------------------------------------------------------------------------------------
# experts
# ---------------------------------------------------------------------------------------------------------------------


def load_or_train_expert(base, shape: str, seed: int, args, log) -> tuple:
    """The LoRA expert of `shape` for fine-tune `seed`: `(unet, seconds, from_cache)`."""
    from safetensors.torch import load_file, save_file

    from diffusers_ext.data.mosaic import MosaicConfig, mosaic_dataset
    from diffusers_ext.evaluation import mosaic_finetune
    from diffusers_ext.evaluation.reporting import ResultCache

    settings = {
        "shape": shape,
        "seed": seed,
        "samples": args.dnd_finetune_samples,
        "steps": args.dnd_finetune_steps,
        "batch": args.dnd_finetune_batch,
        "rank": args.dnd_rank,
        "lr": args.dnd_lr,
    }
    code = [mosaic_finetune.__file__, os.path.join(ROOT, "diffusers_ext", "data", "mosaic.py")]
    cache = ResultCache(args.dnd_cache_dir, settings, code)
    if cache.has(f"{shape}.safetensors"):
        state = load_file(cache.path(f"{shape}.safetensors"))
        return mosaic_finetune.unet_with_lora(base, state, rank=args.dnd_rank), 0.0, True
    start = time.perf_counter()
    config = MosaicConfig(shapes=(shape,), tasks=("single", "pair", "count"))
    data = mosaic_dataset(config, args.dnd_finetune_samples, seed=100 + seed, split="train")
    unet, lora_state, losses = mosaic_finetune.finetune_unet(
        base,
        list(data["image"]),
        list(data["caption"]),
        num_steps=args.dnd_finetune_steps,
        rank=args.dnd_rank,
        learning_rate=args.dnd_lr,
        seed=seed,
        batch_size=args.dnd_finetune_batch,
    )
    path = cache.path(f"{shape}.safetensors")
    save_file({k: v.contiguous() for k, v in lora_state.items()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    seconds = time.perf_counter() - start
    log(
        f"  expert {shape} seed {seed}: loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}, {seconds:.0f}s"
    )
    return unet, seconds, False


# ---------------------------------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------------------------------


class Sampler:
    """Runs every method on one prompt with fixed initial latents; returns images `(n, 3, H, W)` in [0, 1]."""

    def __init__(self, base, experts: list, args):
        from diffusers import StableDiffusionPipeline

        from diffusers_ext import DivideAndDenoisePipeline, MultiDenoiserModel

        self.base, self.args = base, args
        shared = {k: v for k, v in base.components.items() if k != "unet"}
        self.expert_pipes = [StableDiffusionPipeline(**shared, unet=unet) for unet in experts]
        for pipe in self.expert_pipes:
            pipe.set_progress_bar_config(disable=True)
        scheduler = type(base.scheduler).from_config(base.scheduler.config)
        common = {"vae": base.vae, "text_encoder": base.text_encoder, "tokenizer": base.tokenizer}
        self.composite = DivideAndDenoisePipeline(MultiDenoiserModel(experts), scheduler, **common)
        self.composite.set_progress_bar_config(disable=True)
        self.base_composite = DivideAndDenoisePipeline(MultiDenoiserModel([base.unet]), scheduler, **common)
        self.base_composite.set_progress_bar_config(disable=True)
        self.forward_seconds = 0.0
        self.overhead_seconds = 0.0

    def single(self, pipe, prompts: list[str], latents: torch.Tensor, guidance: float) -> torch.Tensor:
        """A StableDiffusionPipeline on a batch of prompts (one per latent)."""
        return pipe(
            prompts,
            height=32,
            width=32,
            num_inference_steps=self.args.dnd_steps,
            guidance_scale=guidance,
            latents=latents,
            output_type="pt",
        ).images

    def run(self, method: str, config: dict, prompt: dict, latents: torch.Tensor, regions=None) -> torch.Tensor:
        from diffusers_ext import AverageAllocator, RegionAllocator

        guidance, n = config["guidance"], len(latents)
        if method == "base":
            return self.single(self.base, [prompt["caption"]] * n, latents, guidance)
        if method.startswith("expert_"):
            pipe = self.expert_pipes[int(method.split("_")[1])]
            return self.single(pipe, [prompt["caption"]] * n, latents, guidance)
        num_agents = len(prompt["sub_prompts"])
        prompts = prompt["sub_prompts"] if config.get("prompts", "sub") == "sub" else [prompt["caption"]] * num_agents
        kwargs = {}
        pipe = self.composite
        if method == "composable":
            pipe = self.base_composite
            kwargs["allocator"] = AverageAllocator()
        elif method == "averaging":
            kwargs["allocator"] = AverageAllocator()
        elif method == "multidiffusion":
            kwargs["allocator"] = RegionAllocator()
        elif method == "multidiffusion_oracle":
            kwargs["allocator"] = RegionAllocator(regions)
        elif method == "divide_and_denoise":
            kwargs["utility"] = config["utility"]
        else:
            raise ValueError(f"unknown method {method!r}")
        out = pipe(
            prompt=prompts,
            height=32,
            width=32,
            num_inference_steps=self.args.dnd_steps,
            guidance_scale=guidance,
            num_images_per_prompt=n,
            latents=latents,
            output_type="pt",
            **kwargs,
        )
        if method == "divide_and_denoise":
            self.forward_seconds += out.timings["model_forwards"]
            self.overhead_seconds += sum(v for k, v in out.timings.items() if k != "model_forwards")
        return out.images


def method_configs(method: str, args) -> list[dict]:
    """The validation grid of a method: the guidance grid, times its second knob if it has one."""
    grid = [{"guidance": g} for g in args.dnd_guidance_grid]
    if method in ("averaging", "multidiffusion"):
        return [dict(c, prompts=p) for p in ("sub", "full") for c in grid]
    if method == "divide_and_denoise":
        return [dict(c, utility=u) for u in args.dnd_utilities for c in grid]
    return grid


def judge_images(judge, images: torch.Tensor, prompt: dict) -> list[dict]:
    row = {"task": "pair", "groups": prompt["groups"], "relation": ""}
    return [judge.evaluate(image, row) for image in images]


def score(verdicts: list[dict]) -> dict:
    from diffusers_ext.evaluation.protocol import binomial_standard_error

    out = {}
    for skill in ("overall", "object", "colour"):
        rate = float(np.mean([v[skill] for v in verdicts]))
        out[skill] = rate
        out[f"{skill}_standard_error"] = binomial_standard_error(rate, len(verdicts))
    out["images"] = len(verdicts)
    return out


def evaluate_method(sampler, judge, method, config, prompts, split_seed, args) -> dict:
    verdicts = []
    for index, prompt in enumerate(prompts):
        latents = initial_latents(index, split_seed, args.dnd_images, (4, 8, 8))
        regions = oracle_regions(prompt, split_seed * 1000 + index, 8, 32) if method.endswith("oracle") else None
        verdicts += judge_images(judge, sampler.run(method, config, prompt, latents, regions), prompt)
    return score(verdicts)


def methods_for(num_experts: int) -> list[str]:
    experts = [f"expert_{k}" for k in range(num_experts)]
    return ["base", *experts, *COMPOSITE_BASELINES, "multidiffusion_oracle", "divide_and_denoise"]


def sanity_matrix(sampler, judge, shapes, args) -> dict:
    """Each expert (and the base) on single-object prompts of every shape: accuracy per (model, shape)."""
    from diffusers_ext.data.mosaic import MosaicConfig

    colours = MosaicConfig().colours
    out = {}
    models = {"base": sampler.base, **{f"expert_{s}": p for s, p in zip(shapes, sampler.expert_pipes)}}
    for name, pipe in models.items():
        out[name] = {}
        for shape in shapes:
            prompts = [
                {"task": "single", "groups": [{"colour": c, "shape": shape, "count": 1}], "relation": ""}
                for c in colours
                for _ in range(args.dnd_sanity_images)
            ]
            captions = [f"a {p['groups'][0]['colour']} {shape}" for p in prompts]
            latents = torch.randn((len(prompts), 4, 8, 8), generator=torch.Generator().manual_seed(4242))
            images = sampler.single(pipe, captions, latents, 4.0)
            out[name][shape] = float(np.mean([judge.evaluate(i, p)["overall"] for i, p in zip(images, prompts)]))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    from diffusers import StableDiffusionPipeline

    from diffusers_ext import zoo
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator
    from diffusers_ext.evaluation.protocol import mean_spread, settings_code_hash
    from diffusers_ext.evaluation.reporting import choose_on_validation

    torch.set_num_threads(1)
    start = time.perf_counter()
    # hashed before anything runs: the code that produced the results
    settings = {
        k[len("dnd_") :]: v
        for k, v in vars(args).items()
        if k.startswith("dnd_") and k not in ("dnd_cache_dir", "dnd_output_dir")
    }
    code = [
        os.path.abspath(__file__),
        os.path.join(ROOT, "diffusers_ext", "pipelines", "divide_and_denoise"),
        os.path.join(ROOT, "diffusers_ext", "evaluation", "mosaic_finetune.py"),
    ]
    code_hash = settings_code_hash(settings, code)

    def log(message):
        print(f"[{time.perf_counter() - start:7.0f}s] {message}", flush=True)

    base = StableDiffusionPipeline.from_pretrained(zoo.path("mosaic-t2i"), torch_dtype=torch.float32)
    base.set_progress_bar_config(disable=True)
    judge = MosaicEvaluator(MosaicConfig())
    colours = MosaicConfig().colours
    prompts = {
        setting: {
            split: make_prompts(
                shapes,
                args.dnd_val_prompts if split == "validation" else args.dnd_test_prompts,
                SPLIT_SEEDS[split] + len(shapes),
                colours,
            )
            for split in SPLIT_SEEDS
        }
        for setting, shapes in SETTINGS_EXPERTS.items()
    }

    experts_by_seed, finetune_seconds = {}, 0.0
    for seed in args.dnd_seeds:
        experts_by_seed[seed] = {}
        for shape in SHAPE_ORDER:
            unet, seconds, cached = load_or_train_expert(base, shape, seed, args, log)
            experts_by_seed[seed][shape] = unet
            finetune_seconds += seconds
    log("experts ready")

    # sanity: each expert is the best at its own shape (first seed), and the base's single-object ceiling
    first = args.dnd_seeds[0]
    sampler = Sampler(base, [experts_by_seed[first][s] for s in SHAPE_ORDER], args)
    sanity_acc = sanity_matrix(sampler, judge, SHAPE_ORDER, args)
    log(f"sanity matrix {sanity_acc}")

    validation, choices = {}, {}
    for setting, shapes in SETTINGS_EXPERTS.items():
        sampler = Sampler(base, [experts_by_seed[first][s] for s in shapes], args)
        validation[setting], choices[setting] = {}, {}
        for method in methods_for(len(shapes)):
            # every method's frozen choice is measured on test below, per fine-tune seed
            record = choose_on_validation(
                method_configs(method, args),
                lambda config, split, sampler=sampler, method=method, setting=setting: evaluate_method(
                    sampler, judge, method, config, prompts[setting][split], SPLIT_SEEDS[split], args
                ),
                score=lambda result: result["overall"],
                names=json.dumps,
                test=False,
            )
            validation[setting][method] = record
            choices[setting][method] = record["chosen"]["candidate"]
            log(
                f"validation {setting} {method}: "
                + ", ".join(f"{r['name']} {r['score']:.3f}" for r in record["validation"])
            )

    test, overhead = {}, {}
    for setting, shapes in SETTINGS_EXPERTS.items():
        test[setting] = {m: {"per_seed": {}} for m in methods_for(len(shapes))}
        forwards = extra = 0.0
        for seed in args.dnd_seeds:
            sampler = Sampler(base, [experts_by_seed[seed][s] for s in shapes], args)
            for method in methods_for(len(shapes)):
                result = evaluate_method(
                    sampler,
                    judge,
                    method,
                    choices[setting][method],
                    prompts[setting]["test"],
                    SPLIT_SEEDS["test"],
                    args,
                )
                test[setting][method]["per_seed"][str(seed)] = result
                log(f"test {setting} seed {seed} {method}: {result['overall']:.3f}")
            forwards += sampler.forward_seconds
            extra += sampler.overhead_seconds
        overhead[setting] = extra / max(forwards, 1e-9)
        for entry in test[setting].values():
            per_seed = list(entry["per_seed"].values())
            for skill in ("overall", "object", "colour"):
                entry[skill] = mean_spread([r[skill] for r in per_seed])
            pooled = float(np.mean([r["overall"] for r in per_seed]))
            images = sum(r["images"] for r in per_seed)
            entry["overall_standard_error_pooled"] = float(np.sqrt(pooled * (1 - pooled) / images))

    own_best = {
        shape: all(
            sanity_acc[f"expert_{shape}"][shape] > sanity_acc[f"expert_{other}"][shape]
            for other in SHAPE_ORDER
            if other != shape
        )
        for shape in SHAPE_ORDER
    }
    headroom = {
        setting: {
            # composition of independent single-object successes of each expert on its own shape
            "product_of_expert_single_object_accuracies": float(
                np.prod([sanity_acc[f"expert_{s}"][s] for s in shapes])
            ),
            "multidiffusion_oracle_test": test[setting]["multidiffusion_oracle"]["overall"]["mean"],
            "best_single_model_test": max(
                test[setting][m]["overall"]["mean"] for m in methods_for(len(shapes)) if m.startswith(("base", "exp"))
            ),
        }
        for setting, shapes in SETTINGS_EXPERTS.items()
    }
    results = {
        "settings": settings,
        "code_hash": code_hash,
        "seconds": time.perf_counter() - start,
        "finetune_seconds": finetune_seconds,
        "prompts": {s: {split: [p["caption"] for p in v] for split, v in d.items()} for s, d in prompts.items()},
        "choices": choices,
        "validation": validation,
        "test": test,
        "summary": {
            "headroom": headroom,
            "comparison": comparisons(test),
            "overhead_of_division_over_forwards": overhead,
            "sanity": {
                "single_object_accuracy": sanity_acc,
                "each_expert_best_on_its_own_shape": own_best,
                "all_experts_best_on_their_own_shape": all(own_best.values()),
            },
        },
    }
    results["summary"]["targets"] = targets_from_results(results)
    return results


def comparisons(test: dict) -> dict:
    """Per expert setting: D&D's mean overall test score against the best non-oracle baseline's and the oracle's."""
    comparison = {}
    for setting in SETTINGS_EXPERTS:
        means = {m: e["overall"]["mean"] for m, e in test[setting].items()}
        non_oracle = {m: v for m, v in means.items() if m not in ("divide_and_denoise", "multidiffusion_oracle")}
        best_name = max(non_oracle, key=non_oracle.get)
        comparison[setting] = {
            "divide_and_denoise": means["divide_and_denoise"],
            "best_non_oracle_baseline": best_name,
            "best_non_oracle_value": non_oracle[best_name],
            "gap": means["divide_and_denoise"] - non_oracle[best_name],
            "multidiffusion_oracle": means["multidiffusion_oracle"],
        }
    return comparison


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded test scores (the measuring run, `--from_results`, and the part's
    rebuild in `benchmarks/mosaic/latent_world.py`)."""
    from diffusers_ext.evaluation.protocol import target

    return [
        target(f"{setting}: D&D minus best non-oracle baseline (overall, test)", c["gap"], 0.2)
        for setting, c in comparisons(results["test"]).items()
    ]


# ---------------------------------------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------------------------------------

LABELS = {
    "base": "base model (full prompt)",
    "composable": "composable diffusion (base, sub-prompts)",
    "averaging": "averaging (experts)",
    "multidiffusion": "MultiDiffusion (default strips)",
    "multidiffusion_oracle": "MultiDiffusion + oracle layout (upper reference)",
    "divide_and_denoise": "Divide-and-Denoise",
}


def label(method: str, setting: str) -> str:
    if method.startswith("expert_"):
        return f"{SETTINGS_EXPERTS[setting][int(method.split('_')[1])]} expert alone (full prompt)"
    return LABELS[method]


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json`, `.md` and `.png` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        stem,
        results,
        "Divide-and-Denoise on the latent text-to-image model (mosaic-t2i, LoRA shape experts)",
        report_sections(results),
        settings_line=f"{results['seconds'] / 60:.1f} min, code hash "
        f"`{results['code_hash'][:12]}`; targets on the test prompts, mean over fine-tune seeds "
        f"{results['settings']['seeds']}.",
        figures={".png": lambda path: write_plot(results, path)},
    )


def report_sections(results: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    lines = [
        "Headroom (shown first): "
        + "; ".join(
            f"{setting}: product of the experts' own-shape single-object accuracies {h['product_of_expert_single_object_accuracies']:.3f}, "
            f"MultiDiffusion + oracle layout {h['multidiffusion_oracle_test']:.3f}, best single model {h['best_single_model_test']:.3f}"
            for setting, h in s["headroom"].items()
        ),
        "",
    ]
    for setting in SETTINGS_EXPERTS:
        lines += [
            f"## {setting.replace('_', ' ')}: test (mean ± std over seeds; ± pooled standard error over images)",
            "",
            "| method | validation choice | overall | object | colour |",
            "| --- | --- | --- | --- | --- |",
        ]
        for method, entry in results["test"][setting].items():
            choice = results["choices"][setting][method]
            lines.append(
                f"| {label(method, setting)} | {choice} | {entry['overall']['mean']:.3f} ± {entry['overall']['std']:.3f} "
                f"(± {entry['overall_standard_error_pooled']:.3f}) | {entry['object']['mean']:.3f} | "
                f"{entry['colour']['mean']:.3f} |"
            )
        lines.append("")
    lines += [
        "## Sanity: single-object accuracy (first seed's experts, guidance 4)",
        "",
        "| model | " + " | ".join(SHAPE_ORDER) + " |",
        "| --- |" + " --- |" * len(SHAPE_ORDER),
    ]
    for model, row in s["sanity"]["single_object_accuracy"].items():
        lines.append(f"| {model} | " + " | ".join(f"{row[shape]:.3f}" for shape in SHAPE_ORDER) + " |")
    lines += ["", f"Each expert best on its own shape: {s['sanity']['each_expert_best_on_its_own_shape']}."]
    return lines


def write_plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SETTINGS_EXPERTS), figsize=(6 * len(SETTINGS_EXPERTS), 4.5))
    for ax, setting in zip(np.atleast_1d(axes), SETTINGS_EXPERTS):
        entries = results["test"][setting]
        names = list(entries)
        values = [entries[m]["overall"]["mean"] for m in names]
        errors = [entries[m]["overall_standard_error_pooled"] for m in names]
        colours = [
            "tab:red" if m == "divide_and_denoise" else "tab:gray" if m.endswith("oracle") else "tab:blue"
            for m in names
        ]
        ax.bar(range(len(names)), values, yerr=errors, color=colours)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([label(m, setting).split(" (")[0] for m in names], rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_title(f"{setting.replace('_', ' ')}: judge overall (test)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import add_from_results_argument, command, rebuild_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    add_from_results_argument(parser)  # here, not in add_arguments: latent_world.py has its own
    args = parser.parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=ROOT)
        stem = os.path.splitext(os.path.basename(args.from_results))[0]
        write_report(results, os.path.join(args.dnd_output_dir, stem))
        return results
    results = run(args)
    results["command"] = command(__file__, argv, omit=("--dnd_output_dir",))
    write_report(results, os.path.join(args.dnd_output_dir, NAME))
    print(json.dumps(results["summary"], indent=2))
    return results


if __name__ == "__main__":
    main()
