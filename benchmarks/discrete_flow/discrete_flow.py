#!/usr/bin/env python
"""Measure discrete flow matching with minibatch OT couplings, Multimask sources and the perplexity bounds.

    python benchmarks/discrete_flow/discrete_flow.py

Four parts, in one process, with the same data, seeds and training budget for every configuration:

1. **Bounds against exact NLLs**: discrete flows whose model is the exact posterior of a known distribution generate
   that distribution, so their NLL is known. For every sequence of a small space, both bounds (computed exactly:
   all `x_t` enumerated, Gauss-Legendre in time) are compared with the exact NLL, for the three sources and for
   the data HMM and two misspecified models.
2. **HMM test bed** (a random HMM, exact likelihood as the judge): each (source, coupling) configuration is
   trained with >= 3 seeds; generative perplexity under the true HMM against NFE, sample diversity, perplexity
   bounds (Monte Carlo) on validation and test sequences. The headroom: the exact-posterior sampler's generative
   perplexity against NFE, and the independent coupling's own low-NFE gap.
3. **OT overhead**: the time of the minibatch assignment over the time of a whole training step, on the
   benchmark's model, at its batch size and at batch 1000 (the paper's), in the same run.
4. **Binarised digits**: the same configurations (fewer steps); judge: a Bernoulli mixture fitted by EM on the
   training split (its test NLL is reported).

The NFE at which an OT coupling is taken to match the independent coupling is chosen on validation sample draws
and then checked once on separate test draws. Writes `benchmarks/discrete_flow/results/discrete_flow.json`, `.md` and `.png`.
"""

import argparse
import itertools
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")

# (name, source, num_mask_tokens, coupling)
CONFIGS = (
    ("uniform/independent", "uniform", None, "independent"),
    ("uniform/hamming_ot", "uniform", None, "hamming_ot"),
    ("mask/independent", "mask", None, "independent"),
    ("multimask/independent", "multimask", 16, "independent"),
    ("multimask/embedding_ot", "multimask", 16, "embedding_ot"),
)
DIGITS_CONFIGS = tuple(c for c in CONFIGS if c[0] != "multimask/independent")
OT_PAIRS = (("uniform/hamming_ot", "uniform/independent"), ("multimask/embedding_ot", "multimask/independent"))


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds (>= 3).")
    parser.add_argument("--train_steps", type=int, default=1500, help="Training steps per HMM model.")
    parser.add_argument("--digits_steps", type=int, default=300, help="Training steps per digits model.")
    parser.add_argument("--batch_size", type=int, default=128, help="Training batch (= OT minibatch).")
    parser.add_argument("--learning_rate", type=float, default=3e-3, help="Peak learning rate (all configs).")
    parser.add_argument("--num_samples", type=int, default=1000, help="Generated sequences per NFE and split.")
    parser.add_argument(
        "--nfe",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8, 16, 32],
        help="NFE grid; its largest value is the full NFE and must be 4x another.",
    )
    parser.add_argument("--bound_samples", type=int, default=16, help="Monte Carlo times per sequence.")
    parser.add_argument("--skip_digits", action="store_true", help="Only the HMM parts (for a quick look).")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "discrete_flow.json"))
    add_from_results_argument(parser)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------- training


def make_scheduler(source, num_mask_tokens, vocab_size):
    from diffusers_ext import DiscreteFlowMatchingScheduler

    return DiscreteFlowMatchingScheduler(vocab_size=vocab_size, source=source, num_mask_tokens=num_mask_tokens)


