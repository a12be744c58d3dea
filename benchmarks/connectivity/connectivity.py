#!/usr/bin/env python
"""Measure connectivity distributions of low-rank RNNs (two flows + ridge read-out) against point estimates.

    python benchmarks/connectivity/connectivity.py

For each ground truth (quadstable, limit cycle, ring, heavy-tailed limit cycle; `diffusers_ext.data.lrrnn`) and
each seed: a network of `--num_neurons` neurons is drawn from the known loading distribution and its latent
dynamics are simulated from a 20 x 20 grid of initial states (`--num_dynamics_steps` steps). Every method sees the
network's input-side loadings `m` (the identifiable rows, as in the reference's synthetic validation) and the
trajectories, never the output side `n`:

- **ours**: the input-side flow on the given rows; the output-side flow on ridge read-outs of networks sampled from
  it (`ridge_readout_targets`); neurons sampled by `ConnectivityPipeline`;
- **trained lrRNN (m given)**: the point estimate with the same information: `n` fitted by Adam on the one-step
  prediction loss from a small initialisation;
- **trained lrRNN (all fitted)**: as users run it: `m` and `n` both fitted from a random initialisation.

Judges (exact, against the known generator): the unbiased MMD^2 (Gaussian kernels at 0.5, 1, 2 x the median
distance of the reference draws) and the sliced 2-Wasserstein distance between each method's neurons `(m, n)` and
fresh draws of the ground truth; and, for networks resampled from our distribution, whether their attractors
(fixed points, limit cycle, ring) match the ground-truth network's within `evaluation.connectivity.TOLERANCES`.
Negative control: the ground-truth network with its `n` shuffled across neurons must fail that check. Sanity
reference: a second network drawn from the ground truth.

Validation, then test once. Before any test seed is touched, each method's training length is chosen on the
`--validation_seeds` (every ground truth, the same choice for all of them), with the same number of candidates for
ours and for each point estimate: ours' training steps x Euler steps (`--flow_steps_grid` x `--inference_steps_grid`)
by the mean fraction of resampled networks reproducing the attractor (ties to fewer steps), each trained lrRNN's
`--lrrnn_steps_grid` by its mean MMD^2 to the ground truth.
The frozen choices then run once on the test `--seeds`; the validation measurements are recorded beside them.
Seeds 0-2 were also the development seeds on which two judge settings (the added 0.25x-median MMD bandwidth and the
ring's 60-step summary) were settled. Writes `benchmarks/connectivity/results/connectivity.json`, `.md` and `.png`.
"""

import argparse
import math
import os
import time

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
METHODS = ("ours", "lrrnn_m_given", "lrrnn_all_fitted")
BASELINES = {"lrrnn_m_given": "trained lrRNN (m given)", "lrrnn_all_fitted": "trained lrRNN (all fitted)"}
MIN_REPRODUCED = 0.9
MIN_Z = 2.0


