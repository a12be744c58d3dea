#!/usr/bin/env python
"""Measure LoMDM (learned per-position schedules) against MDLM at the same steps, size and seeds.

    python benchmarks/lomdm/lomdm.py

Two corpora, in one process, on the same data, initialisations and seeds:

1. **Markov checksum** (`diffusers_ext.data.markov_checksum`): a known random Markov chain whose blocks start with a
   noisy checksum of the block; the exact likelihood is known (`diffusers_ext.evaluation.lomdm`), so the bound can
   be compared with the true NLL (headroom), and samples are judged under the exact likelihood.
2. **stdlib docstrings** (`diffusers_ext.data.stdlib_text`): 32-character windows of the standard library's docstrings.

For each corpus and seed, MDLM (`(c1, c2) = (1, 0)`) and LoMDM (`(0.7, 0.65)`, the paper's values) train the same
bidirectional Llama from the same initial weights on the same batches, both with two mask samples per sequence (the
RLOO pair; for MDLM it only halves the variance). The validation NELBO is logged along training; the only choice
(the checkpoint: the last one) is fixed in advance; the test NELBO bound is computed once at the end. On the Markov
corpus the trained models are also sampled with every decoder of the pack (learned order, OeMDM presets, greedy,
threshold, SOAR) at temperature 1, and the learned order is plotted.

Writes `benchmarks/lomdm/results/lomdm.json`, `lomdm.md` and `lomdm.png`.
"""

import argparse
import json
import math
import os
import platform
import sys
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = {"mdlm": (1.0, 0.0), "lomdm": (0.7, 0.65)}


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds (>= 3).")
    parser.add_argument("--corpora", nargs="+", default=["markov", "stdlib"], help="Corpora to run.")
    parser.add_argument("--markov_steps", type=int, default=800, help="Training steps on the Markov corpus.")
    parser.add_argument("--stdlib_steps", type=int, default=500, help="Training steps on the stdlib corpus.")
    parser.add_argument("--num_symbols", type=int, default=8, help="Markov corpus: symbols.")
    parser.add_argument("--block_size", type=int, default=3, help="Markov corpus: data tokens per checksum.")
    parser.add_argument("--num_blocks", type=int, default=4, help="Markov corpus: blocks per sequence.")
    parser.add_argument("--batch_size", type=int, default=64, help="Sequences per step (two masks each).")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="AdamW learning rate (all networks).")
    parser.add_argument("--num_evals", type=int, default=10, help="Validation NELBO evaluations along training.")
    parser.add_argument("--num_val", type=int, default=512, help="Validation sequences.")
    parser.add_argument("--num_test", type=int, default=1024, help="Test sequences.")
    parser.add_argument("--test_times", type=int, default=16, help="Stratified times per test sequence.")
    parser.add_argument("--num_samples", type=int, default=512, help="Samples per decoder (Markov corpus).")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "lomdm.json"), help="Results file.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if len(args.seeds) < 3:
        print("note: fewer than 3 seeds; the targets need >= 3", file=sys.stderr)
    unknown = [c for c in args.corpora if c not in ("markov", "stdlib")]
    if unknown:
        parser.error(f"--corpora must be among markov, stdlib; got {unknown}")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------------


def with_bos(symbols: torch.LongTensor, tokenizer) -> torch.LongTensor:
    """Symbol indices (offset past the 4 special tokens) behind a `<bos>` prompt: `(N, 1 + L)` token ids."""
    bos = torch.full((symbols.shape[0], 1), tokenizer.bos_token_id, dtype=torch.long)
    return torch.cat([bos, symbols + 4], dim=1)