def train_flow(train, scheduler, coupling, seed, steps, batch_size, hidden_size=64, num_layers=2, lr=1e-3):
    """The training loop of `training/train_discrete_flow.py` without accelerate: AdamW, warm-up + cosine."""
    from diffusers_ext import DiscreteFlowTransformerModel
    from diffusers_ext.losses.discrete_flow import discrete_flow_loss

    torch.manual_seed(seed)
    model = DiscreteFlowTransformerModel(
        vocab_size=scheduler.config.vocab_size,
        num_embeddings=scheduler.num_embeddings,
        sequence_length=train.shape[1],
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=4,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = min(100, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))),
    )
    order = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        idx = torch.randint(0, len(train), (batch_size,), generator=order)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        loss = discrete_flow_loss(model, scheduler, train[idx], "cross_entropy", coupling, generator)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model.eval(), sum(losses[-100:]) / len(losses[-100:])


def sample(model, scheduler, num, nfe, seed, chunk=1000):
    """Draw `num` sequences with `DiscreteFlowPipeline` in `nfe` steps; return them and the mean number of jumps."""
    from diffusers_ext import DiscreteFlowPipeline

    pipe = DiscreteFlowPipeline(model=model, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    outs, jumps = [], []
    for start in range(0, num, chunk):
        out = pipe(
            batch_size=min(chunk, num - start),
            num_inference_steps=nfe,
            generator=torch.Generator().manual_seed(seed * 7919 + start),
        )
        outs.append(out.sequences)
        jumps.append(out.num_jumps.double())
    return torch.cat(outs), float(torch.cat(jumps).mean())


def ot_overhead(model, scheduler, train, coupling, batch_size, repeats=12, seed=0):
    """Fraction of a training step's CPU time spent on the coupling: coupled and independent steps interleaved on
    the same batches; overhead = (t_coupled - t_independent) / t_coupled, and the directly timed coupling share."""
    from diffusers_ext.losses.discrete_flow import discrete_flow_loss

    model = model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # a full step that leaves the model unchanged
    g = torch.Generator().manual_seed(seed)
    totals = {"independent": 0.0, coupling: 0.0}
    direct = {"coupling_seconds": 0.0}
    for r in range(repeats + 2):
        idx = torch.randint(0, len(train), (batch_size,), generator=g)
        for kind in ("independent", coupling) if r % 2 else (coupling, "independent"):
            timings = {"coupling_seconds": 0.0}
            start = time.process_time()
            loss = discrete_flow_loss(
                model, scheduler, train[idx], "cross_entropy", kind, torch.Generator().manual_seed(r), timings=timings
            )
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if r >= 2:  # two warm-up rounds
                totals[kind] += time.process_time() - start
                if kind == coupling:
                    direct["coupling_seconds"] += timings["coupling_seconds"]
    model.eval()
    return {
        "step_seconds_independent": totals["independent"] / repeats,
        "step_seconds_coupled": totals[coupling] / repeats,
        "overhead_fraction": (totals[coupling] - totals["independent"]) / totals[coupling],
        "coupling_share_timed": direct["coupling_seconds"] / totals[coupling],
    }


def mean_std(values):
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std()) if len(values) > 1 else 0.0, "values": list(values)}


# ------------------------------------------------------------------------------------------------------- part 1


def exact_bound_check():
    from diffusers_ext.data.random_hmm import RandomHMM
    from diffusers_ext.evaluation.discrete_flow import HMMJudge, exact_nll_bounds

    V, L = 3, 4
    space = torch.tensor(list(itertools.product(range(V), repeat=L)))
    models = {
        "data_hmm": RandomHMM.random(3, V, L, seed=1, transition_concentration=0.3, emission_concentration=0.3),
        "other_hmm": RandomHMM.random(2, V, L, seed=5, transition_concentration=1.0, emission_concentration=1.0),
        "other_markov_chain": RandomHMM.random_markov_chain(V, L, seed=9, concentration=0.3),
    }
    rows = []
    for (source, M), (name, hmm) in itertools.product(
        (("mask", None), ("multimask", 3), ("uniform", None)), models.items()
    ):
        scheduler = make_scheduler(source, M, V)
        judge = HMMJudge(hmm)
        nll = -judge.log_prob(space)
        bounds = exact_nll_bounds(judge.denoiser(scheduler), scheduler, space, num_nodes=32)
        for kind, values in bounds.items():
            gap = values - nll
            rows.append(
                {
                    "source": source,
                    "model": name,
                    "bound": kind,
                    "sequences": len(space),
                    "valid_fraction": float((gap >= -1e-9).double().mean()),
                    "min_gap_nats": float(gap.min()),
                    "mean_gap_nats": float(gap.mean()),
                }
            )
    return rows