def parse_args(argv=None):
    from diffusers_ext.data.lrrnn import GROUND_TRUTHS
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ground_truths", nargs="+", default=list(GROUND_TRUTHS), choices=GROUND_TRUTHS)
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[103, 104, 105],
        help="Test seeds (>= 3); 0-2 were the development seeds on which the judge settings were settled, and "
        "100-102 the test seeds of two earlier versions of the benchmark.",
    )
    parser.add_argument("--num_neurons", type=int, default=1000, help="Neurons of each ground-truth network.")
    parser.add_argument("--num_dynamics_steps", type=int, default=100, help="Steps of the observed trajectories.")
    parser.add_argument("--num_transitions", type=int, default=4000, help="Transitions used by ridge and fits.")
    parser.add_argument(
        "--validation_seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2, 3],
        help="Seeds on which the training lengths are chosen (disjoint from --seeds).",
    )
    parser.add_argument(
        "--flow_steps_grid",
        type=int,
        nargs="+",
        default=[1000, 3000],
        help="Candidate training steps of each flow (with one value here and in --inference_steps_grid: used "
        "without validation).",
    )
    parser.add_argument(
        "--inference_steps_grid",
        type=int,
        nargs="+",
        default=[20, 100],
        help="Candidate Euler steps of each flow, for sampling and for the ridge read-outs (chosen jointly with "
        "--flow_steps_grid).",
    )
    parser.add_argument("--batch_size", type=int, default=256, help="Training batch of the flows.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate of the flows.")
    parser.add_argument("--hidden_size", type=int, default=128, help="Width of both velocity MLPs.")
    parser.add_argument("--readout_networks", type=int, default=20, help="Sampled networks for the ridge targets.")
    parser.add_argument("--readout_neurons", type=int, default=500, help="Neurons of each of them.")
    parser.add_argument(
        "--lrrnn_steps_grid",
        type=int,
        nargs="+",
        default=[250, 500, 2000, 4000],
        help="Candidate Adam steps of each trained lrRNN fit (one value: used without validation); as many as ours' "
        "candidates, the same tuning budget.",
    )
    parser.add_argument(
        "--lrrnn_free_transitions", type=int, default=1000, help="Transitions of the all-fitted lrRNN (CPU time)."
    )
    parser.add_argument("--num_eval_neurons", type=int, default=1000, help="Neurons compared per method and seed.")
    parser.add_argument("--num_resamples", type=int, default=10, help="Resampled networks per seed.")
    parser.add_argument("--output", type=str, default=os.path.join(RESULTS, "connectivity.json"))
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    overlap = sorted(set(args.seeds) & set(args.validation_seeds))
    if overlap and not args.from_results:
        parser.error(f"--validation_seeds must be disjoint from the test --seeds, both hold {overlap}.")
    for name in ("flow_steps_grid", "inference_steps_grid", "lrrnn_steps_grid"):
        if min(getattr(args, name)) < 1:
            parser.error(f"--{name} must hold positive step counts, got {getattr(args, name)}.")
    return args


# ---------------------------------------------------------------------------------------------------- methods


def train_flow(model, input_loadings, output_loadings, args, seed, steps):
    """Plain AdamW + cosine training of one head of `model` for `steps` steps (the loop of
    `training/train_connectivity_flow.py` without accelerate); returns the last 100 steps' mean loss."""
    from diffusers.optimization import get_scheduler

    from diffusers_ext.losses.connectivity_flow import connectivity_flow_loss

    head = model.input_velocity if output_loadings is None else model.output_velocity
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.learning_rate, weight_decay=0.0)
    schedule = get_scheduler("cosine", optimizer, num_warmup_steps=50, num_training_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(input_loadings), (args.batch_size,), generator=generator)
        outputs = None if output_loadings is None else output_loadings[index]
        loss = connectivity_flow_loss(model, input_loadings[index], outputs, generator)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return sum(losses[-100:]) / len(losses[-100:])