def make_corpus(name: str, args) -> dict:
    from diffusers_ext.data.char_tokenizer import build_char_tokenizer

    if name == "markov":
        from diffusers_ext.data.markov_checksum import MarkovChecksumSource
        from diffusers_ext.evaluation.lomdm import markov_checksum_entropy_rate

        source = MarkovChecksumSource(
            num_symbols=args.num_symbols, block_size=args.block_size, num_blocks=args.num_blocks
        )
        tokenizer = build_char_tokenizer(source.alphabet)
        return {
            "name": name,
            "source": source,
            "tokenizer": tokenizer,
            "train": with_bos(source.sample(20000, seed=1), tokenizer),
            "val": with_bos(source.sample(args.num_val, seed=2), tokenizer),
            "test": with_bos(source.sample(args.num_test, seed=3), tokenizer),
            "steps": args.markov_steps,
            "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128},
            "entropy_rate": markov_checksum_entropy_rate(source),
            "description": (
                f"{source.num_blocks} blocks of (checksum + {source.block_size} Markov tokens) over "
                f"{source.num_symbols} symbols, checksum noise {source.noise}; 20000 train sequences"
            ),
        }
    from diffusers_ext.data.stdlib_text import STDLIB_ALPHABET, encode_windows, stdlib_docstring_windows

    tokenizer = build_char_tokenizer(STDLIB_ALPHABET)
    train = stdlib_docstring_windows("train", 32)
    return {
        "name": name,
        "source": None,
        "tokenizer": tokenizer,
        "train": with_bos(encode_windows(train), tokenizer),
        "val": with_bos(encode_windows(stdlib_docstring_windows("validation", 32, args.num_val)), tokenizer),
        "test": with_bos(encode_windows(stdlib_docstring_windows("test", 32, args.num_test)), tokenizer),
        "steps": args.stdlib_steps,
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128},
        "entropy_rate": None,
        "description": (
            f"32-character windows of stdlib docstrings (Python {platform.python_version()}), {len(train)} train "
            "windows, split by file"
        ),
    }


# ---------------------------------------------------------------------------------------------------------------------
# training and bounds
# ---------------------------------------------------------------------------------------------------------------------


def build_components(corpus: dict, method: str, seed: int):
    from diffusers_ext import LoMDMScheduleNetwork
    from diffusers_ext.models.bidirectional_llama import build_bidirectional_llama

    torch.manual_seed(seed)
    length = corpus["train"].shape[1]
    denoiser = build_bidirectional_llama(corpus["tokenizer"], length, **corpus["model"])
    c1, c2 = METHODS[method]
    vocab = len(corpus["tokenizer"])
    forward_schedule = LoMDMScheduleNetwork(vocab, length, hidden_size=32, num_heads=4, c1=c1, c2=c2)
    reverse_schedule = LoMDMScheduleNetwork(vocab, length, hidden_size=32, num_heads=4, c1=c1, c2=c2)
    return denoiser, forward_schedule, reverse_schedule


def schedule_mask_of(ids: torch.LongTensor) -> torch.BoolTensor:
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 0] = False
    return mask


def bound(models, ids, mask_id, num_times, seed) -> torch.Tensor:
    """NELBO per sequence (nats)."""
    from diffusers_ext.evaluation.lomdm import nelbo_per_sequence

    denoiser, forward_schedule, reverse_schedule = models
    for m in models:
        m.eval()
    values = nelbo_per_sequence(
        lambda z: denoiser(z).logits,
        forward_schedule,
        reverse_schedule,
        ids,
        schedule_mask_of(ids),
        mask_id,
        num_times=num_times,
        seed=seed,
    )
    for m in models:
        m.train()
    return values