# ------------------------------------------------------------------------------------------------------- part 2


def hmm_testbed(args, log):
    from diffusers_ext.data.random_hmm import RandomHMM
    from diffusers_ext.evaluation.discrete_flow import HMMJudge, generative_perplexity, sample_diversity
    from diffusers_ext.losses.discrete_flow import estimate_nll_bounds

    H, V, L = 4, 6, 8
    hmm = RandomHMM.random(H, V, L, seed=0, transition_concentration=0.1, emission_concentration=0.1)
    judge = HMMJudge(hmm)
    train = hmm.sample(20000, seed=100)
    validation = hmm.sample(500, seed=200)
    test = hmm.sample(1000, seed=300)
    data_ppl = {
        split: generative_perplexity(-judge.log_prob(x), L)
        for split, x in (("validation", validation), ("test", test))
    }

    # headroom: the exact-posterior sampler (independent coupling) against NFE
    oracle = {}
    for source in ("mask", "uniform"):
        scheduler = make_scheduler(source, None, V)
        model = judge.denoiser(scheduler)
        curve = {}
        for nfe in args.nfe:
            x = sample_exact(model, scheduler, args.num_samples, L, nfe, seed=999)
            curve[nfe] = generative_perplexity(-judge.log_prob(x), L)
        oracle[source] = curve
    log(f"HMM data perplexity {data_ppl}; exact-posterior sampler {oracle}")

    runs = {}
    for name, source, M, coupling in CONFIGS:
        runs[name] = []
        for seed in args.seeds:
            start = time.process_time()
            scheduler = make_scheduler(source, M, V)
            model, final_loss = train_flow(
                train, scheduler, coupling, seed, args.train_steps, args.batch_size, lr=args.learning_rate
            )
            train_seconds = time.process_time() - start
            run = {"seed": seed, "final_train_loss": final_loss, "train_cpu_seconds": train_seconds}
            for split, offset in (("validation", 10_000), ("test", 20_000)):
                curve, diversity, jumps = {}, {}, {}
                for nfe in args.nfe:
                    x, mean_jumps = sample(model, scheduler, args.num_samples, nfe, seed=offset + 100 * seed + nfe)
                    curve[nfe] = generative_perplexity(-judge.log_prob(x), L)
                    diversity[nfe] = sample_diversity(x)
                    jumps[nfe] = mean_jumps
                run[f"gen_ppl_{split}"] = curve
                run[f"diversity_{split}"] = diversity
                run[f"jumps_{split}"] = jumps
            g = torch.Generator().manual_seed(seed)
            for split, x in (("validation", validation), ("test", test)):
                bounds = estimate_nll_bounds(model, scheduler, x, args.bound_samples, g)
                nll = -judge.log_prob(x)
                run[f"bounds_{split}"] = {
                    kind: {
                        "ppl_bound": math.exp(float(b["mean"].mean()) / L),
                        "ppl_bound_stderr_nats": float(b["mean"].std() / len(x) ** 0.5),
                        "fraction_above_data_nll": float((b["mean"] >= nll).double().mean()),
                    }
                    for kind, b in bounds.items()
                }
            if coupling != "independent":
                run["ot_overhead"] = ot_overhead(model, scheduler, train, coupling, args.batch_size)
                run["ot_overhead_batch_1000"] = ot_overhead(model, scheduler, train, coupling, 1000, repeats=6)
            runs[name].append(run)
            log(
                f"{name} seed {seed}: loss {final_loss:.4f}, test gen-ppl {run['gen_ppl_test']}, "
                f"bounds {run['bounds_test']}, {train_seconds:.0f}s"
            )
    return {
        "hmm": {"states": H, "vocab_size": V, "length": L, "concentration": 0.1},
        "data_ppl": data_ppl,
        "exact_posterior_gen_ppl": oracle,
        "runs": runs,
    }