def fit_connectivity_distribution(m, states, next_states, args, seed, flow_steps, inference_steps):
    """Ours: both flows, `flow_steps` training steps each, the ridge read-outs from networks sampled with
    `inference_steps` Euler steps; returns `(pipeline, info)`."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusers_ext import ConnectivityFlowModel, ConnectivityPipeline, ridge_readout_targets

    torch.manual_seed(seed)
    model = ConnectivityFlowModel(rank=2, hidden_size=args.hidden_size, input_scale=float(m.std()))
    pipe = ConnectivityPipeline(model=model, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    loss_a = train_flow(model, m.float(), None, args, seed, flow_steps)
    generator = torch.Generator().manual_seed(10_000 + seed)
    inputs, outputs = ridge_readout_targets(
        pipe,
        states,
        next_states,
        args.readout_networks,
        args.readout_neurons,
        generator=generator,
        num_inference_steps=inference_steps,
    )
    model.register_to_config(output_scale=float(outputs.std()))
    loss_b = train_flow(model, inputs, outputs, args, seed + 1, flow_steps)
    return pipe, {"input_flow_loss": loss_a, "output_flow_loss": loss_b, "output_scale": model.config.output_scale}


def fit_lrrnn(m_init, states, next_states, alpha, steps, fit_inputs, seed):
    """A trained lrRNN: Adam on the one-step prediction loss (float32); `m` fixed (given) or fitted from `m_init`;
    returns `(m, n, rmse)` (float64)."""
    generator = torch.Generator().manual_seed(seed)
    states, next_states = states.float(), next_states.float()
    m = m_init.clone().float().requires_grad_(fit_inputs)
    n = (0.01 * torch.randn(m_init.shape, generator=generator)).requires_grad_(True)
    optimizer = torch.optim.Adam([n, m] if fit_inputs else [n], lr=0.02)
    targets = next_states - (1 - alpha) * states
    features = None if fit_inputs else torch.tanh(states @ m.T)  # fixed input side: the features never change
    for _ in range(steps):
        current = torch.tanh(states @ m.T) if fit_inputs else features
        loss = (alpha * current @ n / m.shape[0] - targets).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return m.detach().double(), n.detach().double(), float(loss.detach().sqrt())


# ---------------------------------------------------------------------------------------------------- one run


def observe(name, seed, args):
    """The ground truth `name`'s network of `seed` and `args.num_transitions` of its observed one-step transitions:
    `(truth, net, states, next_states)`, the states `(T, 2)` float64."""
    from diffusers_ext.data.lrrnn import GROUND_TRUTHS, initial_state_grid, make_ground_truth

    truth = make_ground_truth(name)
    index = GROUND_TRUTHS.index(name)
    net = truth.network(args.num_neurons, 1000 * index + seed)
    states, next_states = net.transitions(initial_state_grid(20, 2.4), args.num_dynamics_steps)
    pick = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed))[: args.num_transitions]
    return truth, net, states[pick], next_states[pick]


def reference_draws(truth, args, seed):
    """Fresh neurons `(num_eval_neurons, 4)` of the ground truth and the judges' kernel bandwidth."""
    from diffusers_ext.metrics import median_bandwidth

    reference = torch.cat(truth.sample_loadings(args.num_eval_neurons, 40_000 + seed), -1)
    return reference, median_bandwidth(reference)


def sample_ours(pipe, args, seed, inference_steps):
    """`num_eval_neurons` neurons `(num_eval_neurons, 4)` (float64) of one network sampled from our distribution
    with `inference_steps` Euler steps per flow."""
    generator = torch.Generator().manual_seed(20_000 + seed)
    out = pipe(
        num_neurons=args.num_eval_neurons,
        num_inference_steps=inference_steps,
        generator=generator,
        num_dynamics_steps=0,
    )
    return out.loadings[0].double()


def resampled_reproduction(pipe, truth, net, args, seed, inference_steps):
    """Whether each of `num_resamples` networks sampled from `pipe` (`inference_steps` Euler steps per flow)
    reproduces `net`'s attractor: `(reproduced, target, last_summary)`."""
    from diffusers_ext.data.lrrnn import LowRankRNN
    from diffusers_ext.evaluation.connectivity import attractor_summary, reproduces_attractor

    kind = truth.attractor
    target = attractor_summary(kind, net)
    resampled = pipe(
        num_neurons=args.num_neurons,
        num_networks=args.num_resamples,
        num_inference_steps=inference_steps,
        generator=torch.Generator().manual_seed(60_000 + seed),
        num_dynamics_steps=0,
    ).loadings.double()
    reproduced = []
    for loadings in resampled:
        summary = attractor_summary(kind, LowRankRNN(loadings[:, :2], loadings[:, 2:], net.alpha))
        reproduced.append(bool(reproduces_attractor(kind, summary, target)))
    return reproduced, target, summary


