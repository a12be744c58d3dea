#!/usr/bin/env python
"""Measure the prefix and dual KV caches of `DiffusionLMPipeline`: speed against the uncached decode and Fast-dLLM,
cost growth with length, accuracy on the zoo's test beds, and the cache's memory at LLaDA-8B / Dream-7B scale.

    python benchmarks/diffusion_lm_cache/diffusion_lm_cache.py --fast_dllm_repo PATH

`PATH` is a local checkout of NVlabs/Fast-dLLM (`git clone https://github.com/NVlabs/Fast-dLLM`), never committed:
its LLaDA modeling file holds the same weights as the package's `LLaDAModelLM`, and its `generate_with_prefix_cache`
/ `generate_with_dual_cache` are what a Fast-dLLM user runs. One process, the same random-weight model (the LLaDA
architecture at a reduced width, about 60M parameters), prompt and seed for every decoder:

1. **Prefix cache** against the pack's uncached greedy decode (low-confidence remasking, one token per step) at
   generation length 256, block 32, 128-token prompt: the wall-time ratio over repetitions alternating the order;
   the tokens against Fast-dLLM's `generate_with_prefix_cache` on the same weights.
2. **Dual cache with threshold 0.9** against Fast-dLLM's `generate_with_dual_cache(threshold=0.9)`: wall-time ratio,
   alternating; tokens and NFE compared.
3. **Cost growth**: time per generated token at generation length 1024 over that at 256, for the dual cache and for
   the uncached decode (greedy, one token per step; the uncached decode reruns the whole sequence every step).
4. **Quality**: accuracy on the zoo's `addition-mdm` and `sudoku-mdm` test problems with each cache against the
   uncached decode at equal NFE (greedy, one token per step, several blocks); the paired standard error of each
   difference. No choice is made here (the decoders are fixed), so there is no validation split.
5. **Memory**: the cache's bytes for LLaDA-8B and Dream-7B at 4096 tokens, computed from their published configs
   (checked against the bytes the cache holds for the model measured here).

Writes `benchmarks/diffusion_lm_cache/results/diffusion_lm_cache.json` and `.md`.
"""

import argparse
import os
import platform
import sys
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")

PREFIX_RATIO_TARGET = 0.5  # prefix-cached / uncached greedy wall time, gen 256
DUAL_RATIO_TARGET = 1.0  # package dual-cached threshold decode / Fast-dLLM's, gen 256
GROWTH_FRACTION_TARGET = 0.5  # dual cache's per-token growth 256 -> 1024 / the uncached decode's
ACCURACY_GAP_TARGET = 0.01  # |cached - uncached| accuracy, at equal NFE
THRESHOLD = 0.9
MASK_ID = 31999  # the last token of the 32,000-token vocabulary

# LLaDA-8B and Dream-7B: the published configs' attention shapes (keys and values cached per layer and position)
PUBLISHED = {
    "LLaDA-8B": {"layers": 32, "kv_heads": 32, "head_dim": 128},
    "Dream-7B": {"layers": 28, "kv_heads": 4, "head_dim": 128},
}
MEMORY_TOKENS = 4096


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fast_dllm_repo", default=None, help="A local checkout of NVlabs/Fast-dLLM (required).")
    parser.add_argument("--prompt_length", type=int, default=128)
    parser.add_argument("--gen_length", type=int, default=256)
    parser.add_argument("--long_gen_length", type=int, default=1024, help="The cost-growth length.")
    parser.add_argument("--block_length", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3, help="Alternating repetitions of each speed pair.")
    parser.add_argument("--head_scale", type=float, default=40.0, help="Output head multiplier (sharper logits).")
    parser.add_argument("--num_problems", type=int, default=400, help="Test problems per zoo task.")
    parser.add_argument("--batch_size", type=int, default=200, help="Prompts per pipeline call (quality).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=RESULTS)
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.from_results is None and args.fast_dllm_repo is None:
        parser.error("--fast_dllm_repo is required (a local checkout of NVlabs/Fast-dLLM).")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------------


def llada_config(args) -> dict:
    """LLaDA-8B's config.json keys at a reduced width: 8 layers of 512 (8 heads of 64), SwiGLU 1536 (LLaDA's 3x),
    a 32,000-token vocabulary."""
    return {
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rope": True,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "weight_tying": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "attention_dropout": 0.0,
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "flash_attention": False,
        "alibi": False,
        "block_group_size": 1,
        "init_device": "cpu",
        "d_model": 512,
        "n_heads": 8,
        "n_kv_heads": 8,
        "n_layers": 8,
        "mlp_hidden_size": 1536,
        "vocab_size": 32000,
        "embedding_size": 32000,
        "max_sequence_length": args.prompt_length + args.long_gen_length,
        "mask_token_id": MASK_ID,
        "eos_token_id": 1,
        "pad_token_id": 1,
    }


def build_model(args):
    from diffusers_ext import LLaDAConfig, LLaDAModelLM

    torch.manual_seed(args.seed)
    model = LLaDAModelLM(LLaDAConfig(**llada_config(args))).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(args.head_scale)
    return model


def pipeline(model, preset: str, args, **overrides):
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset(preset, block_length=args.block_length, **overrides))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_pipe(pipe, prompt, gen_length, args, cache):
    """`(seconds, sequences, nfe)` of one decode of `prompt` `(1, P)`."""
    start = time.perf_counter()
    out = pipe(
        input_ids=prompt,
        gen_length=gen_length,
        block_length=args.block_length,
        num_inference_steps=gen_length,
        mask_token_id=MASK_ID,
        eos_early_stop=False,
        output_type="seq",
        cache=cache,
    )
    return time.perf_counter() - start, out.sequences, int(out.nfe[0])