def sample_exact(fn, scheduler, num, length, nfe, seed):
    """CTMC Euler sampling with a denoiser function (the exact posterior), the loop of `DiscreteFlowPipeline`."""
    g = torch.Generator().manual_seed(seed)
    x = scheduler.sample_source((num, length), g)
    scheduler.set_timesteps(nfe)
    for t in scheduler.timesteps:
        x = scheduler.step(fn(x, t).logits, t, x, generator=g).prev_sample
    return x


# ------------------------------------------------------------------------------------------------------- part 4


def digits_testbed(args, log):
    from diffusers_ext.data.binarized_digits import load_binarized_digits
    from diffusers_ext.evaluation.discrete_flow import BernoulliMixtureJudge, generative_perplexity, sample_diversity
    from diffusers_ext.losses.discrete_flow import estimate_nll_bounds

    train, validation, test = (load_binarized_digits(s) for s in ("train", "validation", "test"))
    L = train.shape[1]
    judge = BernoulliMixtureJudge.fit(train, num_components=32, num_iters=60, seed=0)
    judge_ppl = {
        "train": generative_perplexity(-judge.log_prob(train), L),
        "test": generative_perplexity(-judge.log_prob(test), L),
    }
    nfe_grid = [4, 16, 64]
    runs = {}
    for name, source, M, coupling in DIGITS_CONFIGS:
        runs[name] = []
        for seed in args.seeds:
            scheduler = make_scheduler(source, M, 2)
            model, final_loss = train_flow(
                train,
                scheduler,
                coupling,
                seed,
                args.digits_steps,
                args.batch_size,
                hidden_size=48,
                lr=args.learning_rate,
            )
            curve = {}
            for nfe in nfe_grid:
                x, _ = sample(model, scheduler, 300, nfe, seed=30_000 + 100 * seed + nfe, chunk=300)
                curve[nfe] = {"gen_ppl": generative_perplexity(-judge.log_prob(x), L), **sample_diversity(x)}
            bounds = estimate_nll_bounds(model, scheduler, test, 8, torch.Generator().manual_seed(seed))
            runs[name].append(
                {
                    "seed": seed,
                    "final_train_loss": final_loss,
                    "gen_ppl_test": curve,
                    "bits_per_pixel_bound_test": {
                        k: float(b["mean"].mean()) / L / math.log(2) for k, b in bounds.items()
                    },
                }
            )
            log(f"digits {name} seed {seed}: {curve} {runs[name][-1]['bits_per_pixel_bound_test']}")
    return {
        "judge": "Bernoulli mixture, 32 components, EM on the train split",
        "judge_ppl": judge_ppl,
        "nfe": nfe_grid,
        "runs": runs,
    }


# ---------------------------------------------------------------------------------------------------- summary