def fit_baselines(net, states, next_states, args, seed, steps):
    """Both trained lrRNNs, `steps[method]` Adam steps each: `{method: (loadings (num_eval_neurons, 4), n, rmse)}`."""
    _, n_given, fit_given = fit_lrrnn(
        net.input_loadings, states, next_states, net.alpha, steps["lrrnn_m_given"], False, seed
    )
    m_init = torch.randn(net.input_loadings.shape, generator=torch.Generator().manual_seed(30_000 + seed))
    few = slice(0, args.lrrnn_free_transitions)
    m_free, n_free, fit_free = fit_lrrnn(
        m_init, states[few], next_states[few], net.alpha, steps["lrrnn_all_fitted"], True, seed
    )
    return {
        "lrrnn_m_given": (torch.cat([net.input_loadings, n_given], -1)[: args.num_eval_neurons], n_given, fit_given),
        "lrrnn_all_fitted": (torch.cat([m_free, n_free], -1)[: args.num_eval_neurons], n_free, fit_free),
    }


# ---------------------------------------------------------------------------------------------------- validation


def ours_candidates(args) -> list[dict]:
    """Ours' validation grid: `{"flow_steps", "inference_steps"}` for every pair, cheapest first (ties go to it)."""
    return [
        {"flow_steps": steps, "inference_steps": euler}
        for steps in sorted(args.flow_steps_grid)
        for euler in sorted(args.inference_steps_grid)
    ]


def describe_ours(candidate: dict) -> str:
    return f"{candidate['flow_steps']} steps, {candidate['inference_steps']} Euler steps"


def validate_ours(candidate, args, log):
    """Ours with `candidate` (`{"flow_steps", "inference_steps"}`) on every ground truth and validation seed: per
    ground truth the fraction of resampled networks reproducing the attractor and the mean MMD^2;
    `mean_reproduced_rate` over ground truths (the score)."""
    from diffusers_ext.evaluation.connectivity import loading_distances

    per_truth = {}
    for name in args.ground_truths:
        reproduced, mmd2 = [], []
        for seed in args.validation_seeds:
            truth, net, states, next_states = observe(name, seed, args)
            flow_steps, euler = candidate["flow_steps"], candidate["inference_steps"]
            pipe, _ = fit_connectivity_distribution(
                net.input_loadings, states, next_states, args, seed, flow_steps, euler
            )
            reference, bandwidth = reference_draws(truth, args, seed)
            mmd2.append(loading_distances(sample_ours(pipe, args, seed, euler), reference, bandwidth, seed)["mmd2"])
            reproduced += resampled_reproduction(pipe, truth, net, args, seed, euler)[0]
        per_truth[name] = {"reproduced_rate": sum(reproduced) / len(reproduced), "mmd2": sum(mmd2) / len(mmd2)}
        log(f"validation: ours, {describe_ours(candidate)}, {name}: {per_truth[name]}")
    rates = [entry["reproduced_rate"] for entry in per_truth.values()]
    return {"per_ground_truth": per_truth, "mean_reproduced_rate": sum(rates) / len(rates)}


def validate_lrrnn_steps(lrrnn_steps, args, log):
    """Both trained lrRNNs with `lrrnn_steps` on every ground truth and validation seed: per ground truth each one's
    mean MMD^2; `mean_mmd2` per method over ground truths (the score)."""
    from diffusers_ext.evaluation.connectivity import loading_distances

    per_truth = {}
    for name in args.ground_truths:
        mmd2 = {method: [] for method in BASELINES}
        for seed in args.validation_seeds:
            truth, net, states, next_states = observe(name, seed, args)
            reference, bandwidth = reference_draws(truth, args, seed)
            fits = fit_baselines(net, states, next_states, args, seed, dict.fromkeys(BASELINES, lrrnn_steps))
            for method, (loadings, _, _) in fits.items():
                mmd2[method].append(loading_distances(loadings, reference, bandwidth, seed)["mmd2"])
        per_truth[name] = {method: sum(v) / len(v) for method, v in mmd2.items()}
        log(f"validation: trained lrRNNs, {lrrnn_steps} steps, {name}: {per_truth[name]}")
    mean = {method: sum(e[method] for e in per_truth.values()) / len(per_truth) for method in BASELINES}
    return {"per_ground_truth": per_truth, "mean_mmd2": mean}