def train(corpus: dict, method: str, seed: int, args) -> dict:
    from diffusers_ext.losses.lomdm import lomdm_loss

    models = build_components(corpus, method, seed)
    denoiser, forward_schedule, reverse_schedule = models
    params = list(denoiser.parameters())
    if METHODS[method][1] > 0:
        params += list(forward_schedule.parameters()) + list(reverse_schedule.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.01)
    warmup = 50
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    generator = torch.Generator().manual_seed(1000 + seed)
    data, mask_id = corpus["train"], corpus["tokenizer"].mask_token_id
    val_length = corpus["val"].shape[1] - 1
    curve, start = [], time.perf_counter()
    eval_every = max(corpus["steps"] // args.num_evals, 1)
    for step in range(1, corpus["steps"] + 1):
        batch = data[torch.randint(len(data), (args.batch_size,), generator=generator)]
        out = lomdm_loss(
            lambda z: denoiser(z).logits,
            forward_schedule,
            reverse_schedule,
            batch,
            schedule_mask_of(batch),
            mask_id,
            generator=generator,
            num_mask_samples=2,
        )
        optimizer.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        lr_scheduler.step()
        if step % eval_every == 0 or step == corpus["steps"]:
            val = bound(models, corpus["val"], mask_id, num_times=4, seed=7).mean().item() / val_length
            curve.append({"step": step, "val_nelbo_per_token": val, "train_nelbo_per_token": out.nelbo.item()})
    train_seconds = time.perf_counter() - start
    test = bound(models, corpus["test"], mask_id, num_times=args.test_times, seed=11) / val_length
    return {"models": models, "curve": curve, "test_per_sequence": test, "train_seconds": train_seconds}


def steps_to_reach(curve: list[dict], level: float) -> int | None:
    for point in curve:
        if point["val_nelbo_per_token"] <= level:
            return point["step"]
    return None


# ---------------------------------------------------------------------------------------------------------------------
# sampling (Markov corpus)
# ---------------------------------------------------------------------------------------------------------------------


def decoders(gen_length: int):
    from diffusers_ext import OeMDMScheduler, SOARScheduler

    return {
        "learned order (LoMDM reverse scheduler)": OeMDMScheduler.from_preset("lomdm"),
        "OeMDM mdm (random order)": OeMDMScheduler.from_preset("mdm"),
        "OeMDM ar (left to right)": OeMDMScheduler.from_preset("ar"),
        "OeMDM block (4)": OeMDMScheduler.from_preset("block", order_block_length=4),
        "greedy confidence (low-confidence remasking)": SOARScheduler(block_length=gen_length),
        "threshold 0.9 (Fast-dLLM)": SOARScheduler(block_length=gen_length, confidence_threshold=0.9),
        "SOAR tau=0.9 beam=2": SOARScheduler(block_length=gen_length, confidence_threshold=0.9, max_beam_size=2),
    }


class CommitRecorder:
    """A pipeline callback recording the step at which each generated position was unmasked (one row per prompt;
    the pipeline drops finished rows after the callback, so the rows still alive are tracked here)."""

    def __init__(self, num_rows: int, gen_length: int, mask_id: int):
        self.steps = torch.full((num_rows, gen_length), -1)
        self.alive = torch.arange(num_rows)
        self.gen_length, self.mask_id = gen_length, mask_id
        self.num_steps = 0

    def __call__(self, pipeline, step, timestep, kwargs):
        committed = kwargs["transfer_index"][:, -self.gen_length :]
        rows, cols = committed.nonzero(as_tuple=True)
        self.steps[self.alive[rows], cols] = step
        self.num_steps = max(self.num_steps, step + 1)
        unfinished = (kwargs["sequences"][:, -self.gen_length :] == self.mask_id).any(1)
        self.alive = self.alive[unfinished]
        return {}

    def mean_unmask_time(self) -> list[float]:
        """Mean unmasking step per position, scaled to [0, 1] (0 = first step, 1 = last)."""
        return (self.steps.double().mean(0) / max(self.num_steps - 1, 1)).tolist()


def sample_all(corpus: dict, models, method: str, args, seed: int) -> tuple[dict, list[float] | None]:
    from diffusers_ext import LoMDMPipeline, OeMDMScheduler
    from diffusers_ext.evaluation.lomdm import markov_checksum_sample_quality

    denoiser, forward_schedule, reverse_schedule = models
    tokenizer, source = corpus["tokenizer"], corpus["source"]
    gen_length = corpus["test"].shape[1] - 1
    pipe = LoMDMPipeline(
        denoiser.eval(),
        decoders(gen_length)["OeMDM mdm (random order)"],
        tokenizer,
        reverse_schedule=reverse_schedule.eval(),
        forward_schedule=forward_schedule.eval(),
    )
    pipe.set_progress_bar_config(disable=True)
    results, order = {}, None
    for name, scheduler in decoders(gen_length).items():
        if name.startswith("learned") and method == "mdlm":
            continue
        pipe.scheduler = scheduler
        recorder = CommitRecorder(args.num_samples, gen_length, mask_id=tokenizer.mask_token_id)
        out = pipe(
            prompt=["<|bos|>"] * args.num_samples,
            gen_length=gen_length,
            num_inference_steps=gen_length,
            temperature=1.0,
            eos_early_stop=False,
            generator=torch.Generator().manual_seed(100 + seed),
            output_type="seq",
            callback_on_step_end=recorder if isinstance(scheduler, OeMDMScheduler) else None,
            callback_on_step_end_tensor_inputs=["sequences", "transfer_index"],
        )
        symbols = out.sequences - 4
        results[name] = markov_checksum_sample_quality(source, symbols) if source is not None else {}
        if name.startswith("learned"):
            order = recorder.mean_unmask_time()
    return results, order


@torch.no_grad()
def learned_order(corpus: dict, models, args, seed: int) -> dict:
    """The learned order: mean forward exponent per position on test data, and the mean unmasking time of each
    position when sampling with the learned reverse schedule (0 = first step, 1 = last)."""
    from diffusers_ext import LoMDMPipeline, OeMDMScheduler

    denoiser, forward_schedule, reverse_schedule = models
    ids = corpus["test"]
    exponents = forward_schedule.eval()(ids, schedule_mask_of(ids)).exponents[:, 1:].mean(0)
    gen_length = ids.shape[1] - 1
    pipe = LoMDMPipeline(
        denoiser.eval(), OeMDMScheduler.from_preset("lomdm"), corpus["tokenizer"], reverse_schedule.eval()
    )
    pipe.set_progress_bar_config(disable=True)
    n = min(args.num_samples, 256)
    recorder = CommitRecorder(n, gen_length, mask_id=corpus["tokenizer"].mask_token_id)

    pipe(
        prompt=["<|bos|>"] * n,
        gen_length=gen_length,
        num_inference_steps=gen_length,
        temperature=1.0,
        eos_early_stop=False,
        generator=torch.Generator().manual_seed(200 + seed),
        output_type="seq",
        callback_on_step_end=recorder,
        callback_on_step_end_tensor_inputs=["sequences", "transfer_index"],
    )
    return {
        "forward_exponent_per_position": exponents.tolist(),
        "mean_unmask_time_per_position": recorder.mean_unmask_time(),
    }


# ---------------------------------------------------------------------------------------------------------------------
# the MDLM special case
# ---------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def special_case_check(corpus: dict, models) -> dict:
    """(c1, c2) = (1, 0): LoMDM's loss against the shared MDLM loss on the same masks, and learned-order samples
    against the OeMDM "mdm" preset with the same generator."""
    from diffusers_ext import LoMDMPipeline, LoMDMScheduleNetwork, OeMDMScheduler
    from diffusers_ext.losses.lomdm import lomdm_loss
    from diffusers_ext.losses.masked_diffusion import masked_diffusion_loss

    denoiser = models[0].eval()
    ids = corpus["test"][:256]
    vocab, length = len(corpus["tokenizer"]), ids.shape[1]
    fixed = LoMDMScheduleNetwork(vocab, length, hidden_size=32, num_heads=4, c1=1.0, c2=0.0).eval()
    mask_id = corpus["tokenizer"].mask_token_id
    diffs = []
    for seed in range(4):
        out = lomdm_loss(
            lambda z: denoiser(z).logits,
            fixed,
            fixed,
            ids,
            schedule_mask_of(ids),
            mask_id,
            generator=torch.Generator().manual_seed(seed),
            num_mask_samples=1,
        )
        logits = denoiser(torch.where(out.masked[0], mask_id, ids)).logits
        reference = masked_diffusion_loss(logits[:, 1:], ids[:, 1:], out.masked[0][:, 1:], out.t)
        diffs.append(abs(out.nelbo.item() - reference.item()))
    samples = []
    for scheduler in (OeMDMScheduler.from_preset("lomdm"), OeMDMScheduler.from_preset("mdm")):
        pipe = LoMDMPipeline(denoiser, scheduler, corpus["tokenizer"], reverse_schedule=fixed)
        pipe.set_progress_bar_config(disable=True)
        samples.append(
            pipe(
                prompt=["<|bos|>"] * 64,
                gen_length=length - 1,
                num_inference_steps=length - 1,
                temperature=1.0,
                eos_early_stop=False,
                generator=torch.Generator().manual_seed(5),
                output_type="seq",
            ).sequences
        )
    return {
        "loss_max_abs_diff": max(diffs),
        "sample_max_abs_diff": int((samples[0] - samples[1]).abs().max()),
    }


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------


def mean_sd(values: list[float]) -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    sd = float(t.std()) if len(values) > 1 else 0.0
    return {"mean": float(t.mean()), "sd": sd, "per_seed": [float(v) for v in values]}


def lomdm_targets(summary: dict) -> list[dict]:
    """Two targets per corpus, from the summary's per-seed test bounds and steps-to-MDLM's-bound ratios."""
    from diffusers_ext.evaluation.protocol import target

    targets = []
    for name in summary["mdlm_test_ppl_bound"]:
        mdlm_ppl, lomdm_ppl = summary["mdlm_test_ppl_bound"][name], summary["lomdm_test_ppl_bound"][name]
        targets += [
            target(
                f"{name}: MDLM minus LoMDM test perplexity bound, above the seed spread (max sd)",
                mdlm_ppl["mean"] - lomdm_ppl["mean"],
                max(mdlm_ppl["sd"], lomdm_ppl["sd"]),
            ),
            target(
                f"{name}: steps for LoMDM to reach MDLM's final validation bound / MDLM's steps",
                summary["steps_to_mdlm_final_ratio"][name]["mean"],
                0.6,
                "<=",
            ),
        ]
    return targets


def write_plot(path: str, corpora_results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(corpora_results)
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 7.5), squeeze=False)
    for col, name in enumerate(names):
        res = corpora_results[name]
        ax = axes[0, col]
        for method, color in (("mdlm", "tab:blue"), ("lomdm", "tab:red")):
            for k, run in enumerate(res["runs"][method]):
                steps = [p["step"] for p in run["curve"]]
                values = [math.exp(p["val_nelbo_per_token"]) for p in run["curve"]]
                ax.plot(steps, values, color=color, alpha=0.7, label=method.upper() if k == 0 else None)
        ax.set_title(f"{name}: validation perplexity bound")
        ax.set_xlabel("training step")
        ax.set_ylabel("exp(NELBO / token)")
        ax.set_ylim(
            top=min(ax.get_ylim()[1], 3 * math.exp(res["runs"]["mdlm"][0]["curve"][-1]["val_nelbo_per_token"]))
        )
        ax.legend()
        ax = axes[1, col]
        order = res["learned_order"]
        positions = list(range(len(order["mean_unmask_time_per_position"])))
        colors = ["tab:orange" if p in res.get("checksum_positions", []) else "tab:gray" for p in positions]
        ax.bar(positions, order["mean_unmask_time_per_position"], color=colors)
        ax.set_title(f"{name}: learned order (mean unmasking time; orange = checksum)")
        ax.set_xlabel("position")
        ax.set_ylabel("0 = first step, 1 = last")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report_sections(result: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = result["summary"]
    lines = ["## Headroom", ""]
    for name, h in s["sanity"]["headroom"].items():
        lines.append(f"- {name}: {h}")
    lines += ["", "## Test perplexity bound (exp NELBO per token), mean ± sd over seeds", ""]
    lines += ["| corpus | MDLM | LoMDM | steps to MDLM's final bound (ratio) |", "| --- | --- | --- | --- |"]
    for name in s["mdlm_test_ppl_bound"]:
        m, lo = s["mdlm_test_ppl_bound"][name], s["lomdm_test_ppl_bound"][name]
        ratio = s["steps_to_mdlm_final_ratio"][name]
        lines.append(
            f"| {name} | {m['mean']:.4f} ± {m['sd']:.4f} | {lo['mean']:.4f} ± {lo['sd']:.4f} | "
            f"{ratio['mean']:.3g} (per seed {ratio['per_seed']}) |"
        )
    if "markov" in result["corpora"]:
        lines += ["", "## Samples under the exact likelihood (Markov checksum, temperature 1, 16 steps)", ""]
        lines += [
            "| model | decoder | exact NLL / token | checksum agreement | distinct |",
            "| --- | --- | --- | --- | --- |",
        ]
        for method, table in result["corpora"]["markov"]["samples"].items():
            for decoder, q in table.items():
                lines.append(
                    f"| {method} | {decoder} | {q['nll_per_token']['mean']:.4f} ± {q['nll_per_token']['sd']:.4f} | "
                    f"{q['checksum_agreement']['mean']:.3f} | {q['distinct_fraction']['mean']:.3f} |"
                )
        data = result["corpora"]["markov"]["data_reference"]
        lines.append(
            f"| data | (test split) | {data['nll_per_token']:.4f} | {data['checksum_agreement']:.3f} | "
            f"{data['distinct_fraction']:.3f} |"
        )
    return lines


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    if args.from_results:
        result = rebuild_results(args.from_results, lambda r: lomdm_targets(r["summary"]), rel_to=REPO)
        write_results(
            stem,
            result,
            "LoMDM vs MDLM",
            report_sections(result),
            figures={".png": lambda path: write_plot(path, result["corpora"])},
        )
        return
    torch.set_num_threads(1)
    from diffusers_ext.evaluation.lomdm import markov_checksum_sample_quality

    start = time.perf_counter()
    corpora, summary = (
        {},
        {
            "mdlm_test_ppl_bound": {},
            "lomdm_test_ppl_bound": {},
            "mdlm_test_nelbo_per_token": {},
            "lomdm_test_nelbo_per_token": {},
            "steps_to_mdlm_final_ratio": {},
            "targets": [],
            "sanity": {"headroom": {}},
        },
    )
    for name in args.corpora:
        corpus = make_corpus(name, args)
        print(f"[{name}] {corpus['description']}", flush=True)
        runs = {"mdlm": [], "lomdm": []}
        samples = {"mdlm": {}, "lomdm": {}}
        order = None
        for seed in args.seeds:
            for method in METHODS:
                run = train(corpus, method, seed, args)
                test = run["test_per_sequence"]
                record = {
                    "seed": seed,
                    "curve": run["curve"],
                    "test_nelbo_per_token": float(test.mean()),
                    "test_nelbo_se": float(test.std() / math.sqrt(len(test))),
                    "train_seconds": run["train_seconds"],
                }
                runs[method].append(record)
                print(
                    f"[{name}] seed {seed} {method}: test NELBO {record['test_nelbo_per_token']:.4f} nats/token "
                    f"(ppl {math.exp(record['test_nelbo_per_token']):.4f}), {run['train_seconds']:.0f}s",
                    flush=True,
                )
                if name == "markov":
                    table, _ = sample_all(corpus, run["models"], method, args, seed)
                    for decoder, q in table.items():
                        samples[method].setdefault(decoder, []).append(q)
                if method == "lomdm" and seed == args.seeds[0]:
                    order = learned_order(corpus, run["models"], args, seed)
                if method == "mdlm" and seed == args.seeds[0] and name == args.corpora[0]:
                    summary["sanity"]["mdlm_special_case"] = special_case_check(corpus, run["models"])
        res = {"description": corpus["description"], "steps": corpus["steps"], "runs": runs, "learned_order": order}
        if corpus["source"] is not None:
            res["checksum_positions"] = corpus["source"].checksum_positions
            res["entropy_rate_nats_per_token"] = corpus["entropy_rate"]
            res["data_reference"] = markov_checksum_sample_quality(corpus["source"], corpus["test"][:, 1:] - 4)
            res["samples"] = {
                method: {
                    decoder: {key: mean_sd([q[key] for q in qs]) for key in qs[0]} for decoder, qs in table.items()
                }
                for method, table in samples.items()
            }
        corpora[name] = res

        mdlm = [r["test_nelbo_per_token"] for r in runs["mdlm"]]
        lomdm = [r["test_nelbo_per_token"] for r in runs["lomdm"]]
        summary["mdlm_test_nelbo_per_token"][name] = mean_sd(mdlm)
        summary["lomdm_test_nelbo_per_token"][name] = mean_sd(lomdm)
        summary["mdlm_test_ppl_bound"][name] = mean_sd([math.exp(v) for v in mdlm])
        summary["lomdm_test_ppl_bound"][name] = mean_sd([math.exp(v) for v in lomdm])
        ratios = []
        for a, b in zip(runs["mdlm"], runs["lomdm"]):
            reached = steps_to_reach(b["curve"], a["curve"][-1]["val_nelbo_per_token"])
            ratios.append(reached / a["curve"][-1]["step"] if reached is not None else math.inf)
        summary["steps_to_mdlm_final_ratio"][name] = {
            "mean": float(sum(ratios) / len(ratios)),
            "per_seed": ratios,
            "definition": "first validation step (num_evals evenly spaced) at which LoMDM's bound <= MDLM's final bound, "
            "over MDLM's steps; inf if never",
        }
        if corpus["entropy_rate"] is not None:
            summary["sanity"]["headroom"][name] = (
                f"exact entropy {corpus['entropy_rate']:.4f} nats/token vs MDLM test bound "
                f"{summary['mdlm_test_nelbo_per_token'][name]['mean']:.4f}: room "
                f"{summary['mdlm_test_nelbo_per_token'][name]['mean'] - corpus['entropy_rate']:.4f}"
            )
    summary["targets"] = lomdm_targets(summary)
    special = summary["sanity"].get("mdlm_special_case", {})
    summary["mdlm_special_case_max_abs_diff"] = special.get("loss_max_abs_diff")
    summary["sanity"]["mdlm_special_case_ok"] = bool(
        special and special["loss_max_abs_diff"] < 1e-5 and special["sample_max_abs_diff"] == 0
    )
    result = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "methods": {k: {"c1": v[0], "c2": v[1]} for k, v in METHODS.items()},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
        "summary": summary,
        "corpora": corpora,
        "wall_seconds": time.perf_counter() - start,
    }
    write_results(
        stem,
        result,
        "LoMDM vs MDLM",
        report_sections(result),
        figures={".png": lambda path: write_plot(path, corpora)},
    )
    print(json.dumps({k: summary[k] for k in ("targets", "mdlm_special_case_max_abs_diff")}, indent=1))


if __name__ == "__main__":
    main()
