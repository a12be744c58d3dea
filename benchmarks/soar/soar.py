#!/usr/bin/env python
"""Measure SOAR against the standard masked-diffusion-LM decoders, on a test bed with measured headroom.

    python benchmarks/soar/soar.py

One process, the same puzzles and seeds for every decoder:

1. **Sudoku test bed** (`diffusers_ext/zoo/sudoku-mdm`, 6x6 sudoku completion, puzzles with one solution whose
   solution grids are held out of training). First the headroom on the validation split: (a) the fraction of
   puzzles some decoding order solves (`oracle_order_search`) and (b) the accuracy of a wide position beam search
   under SOAR's own score. Then every choice on the validation split: the SOAR setting (threshold, beam, cap on
   parallel tokens) is the most accurate whose NFE is at most 60% of greedy's; the threshold baseline is the
   whole curve of its thresholds. Then the test split, once, with the frozen choices. A puzzle counts as solved
   when the decoded grid is a valid sudoku keeping its givens (the judge needs no model).
2. **Negative case** (`diffusers_ext/zoo/addition-mdm`, 3-digit addition): the same two headroom diagnostics, to
   show why search cannot win there: some order solves most problems, but the search objective prefers wrong ones.
3. **Oracle Markov chains** (training-free; exact marginals) and **decoder overhead** (a ~10M bidirectional Llama),
   as before.

Writes `benchmarks/soar/results/soar.json`, `soar.md` and `soar.png`; `summary` holds the issue's keys and `targets`.
"""