def choose_training_lengths(args, log) -> dict:
    """Each method's training length (and ours' Euler steps) chosen on the validation seeds
    (`reporting.choose_on_validation`, test measured later by `run_one`): `{"ours": record, "lrrnn_m_given": record,
    "lrrnn_all_fitted": record}`, ours' candidates `{"flow_steps", "inference_steps"}`. A grid of one candidate is
    used as given (its record has no validation measurements)."""
    from diffusers_ext.evaluation.reporting import choose_on_validation

    def given(value, name=str):
        return {"validation": [], "chosen": {"name": name(value), "candidate": value, "score": None}, "test": None}

    choices = {}
    candidates = ours_candidates(args)
    if len(candidates) == 1:
        choices["ours"] = given(candidates[0], describe_ours)
    else:
        choices["ours"] = choose_on_validation(
            candidates,
            lambda candidate, split: validate_ours(candidate, args, log),
            lambda measurement: measurement["mean_reproduced_rate"],
            names=describe_ours,
            test=False,
        )
    measured = {}

    def measure_lrrnn(steps, split):
        if steps not in measured:
            measured[steps] = validate_lrrnn_steps(steps, args, log)
        return measured[steps]

    for method in BASELINES:
        if len(args.lrrnn_steps_grid) == 1:
            choices[method] = given(args.lrrnn_steps_grid[0])
        else:
            choices[method] = choose_on_validation(
                args.lrrnn_steps_grid,
                measure_lrrnn,
                lambda measurement, method=method: measurement["mean_mmd2"][method],
                maximize=False,
                test=False,
            )
    log("chosen on validation: " + ", ".join(f"{k}: {v['chosen']['name']}" for k, v in choices.items()))
    return choices


# ---------------------------------------------------------------------------------------------------- one run


def run_one(name, seed, args, steps, log):
    """One test run of every method on ground truth `name` and `seed`, with the chosen `steps`
    (`{"ours": {"flow_steps", "inference_steps"}, "lrrnn_m_given": Adam steps, "lrrnn_all_fitted": Adam steps}`)."""
    from diffusers_ext.data.lrrnn import LowRankRNN
    from diffusers_ext.evaluation.connectivity import attractor_summary, loading_distances, reproduces_attractor

    start = time.process_time()
    truth, net, states, next_states = observe(name, seed, args)
    flow_steps, euler = steps["ours"]["flow_steps"], steps["ours"]["inference_steps"]
    pipe, info = fit_connectivity_distribution(net.input_loadings, states, next_states, args, seed, flow_steps, euler)
    ours = sample_ours(pipe, args, seed, euler)
    fits = fit_baselines(net, states, next_states, args, seed, steps)
    samples = {"ours": ours, **{method: fit[0] for method, fit in fits.items()}}
    reference, bandwidth = reference_draws(truth, args, seed)
    distances = {method: loading_distances(x, reference, bandwidth, seed) for method, x in samples.items()}
    second = truth.network(args.num_eval_neurons, 50_000 + seed)
    distances["second_ground_truth_draw"] = loading_distances(
        torch.cat([second.input_loadings, second.output_loadings], -1), reference, bandwidth, seed
    )

    kind = truth.attractor
    reproduced, target, summary = resampled_reproduction(pipe, truth, net, args, seed, euler)
    shuffle = torch.randperm(net.num_neurons, generator=torch.Generator().manual_seed(70_000 + seed))
    control = LowRankRNN(net.input_loadings, net.output_loadings[shuffle], net.alpha)
    given_net = LowRankRNN(net.input_loadings, fits["lrrnn_m_given"][1], net.alpha)
    fresh = [
        bool(reproduces_attractor(kind, attractor_summary(kind, truth.network(args.num_neurons, seed_b)), target))
        for seed_b in range(80_000 + 100 * seed, 80_000 + 100 * seed + args.num_resamples)
    ]
    run = {
        "ground_truth": name,
        "seed": seed,
        "bandwidth": bandwidth,
        "distances": distances,
        "ground_truth_attractor": target,
        "resampled_reproduce": reproduced,
        "example_resample_attractor": summary,
        "shuffled_control_reproduces": bool(reproduces_attractor(kind, attractor_summary(kind, control), target)),
        "fresh_networks_reproduce": fresh,
        "lrrnn_m_given_reproduces": bool(reproduces_attractor(kind, attractor_summary(kind, given_net), target)),
        "lrrnn_fit_rmse": {"m_given": fits["lrrnn_m_given"][2], "all_fitted": fits["lrrnn_all_fitted"][2]},
        "training": info,
        "cpu_seconds": time.process_time() - start,
    }
    log(
        f"{name} seed {seed}: MMD2 ours {distances['ours']['mmd2']:.4f}, m-given {distances['lrrnn_m_given']['mmd2']:.4f}"
        f", all-fitted {distances['lrrnn_all_fitted']['mmd2']:.4f}; reproduced {sum(reproduced)}/{len(reproduced)}; "
        f"{run['cpu_seconds']:.0f}s"
    )
    return run, samples, reference