def summarise(args, exact_rows, hmm):
    """The summary and its computed targets, from the recorded measurements (`args` needs `nfe` and `batch_size`)."""
    from diffusers_ext.evaluation.protocol import target

    runs = hmm["runs"]
    nfe = sorted(args.nfe)
    full = max(nfe)  # the full NFE: the largest of the grid (4x the sequence length by default)
    if full // 4 not in nfe or full % 4:
        raise ValueError(f"the NFE grid {nfe} must contain a quarter of its largest value {full}.")

    def curve(name, split):
        return {n: mean_std([r[f"gen_ppl_{split}"][n] for r in runs[name]]) for n in nfe}

    gen_ppl_vs_nfe = {name: {str(n): v for n, v in curve(name, "test").items()} for name in runs}
    targets, nfe_ratio = [], {}
    for ot_name, ind_name in OT_PAIRS:
        reference = {s: curve(ind_name, s)[full]["mean"] for s in ("validation", "test")}
        ot_val = curve(ot_name, "validation")
        # chosen on validation draws: the smallest NFE whose OT gen-ppl is within 5% of independent at full NFE
        chosen = next((n for n in nfe if ot_val[n]["mean"] <= 1.05 * reference["validation"]), None)
        ot_test = curve(ot_name, "test")
        met_on_test = chosen is not None and ot_test[chosen]["mean"] <= 1.05 * reference["test"]
        ratio = chosen / full if chosen is not None else None
        nfe_ratio[ot_name] = {
            "chosen_nfe_on_validation": chosen,
            "full_nfe": full,
            "ratio": ratio,
            "ot_gen_ppl_test_at_chosen": ot_test[chosen]["mean"] if chosen else None,
            "independent_gen_ppl_test_at_full": reference["test"],
            "independent_gen_ppl_test_at_chosen": curve(ind_name, "test")[chosen]["mean"] if chosen else None,
            "within_5pct_on_test": met_on_test,
        }
        # no matching NFE (or no match on test) is no number: never met
        targets.append(
            target(
                f"{ot_name} matches {ind_name} at full NFE within 5% at <= 1/4 NFE (test draws)",
                ratio if (ratio is not None and met_on_test) else math.inf,
                0.25,
                "<=",
            )
        )

    # Multimask vs single mask: the multimask coupling chosen on validation (full NFE), compared on test
    mm_names = [n for n in runs if n.startswith("multimask/")]
    best_mm = min(mm_names, key=lambda n: curve(n, "validation")[full]["mean"])
    multimask_gen_ppl = curve(best_mm, "test")[full]
    mask_gen_ppl = curve("mask/independent", "test")[full]
    targets.append(
        target(
            f"Multimask ({best_mm}, chosen on validation) gen-ppl <= single mask, full NFE, test",
            multimask_gen_ppl["mean"],
            mask_gen_ppl["mean"],
            "<=",
        )
    )

    exact_valid = min(r["valid_fraction"] for r in exact_rows)
    for kind in ("kl", "entropy"):
        value = min(r["valid_fraction"] for r in exact_rows if r["bound"] == kind)
        targets.append(target(f"{kind} bound >= exact NLL on every sequence (models with a known NLL)", value, 1.0))
    trained_fraction = {
        name: {
            kind: mean_std([r["bounds_test"][kind]["fraction_above_data_nll"] for r in rs])
            for kind in ("kl", "entropy")
        }
        for name, rs in runs.items()
    }

    overhead = {
        name: mean_std([r["ot_overhead"]["overhead_fraction"] for r in rs])
        for name, rs in runs.items()
        if "ot_overhead" in rs[0]
    }
    overhead_1000 = {
        name: mean_std([r["ot_overhead_batch_1000"]["overhead_fraction"] for r in rs])
        for name, rs in runs.items()
        if "ot_overhead" in rs[0]
    }
    worst = max(v["mean"] for v in overhead.values())
    targets.append(
        target(f"OT overhead of a training step (batch {args.batch_size}, worst coupling)", worst, 0.10, "<=")
    )

    ind = curve("uniform/independent", "test")
    mask = curve("mask/independent", "test")
    sanity = {
        "data_ppl": hmm["data_ppl"],
        "exact_posterior_gen_ppl_at_full_nfe": {s: c[full] for s, c in hmm["exact_posterior_gen_ppl"].items()},
        "independent_low_nfe_gap": {  # headroom: the independent coupling at 1/4 NFE vs full NFE
            "uniform": ind[full // 4]["mean"] / ind[full]["mean"] - 1,
            "mask": mask[full // 4]["mean"] / mask[full]["mean"] - 1,
        },
        "exact_posterior_low_nfe_gap": {
            s: c[full // 4] / c[full] - 1 for s, c in hmm["exact_posterior_gen_ppl"].items()
        },
        "bounds_validation_vs_test_ppl": {
            name: {
                k: [rs[0]["bounds_validation"][k]["ppl_bound"], rs[0]["bounds_test"][k]["ppl_bound"]]
                for k in ("kl", "entropy")
            }
            for name, rs in runs.items()
        },
    }
    return {
        "gen_ppl_vs_nfe": gen_ppl_vs_nfe,
        "nfe_ratio_ot_to_match_independent": nfe_ratio,
        "multimask_gen_ppl": {"config": best_mm, **multimask_gen_ppl},
        "mask_gen_ppl": mask_gen_ppl,
        "bounds_valid_fraction": {
            "exact_models": exact_valid,
            "trained_models_bound_above_true_data_nll": trained_fraction,
        },
        "ot_overhead_fraction": {f"batch_{args.batch_size}": overhead, "batch_1000": overhead_1000},
        "targets": targets,
        "sanity": sanity,
    }


def report_sections(result) -> list[str]:
    """The Markdown sections after the standard header and targets table."""
    s = result["summary"]
    nfe = list(next(iter(s["gen_ppl_vs_nfe"].values())).keys())
    lines = [
        "## HMM: generative perplexity (true HMM as judge) vs NFE, test draws, mean ± std over seeds",
        "",
        "| config | " + " | ".join(f"NFE {n}" for n in nfe) + " |",
        "| --- |" + " --- |" * len(nfe),
    ]
    for name, row in s["gen_ppl_vs_nfe"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v['mean']:.3f} ± {v['std']:.3f}" for v in row.values()) + " |")
    lines += [
        "",
        f"Data perplexity (test): {s['sanity']['data_ppl']['test']:.3f}; exact-posterior sampler at full "
        f"NFE: {s['sanity']['exact_posterior_gen_ppl_at_full_nfe']}",
    ]
    return lines


def int_keys(node):
    """`node` read back from JSON with its digit-string keys (NFE values) as ints again, as the run built it."""
    if isinstance(node, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: int_keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [int_keys(v) for v in node]
    return node


def targets_from_results(result) -> list[dict]:
    """The targets rebuilt from a results file's recorded measurements (`--from_results`)."""
    settings = argparse.Namespace(**result["settings"])
    return summarise(settings, result["exact_bound_check"], int_keys(result["hmm"]))["targets"]


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in s["gen_ppl_vs_nfe"].items():
        xs = [int(n) for n in row]
        ax.errorbar(
            xs,
            [v["mean"] for v in row.values()],
            yerr=[v["std"] for v in row.values()],
            label=name,
            marker="o",
            capsize=2,
        )
    ax.axhline(s["sanity"]["data_ppl"]["test"], color="k", ls="--", lw=1, label="data")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("NFE")
    ax.set_ylabel("generative perplexity (true HMM)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    import sys

    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    title = "Discrete flow matching: minibatch OT, Multimask, perplexity bounds"
    if args.from_results:
        result = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_results(stem, result, title, report_sections(result), figures={".png": lambda p: plot(result, p)})
        return
    torch.set_num_threads(1)
    if len(args.seeds) < 3:
        print("warning: fewer than 3 seeds; the measurement protocol asks for >= 3", file=sys.stderr)
    begin = time.time()

    def log(message):
        print(f"[{time.time() - begin:7.1f}s] {message}", flush=True)

    exact_rows = exact_bound_check()
    log(f"exact bound check: min valid fraction {min(r['valid_fraction'] for r in exact_rows)}")
    hmm = hmm_testbed(args, log)
    digits = None if args.skip_digits else digits_testbed(args, log)
    result = {
        "command": command(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "summary": summarise(args, exact_rows, hmm),
        "exact_bound_check": exact_rows,
        "hmm": hmm,
        "digits": digits,
        "wall_seconds": time.time() - begin,
    }
    write_results(stem, result, title, report_sections(result), figures={".png": lambda p: plot(result, p)})
    log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