def run_reference(function, model, prompt, gen_length, args, threshold=None):
    """`(seconds, sequences, nfe)` of Fast-dLLM's `function` on the published model."""
    from diffusers_ext.evaluation.fast_dllm_reference import CountedForwards

    counted = CountedForwards(model)
    start = time.perf_counter()
    with torch.no_grad():
        x, nfe = function(
            counted,
            prompt,
            steps=gen_length,
            gen_length=gen_length,
            block_length=args.block_length,
            temperature=0.0,
            remasking="low_confidence",
            mask_id=MASK_ID,
            threshold=threshold,
        )
    return time.perf_counter() - start, x[:, prompt.shape[1] :], int(nfe)


def alternate(arms: dict, repetitions: int) -> dict:
    """Run each arm `repetitions` times, the order rotating each repetition; `{name: [(seconds, seq, nfe)...]}`."""
    names = list(arms)
    runs = {name: [] for name in names}
    for rep in range(repetitions):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            runs[name].append(arms[name]())
            print(f"  rep {rep} {name}: {runs[name][-1][0]:.2f} s, NFE {runs[name][-1][2]}", file=sys.stderr)
    return runs


def summarise_arm(runs) -> dict:
    seconds = [r[0] for r in runs]
    return {"seconds": seconds, "total_seconds": sum(seconds), "nfe": runs[0][2]}


def same_tokens(a, b) -> bool:
    return bool(torch.equal(a, b))