# ---------------------------------------------------------------------------------------------------- summary


def summarise(runs: list[dict], ground_truths: list[str]) -> dict:
    from diffusers_ext.evaluation.protocol import binomial_standard_error, mean_spread

    per_truth = {}
    for name in ground_truths:
        rows = [r for r in runs if r["ground_truth"] == name]
        entry = {"distances": {}, "improvement": {}}
        for method in (*METHODS, "second_ground_truth_draw"):
            entry["distances"][method] = {
                metric: mean_spread([r["distances"][method][metric] for r in rows]) for metric in ("mmd2", "sliced_w2")
            }
        for baseline in BASELINES:
            entry["improvement"][baseline] = {}
            for metric in ("mmd2", "sliced_w2"):
                diffs = mean_spread([r["distances"][baseline][metric] - r["distances"]["ours"][metric] for r in rows])
                diffs["z"] = (
                    diffs["mean"] / diffs["sem"] if diffs["sem"] > 0 else (math.inf if diffs["mean"] > 0 else 0.0)
                )
                entry["improvement"][baseline][metric] = diffs
        outcomes = [ok for r in rows for ok in r["resampled_reproduce"]]
        rate = sum(outcomes) / len(outcomes)
        entry["reproduced"] = {
            "rate": rate,
            "count": len(outcomes),
            "se": binomial_standard_error(rate, len(outcomes)),
        }
        entry["shuffled_control_rate"] = sum(r["shuffled_control_reproduces"] for r in rows) / len(rows)
        entry["lrrnn_m_given_reproduces_rate"] = sum(r["lrrnn_m_given_reproduces"] for r in rows) / len(rows)
        fresh = [ok for r in rows for ok in r.get("fresh_networks_reproduce", [])]
        entry["fresh_network_rate"] = sum(fresh) / len(fresh) if fresh else None
        per_truth[name] = entry
    return per_truth


def targets_from_results(results: dict) -> list[dict]:
    from diffusers_ext.evaluation.protocol import target

    rows = []
    for name, entry in results["per_ground_truth"].items():
        for baseline, label in BASELINES.items():
            z = entry["improvement"][baseline]["mmd2"]["z"]
            rows.append(target(f"{name}: MMD^2 of {label} minus ours, in SE over seeds", z, MIN_Z))
        rows.append(
            target(
                f"{name}: resampled networks reproducing the attractor", entry["reproduced"]["rate"], MIN_REPRODUCED
            )
        )
    return rows