import argparse
import json
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
SOAR_TAUS = (0.9, 0.95, 0.99)
SOAR_BEAMS = (2, 4)
SOAR_CAPS = (2, 5)
WIDE_BEAM = 8  # headroom (b): position beam search under SOAR's score with this beam
ORACLE_BEAM = 4  # headroom (a): answer-guided order search beam
NFE_BUDGET = 0.6  # SOAR must use at most this fraction of greedy's NFE


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", type=str, default=None, help="Sudoku pipeline folder; default: the zoo.")
    parser.add_argument("--num_validation", type=int, default=150, help="Validation puzzles.")
    parser.add_argument("--num_test", type=int, default=400, help="Test puzzles.")
    parser.add_argument(
        "--min_givens",
        type=int,
        default=13,
        help="Stop blanking at this many givens (0: minimal puzzles, ~10 givens); 13 was chosen on validation "
        "puzzles as the difficulty where greedy decoding is neither hopeless nor saturated.",
    )
    parser.add_argument("--addition_problems", type=int, default=400, help="Addition problems (negative case).")
    parser.add_argument("--batch_size", type=int, default=300, help="Prompts per pipeline call.")
    parser.add_argument("--oracle_chains", type=int, default=300, help="Random Markov chains (one prompt each).")
    parser.add_argument("--oracle_states", type=int, default=6, help="States per chain.")
    parser.add_argument("--oracle_length", type=int, default=16, help="Decoded length on the oracle.")
    parser.add_argument("--oracle_concentration", type=float, default=1.0, help="Dirichlet concentration.")
    parser.add_argument("--overhead_prompts", type=int, default=8, help="Prompts of the overhead measurement.")
    parser.add_argument("--overhead_gen_length", type=int, default=64, help="Generated tokens, overhead run.")
    parser.add_argument("--skip_extras", action="store_true", help="Skip the oracle chains and the overhead run.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the puzzle draws and the oracle chains.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where soar.json/.md/.png go.")
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    for name in ("num_validation", "num_test", "addition_problems", "batch_size", "oracle_chains"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    return args


def decode(pipe, scheduler, prompts, gen_length, steps, batch_size):
    """Decode `prompts` with `scheduler`; returns sequences, per-prompt NFE and row forwards, and seconds."""
    pipe.scheduler = scheduler
    sequences, nfe, row_forwards = [], [], []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        out = pipe(
            input_ids=prompts[i : i + batch_size],
            gen_length=gen_length,
            block_length=gen_length,
            num_inference_steps=steps or gen_length,
            eos_early_stop=False,
            output_type="seq",
        )
        sequences.append(out.sequences)
        nfe.append(out.nfe)
        row_forwards.append(out.row_forwards)
    seconds = time.perf_counter() - start
    return torch.cat(sequences), torch.cat(nfe).float(), torch.cat(row_forwards).float(), seconds


def scheduler_for(config: dict, gen_length: int):
    from diffusers_ext import SOARScheduler

    config = dict(config)
    preset = config.pop("preset", None)
    if preset is not None:
        return SOARScheduler.from_preset(preset, **{"block_length": gen_length, **config})
    return SOARScheduler(block_length=gen_length, **config)


def run_methods(pipe, methods, prompts, judge, gen_length, batch_size, label):
    rows = []
    for method in methods:
        sequences, nfe, row_forwards, seconds = decode(
            pipe, scheduler_for(method["config"], gen_length), prompts, gen_length, method.get("steps"), batch_size
        )
        correct = judge(sequences).float()
        rows.append(
            {
                **{k: method[k] for k in ("name", "family", "config")},
                "num_inference_steps": method.get("steps") or gen_length,
                "accuracy": correct.mean().item(),
                "accuracy_stderr": (correct.std() / len(correct) ** 0.5).item() if len(correct) > 1 else 0.0,
                "nfe": nfe.mean().item(),
                "row_forwards": row_forwards.mean().item(),
                "seconds": seconds,
            }
        )
        r = rows[-1]
        print(
            f"[{label}] {r['name']:>40}: acc {r['accuracy']:.4f} nfe {r['nfe']:.2f} rows {r['row_forwards']:.1f} "
            f"{seconds:.0f}s",
            flush=True,
        )
    return rows


def greedy_methods(gen_length):
    return [
        {"name": f"greedy steps={s}", "family": "greedy", "config": {}, "steps": s}
        for s in sorted({gen_length, gen_length // 2, gen_length // 4}, reverse=True)
    ]


def threshold_methods():
    return [
        {"name": f"threshold tau={t:g}", "family": "threshold", "config": {"confidence_threshold": t}}
        for t in THRESHOLDS
    ]


def soar_grid():
    return [
        {
            "name": f"SOAR tau={t:g} beam={b} max_parallel={c}",
            "family": "soar",
            "config": {"confidence_threshold": t, "max_beam_size": b, "max_parallel_tokens": c},
        }
        for t in SOAR_TAUS
        for b in SOAR_BEAMS
        for c in SOAR_CAPS
    ]


def preset_methods():
    return [
        {"name": "SOAR preset llada", "family": "soar-preset", "config": {"preset": "soar-llada"}},
        {"name": "SOAR preset dream", "family": "soar-preset", "config": {"preset": "soar-dream"}},
    ]


def pbs_methods(beams=(2,)):
    return [{"name": f"PBS beam={b}", "family": "pbs", "config": {"max_beam_size": b}} for b in beams]


def oracle_methods(gen_length):
    return greedy_methods(gen_length) + threshold_methods() + pbs_methods() + preset_methods()


def logits_fn_of(pipe):
    def logits_fn(x):
        return pipe.adapter(pipe.model, x, torch.ones_like(x))

    return logits_fn


def headroom(pipe, prompts, answers, judge, gen_length, batch_size, label):
    """(a) answer-guided order search, (b) wide position beam search under SOAR's score; with greedy beside."""
    from diffusers_ext.evaluation.soar_headroom import oracle_order_search

    mask_id = pipe.resolve_mask_token_id()
    start = time.perf_counter()
    any_order = oracle_order_search(logits_fn_of(pipe), prompts, answers, mask_id, beam_size=ORACLE_BEAM)
    seconds = time.perf_counter() - start
    wide = run_methods(pipe, pbs_methods((WIDE_BEAM,)), prompts, judge, gen_length, batch_size, label)[0]
    greedy = run_methods(pipe, greedy_methods(gen_length)[:1], prompts, judge, gen_length, batch_size, label)[0]
    print(
        f"[{label}] headroom: some order {any_order.float().mean():.4f}, score search {wide['accuracy']:.4f}, "
        f"greedy {greedy['accuracy']:.4f}",
        flush=True,
    )
    return {
        "any_order_solves": any_order.float().mean().item(),
        "any_order_beam": ORACLE_BEAM,
        "any_order_seconds": seconds,
        "score_search_accuracy": wide["accuracy"],
        "score_search_beam": WIDE_BEAM,
        "score_search_run": wide,
        "greedy_accuracy": greedy["accuracy"],
    }


def choose_soar(validation_runs, greedy_nfe):
    """The most accurate SOAR grid setting within the NFE budget (ties: fewer NFE, then grid order)."""
    within = [r for r in validation_runs if r["family"] == "soar" and r["nfe"] <= NFE_BUDGET * greedy_nfe]
    pool = within or [r for r in validation_runs if r["family"] == "soar"]
    return max(pool, key=lambda r: (r["accuracy"], -r["nfe"]))


def run_sudoku(args) -> dict:
    from diffusers_ext import DiffusionLMPipeline, zoo
    from diffusers_ext.data.sudoku import SudokuTokens, sudoku_problems

    pipe = DiffusionLMPipeline.from_pretrained(args.model_path or zoo.path("sudoku-mdm"))
    pipe.model.to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    encoder = SudokuTokens(pipe.tokenizer)
    gen_length = encoder.gen_length
    start = time.perf_counter()
    splits = {}
    for split, count in (("validation", args.num_validation), ("test", args.num_test)):
        puzzles, solutions = sudoku_problems(count, split, seed=args.seed, min_givens=args.min_givens)
        splits[split] = (puzzles, solutions)
    print(f"puzzles drawn in {time.perf_counter() - start:.0f}s", flush=True)

    def judge_for(puzzles):
        return lambda sequences: encoder.solved(sequences, puzzles)

    # validation: headroom, then every choice
    puzzles, solutions = splits["validation"]
    prompts, answers = encoder.prompts(puzzles), encoder.answers(solutions)
    judge = judge_for(puzzles)
    room = headroom(pipe, prompts, answers, judge, gen_length, args.batch_size, "sudoku/validation")
    validation = run_methods(
        pipe,
        greedy_methods(gen_length)[:1] + soar_grid(),
        prompts,
        judge,
        gen_length,
        args.batch_size,
        "sudoku/validation",
    )
    greedy_val = validation[0]
    chosen = choose_soar(validation, greedy_val["nfe"])
    pll_config = {**chosen["config"], "beam_score": "pll"}
    validation += run_methods(
        pipe,
        [{"name": chosen["name"] + " +PLL", "family": "soar-pll", "config": pll_config}],
        prompts,
        judge,
        gen_length,
        args.batch_size,
        "sudoku/validation",
    )

    # test, once, with the frozen choices
    puzzles, solutions = splits["test"]
    prompts = encoder.prompts(puzzles)
    judge = judge_for(puzzles)
    test_methods = (
        greedy_methods(gen_length)
        + threshold_methods()
        + pbs_methods((2,))
        + [{"name": chosen["name"], "family": "soar", "config": chosen["config"]}]
        + [{"name": chosen["name"] + " +PLL", "family": "soar-pll", "config": pll_config}]
        + preset_methods()
    )
    test = run_methods(pipe, test_methods, prompts, judge, gen_length, args.batch_size, "sudoku/test")
    givens = (puzzles > 0).sum(1).float()
    return {
        "task": "6x6 sudoku completion (zoo sudoku-mdm)",
        "gen_length": gen_length,
        "num_validation": args.num_validation,
        "num_test": args.num_test,
        "min_givens": args.min_givens,
        "mean_givens_test": givens.mean().item(),
        "headroom_validation": room,
        "validation_runs": validation,
        "chosen_soar": {
            "name": chosen["name"],
            "config": chosen["config"],
            "validation_accuracy": chosen["accuracy"],
            "validation_nfe": chosen["nfe"],
            "rule": f"most accurate SOAR grid setting with NFE <= {NFE_BUDGET} x greedy's on validation",
        },
        "test_runs": test,
    }


def run_addition(args) -> dict:
    from diffusers_ext import DiffusionLMPipeline, zoo
    from diffusers_ext.data.addition import AdditionTokens, draw_test_problems

    pipe = DiffusionLMPipeline.from_pretrained(zoo.path("addition-mdm"))
    pipe.set_progress_bar_config(disable=True)
    encoder = AdditionTokens(pipe.tokenizer, num_digits=3)
    pairs = draw_test_problems(args.addition_problems, num_digits=3, seed=args.seed + 1)
    prompts, answers = encoder.prompts(pairs), encoder.answers(pairs)

    def judge(sequences):
        return (sequences == answers).all(1)

    room = headroom(pipe, prompts, answers, judge, encoder.gen_length, args.batch_size, "addition")
    runs = run_methods(
        pipe,
        [{"name": "SOAR preset llada", "family": "soar-preset", "config": {"preset": "soar-llada"}}]
        + [
            {
                "name": "SOAR preset llada +PLL",
                "family": "soar-pll",
                "config": {"preset": "soar-llada", "beam_score": "pll"},
            }
        ],
        prompts,
        judge,
        encoder.gen_length,
        args.batch_size,
        "addition",
    )
    return {"task": "3-digit addition (zoo addition-mdm)", "num_problems": len(pairs), "headroom": room, "runs": runs}


class ForwardTimer:
    """Wall time spent inside a module's forward calls (pre/post hooks)."""

    def __init__(self, module):
        self.seconds, self._start = 0.0, None
        self._handles = [
            module.register_forward_pre_hook(self._before),
            module.register_forward_hook(self._after),
        ]

    def _before(self, module, args):
        self._start = time.perf_counter()

    def _after(self, module, args, output):
        self.seconds += time.perf_counter() - self._start

    def remove(self):
        for handle in self._handles:
            handle.remove()


def run_oracle(args) -> dict:
    from diffusers_ext import DiffusionLMPipeline
    from diffusers_ext.evaluation.soar import MarkovChainOracleLM

    oracle = MarkovChainOracleLM.random(
        args.oracle_chains, args.oracle_states, concentration=args.oracle_concentration, seed=args.seed
    )
    first = torch.multinomial(oracle.initial.float(), 1, generator=torch.Generator().manual_seed(args.seed))
    prompts = torch.cat([oracle.chain_token(torch.arange(args.oracle_chains)).unsqueeze(1), first], dim=1)
    gen_length = args.oracle_length - 1  # the first state is the prompt
    pipe = DiffusionLMPipeline(oracle, _oracle_scheduler())
    pipe.set_progress_bar_config(disable=True)
    rows = []
    for method in oracle_methods(gen_length):
        sequences, nfe, row_forwards, seconds = decode(
            pipe, scheduler_for(method["config"], gen_length), prompts, gen_length, method.get("steps"), len(prompts)
        )
        loglik = oracle.joint_log_likelihood(torch.cat([prompts, sequences], dim=1))
        rows.append(
            {
                **{k: method[k] for k in ("name", "family", "config")},
                "num_inference_steps": method.get("steps") or gen_length,
                "mean_joint_loglik": loglik.mean().item(),
                "nfe": nfe.mean().item(),
                "row_forwards": row_forwards.mean().item(),
                "seconds": seconds,
            }
        )
    masked = torch.cat([prompts, torch.full((len(prompts), gen_length), oracle.config.mask_token_id)], dim=1)
    viterbi = oracle.joint_log_likelihood(oracle.viterbi(masked)).mean().item()
    return {
        "num_chains": args.oracle_chains,
        "num_states": args.oracle_states,
        "length": args.oracle_length,
        "concentration": args.oracle_concentration,
        "viterbi_mean_joint_loglik": viterbi,
        "runs": rows,
    }


def _oracle_scheduler():
    from diffusers_ext import SOARScheduler

    return SOARScheduler()


def run_overhead(args) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from diffusers_ext import DiffusionLMPipeline, SOARScheduler
    from diffusers_ext.models.tiny_tokenizers import get_tiny_lm_tokenizer

    tokenizer = get_tiny_lm_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=320,
        intermediate_size=1280,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
        use_cache=False,
        is_causal=False,
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).eval()
    parameters = sum(p.numel() for p in model.parameters())
    # a sharper head than at initialisation, so that both SOAR branches run (confident and unsure positions)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    scheduler = SOARScheduler.from_preset("soar-llada", block_length=32)
    pipe = DiffusionLMPipeline(model, scheduler, tokenizer)
    pipe.set_progress_bar_config(disable=True)
    prompts = [f"question {i}: what is {i} + {2 * i}?" for i in range(args.overhead_prompts)]
    kwargs = {"gen_length": args.overhead_gen_length, "eos_early_stop": False, "output_type": "seq"}
    pipe(prompt=prompts[:1], **{**kwargs, "gen_length": 32})  # warm-up
    timer = ForwardTimer(model)
    start = time.perf_counter()
    out = pipe(prompt=prompts, **kwargs)
    total = time.perf_counter() - start
    timer.remove()
    return {
        "parameters": parameters,
        "prompts": len(prompts),
        "gen_length": args.overhead_gen_length,
        "nfe": out.nfe.float().mean().item(),
        "row_forwards": out.row_forwards.float().mean().item(),
        "decode_seconds": total,
        "forward_seconds": timer.seconds,
        "overhead_fraction": (total - timer.seconds) / total,
    }


def interpolate_accuracy(runs: list[dict], nfe: float) -> float:
    """Accuracy of a family's NFE-accuracy curve at `nfe` (linear between settings, clamped at the ends)."""
    points = sorted((r["nfe"], r["accuracy"]) for r in runs)
    if nfe <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= nfe <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (nfe - x0) / (x1 - x0)
    return points[-1][1]


def test_runs_of(sudoku) -> tuple[dict, dict, float]:
    """`(greedy, chosen SOAR, threshold accuracy at SOAR's NFE)` of the sudoku test split."""
    runs = {r["name"]: r for r in sudoku["test_runs"]}
    greedy = runs[f"greedy steps={sudoku['gen_length']}"]
    soar = runs[sudoku["chosen_soar"]["name"]]
    thresholds = [r for r in sudoku["test_runs"] if r["family"] == "threshold"]
    return greedy, soar, interpolate_accuracy(thresholds, soar["nfe"])


def sudoku_targets(sudoku) -> list[dict]:
    """The computed targets, from the sudoku test runs."""
    from diffusers_ext.evaluation.protocol import target

    greedy, soar, threshold_at = test_runs_of(sudoku)
    return [
        target("soar_accuracy >= greedy_full_accuracy + 0.02", soar["accuracy"], greedy["accuracy"] + 0.02),
        target("soar_nfe <= 0.6 x greedy_full_nfe", soar["nfe"], NFE_BUDGET * greedy["nfe"], "<="),
        target("soar_accuracy >= threshold_accuracy_at_soar_nfe + 0.01", soar["accuracy"], threshold_at + 0.01),
    ]


def summarise(sudoku, addition, oracle, overhead) -> dict:
    runs = {r["name"]: r for r in sudoku["test_runs"]}
    greedy, soar, threshold_at = test_runs_of(sudoku)
    pll = runs[sudoku["chosen_soar"]["name"] + " +PLL"]
    pbs = runs["PBS beam=2"]
    room = sudoku["headroom_validation"]
    summary = {
        "task": sudoku["task"],
        "greedy_full_accuracy": greedy["accuracy"],
        "greedy_full_nfe": greedy["nfe"],
        "soar_setting": sudoku["chosen_soar"]["name"],
        "soar_accuracy": soar["accuracy"],
        "soar_accuracy_stderr": soar["accuracy_stderr"],
        "soar_nfe": soar["nfe"],
        "soar_row_forwards": soar["row_forwards"],
        "greedy_full_row_forwards": greedy["row_forwards"],
        "threshold_accuracy_at_soar_nfe": threshold_at,
        "pbs_accuracy": pbs["accuracy"],
        "pbs_nfe": pbs["nfe"],
        "pbs_row_forwards": pbs["row_forwards"],
        "pll_rescoring_accuracy": pll["accuracy"],
        "pll_rescoring_nfe": pll["nfe"],
        "pll_rescoring_row_forwards": pll["row_forwards"],
        "headroom_any_order": room["any_order_solves"],
        "headroom_score_search": room["score_search_accuracy"],
        "headroom_greedy": room["greedy_accuracy"],
        "addition_headroom_any_order": addition["headroom"]["any_order_solves"],
        "addition_headroom_score_search": addition["headroom"]["score_search_accuracy"],
        "addition_greedy": addition["headroom"]["greedy_accuracy"],
    }
    summary["targets"] = sudoku_targets(sudoku)
    sanity = {
        "headroom (b) score search > greedy on validation": room["score_search_accuracy"] > room["greedy_accuracy"],
        "headroom (a) some order solves more than greedy on validation": room["any_order_solves"]
        > room["greedy_accuracy"],
        "greedy is not saturated (accuracy < 0.98)": greedy["accuracy"] < 0.98,
        "addition fails (b): score search <= greedy": addition["headroom"]["score_search_accuracy"]
        <= addition["headroom"]["greedy_accuracy"],
    }
    if oracle is not None:
        greedy_o = next(r for r in oracle["runs"] if r["name"] == f"greedy steps={oracle['length'] - 1}")
        soar_o = next(r for r in oracle["runs"] if r["name"] == "SOAR preset llada")
        summary["oracle_loglik_greedy"] = greedy_o["mean_joint_loglik"]
        summary["oracle_loglik_soar"] = soar_o["mean_joint_loglik"]
        summary["oracle_loglik_viterbi"] = oracle["viterbi_mean_joint_loglik"]
        sanity["oracle chains: SOAR log-likelihood > greedy"] = (
            soar_o["mean_joint_loglik"] > greedy_o["mean_joint_loglik"]
        )
    if overhead is not None:
        summary["decoder_overhead_fraction"] = overhead["overhead_fraction"]
        sanity["decoder overhead <= 10%"] = overhead["overhead_fraction"] <= 0.10
    summary["sanity"] = {k: bool(v) for k, v in sanity.items()}
    return summary


def _table(runs, with_stderr=True):
    lines = ["| decoder | accuracy | NFE | row forwards | seconds |", "| --- | --- | --- | --- | --- |"]
    for r in runs:
        acc = f"{r['accuracy']:.4f}" + (f" ± {r['accuracy_stderr']:.4f}" if with_stderr else "")
        lines.append(f"| {r['name']} | {acc} | {r['nfe']:.2f} | {r['row_forwards']:.2f} | {r['seconds']:.0f} |")
    return lines


def report_sections(results) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = results["summary"]
    sudoku, addition = results["sudoku"], results["addition"]
    room = sudoku["headroom_validation"]
    lines = [
        f"## Headroom first (validation, {sudoku['num_validation']} puzzles)",
        "",
        "| test bed | some order solves (a) | wide beam under SOAR's score (b) | greedy |",
        "| --- | --- | --- | --- |",
        f"| sudoku 6x6 | {room['any_order_solves']:.4f} | {room['score_search_accuracy']:.4f} "
        f"(beam {room['score_search_beam']}) | {room['greedy_accuracy']:.4f} |",
        f"| addition (negative case) | {addition['headroom']['any_order_solves']:.4f} | "
        f"{addition['headroom']['score_search_accuracy']:.4f} | {addition['headroom']['greedy_accuracy']:.4f} |",
        "",
    ]
    lines += ["Sanity: " + ", ".join(f"{k}: {v}" for k, v in s["sanity"].items()), ""]
    lines += [f"Chosen on validation: **{sudoku['chosen_soar']['name']}** ({sudoku['chosen_soar']['rule']}).", ""]
    lines += [f"## Sudoku test split ({sudoku['num_test']} puzzles, mean {sudoku['mean_givens_test']:.1f} givens)", ""]
    lines += _table(sudoku["test_runs"])
    lines += ["", "## Sudoku validation runs", ""] + _table(sudoku["validation_runs"])
    lines += ["", f"## Addition ({addition['num_problems']} problems)", ""] + _table(addition["runs"])
    if results.get("oracle"):
        o = results["oracle"]
        lines += [
            "",
            f"## Oracle Markov chains: {o['num_chains']} chains; Viterbi {o['viterbi_mean_joint_loglik']:.4f}",
            "",
            "| decoder | mean joint log-likelihood | NFE | row forwards |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r['name']} | {r['mean_joint_loglik']:.4f} | {r['nfe']:.2f} | {r['row_forwards']:.2f} |"
            for r in o["runs"]
        ]
    if results.get("overhead"):
        v = results["overhead"]
        lines += [
            "",
            f"## Decoder overhead: {v['parameters']:,} parameters: {v['overhead_fraction']:.1%} of decoding "
            f"time outside model forwards",
        ]
    return lines


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    colors = {
        "greedy": "#555",
        "threshold": "#4a78b5",
        "pbs": "#8a5",
        "soar": "#c33",
        "soar-pll": "#e90",
        "soar-preset": "#a3c",
    }
    for ax, key, runs, title in (
        (axes[0], "nfe", results["sudoku"]["test_runs"], "sudoku test: accuracy vs NFE"),
        (axes[1], "nfe", results["sudoku"]["validation_runs"], "sudoku validation (choices made here)"),
    ):
        for family, color in colors.items():
            pts = sorted((r for r in runs if r["family"] == family), key=lambda r: r[key])
            if pts:
                ax.plot(
                    [r[key] for r in pts],
                    [r["accuracy"] for r in pts],
                    "o-" if family in ("greedy", "threshold") else "o",
                    color=color,
                    label=family,
                )
        ax.set_xlabel("NFE (forward calls per puzzle)")
        ax.set_ylabel("solved")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: sudoku_targets(r["sudoku"]), rel_to=REPO)
    else:
        torch.set_num_threads(1)
        start = time.perf_counter()
        results = {
            "command": command(__file__, argv),
            "settings": {k: v for k, v in vars(args).items() if k != "from_results"} | {"output_dir": None},
            "torch_threads": torch.get_num_threads(),
        }
        results["sudoku"] = run_sudoku(args)
        results["addition"] = run_addition(args)
        results["oracle"] = None if args.skip_extras else run_oracle(args)
        results["overhead"] = None if args.skip_extras else run_overhead(args)
        results["summary"] = summarise(results["sudoku"], results["addition"], results["oracle"], results["overhead"])
        results["seconds"] = time.perf_counter() - start
    write_results(
        os.path.join(args.output_dir, "soar"),
        results,
        "SOAR decoding benchmark",
        report_sections(results),
        figures={".png": lambda path: write_plot(results, path)},
    )
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