def measure_speed(args) -> dict:
    from diffusers_ext.evaluation.fast_dllm_reference import load_fast_dllm, published_model

    fast_dllm = load_fast_dllm(args.fast_dllm_repo)
    model = build_model(args)
    reference = published_model(fast_dllm, "llada", llada_config(args), model)
    prompt = torch.randint(2, 31000, (1, args.prompt_length), generator=torch.Generator().manual_seed(args.seed))
    gen = args.gen_length
    greedy = pipeline(model, "llada", args)
    threshold = pipeline(model, "fast-dllm", args, confidence_threshold=THRESHOLD)
    generate = fast_dllm.generate

    print("1. prefix cache vs uncached greedy (and the dual cache, for the growth)", file=sys.stderr)
    runs = alternate(
        {
            "uncached": lambda: run_pipe(greedy, prompt, gen, args, None),
            "prefix": lambda: run_pipe(greedy, prompt, gen, args, "prefix"),
            "dual": lambda: run_pipe(greedy, prompt, gen, args, "dual"),
        },
        args.repetitions,
    )
    fast_prefix = run_reference(generate.generate_with_prefix_cache, reference, prompt, gen, args)
    fast_dual_greedy = run_reference(generate.generate_with_dual_cache, reference, prompt, gen, args)
    greedy_part = {
        name: {**summarise_arm(r), "tokens_equal_first_run": all(same_tokens(x[1], r[0][1]) for x in r)}
        for name, r in runs.items()
    }
    greedy_part["prefix"]["tokens_equal_fast_dllm"] = same_tokens(runs["prefix"][0][1], fast_prefix[1])
    greedy_part["prefix"]["fast_dllm_nfe"] = fast_prefix[2]
    greedy_part["dual"]["tokens_equal_fast_dllm"] = same_tokens(runs["dual"][0][1], fast_dual_greedy[1])
    greedy_part["uncached"]["tokens_equal_prefix"] = same_tokens(runs["uncached"][0][1], runs["prefix"][0][1])

    print("2. dual cache + threshold vs Fast-dLLM's dual-cache threshold generate", file=sys.stderr)
    dual_runs = alternate(
        {
            "package": lambda: run_pipe(threshold, prompt, gen, args, "dual"),
            "fast_dllm": lambda: run_reference(
                generate.generate_with_dual_cache, reference, prompt, gen, args, THRESHOLD
            ),
        },
        args.repetitions,
    )
    dual_part = {name: summarise_arm(r) for name, r in dual_runs.items()}
    dual_part["tokens_equal"] = same_tokens(dual_runs["package"][0][1], dual_runs["fast_dllm"][0][1])

    print("3. cost growth at the long generation length", file=sys.stderr)
    long = args.long_gen_length
    long_runs = alternate(
        {
            "uncached": lambda: run_pipe(greedy, prompt, long, args, None),
            "dual": lambda: run_pipe(greedy, prompt, long, args, "dual"),
        },
        1,
    )
    growth = {}
    for name in ("uncached", "dual"):
        short_per_token = greedy_part[name]["total_seconds"] / args.repetitions / gen
        long_per_token = long_runs[name][0][0] / long
        growth[name] = {
            "seconds_per_token_short": short_per_token,
            "seconds_per_token_long": long_per_token,
            "growth": long_per_token / short_per_token,
            "nfe_long": long_runs[name][0][2],
        }

    # the bytes the dual cache holds for this model, against the formula used for LLaDA-8B / Dream-7B below
    from diffusers_ext.pipelines.diffusion_lm.kv_cache import DiffusionLMKVCache

    config = model.config
    store = DiffusionLMKVCache("dual", "cache")
    with torch.no_grad():
        store.logits(
            greedy.adapter,
            model,
            torch.cat([prompt, torch.full((1, gen), MASK_ID)], 1),
            torch.ones(1, args.prompt_length + gen, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
            torch.where(torch.arange(args.prompt_length + gen) >= args.prompt_length, 0, -1),
            args.prompt_length + args.block_length,
        )
    held = sum(t.numel() * t.element_size() for t in store.keys + store.values)
    formula = cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim, args.prompt_length + gen, 4)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "greedy": greedy_part,
        "dual_threshold": dual_part,
        "growth": growth,
        "cache_bytes_held": held,
        "cache_bytes_formula": formula,
    }


def cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, bytes_per_value: int) -> int:
    """Keys and values of every layer and position for one sequence: `2 * layers * kv_heads * head_dim * tokens`
    values."""
    return 2 * layers * kv_heads * head_dim * tokens * bytes_per_value


def memory_table() -> dict:
    return {
        name: {
            **shape,
            "tokens": MEMORY_TOKENS,
            "bf16_bytes": cache_bytes(shape["layers"], shape["kv_heads"], shape["head_dim"], MEMORY_TOKENS, 2),
        }
        for name, shape in PUBLISHED.items()
    }


# ---------------------------------------------------------------------------------------------------------------------
# quality on the zoo's test beds
# ---------------------------------------------------------------------------------------------------------------------


def decode_accuracy(pipe, prompts, judge, gen_length, block_length, cache, batch_size):
    correct, nfe = [], []
    for i in range(0, len(prompts), batch_size):
        out = pipe(
            input_ids=prompts[i : i + batch_size],
            gen_length=gen_length,
            block_length=block_length,
            num_inference_steps=gen_length,
            eos_early_stop=False,
            output_type="seq",
            cache=cache,
        )
        correct.append(judge(out.sequences, i))
        nfe.append(out.nfe)
    return torch.cat(correct).float(), torch.cat(nfe).float()