def report_sections(results: dict) -> list[str]:
    from diffusers_ext.evaluation.connectivity import TOLERANCES

    lines = ["## Distances to the ground truth (mean +- SE over seeds; lower is better)", ""]
    lines += ["| ground truth | method | MMD^2 | sliced W2 |", "| --- | --- | --- | --- |"]
    labels = {
        "ours": "ours (two flows + ridge)",
        **BASELINES,
        "second_ground_truth_draw": "a second ground-truth draw",
    }
    for name, entry in results["per_ground_truth"].items():
        for method, label in labels.items():
            d = entry["distances"][method]
            lines.append(
                f"| {name} | {label} | {d['mmd2']['mean']:.4f} +- {d['mmd2']['sem']:.4f} "
                f"| {d['sliced_w2']['mean']:.3f} +- {d['sliced_w2']['sem']:.3f} |"
            )
    lines += ["", "## Attractors of resampled networks", ""]
    lines += [
        "| ground truth | attractor | reproduced (ours) | fresh ground-truth networks | shuffled-n control "
        "| trained lrRNN (m given) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in results["per_ground_truth"].items():
        rep = entry["reproduced"]
        kind = results["attractor_kinds"][name]
        fresh = entry.get("fresh_network_rate")
        lines.append(
            f"| {name} | {kind} | {rep['rate']:.2f} +- {rep['se']:.2f} (n={rep['count']}) | "
            f"{'-' if fresh is None else f'{fresh:.2f}'} | {entry['shuffled_control_rate']:.2f} | "
            f"{entry['lrrnn_m_given_reproduces_rate']:.2f} |"
        )
    lines += [
        "",
        "Fresh ground-truth networks: new networks of the same size drawn from the known generator, judged against the "
        "same ground-truth network (a reference for what finite-size fluctuations alone allow).",
        "",
        "Tolerances: " + ", ".join(f"{k} = {v}" for k, v in TOLERANCES.items()) + ".",
    ]
    return lines + validation_section(results)


def validation_section(results: dict) -> list[str]:
    """The validation grid of each method's training length and the frozen choices (Markdown lines)."""
    validation = results.get("validation")
    if not validation:
        return []
    choices = validation["choices"]
    lines = ["", f"## Validation (seeds {validation['seeds']}; the test seeds were run once with the choices)", ""]
    ours = choices["ours"]
    if ours["validation"]:
        names = list(ours["validation"][0]["measurement"]["per_ground_truth"])
        lines += [
            "Ours: training steps and Euler steps of each flow, chosen by the mean reproduced fraction over ground "
            "truths (ties to fewer steps).",
            "",
            "| flow steps, Euler steps | "
            + " | ".join(f"{n}: reproduced / MMD^2" for n in names)
            + " | mean reproduced |",
            "| --- | " + " | ".join("---" for _ in names) + " | --- |",
        ]
        for row in ours["validation"]:
            per = row["measurement"]["per_ground_truth"]
            cells = [f"{per[n]['reproduced_rate']:.2f} / {per[n]['mmd2']:.4f}" for n in names]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + f" | {row['score']:.3f} |")
        lines.append("")
    if any(choices[m]["validation"] for m in BASELINES):
        lines += [
            "Trained lrRNNs: Adam steps, each chosen by its mean MMD^2 over ground truths (lower is better).",
            "",
            "| Adam steps | " + " | ".join(BASELINES.values()) + " |",
            "| --- | " + " | ".join("---" for _ in BASELINES) + " |",
        ]
        first = choices[next(iter(BASELINES))]["validation"]
        for i, row in enumerate(first):
            cells = [f"{choices[m]['validation'][i]['measurement']['mean_mmd2'][m]:.4f}" for m in BASELINES]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
        lines.append("")
    chosen = [f"ours {choices['ours']['chosen']['name']}"]
    chosen += [f"{method} {choices[method]['chosen']['name']} Adam steps" for method in BASELINES]
    lines.append("Chosen: " + ", ".join(chosen) + ".")
    return lines


