#!/usr/bin/env python
"""Measure SOAR against the standard masked-diffusion-LM decoders: accuracy against NFE and wall time.

    python benchmarks/soar.py

Three parts, in one process, on the same prompts and seeds:

1. **Zoo task** (`diffusers_ext/zoo/addition-mdm`, 3-digit addition, answer most-significant digit first): exact
   match on the test split for greedy low-confidence remasking (several step budgets), Fast-dLLM thresholds,
   position beam search and SOAR settings.
2. **Oracle Markov chains** (training-free): an exact-marginal model of known random chains; the joint
   log-likelihood of each decoded sequence under its chain measures the decoder alone (Viterbi is the ceiling).
3. **Decoder overhead**: SOAR on a randomly initialised ~10M-parameter bidirectional Llama; the fraction of
   decoding wall time spent outside model forwards.

Writes `benchmarks/results/soar.json`, `soar.md` and `soar.png`.
"""

import argparse
import json
import os
import sys
import time

import torch


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# (label, scheduler config, num_inference_steps); steps None means one token per step (gen_length)
GREEDY_STEP_FRACTIONS = (1, 2, 4)  # greedy with gen_length, gen_length / 2 and gen_length / 4 steps
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
PBS_BEAMS = (2, 3)
# SOAR settings: (threshold, beam) grid, plus the configurations of the paper's LLaDA and Dream code
SOAR_SETTINGS = (
    ("SOAR tau=0.9 beam=2", {"confidence_threshold": 0.9, "max_beam_size": 2}),
    ("SOAR tau=0.8 beam=2", {"confidence_threshold": 0.8, "max_beam_size": 2}),
    ("SOAR tau=0.95 beam=2", {"confidence_threshold": 0.95, "max_beam_size": 2}),
    ("SOAR tau=0.9 beam=3", {"confidence_threshold": 0.9, "max_beam_size": 3}),
    ("SOAR tau=0.7 beam=3", {"confidence_threshold": 0.7, "max_beam_size": 3}),
    ("SOAR tau=0.9 beam=2 logprob", {"confidence_threshold": 0.9, "max_beam_size": 2, "score": "logprob"}),
    (
        "SOAR paper-LLaDA (tau=0.95 beam=2 max 5)",
        {"confidence_threshold": 0.95, "max_beam_size": 2, "max_parallel_tokens": 5},
    ),
    (
        "SOAR paper-Dream (tau=0.9 beam=2 max 5 mean)",
        {"confidence_threshold": 0.9, "max_beam_size": 2, "max_parallel_tokens": 5, "score": "mean"},
    ),
)
# the recommended default, fixed before measuring (the paper's Dream threshold and beam)
DEFAULT_SOAR = "SOAR tau=0.9 beam=2"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", type=str, default=None, help="Pipeline folder; default: the zoo entry.")
    parser.add_argument("--num_problems", type=int, default=5000, help="Test problems of the zoo task.")
    parser.add_argument("--batch_size", type=int, default=500, help="Prompts per pipeline call.")
    parser.add_argument("--oracle_chains", type=int, default=300, help="Random Markov chains (one prompt each).")
    parser.add_argument("--oracle_states", type=int, default=6, help="States per chain.")
    parser.add_argument("--oracle_length", type=int, default=16, help="Decoded length on the oracle.")
    parser.add_argument("--oracle_concentration", type=float, default=1.0, help="Dirichlet concentration.")
    parser.add_argument("--overhead_prompts", type=int, default=8, help="Prompts of the overhead measurement.")
    parser.add_argument("--overhead_gen_length", type=int, default=64, help="Generated tokens, overhead run.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the problem draw and the oracle chains.")
    parser.add_argument("--output_dir", type=str, default=RESULTS, help="Where soar.json/.md/.png go.")
    args = parser.parse_args(argv)
    for name in ("num_problems", "batch_size", "oracle_chains", "oracle_states", "oracle_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    return args


def methods(gen_length: int) -> list[dict]:
    """Every decoder of the comparison: name, family, scheduler config and step budget."""
    steps = sorted({max(1, gen_length // f) for f in GREEDY_STEP_FRACTIONS}, reverse=True)
    runs = [{"name": f"greedy steps={s}", "family": "greedy", "config": {}, "steps": s} for s in steps]
    runs += [
        {"name": f"threshold tau={t:g}", "family": "threshold", "config": {"confidence_threshold": t}, "steps": None}
        for t in THRESHOLDS
    ]
    runs += [
        {"name": f"PBS beam={b}", "family": "pbs", "config": {"max_beam_size": b}, "steps": None} for b in PBS_BEAMS
    ]
    runs.append(
        {
            "name": "PBS beam=2 logprob",
            "family": "pbs",
            "config": {"max_beam_size": 2, "score": "logprob"},
            "steps": None,
        }
    )
    runs += [{"name": name, "family": "soar", "config": config, "steps": None} for name, config in SOAR_SETTINGS]
    return runs


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


def decode(pipe, scheduler_config, block_length, prompts, gen_length, steps, batch_size):
    from diffusers_ext import SOARScheduler

    pipe.scheduler = SOARScheduler(block_length=block_length, **scheduler_config)
    sequences, nfe, row_forwards = [], [], []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        out = pipe(
            input_ids=prompts[i : i + batch_size],
            gen_length=gen_length,
            block_length=block_length,
            num_inference_steps=steps or gen_length,
            eos_early_stop=False,
            output_type="seq",
        )
        sequences.append(out.sequences)
        nfe.append(out.nfe)
        row_forwards.append(out.row_forwards)
    seconds = time.perf_counter() - start
    return torch.cat(sequences), torch.cat(nfe).float(), torch.cat(row_forwards).float(), seconds


def run_zoo_task(args) -> dict:
    from diffusers_ext import DiffusionLMPipeline, zoo
    from diffusers_ext.data.addition import AdditionTokens, draw_test_problems

    pipe = DiffusionLMPipeline.from_pretrained(args.model_path or zoo.path("addition-mdm"))
    pipe.set_progress_bar_config(disable=True)
    encoder = AdditionTokens(pipe.tokenizer, num_digits=3)
    pairs = draw_test_problems(args.num_problems, num_digits=3, seed=args.seed)
    prompts, answers = encoder.prompts(pairs), encoder.answers(pairs)
    gen_length = encoder.gen_length
    rows = []
    for method in methods(gen_length):
        sequences, nfe, row_forwards, seconds = decode(
            pipe, method["config"], gen_length, prompts, gen_length, method["steps"], args.batch_size
        )
        correct = (sequences == answers).all(1).float()
        rows.append(
            {
                **{k: method[k] for k in ("name", "family", "config")},
                "num_inference_steps": method["steps"] or gen_length,
                "accuracy": correct.mean().item(),
                "digit_accuracy": (sequences[:, : encoder.answer_digits] == answers[:, : encoder.answer_digits])
                .float()
                .mean()
                .item(),
                "nfe": nfe.mean().item(),
                "row_forwards": row_forwards.mean().item(),
                "seconds": seconds,
            }
        )
        print(f"{method['name']:>24}: accuracy {rows[-1]['accuracy']:.4f} nfe {rows[-1]['nfe']:.3f} {seconds:.1f}s")
    return {"num_problems": len(pairs), "gen_length": gen_length, "runs": rows}


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
    for method in methods(gen_length):
        sequences, nfe, row_forwards, seconds = decode(
            pipe, method["config"], gen_length, prompts, gen_length, method["steps"], len(prompts)
        )
        loglik = oracle.joint_log_likelihood(torch.cat([prompts, sequences], dim=1))
        rows.append(
            {
                **{k: method[k] for k in ("name", "family", "config")},
                "num_inference_steps": method["steps"] or gen_length,
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
    scheduler = SOARScheduler(block_length=32, **dict(SOAR_SETTINGS)[DEFAULT_SOAR])
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


def summarise(zoo_results, oracle, overhead) -> dict:
    runs = zoo_results["runs"]
    greedy_full = next(
        r for r in runs if r["family"] == "greedy" and r["num_inference_steps"] == zoo_results["gen_length"]
    )
    soar_name = DEFAULT_SOAR
    soar = next(r for r in runs if r["name"] == soar_name)
    thresholds = [r for r in runs if r["family"] == "threshold"]
    threshold_at = interpolate_accuracy(thresholds, soar["nfe"])
    oracle_greedy = next(
        r for r in oracle["runs"] if r["family"] == "greedy" and r["num_inference_steps"] == oracle["length"] - 1
    )
    oracle_soar = next(r for r in oracle["runs"] if r["name"] == soar_name)
    summary = {
        "greedy_full_accuracy": greedy_full["accuracy"],
        "greedy_full_nfe": greedy_full["nfe"],
        "soar_setting": soar_name,
        "soar_accuracy": soar["accuracy"],
        "soar_nfe": soar["nfe"],
        "soar_row_forwards": soar["row_forwards"],
        "threshold_accuracy_at_soar_nfe": threshold_at,
        "oracle_loglik_greedy": oracle_greedy["mean_joint_loglik"],
        "oracle_loglik_soar": oracle_soar["mean_joint_loglik"],
        "oracle_loglik_viterbi": oracle["viterbi_mean_joint_loglik"],
        "decoder_overhead_fraction": overhead["overhead_fraction"],
        "overhead_model_parameters": overhead["parameters"],
    }
    summary["targets_met"] = {
        "soar_accuracy >= greedy_full_accuracy": summary["soar_accuracy"] >= summary["greedy_full_accuracy"],
        "soar_nfe <= 0.6 x greedy_full_nfe": summary["soar_nfe"] <= 0.6 * summary["greedy_full_nfe"],
        "soar_accuracy > threshold_accuracy_at_soar_nfe": summary["soar_accuracy"] > threshold_at,
        "oracle_loglik_soar > oracle_loglik_greedy": summary["oracle_loglik_soar"] > summary["oracle_loglik_greedy"],
        "decoder_overhead_fraction <= 0.10": summary["decoder_overhead_fraction"] <= 0.10,
        "0.5 <= greedy_full_accuracy < 1": 0.5 <= summary["greedy_full_accuracy"] < 1.0,
    }
    return summary


def write_markdown(results, path):
    s = results["summary"]
    lines = [
        "# SOAR decoding benchmark",
        "",
        f"Command: `{results['command']}`",
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
        f"| SOAR accuracy >= greedy full-NFE accuracy | {s['soar_accuracy']:.4f} vs {s['greedy_full_accuracy']:.4f} "
        f"| {s['targets_met']['soar_accuracy >= greedy_full_accuracy']} |",
        f"| SOAR NFE <= 60% of greedy's | {s['soar_nfe']:.3f} vs {s['greedy_full_nfe']:.3f} "
        f"({s['soar_nfe'] / s['greedy_full_nfe']:.1%}) | {s['targets_met']['soar_nfe <= 0.6 x greedy_full_nfe']} |",
        f"| SOAR beats Fast-dLLM threshold at matched NFE | {s['soar_accuracy']:.4f} vs "
        f"{s['threshold_accuracy_at_soar_nfe']:.4f} | {s['targets_met']['soar_accuracy > threshold_accuracy_at_soar_nfe']} |",
        f"| oracle: SOAR joint log-likelihood > greedy | {s['oracle_loglik_soar']:.4f} vs {s['oracle_loglik_greedy']:.4f} "
        f"(Viterbi {s['oracle_loglik_viterbi']:.4f}) | {s['targets_met']['oracle_loglik_soar > oracle_loglik_greedy']} |",
        f"| decoder overhead <= 10% ({s['overhead_model_parameters'] / 1e6:.1f}M-parameter model) "
        f"| {s['decoder_overhead_fraction']:.1%} | {s['targets_met']['decoder_overhead_fraction <= 0.10']} |",
        "",
        f"## Zoo task: {results['zoo_task']['num_problems']} test problems of 3-digit addition",
        "",
        "| decoder | exact match | answer-digit accuracy | NFE | row forwards | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["zoo_task"]["runs"]:
        lines.append(
            f"| {r['name']} | {r['accuracy']:.4f} | {r['digit_accuracy']:.4f} | {r['nfe']:.3f} "
            f"| {r['row_forwards']:.3f} | {r['seconds']:.1f} |"
        )
    o = results["oracle"]
    lines += [
        "",
        f"## Oracle Markov chains: {o['num_chains']} chains, {o['num_states']} states, length {o['length']}, "
        f"Dirichlet({o['concentration']:g}); Viterbi {o['viterbi_mean_joint_loglik']:.4f}",
        "",
        "| decoder | mean joint log-likelihood | NFE | row forwards |",
        "| --- | --- | --- | --- |",
    ]
    for r in o["runs"]:
        lines.append(f"| {r['name']} | {r['mean_joint_loglik']:.4f} | {r['nfe']:.3f} | {r['row_forwards']:.3f} |")
    v = results["overhead"]
    lines += [
        "",
        f"## Decoder overhead: {v['parameters']:,} parameters, {v['prompts']} prompts x {v['gen_length']} tokens",
        "",
        f"{v['decode_seconds']:.2f} s decoding, {v['forward_seconds']:.2f} s in model forwards: overhead "
        f"{v['overhead_fraction']:.1%} (NFE {v['nfe']:.1f}, row forwards {v['row_forwards']:.1f} per prompt).",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), dpi=100)
    colors = {"greedy": "#555", "threshold": "#4a78b5", "pbs": "#8a5", "soar": "#c33"}
    labels = {"greedy": "greedy low-confidence", "threshold": "Fast-dLLM threshold", "pbs": "PBS", "soar": "SOAR"}
    for ax, key, xlabel in ((axes[0], "nfe", "NFE (forward calls per prompt)"), (axes[1], "seconds", "wall seconds")):
        for family, color in colors.items():
            runs = sorted((r for r in results["zoo_task"]["runs"] if r["family"] == family), key=lambda r: r[key])
            ax.plot([r[key] for r in runs], [r["accuracy"] for r in runs], "o-", color=color, label=labels[family])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("exact match (zoo addition task)")
        ax.legend(fontsize=8)
    for family, color in colors.items():
        runs = sorted((r for r in results["oracle"]["runs"] if r["family"] == family), key=lambda r: r["nfe"])
        axes[2].plot(
            [r["nfe"] for r in runs], [r["mean_joint_loglik"] for r in runs], "o-", color=color, label=labels[family]
        )
    axes[2].axhline(results["oracle"]["viterbi_mean_joint_loglik"], color="#999", linestyle="--", label="Viterbi")
    axes[2].set_xlabel("NFE")
    axes[2].set_ylabel("oracle chains: mean joint log-likelihood")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    results = {
        "command": "python benchmarks/soar.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "settings": vars(args) | {"output_dir": None},
        "torch_threads": torch.get_num_threads(),
    }
    results["zoo_task"] = run_zoo_task(args)
    results["oracle"] = run_oracle(args)
    results["overhead"] = run_overhead(args)
    results["summary"] = summarise(results["zoo_task"], results["oracle"], results["overhead"])
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "soar.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    write_markdown(results, os.path.join(args.output_dir, "soar.md"))
    write_plot(results, os.path.join(args.output_dir, "soar.png"))
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