def measure_quality(args) -> dict:
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler, zoo
    from diffusers_ext.data.addition import AdditionTokens, draw_test_problems
    from diffusers_ext.data.sudoku import SudokuTokens, sudoku_problems
    from diffusers_ext.evaluation.protocol import paired_difference

    tasks = {}
    pipe = DiffusionLMPipeline.from_pretrained(zoo.path("addition-mdm"))
    encoder = AdditionTokens(pipe.tokenizer, num_digits=3)
    pairs = draw_test_problems(args.num_problems, num_digits=3, seed=args.seed + 1)
    answers = encoder.answers(pairs)
    tasks["addition-mdm"] = (
        pipe,
        encoder.prompts(pairs),
        encoder.gen_length,
        4,
        lambda s, i: (s == answers[i : i + len(s)]).all(1),
    )
    pipe = DiffusionLMPipeline.from_pretrained(zoo.path("sudoku-mdm"))
    pipe.model.to(torch.float32)
    encoder = SudokuTokens(pipe.tokenizer)
    puzzles, _ = sudoku_problems(args.num_problems, "test", seed=args.seed, min_givens=13)
    sudoku_encoder = encoder
    tasks["sudoku-mdm"] = (
        pipe,
        encoder.prompts(puzzles),
        encoder.gen_length,
        12,
        lambda s, i: sudoku_encoder.solved(s, puzzles[i : i + len(s)]),
    )
    results = {}
    for task, (pipe, prompts, gen_length, block_length, judge) in tasks.items():
        pipe.set_progress_bar_config(disable=True)
        pipe.scheduler = SOARScheduler.from_preset("llada", block_length=block_length)
        runs = {}
        for cache in (None, "prefix", "dual"):
            correct, nfe = decode_accuracy(pipe, prompts, judge, gen_length, block_length, cache, args.batch_size)
            runs[cache or "uncached"] = {
                "correct": correct.tolist(),
                "accuracy": correct.mean().item(),
                "nfe": nfe.mean().item(),
            }
            print(
                f"  {task} {cache}: accuracy {correct.mean().item():.4f}, NFE {nfe.mean().item():.1f}", file=sys.stderr
            )
        for cache in ("prefix", "dual"):
            runs[cache]["difference"] = paired_difference(runs[cache]["correct"], runs["uncached"]["correct"])
        results[task] = {
            "gen_length": gen_length,
            "block_length": block_length,
            "num_problems": len(prompts),
            "runs": runs,
        }
    return results


# ---------------------------------------------------------------------------------------------------------------------
# targets and report
# ---------------------------------------------------------------------------------------------------------------------