def plot(results: dict, samples: dict | None, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["per_ground_truth"])
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 7.5), squeeze=False)
    for j, name in enumerate(names):
        ax = axes[0, j]
        if samples and name in samples:
            drawn = samples[name]
            ax.scatter(drawn["reference"][:, 0], drawn["reference"][:, 2], s=3, c="0.6", label="ground truth")
            ax.scatter(drawn["ours"][:, 0], drawn["ours"][:, 2], s=3, c="tab:blue", alpha=0.6, label="ours")
            given = drawn["lrrnn_m_given"]
            ax.scatter(given[:, 0], given[:, 2], s=3, c="tab:red", alpha=0.6, label="trained lrRNN (m given)")
            ax.set_xlabel("m_1")
            ax.set_ylabel("n_1")
            ax.legend(fontsize=7, markerscale=3)
        ax.set_title(name)
        ax = axes[1, j]
        entry = results["per_ground_truth"][name]
        distances = entry["distances"]
        methods = ["ours", *BASELINES, "second_ground_truth_draw"]
        values = [distances[m]["mmd2"]["mean"] for m in methods]
        errors = [distances[m]["mmd2"]["sem"] for m in methods]
        ax.bar(range(len(methods)), values, yerr=errors, color=["tab:blue", "tab:red", "tab:orange", "0.6"])
        ax.set_xticks(range(len(methods)), ["ours", "lrRNN\nm given", "lrRNN\nall fitted", "2nd GT\ndraw"], fontsize=8)
        ax.set_ylabel("MMD^2 to the ground truth")
        ax.set_yscale("symlog", linthresh=1e-3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    import sys

    from diffusers_ext.data.lrrnn import ATTRACTORS
    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    stem = os.path.splitext(args.output)[0]
    title = "Connectivity distributions of low-rank RNNs: two flows + ridge read-out vs point estimates"
    settings_line = None
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        return write_results(
            stem, results, title, report_sections(results), figures={".png": lambda p: plot(results, None, p)}
        )
    torch.set_num_threads(1)
    if len(args.seeds) < 3:
        print("warning: fewer than 3 seeds; the measurement protocol asks for >= 3", file=sys.stderr)
    begin = time.time()

    def log(message):
        print(f"[{time.time() - begin:7.1f}s] {message}", flush=True)

    choices = choose_training_lengths(args, log)
    steps = {method: record["chosen"]["candidate"] for method, record in choices.items()}
    runs, drawn = [], {}
    for name in args.ground_truths:
        for seed in args.seeds:
            run, samples, reference = run_one(name, seed, args, steps, log)
            runs.append(run)
            if seed == args.seeds[0]:
                drawn[name] = {"reference": reference.numpy(), **{k: v.numpy() for k, v in samples.items()}}
    results = {
        "command": command(__file__, argv, omit=("--output",)),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "from_results")},
        "attractor_kinds": {name: ATTRACTORS[name] for name in args.ground_truths},
        "validation": {"seeds": args.validation_seeds, "choices": choices},
        "training_steps": steps,
        "per_ground_truth": summarise(runs, args.ground_truths),
        "runs": runs,
        "wall_seconds": time.time() - begin,
    }
    results["summary"] = {
        "targets": targets_from_results(results),
        "sanity": {
            name: {
                "second_ground_truth_draw_mmd2": entry["distances"]["second_ground_truth_draw"]["mmd2"]["mean"],
                "shuffled_control_reproduce_rate": entry["shuffled_control_rate"],
                "fresh_ground_truth_network_reproduce_rate": entry["fresh_network_rate"],
            }
            for name, entry in results["per_ground_truth"].items()
        },
    }
    settings_line = (
        f"Settings: {len(args.seeds)} seeds, {args.num_neurons} neurons, {args.num_transitions} transitions, "
        f"{describe_ours(steps['ours'])} per flow (chosen on validation seeds {args.validation_seeds}), "
        f"{args.num_resamples} resampled networks per seed, one CPU thread."
    )
    write_results(
        stem,
        results,
        title,
        report_sections(results),
        settings_line,
        figures={".png": lambda p: plot(results, drawn, p)},
    )
    log(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
