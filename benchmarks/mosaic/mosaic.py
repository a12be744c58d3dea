#!/usr/bin/env python
"""Measure the mosaic world: the exact judge, the zoo text-to-image model, and the paper's three findings.

    python benchmarks/mosaic/mosaic.py

Three parts, in one process:

1. **Judge** (`diffusers_ext.evaluation.mosaic`): per-skill accuracy on real renders of test and held-out scenes,
   with the true prompt (must pass) and with a prompt corrupted in that skill (must fail); agreement of its
   verdicts under small perturbations (noise, dimming, a 1-pixel shift, a slight blur); and the share of real
   renders that still pass after a round trip through the zoo model's VAE (the ceiling the VAE puts on the zoo).
2. **Zoo model** (`diffusers_ext/zoo/mosaic-t2i`): the guidance scale is chosen on validation prompts, then the
   test prompts are judged once; overall and per skill. Headroom target: 0.3 <= overall <= 0.85.
3. **Findings, with proxy models** (smaller text-to-image models of the same kind, trained in this process on
   mosaic variants, all in the latent space of the zoo model's frozen VAE, one seed each): accuracy vs dataset size per skill; scene
   complexity vs concept imbalance; accuracy on held-out combinations vs the held-out fraction.

Writes `benchmarks/mosaic/results/mosaic.json`, `mosaic.md` and `mosaic.png`. The proxy sweeps are cached under
`--cache_dir`, keyed by their settings and the source of every module they run, so a rerun with unchanged code
reuses them (`--no_cache` retrains).
"""

import argparse
import hashlib
import inspect
import json
import math
import os
import random
import time

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")

GUIDANCE_GRID = (2.0, 4.0, 7.0)
PERTURBATIONS = ("noise 0.03", "dim x0.9", "shift 1px", "blur 0.5")
STRESS = ("noise 0.08", "blur 0.8")


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", type=str, default=None, help="Pipeline folder; default: the zoo entry.")
    parser.add_argument("--judge_samples", type=int, default=1500, help="Real renders per judge set.")
    parser.add_argument("--val_prompts", type=int, default=150, help="Validation prompts (guidance choice).")
    parser.add_argument("--test_prompts", type=int, default=400, help="Test prompts of the zoo model.")
    parser.add_argument("--steps", type=int, default=25, help="DDIM steps of every sampler.")
    parser.add_argument("--proxy_steps", type=int, default=600, help="Training steps of each proxy model.")
    parser.add_argument(
        "--proxy_vae_path", type=str, default=None, help="VAE folder the proxies share; default: the zoo model's vae/."
    )
    parser.add_argument("--proxy_eval_prompts", type=int, default=200, help="Prompts per proxy evaluation.")
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 1500, 6000], help="Dataset sizes.")
    parser.add_argument(
        "--heldout_fractions",
        type=float,
        nargs="+",
        default=[0.15, 0.35, 0.55],
        help="Held-out fractions of the compositional sweep.",
    )
    parser.add_argument("--skip_sweeps", action="store_true", help="Judge and zoo only (no findings).")
    parser.add_argument(
        "--cache_dir",
        type=str,
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "mosaic"),
        help="Proxy-sweep cache, one entry per proxy keyed by its settings, the VAE weights and the "
        "code (default: benchmarks/.cache/mosaic, ignored by git).",
    )
    parser.add_argument("--no_cache", action="store_true", help="Retrain the proxies even if cached.")
    parser.add_argument(
        "--proxies",
        nargs="+",
        default=None,
        help="Train only these proxies (names like 'size=300', 'extra=2,zipf=1.5', 'heldout=0.35') "
        "into the cache, then stop (no judge or zoo part).",
    )
    parser.add_argument(
        "--cached_sweeps_only",
        action="store_true",
        help="Use the proxy sweeps only if cached; otherwise report them as not run.",
    )
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "mosaic.json"), help="Results JSON.")
    add_from_results_argument(parser)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------------------