def cache_targets(summary: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    speed, settings = summary["speed"], summary["settings"]
    greedy, dual, growth = speed["greedy"], speed["dual_threshold"], speed["growth"]
    short, long = settings["gen_length"], settings["long_gen_length"]
    rows = [
        target(
            f"prefix cache / uncached greedy decode, wall time (gen {short})",
            greedy["prefix"]["total_seconds"] / greedy["uncached"]["total_seconds"],
            PREFIX_RATIO_TARGET,
            "<=",
        ),
        target(
            "prefix cache: tokens equal Fast-dLLM's generate_with_prefix_cache",
            float(greedy["prefix"]["tokens_equal_fast_dllm"]),
            1.0,
            ">=",
        ),
        target(
            "dual cache + threshold 0.9 / Fast-dLLM's dual-cache threshold generate, wall time",
            dual["package"]["total_seconds"] / dual["fast_dllm"]["total_seconds"],
            DUAL_RATIO_TARGET,
            "<=",
        ),
        target("dual cache + threshold 0.9: tokens equal Fast-dLLM's", float(dual["tokens_equal"]), 1.0, ">="),
        target(
            "dual cache + threshold 0.9: NFE equal Fast-dLLM's",
            float(dual["package"]["nfe"] == dual["fast_dllm"]["nfe"]),
            1.0,
            ">=",
        ),
        target(
            f"dual cache's per-token cost growth (gen {long} / gen {short}) / the uncached decode's",
            growth["dual"]["growth"] / growth["uncached"]["growth"],
            GROWTH_FRACTION_TARGET,
            "<=",
        ),
    ]
    for task, record in summary["quality"].items():
        for cache in ("prefix", "dual"):
            run = record["runs"][cache]
            rows.append(
                target(
                    f"{task}: |accuracy with the {cache} cache - uncached| (greedy, equal NFE)",
                    abs(run["accuracy"] - record["runs"]["uncached"]["accuracy"]),
                    ACCURACY_GAP_TARGET,
                    "<=",
                )
            )
    return rows


def report_sections(result: dict) -> list[str]:
    summary = result["summary"]
    speed = summary["speed"]
    greedy, dual, growth = speed["greedy"], speed["dual_threshold"], speed["growth"]
    reps = len(greedy["uncached"]["seconds"])
    lines = [
        "## Speed (one process, alternating order)",
        "",
        f"Native `LLaDAModelLM` at the LLaDA architecture, {speed['parameters'] / 1e6:.1f}M parameters, random weights "
        f"(output head x{summary['settings']['head_scale']:g}), {summary['settings']['prompt_length']}-token prompt, "
        f"block {summary['settings']['block_length']}; {reps} repetitions.",
        "",
        f"| decode (gen {summary['settings']['gen_length']}) | seconds per decode | NFE |",
        "| --- | --- | --- |",
    ]
    for name in ("uncached", "prefix", "dual"):
        arm = greedy[name]
        lines.append(f"| greedy, {name} | {arm['total_seconds'] / reps:.2f} | {arm['nfe']} |")
    for name, label in (
        ("package", "pipeline, dual cache, threshold 0.9"),
        ("fast_dllm", "Fast-dLLM generate_with_dual_cache, threshold 0.9"),
    ):
        arm = dual[name]
        lines.append(f"| {label} | {arm['total_seconds'] / reps:.2f} | {arm['nfe']} |")
    lines += [
        "",
        f"Tokens: prefix cache = Fast-dLLM's prefix-cache generate: {greedy['prefix']['tokens_equal_fast_dllm']}; dual "
        f"cache (greedy) = Fast-dLLM's dual-cache generate: {greedy['dual']['tokens_equal_fast_dllm']}; dual + threshold "
        f"= Fast-dLLM's: {dual['tokens_equal']}; the uncached greedy decode = the prefix-cached one: "
        f"{greedy['uncached']['tokens_equal_prefix']} (the cache is an approximation).",
        "",
        f"| cost growth | seconds per token, gen {summary['settings']['gen_length']} | gen "
        f"{summary['settings']['long_gen_length']} | growth |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("uncached", "dual"):
        g = growth[name]
        lines.append(
            f"| {name} | {g['seconds_per_token_short']:.4f} | {g['seconds_per_token_long']:.4f} | {g['growth']:.2f}x |"
        )
    lines += ["", "## Accuracy on the zoo's test beds (greedy, one token per step)", ""]
    lines += [
        "| task | blocks | uncached | prefix (diff, paired SE) | dual (diff, paired SE) | NFE |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for task, record in summary["quality"].items():
        runs = record["runs"]
        cells = [
            f"{runs[c]['accuracy']:.4f} ({runs[c]['difference']['difference']:+.4f}, {runs[c]['difference']['sem']:.4f})"
            for c in ("prefix", "dual")
        ]
        lines.append(
            f"| {task} ({record['num_problems']} problems) | {record['gen_length'] // record['block_length']} of "
            f"{record['block_length']} | {runs['uncached']['accuracy']:.4f} | {cells[0]} | {cells[1]} | "
            f"{runs['uncached']['nfe']:.0f} |"
        )
    lines += ["", f"## Cache memory at {MEMORY_TOKENS} tokens (computed, bf16, one sequence)", ""]
    lines += ["| model | layers x key/value heads x head dim | bytes | GiB |", "| --- | --- | --- | --- |"]
    for name, row in summary["memory"].items():
        lines.append(
            f"| {name} | {row['layers']} x {row['kv_heads']} x {row['head_dim']} | {row['bf16_bytes']:,} | "
            f"{row['bf16_bytes'] / 2**30:.3f} |"
        )
    lines += [
        "",
        f"The formula `2 x layers x kv_heads x head_dim x tokens x bytes` gives {speed['cache_bytes_formula']:,} bytes for "
        f"the model measured here at {summary['settings']['prompt_length'] + summary['settings']['gen_length']} tokens "
        f"(float32); its dual cache held {speed['cache_bytes_held']:,}.",
    ]
    return lines


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import checkout_commit, command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        result = rebuild_results(args.from_results, lambda r: cache_targets(r["summary"]), rel_to=REPO)
    else:
        start = time.perf_counter()
        summary = {
            "settings": {
                k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "fast_dllm_repo")
            },
            "memory": memory_table(),
        }
        summary["speed"] = measure_speed(args)
        summary["quality"] = measure_quality(args)
        summary["sanity"] = {
            "cache_bytes_formula_matches": summary["speed"]["cache_bytes_held"]
            == summary["speed"]["cache_bytes_formula"],
            "wall_seconds": time.perf_counter() - start,
        }
        summary["targets"] = cache_targets(summary)
        result = {
            "command": command(__file__, argv, omit=("--output_dir", "--fast_dllm_repo")),
            "references": {"NVlabs/Fast-dLLM": checkout_commit(args.fast_dllm_repo)},
            "machine": {
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "platform": platform.platform(),
            },
            "summary": summary,
        }
    machine = result["machine"]
    write_results(
        os.path.join(args.output_dir, "diffusion_lm_cache"),
        result,
        "Prefix and dual KV caches of DiffusionLMPipeline",
        report_sections(result),
        settings_line=f"CPU, float32, {machine['torch_threads']} torch threads; Fast-dLLM @ "
        f"`{result['references']['NVlabs/Fast-dLLM']}`.",
    )
    return result


if __name__ == "__main__":
    main()