# 1. The judge
# ---------------------------------------------------------------------------------------------------------------------


def perturb(image: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """`image` `(H, W, 3)` in [0, 1] under one named perturbation."""
    from PIL import Image, ImageFilter

    if kind.startswith("noise"):
        return np.clip(image + rng.normal(0, float(kind.split()[1]), image.shape), 0, 1)
    if kind == "dim x0.9":
        return image * 0.9
    if kind == "shift 1px":
        return np.roll(image, 1, axis=int(rng.integers(0, 2)))
    if kind.startswith("blur"):
        pil = Image.fromarray((image * 255).round().astype(np.uint8))
        return np.asarray(pil.filter(ImageFilter.GaussianBlur(float(kind.split()[1])))) / 255
    raise ValueError(f"unknown perturbation {kind!r}")


def judge_section(args, vae=None):
    from diffusers_ext.data.mosaic import MosaicConfig, mosaic_records
    from diffusers_ext.evaluation.mosaic import SKILLS, MosaicEvaluator, corrupt_prompt

    sets = {
        "test": (MosaicConfig(), "test"),
        "heldout_complex": (MosaicConfig(extra_objects=2, heldout_fraction=0.35, zipf_exponent=1.0), "heldout"),
    }
    out = {}
    for name, (config, split) in sets.items():
        judge = MosaicEvaluator(config)
        rows = list(mosaic_records(config, args.judge_samples, seed=7001, split=split))
        rng = random.Random(0)
        generator = np.random.default_rng(0)
        positives = {s: [] for s in SKILLS}
        negatives = {s: [] for s in SKILLS}
        agreement = {k: [] for k in PERTURBATIONS + STRESS}
        for row in rows:
            image = np.asarray(row["image"]) / 255
            prompts = [row] + [p for p in (corrupt_prompt(row, s, config, rng) for s in SKILLS) if p is not None]
            detections = judge.detect(image)
            verdicts = [judge.judge(detections, p) for p in prompts]
            for skill, value in verdicts[0].items():
                if skill in positives:
                    positives[skill].append(value)
            for prompt, verdict in zip(prompts[1:], verdicts[1:]):
                for skill in SKILLS:  # the corrupted skill is the one whose field changed
                    if skill in verdict and _corrupted_skill(row, prompt) == skill:
                        negatives[skill].append(not verdict[skill])
            for kind in agreement:
                moved = judge.detect(perturb(image, kind, generator))
                agreement[kind].append(float(np.mean([judge.judge(moved, p) == v for p, v in zip(prompts, verdicts)])))
        out[name] = {
            "num_images": len(rows),
            "accuracy": {
                s: float(np.mean(positives[s] + negatives[s])) for s in SKILLS if positives[s] or negatives[s]
            },
            "true_prompt_pass_rate": {s: float(np.mean(v)) for s, v in positives.items() if v},
            "corrupted_prompt_reject_rate": {s: float(np.mean(v)) for s, v in negatives.items() if v},
            "n_true": {s: len(v) for s, v in positives.items()},
            "n_corrupted": {s: len(v) for s, v in negatives.items()},
            "perturbation_agreement": {k: float(np.mean(v)) for k, v in agreement.items()},
        }
    if vae is not None:
        out["vae_round_trip"] = vae_round_trip(vae, MosaicConfig(), min(args.judge_samples, 500))
    return out


def _corrupted_skill(row: dict, prompt: dict) -> str:
    if prompt["relation"] != row["relation"]:
        return "relation"
    for a, b in zip(row["groups"], prompt["groups"]):
        if a["shape"] != b["shape"]:
            return "object"
        if a["colour"] != b["colour"]:
            return "colour"
        if a["count"] != b["count"]:
            return "count"
    raise ValueError("prompt is not corrupted")


@torch.no_grad()
def vae_round_trip(vae, config, num: int) -> dict:
    """Judge accuracy of real test renders after encoding and decoding with `vae` (posterior mean)."""
    from diffusers_ext.data.mosaic import images_to_tensor, mosaic_records
    from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize

    rows = list(mosaic_records(config, num, seed=7002, split="test"))
    judge = MosaicEvaluator(config)
    results, psnr = [], []
    for start in range(0, num, 100):
        chunk = rows[start : start + 100]
        x = images_to_tensor([r["image"] for r in chunk])
        y = vae.decode(vae.encode(x.to(vae.dtype)).latent_dist.mean).sample.float().clamp(-1, 1)
        psnr += (10 * torch.log10(4 / ((y - x) ** 2).mean(dim=(1, 2, 3)))).tolist()
        images = ((y + 1) / 2).permute(0, 2, 3, 1).numpy()
        results += [judge.evaluate(image, row) for image, row in zip(images, chunk)]
    return {**summarize(results, rows), "psnr_db": float(np.mean(psnr))}


# ---------------------------------------------------------------------------------------------------------------------
# 2. The zoo model
# ---------------------------------------------------------------------------------------------------------------------


def zoo_section(args):
    from diffusers import StableDiffusionPipeline

    from diffusers_ext import zoo
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.evaluation.mosaic import evaluate_text_to_image

    path = args.model_path or zoo.path("mosaic-t2i")
    pipe = StableDiffusionPipeline.from_pretrained(path, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    config = MosaicConfig()
    validation = {}
    for scale in GUIDANCE_GRID:
        validation[str(scale)] = evaluate_text_to_image(pipe, config, args.val_prompts, 9001, scale, args.steps)
        print(f"zoo validation guidance {scale}: {validation[str(scale)]['overall']:.3f}", flush=True)
    best = max(GUIDANCE_GRID, key=lambda s: validation[str(s)]["overall"])
    test = evaluate_text_to_image(pipe, config, args.test_prompts, 9002, best, args.steps)
    test["standard_error"] = math.sqrt(test["overall"] * (1 - test["overall"]) / test["n"])
    print(f"zoo test (guidance {best}): {test['overall']:.3f}", flush=True)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs if "checkpoint" not in r)
    return pipe, {
        "path": os.path.relpath(path, REPO),
        "validation": validation,
        "chosen_guidance_scale": best,
        "test": test,
        "folder_bytes": size,
    }


# ---------------------------------------------------------------------------------------------------------------------
# 3. The findings, with proxy models
# ---------------------------------------------------------------------------------------------------------------------

PROXY = {
    "unet_channels": [16, 32],
    "attention_head_dim": 8,
    "text_hidden_size": 32,
    "text_layers": 1,
    "vae_channels": [16, 32, 32],
    "batch_size": 32,
    "lr": 2e-3,
    "guidance": 4.0,
    "max_length": 24,
}


def load_proxy_vae(path: str):
    """The frozen VAE every proxy shares (default: the zoo model's), in float32, and a hash of its weights."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(path, torch_dtype=torch.float32).eval()
    digest = hashlib.sha256()
    for name, tensor in sorted(vae.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return vae, digest.hexdigest()[:16]


def train_proxy(vae, config, num_samples: int, steps: int, seed: int = 0):
    """A small UNet + text encoder trained on `num_samples` train scenes of `config` in the frozen `vae`'s latents;
    returns the assembled `StableDiffusionPipeline`."""
    import torch.nn.functional as F

    from diffusers_ext.data.mosaic import mosaic_records, mosaic_tokenizer
    from diffusers_ext.models.stable_diffusion_components import (
        assemble_stable_diffusion_pipeline,
        build_stable_diffusion_components,
        stable_diffusion_schedulers,
    )
    from diffusers_ext.models.training_modules import TextConditionedDenoiser
    from diffusers_ext.training_utils import cosine_with_warmup, encode_posteriors

    rows = list(mosaic_records(config, num_samples, seed=seed, split="train"))
    images = torch.from_numpy(np.stack([np.asarray(r["image"]) for r in rows])).permute(0, 3, 1, 2)
    tokenizer = mosaic_tokenizer(PROXY["max_length"])
    ids = tokenizer(
        [r["caption"] for r in rows], padding="max_length", max_length=PROXY["max_length"], return_tensors="pt"
    ).input_ids
    empty = tokenizer([""], padding="max_length", max_length=PROXY["max_length"], return_tensors="pt").input_ids
    means, stds = encode_posteriors(vae, images, "cpu")
    scaling = float(1 / means.std())
    torch.manual_seed(seed + 1)
    _, text_encoder, unet = build_stable_diffusion_components(
        tokenizer,
        resolution=32,
        latent_channels=4,
        vae_channels=PROXY["vae_channels"],
        unet_channels=PROXY["unet_channels"],
        attention_head_dim=PROXY["attention_head_dim"],
        text_hidden_size=PROXY["text_hidden_size"],
        text_layers=PROXY["text_layers"],
        max_length=PROXY["max_length"],
    )
    denoiser = TextConditionedDenoiser(unet, text_encoder)
    optimizer = torch.optim.AdamW(denoiser.parameters(), lr=PROXY["lr"], weight_decay=1e-4)
    scheduler, _ = stable_diffusion_schedulers()
    generator = torch.Generator().manual_seed(seed + 2)
    for step in range(steps):
        cosine_with_warmup(optimizer, step, steps, PROXY["lr"], 50)
        index = torch.randint(0, num_samples, (PROXY["batch_size"],), generator=generator)
        latents = (means[index] + stds[index] * torch.randn(means[index].shape, generator=generator)) * scaling
        noise = torch.randn(latents.shape, generator=generator)
        t = torch.randint(0, 1000, (len(index),), generator=generator)
        drop = torch.rand(len(index), generator=generator) < 0.1
        prediction = denoiser(scheduler.add_noise(latents, noise, t), t, torch.where(drop[:, None], empty, ids[index]))
        loss = F.mse_loss(prediction, noise)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(denoiser.parameters(), 1.0)
        optimizer.step()
    import copy

    proxy_vae = copy.deepcopy(vae)
    proxy_vae.register_to_config(scaling_factor=scaling)
    pipe = assemble_stable_diffusion_pipeline(proxy_vae, text_encoder.eval(), tokenizer, unet.eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe, float(loss.detach())


def _source_key(settings: dict) -> str:
    from diffusers_ext import training_utils
    from diffusers_ext.data import mosaic as data_module
    from diffusers_ext.evaluation import mosaic as evaluation_module
    from diffusers_ext.models import stable_diffusion_components as components
    from diffusers_ext.models import training_modules

    parts = [json.dumps(settings, sort_keys=True), json.dumps(PROXY, sort_keys=True)]
    used = (
        components,
        training_modules.TextConditionedDenoiser,
        training_utils.cosine_with_warmup,
        training_utils.encode_posteriors,
    )
    for obj in (data_module, evaluation_module, *used, load_proxy_vae, train_proxy, proxy_result, vae_round_trip):
        parts.append(inspect.getsource(obj))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def proxy_plan(args) -> dict:
    """Every proxy of the three sweeps: name -> (training config, number of training scenes)."""
    from diffusers_ext.data.mosaic import MosaicConfig

    largest = max(args.sizes)
    plan = {f"size={size}": (MosaicConfig(), size) for size in sorted(args.sizes)}
    for complexity in (0, 2):
        for zipf in (0.0, 1.5):
            if complexity or zipf:
                config = MosaicConfig(extra_objects=complexity, zipf_exponent=zipf)
                plan[f"extra={complexity},zipf={zipf}"] = (config, largest)
    for fraction in args.heldout_fractions:
        plan[f"heldout={fraction}"] = (MosaicConfig(heldout_fraction=fraction), largest)
    return plan


def proxy_result(args, vae, name: str, config, size: int, train: bool) -> dict | None:
    """Train and judge one proxy: test prompts of the default world, and for held-out configs the in-distribution
    test prompts and the held-out prompts of that world (a fixed guidance scale for every proxy)."""
    from diffusers_ext.data.mosaic import MosaicConfig
    from diffusers_ext.evaluation.mosaic import evaluate_text_to_image

    if not train:
        return None
    n, g = args.proxy_eval_prompts, PROXY["guidance"]
    t0 = time.perf_counter()
    pipe, loss = train_proxy(vae, config, size, args.proxy_steps)
    result = {"final_loss": loss, "train_seconds": time.perf_counter() - t0, "num_train_scenes": size}
    result["test"] = evaluate_text_to_image(pipe, MosaicConfig(), n, 8001, g, args.steps)
    if config.heldout_fraction > 0:
        eval_config = MosaicConfig(heldout_fraction=config.heldout_fraction)
        result["test_in_distribution"] = evaluate_text_to_image(pipe, eval_config, n, 8001, g, args.steps)
        result["heldout"] = evaluate_text_to_image(pipe, eval_config, n, 8002, g, args.steps, split="heldout")
    print(f"proxy {name}: test overall {result['test']['overall']:.3f} ({result['train_seconds']:.0f}s)", flush=True)
    return result


def cached_sweeps(args):
    """The three sweeps, each proxy cached on its own (key: settings, VAE weights, source of the code it runs);
    `--proxies` trains only the named ones (to spread the work over processes)."""
    from diffusers_ext import zoo
    from diffusers_ext.data.mosaic import MosaicConfig

    vae_path = args.proxy_vae_path or os.path.join(zoo.path("mosaic-t2i"), "vae")
    vae, vae_hash = load_proxy_vae(vae_path)
    settings = {k: getattr(args, k) for k in ("proxy_steps", "proxy_eval_prompts", "steps")}
    settings["proxy_vae_weights"] = vae_hash
    key = _source_key(settings)
    plan = proxy_plan(args)
    unknown = set(args.proxies or ()) - set(plan)
    if unknown:
        raise ValueError(f"--proxies {sorted(unknown)} unknown; expected names from {list(plan)}.")
    os.makedirs(args.cache_dir, exist_ok=True)
    results, cached = {}, []
    for name, (config, size) in plan.items():
        path = os.path.join(args.cache_dir, f"proxy-{name}-{key}.json")
        if os.path.isfile(path) and not args.no_cache:
            with open(path) as f:
                results[name] = json.load(f)
            cached.append(name)
            continue
        train = not args.cached_sweeps_only and (not args.proxies or name in args.proxies)
        results[name] = proxy_result(args, vae, name, config, size, train)
        if results[name] is not None:
            with open(path, "w") as f:
                json.dump(results[name], f)
    largest = max(args.sizes)
    return {
        "proxy": {**PROXY, "steps": args.proxy_steps, "eval_prompts": args.proxy_eval_prompts, "seed": 0},
        "proxy_vae": {"path": os.path.relpath(vae_path, REPO), "weights": vae_hash},
        "proxy_vae_round_trip": vae_round_trip(vae, MosaicConfig(), 300),
        "size_sweep": {str(size): results[f"size={size}"] for size in sorted(args.sizes)},
        "complexity_vs_imbalance": {
            f"extra_objects={c},zipf={z}": results[f"size={largest}" if not (c or z) else f"extra={c},zipf={z}"]
            for c in (0, 2)
            for z in (0.0, 1.5)
        },
        "heldout_sweep": {str(f): results[f"heldout={f}"] for f in args.heldout_fractions},
        "cache_key": key,
        "from_cache": cached,
        "not_run": [name for name, r in results.items() if r is None],
    }


# ---------------------------------------------------------------------------------------------------------------------
# Summary, targets, table, plot
# ---------------------------------------------------------------------------------------------------------------------


def summarize_findings(sweeps: dict) -> dict:
    """The three findings, each only when every proxy of its sweep was run."""
    findings = {}
    sizes = sweeps["size_sweep"]
    if all(sizes.values()):
        smallest, largest = min(sizes, key=int), max(sizes, key=int)
        skills = [s for s in ("object", "colour", "count", "relation") if s in sizes[smallest]["test"]]
        findings["weakest_skill_at_smallest_size"] = min(skills, key=lambda s: sizes[smallest]["test"][s])
        findings["accuracy_gain_smallest_to_largest"] = (
            sizes[largest]["test"]["overall"] - sizes[smallest]["test"]["overall"]
        )
    grid = sweeps["complexity_vs_imbalance"]
    needed = ("extra_objects=0,zipf=0.0", "extra_objects=2,zipf=0.0", "extra_objects=0,zipf=1.5")
    if all(grid[k] for k in needed):
        base = grid["extra_objects=0,zipf=0.0"]["test"]["overall"]
        findings["complexity_drop"] = base - grid["extra_objects=2,zipf=0.0"]["test"]["overall"]
        findings["imbalance_drop"] = base - grid["extra_objects=0,zipf=1.5"]["test"]["overall"]
    held = sweeps["heldout_sweep"]
    if all(held.values()):
        fractions = sorted(held, key=float)
        findings["heldout_overall_by_fraction"] = {f: held[f]["heldout"]["overall"] for f in fractions}
        findings["heldout_gap_by_fraction"] = {
            f: held[f]["test_in_distribution"]["overall"] - held[f]["heldout"]["overall"] for f in fractions
        }
    return findings


HEADROOM = (0.3, 0.85)  # the zoo's overall test accuracy must leave room both ways
# rows the results once wrote by hand, now computed by `protocol.target`: a two-sided condition becomes one row per
# comparison, and "counting is the weakest skill" the margin by which it is
REWRITTEN_ROWS = {
    "finding: counting is the weakest skill at the smallest dataset": [
        "finding: counting is the weakest skill at the smallest dataset (other skills' lowest accuracy - counting's)",
    ],
    "zoo overall accuracy on test prompts (headroom)": [
        "zoo overall accuracy on test prompts (headroom: not hopeless)",
        "zoo overall accuracy on test prompts (headroom: not saturated)",
    ],
    "finding: complexity costs more than imbalance (drop difference, > 0 and > 2 SE)": [
        "finding: complexity costs accuracy (complexity drop >= one test prompt)",
        "finding: complexity costs more than imbalance (drop difference >= 2 SE)",
    ],
}


def rewritten_rows(path: str) -> dict:
    """The `REWRITTEN_ROWS` entries whose old row the results file `path` still records: a file written before the
    rows were rewritten maps them (`rebuild_results`' `replaced`); one rebuilt since records the new rows, which are
    then compared like every other row."""
    with open(path, encoding="utf-8") as f:
        recorded = {row["name"] for row in json.load(f).get("summary", {}).get("targets", [])}
    return {old: new for old, new in REWRITTEN_ROWS.items() if old in recorded}


def build_summary(judge, zoo_result, sweeps):
    """The summary and its computed targets, from the judge, zoo and sweep measurements.

    A strict "> 0" on an accuracy difference over `n` prompts is written ">= 1/n" (one prompt), which is the same."""
    from diffusers_ext.evaluation.protocol import target

    targets, sanity = [], {}
    evaluator_accuracy = {name: judge[name]["accuracy"] for name in ("test", "heldout_complex")}
    for name in ("test", "heldout_complex"):
        for skill, value in judge[name]["accuracy"].items():
            targets.append(target(f"judge accuracy on real renders ({name}, {skill})", value, 0.99))
        for kind in PERTURBATIONS:
            value = judge[name]["perturbation_agreement"][kind]
            targets.append(target(f"judge agreement under {kind} ({name})", value, 0.99))
    summary = {"evaluator_accuracy": evaluator_accuracy}
    if zoo_result is not None:
        test = zoo_result["test"]
        summary["zoo_accuracy"] = {
            k: test[k] for k in ("overall", "object", "colour", "count", "relation") if k in test
        }
        summary["zoo_accuracy"]["by_task"] = test.get("by_task", {})
        summary["zoo_accuracy"]["guidance_scale"] = zoo_result["chosen_guidance_scale"]
        overall = test["overall"]
        low, high = REWRITTEN_ROWS["zoo overall accuracy on test prompts (headroom)"]
        targets += [target(low, overall, HEADROOM[0]), target(high, overall, HEADROOM[1], "<=")]
        targets.append(target("zoo folder size (bytes)", zoo_result["folder_bytes"], 3 * 2**20, "<="))
        if "vae_round_trip" in judge:
            sanity["zoo_vae_round_trip_pass_rate"] = judge["vae_round_trip"]["overall"]
            sanity["zoo_vae_round_trip_psnr_db"] = judge["vae_round_trip"]["psnr_db"]
    if sweeps is not None:
        findings = summarize_findings(sweeps)
        summary["size_sweep"] = {k: v["test"] for k, v in sweeps["size_sweep"].items() if v}
        summary["complexity_vs_imbalance"] = {k: v["test"] for k, v in sweeps["complexity_vs_imbalance"].items() if v}
        summary["heldout_sweep"] = {
            k: {"heldout": v["heldout"], "test_in_distribution": v["test_in_distribution"]}
            for k, v in sweeps["heldout_sweep"].items()
            if v
        }
        summary["findings"] = findings
        summary["proxies_not_run"] = sweeps["not_run"]
        sanity["proxy_vae_round_trip_pass_rate"] = sweeps["proxy_vae_round_trip"]["overall"]
        # whether each of the paper's findings reproduces at this scale (measured, reported either way)
        sizes = sweeps["size_sweep"]
        if "weakest_skill_at_smallest_size" in findings:
            smallest = sizes[min(sizes, key=int)]["test"]
            others = [smallest[s] for s in ("object", "colour", "relation") if s in smallest]
            (name,) = REWRITTEN_ROWS["finding: counting is the weakest skill at the smallest dataset"]
            targets.append(target(name, min(others) - smallest["count"], 0.0))
        if "accuracy_gain_smallest_to_largest" in findings:
            gain = findings["accuracy_gain_smallest_to_largest"]
            targets.append(
                target(
                    "finding: accuracy rises with dataset size (overall, largest - smallest)",
                    gain,
                    1 / sizes[max(sizes, key=int)]["test"]["n"],
                )
            )
        if "complexity_drop" in findings:
            # significant only beyond two standard errors of the two variants' accuracies
            grid = sweeps["complexity_vs_imbalance"]
            p_c = grid["extra_objects=2,zipf=0.0"]["test"]["overall"]
            p_i = grid["extra_objects=0,zipf=1.5"]["test"]["overall"]
            n = grid["extra_objects=0,zipf=0.0"]["test"]["n"]
            se = math.sqrt((p_c * (1 - p_c) + p_i * (1 - p_i)) / n)
            findings["complexity_minus_imbalance_standard_error"] = se
            difference = findings["complexity_drop"] - findings["imbalance_drop"]
            costs, more = REWRITTEN_ROWS[
                "finding: complexity costs more than imbalance (drop difference, > 0 and > 2 SE)"
            ]
            targets += [target(costs, findings["complexity_drop"], 1 / n), target(more, difference, 2 * se)]
        if "heldout_overall_by_fraction" in findings:
            by_fraction = list(findings["heldout_overall_by_fraction"].values())
            n = sweeps["heldout_sweep"][max(sweeps["heldout_sweep"], key=float)]["heldout"]["n"]
            targets.append(
                target(
                    "finding: held-out accuracy falls as the held-out fraction grows (first - last)",
                    by_fraction[0] - by_fraction[-1],
                    1 / n,
                )
            )
    summary["targets"] = targets
    summary["sanity"] = sanity
    return summary


def report_sections(summary) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    lines = []
    skills = ("overall", "object", "colour", "count", "relation")

    def row(label, s):
        return f"| {label} | " + " | ".join(f"{s[k]:.3f}" if k in s else "-" for k in skills) + " |"

    header = ["| | " + " | ".join(skills) + " |", "|---" * (len(skills) + 1) + "|"]
    if "zoo_accuracy" in summary:
        lines += ["## Zoo model (test prompts)", "", *header, row("mosaic-t2i", summary["zoo_accuracy"])]
    if "size_sweep" in summary:
        lines += ["", "## Proxy: accuracy vs dataset size", "", *header]
        lines += [row(f"{k} scenes", v) for k, v in sorted(summary["size_sweep"].items(), key=lambda kv: int(kv[0]))]
        lines += ["", "## Proxy: complexity vs imbalance", "", *header]
        lines += [row(k, v) for k, v in summary["complexity_vs_imbalance"].items()]
        lines += ["", "## Proxy: held-out combinations", "", *header]
        for k, v in summary["heldout_sweep"].items():
            lines += [
                row(f"fraction {k}, in-distribution", v["test_in_distribution"]),
                row(f"fraction {k}, held-out", v["heldout"]),
            ]
    return lines


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    sizes = sorted(summary.get("size_sweep", {}), key=int)
    for skill in ("overall", "object", "colour", "count", "relation"):
        axes[0].plot(
            [int(s) for s in sizes], [summary["size_sweep"][s].get(skill, np.nan) for s in sizes], "o-", label=skill
        )
    axes[0].set(xscale="log", xlabel="training scenes", ylabel="judge accuracy", title="proxies: accuracy vs size")
    axes[0].legend()
    grid = summary.get("complexity_vs_imbalance", {})
    axes[1].bar(range(len(grid)), [v["overall"] for v in grid.values()])
    axes[1].set_xticks(range(len(grid)), [k.replace(",", "\n") for k in grid], fontsize=8)
    axes[1].set(ylabel="overall accuracy (simple test prompts)", title="proxies: complexity vs imbalance")
    held = summary.get("heldout_sweep", {})
    fractions = sorted(held, key=float)
    for key, label in (("test_in_distribution", "seen combinations"), ("heldout", "held-out combinations")):
        axes[2].plot([float(f) for f in fractions], [held[f][key]["overall"] for f in fractions], "o-", label=label)
    axes[2].set(xlabel="held-out fraction", ylabel="overall accuracy", title="proxies: held-out combinations")
    if not fractions:
        axes[2].text(0.5, 0.5, "not run (CPU time)", ha="center", transform=axes[2].transAxes)
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    if args.from_results:
        results = rebuild_results(
            args.from_results,
            lambda r: build_summary(r["judge"], r["zoo"], r["sweeps"])["targets"],
            rel_to=REPO,
            replaced=rewritten_rows(args.from_results),
        )
        write_results(
            stem,
            results,
            "mosaic benchmark",
            report_sections(results["summary"]),
            figures={".png": lambda path: plot(results["summary"], path)},
        )
        return
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.proxies:
        cached_sweeps(args)
        return
    zoo_result, pipe = None, None
    if args.model_path or os.path.isdir(os.path.join(REPO, "diffusers_ext", "zoo", "mosaic-t2i", "unet")):
        pipe, zoo_result = zoo_section(args)
    judge = judge_section(args, pipe.vae if pipe is not None else None)
    print("judge:", json.dumps({k: judge[k]["accuracy"] for k in ("test", "heldout_complex")}), flush=True)
    sweeps = None if args.skip_sweeps else cached_sweeps(args)
    summary = build_summary(judge, zoo_result, sweeps)
    results = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "cache_dir", "from_results")},
        "summary": summary,
        "judge": judge,
        "zoo": zoo_result,
        "sweeps": sweeps,
        "seconds": time.perf_counter() - start,
    }
    write_results(
        stem, results, "mosaic benchmark", report_sections(summary), figures={".png": lambda path: plot(summary, path)}
    )
    for t in summary["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS'} {t['name']}: {t['value']} ({t['comparison']} {t['threshold']})")


if __name__ == "__main__":
    main()
