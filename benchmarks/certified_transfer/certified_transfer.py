"""Certified few-shot transfer on the digits-episodes proxy: sample-then-evaluate over a parameter diffusion model
of LoRA adapters (STEEL-style) against SGD-fitted LoRA, Gaussian-fit random adapters and the best upstream adapter.

    python training/train_parameter_diffusion.py --output_dir parameter-diffusion-digits --report_to none
    python benchmarks/certified_transfer/certified_transfer.py --model_dir parameter-diffusion-digits

Episodes: a held-out 5-way class combination under a held-out domain (odd parameter bins), images from the digits'
held-out split; `k` support examples per class (k = 1, 4, 16), the query is the rest. The finite class (|Theta|
adapters) is drawn once per seed before any downstream data are seen, so it is independent of every episode's
support set, and certified on each (docs/certified_transfer.md). SGD-LoRA's steps and learning rate are chosen on
validation episodes; everything is measured once on the test episodes.
"""

import argparse
import math
import os
import sys

import torch

from diffusers_ext import SampleThenEvaluatePipeline, finite_class_certificate
from diffusers_ext.data.digit_domains import sample_domain
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.evaluation.certified_transfer import (
    episode_classes,
    gaussian_fit_sample,
    load_proxy,
    make_task,
    parameter_count_bound,
    sgd_pac_bayes_bound,
    split_class_combinations,
)
from diffusers_ext.evaluation.protocol import binomial_standard_error, mean_spread, target
from diffusers_ext.evaluation.reporting import (
    add_from_results_argument,
    choose_on_validation,
    command,
    rebuild_results,
    without_machine_paths,
    write_results,
)


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
TITLE = "Certified few-shot transfer (digits-episodes proxy)"
CHANCE_ERROR = 0.8  # the error of guessing on the proxy's 5-way episodes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model_dir", default=None, help="A SampleThenEvaluatePipeline folder (the training output; required)."
    )
    parser.add_argument("--classifier_path", default="diffusers_ext/zoo/digits-classifier", help="Frozen backbone.")
    parser.add_argument("--num_episodes", type=int, default=200, help="Test episodes.")
    parser.add_argument("--num_validation_episodes", type=int, default=40, help="Validation episodes.")
    parser.add_argument("--shots", type=int, nargs="+", default=[1, 4, 16], help="Support examples per class.")
    parser.add_argument("--num_hypotheses", type=int, default=500, help="|Theta| of the sampled classes.")
    parser.add_argument("--num_inference_steps", type=int, default=25, help="DDIM steps of the sampler.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Seeds of the class draws.")
    parser.add_argument("--delta", type=float, default=0.05, help="Certificate failure probability.")
    parser.add_argument(
        "--oracle_episodes", type=int, default=50, help="Test episodes of the oracle-pick headroom (top shots)."
    )
    parser.add_argument(
        "--pac_bayes_draws", type=int, default=500, help="Posterior draws of SGD-LoRA's PAC-Bayes Gibbs risk."
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Results stem (default: results/certified_transfer; with --from_results, that file's own stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.from_results is None and args.model_dir is None:
        parser.error("--model_dir is required (unless --from_results).")
    if args.output is None:
        args.output = (
            os.path.splitext(args.from_results)[0]
            if args.from_results
            else os.path.join(RESULTS, "certified_transfer")
        )
    return args


def build_episodes(proxy, split: str, num: int, shots, seed: int):
    """Episodes `[{"classes", "domain", per shot k: (support hidden, targets), (query hidden, targets)}]`."""
    images, labels = load_digits_images("heldout", resolution=8)
    _, downstream = split_class_combinations(episode_classes(), 0.3, torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed + (0 if split == "test" else 10_000))
    episodes = []
    for _ in range(num):
        classes = downstream[int(torch.randint(len(downstream), (1,), generator=generator))]
        domain = sample_domain(generator, "downstream")
        hidden, targets = make_task(proxy, images, labels, classes, domain, generator)
        order = torch.randperm(len(targets), generator=generator)
        ranks = torch.zeros(len(targets), dtype=torch.long)
        for c in range(5):
            members = order[targets[order] == c]
            ranks[members] = torch.arange(len(members))
        episode = {"classes": torch.tensor(classes), "domain": domain.to_dict(), "splits": {}}
        for k in shots:
            support = ranks < k
            episode["splits"][k] = ((hidden[support], targets[support]), (hidden[~support], targets[~support]))
        episodes.append(episode)
    return episodes


def stacked(episodes, k, part):
    """`(hidden (T, n, ...), targets (T, n), classes (T, 5))` of one part (0 support, 1 query) at `k` shots; every
    episode has exactly `5 k` support examples; queries are evaluated one by one (their sizes differ)."""
    hidden = torch.stack([e["splits"][k][part][0] for e in episodes])
    targets = torch.stack([e["splits"][k][part][1] for e in episodes])
    return hidden, targets, torch.stack([e["classes"] for e in episodes])


def class_risks(proxy, vectors, episodes, k):
    """Support risks `(T, H)` of one fixed class `(H, dim)` on every episode."""
    return torch.stack(
        [proxy.risks(vectors, e["splits"][k][0][0], e["splits"][k][0][1], e["classes"]) for e in episodes]
    )


def query_errors(proxy, picked, episodes, k):
    """Query errors `(T,)` of one picked adapter per episode, `picked` `(T, dim)`."""
    return torch.stack(
        [
            proxy.risks(picked[i : i + 1], e["splits"][k][1][0], e["splits"][k][1][1], e["classes"])[0]
            for i, e in enumerate(episodes)
        ]
    )


def summarise(emp, bound, query):
    """Per-method record at one shot setting; `bound` may be the Hoeffding or kl certificate."""
    return {
        "query_accuracy": float(1 - query.mean()),
        "query_accuracy_se": binomial_standard_error(float(1 - query.mean()), len(query)),
        "empirical_risk": float(emp.mean()),
        "certificate_mean": float(bound.mean()),
        "non_vacuous": float((bound < 1).float().mean()),
        # a 5-way task's chance error is 0.8: a bound in (0.8, 1) is "non-vacuous" yet says less than guessing
        "below_chance": float((bound < CHANCE_ERROR).float().mean()),
        "violation_rate": float((query > bound).float().mean()),
        "episodes": len(query),
    }


def finite_class_method(proxy, vectors, episodes, k, delta, risks=None, oracle_episodes=0):
    """Pick the lowest-support-risk member of the fixed class `vectors` in every episode; certify it. `risks`
    `(T, H)`: the support risks if already computed (the pipeline's); `oracle_episodes`: on that many episodes also
    the query accuracy of the class member best on the query set (the class's headroom)."""
    if risks is None:
        risks = class_risks(proxy, vectors, episodes, k)
    index = risks.argmin(1)
    emp = risks.gather(1, index[:, None])[:, 0]
    query = query_errors(proxy, vectors[index], episodes, k)
    n = 5 * k
    record = summarise(emp, finite_class_certificate(emp, n, len(vectors), delta), query)
    kl = finite_class_certificate(emp, n, len(vectors), delta, "kl")
    record.update(kl_certificate_mean=float(kl.mean()), kl_non_vacuous=float((kl < 1).float().mean()))
    record["kl_below_chance"] = float((kl < CHANCE_ERROR).float().mean())
    record["kl_violation_rate"] = float((query > kl).float().mean())
    if oracle_episodes:
        oracle = [proxy.risks(vectors, *e["splits"][k][1], e["classes"]).min() for e in episodes[:oracle_episodes]]
        record["oracle_pick_query_accuracy"] = float(1 - torch.stack(oracle).mean())
    return record


def sgd_method(proxy, episodes, k, steps, lr, delta, seed=0, num_draws=None):
    """SGD-fitted LoRA on each support set. Its honest certificate (with `num_draws`) is the PAC-Bayes bound of a
    Gaussian posterior around the SGD solution with the prior centred at its initialisation
    (`sgd_pac_bayes_bound`, McAllester's form as `certificate_mean`, the kl form beside it), checked against the
    posterior's query error; the 32-bit parameter-count bound of the deterministic adapter is reported too."""
    hidden, targets, classes = stacked(episodes, k, 0)
    generator = torch.Generator().manual_seed(seed)
    init = proxy.init_vectors(len(episodes), generator)
    fitted = proxy.fit(hidden, targets, classes, steps, lr, generator, init=init)
    with torch.no_grad():
        emp = (proxy.logits(fitted, hidden, classes).argmax(-1) != targets).float().mean(1)
    query = query_errors(proxy, fitted, episodes, k)
    count = torch.tensor([parameter_count_bound(float(r), 5 * k, proxy.dim, delta) for r in emp])
    if num_draws is None:  # validation: accuracy only
        return summarise(emp, count, query)
    pac = sgd_pac_bayes_bound(
        proxy,
        fitted,
        init,
        hidden,
        targets,
        classes,
        torch.Generator().manual_seed(seed + 1),
        delta,
        num_draws=num_draws,
    )
    # the Gibbs posterior's query error (20 draws per episode), which is what the PAC-Bayes bound certifies
    draws = pac["posterior_draws"](20, torch.Generator().manual_seed(seed + 2))
    gibbs_query = torch.stack(
        [proxy.risks(draws[i], *e["splits"][k][1], e["classes"]).mean() for i, e in enumerate(episodes)]
    )
    record = summarise(pac["gibbs_risk"], pac["bound"], gibbs_query)
    record.update(
        deterministic_query_accuracy=float(1 - query.mean()),
        deterministic_empirical_risk=float(emp.mean()),
        gibbs_query_accuracy=float(1 - gibbs_query.mean()),
        kl_certificate_mean=float(pac["kl_bound"].mean()),
        kl_non_vacuous=float((pac["kl_bound"] < 1).float().mean()),
        kl_below_chance=float((pac["kl_bound"] < 0.8).float().mean()),
        kl_violation_rate=float((gibbs_query > pac["kl_bound"]).float().mean()),
        prior_sigma_median=float(pac["sigma"].median()),
        kl_divergence_median=float(pac["kl"].median()),
        parameter_count_bound_mean=float(count.mean()),
        parameter_count_non_vacuous=float((count < 1).float().mean()),
    )
    # the accuracy STEEL is compared with is the deterministic SGD adapter's (what a user runs)
    record["query_accuracy"] = record["deterministic_query_accuracy"]
    record["query_accuracy_se"] = binomial_standard_error(record["query_accuracy"], len(query))
    return record


def model_record(model_dir):
    """What the results need to name the trained model: its training command and metrics, model and scheduler
    configs."""
    import json

    record = {}
    for key, path in (
        ("training", "training_metrics.json"),
        ("model_config", os.path.join("model", "config.json")),
        ("scheduler_config", os.path.join("scheduler", "scheduler_config.json")),
    ):
        full = os.path.join(model_dir, path)
        if os.path.isfile(full):
            with open(full, encoding="utf-8") as f:
                record[key] = json.load(f)
    if "command" in record.get("training", {}):
        record["training"]["command"] = without_machine_paths(record["training"]["command"])
    record.get("model_config", {}).pop("parameter_names", None)
    record.get("model_config", {}).pop("parameter_shapes", None)
    return record


def value(methods: dict, method: str, k, metric: str) -> float:
    """`metric` of `method` at `k` shots: the mean over seeds where the method has seeds, else its one number."""
    entry = methods[method][str(k)][metric]
    return entry["mean"] if isinstance(entry, dict) else entry


def targets_from_results(results: dict) -> list[dict]:
    """The computed targets, from the recorded `methods` and settings (the measuring run and `--from_results`)."""
    settings, methods = results["settings"], results["methods"]
    shots, k_max = settings["shots"], max(settings["shots"])
    steel = value(methods, "steel", k_max, "query_accuracy")
    violation = max(value(methods, "steel", k, "violation_rate") for k in shots)
    return [
        target(
            f"STEEL certificate violation rate (max over shots, {settings['num_episodes']} episodes)",
            violation,
            settings["delta"],
            "<=",
        ),
        target(f"STEEL non-vacuous fraction at {k_max} shots", value(methods, "steel", k_max, "non_vacuous"), 0.9),
        target(
            f"SGD-LoRA non-vacuous fraction at {k_max} shots (PAC-Bayes bound, best prior scale)",
            value(methods, "sgd_lora", k_max, "non_vacuous"),
            0.0,
            "<=",
        ),
        target(
            f"STEEL query accuracy minus SGD-LoRA's at {k_max} shots",
            steel - value(methods, "sgd_lora", k_max, "query_accuracy"),
            -0.10,
        ),
        target(
            f"STEEL minus Gaussian-fit random adapters, query accuracy at {k_max} shots",
            steel - value(methods, "gaussian", k_max, "query_accuracy"),
            1e-9,
        ),
        target(
            f"STEEL minus best upstream adapter, query accuracy at {k_max} shots",
            steel - value(methods, "best_upstream", k_max, "query_accuracy"),
            1e-9,
        ),
    ]


def report_sections(results: dict) -> list[str]:
    """The Markdown sections after the standard header and targets table, from the results alone."""
    settings, methods = results["settings"], results["methods"]
    headroom, sgd_choice = results["summary"]["headroom"], results["sgd_validation"]
    shots, k_max, oracle_episodes = settings["shots"], max(settings["shots"]), settings["oracle_episodes"]
    lines = [
        "## Headroom",
        "",
        "| shots | frozen backbone query accuracy |",
        "| --- | --- |",
    ]
    for k in shots:
        lines.append(f"| {k} | {headroom['frozen_backbone_query_accuracy'][str(k)]:.3f} |")
    lines += [
        "",
        f"Oracle pick from the STEEL class (the member best on the query set, {k_max} shots, first "
        f"{oracle_episodes} test episodes): query accuracy "
        f"{headroom[f'oracle_pick_from_steel_class_{k_max}_shots_{oracle_episodes}_episodes']:.3f}.",
    ]
    lines += ["", "## Query accuracy, certificate, non-vacuous fraction, violation rate (test episodes)", ""]
    lines += [
        "| method | shots | query acc | emp. risk | certificate (Hoeffding form) | non-vacuous | violation rate "
        "| kl certificate | kl below chance (0.8) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "steel": "STEEL (diffusion class)",
        "gaussian": "Gaussian-fit class",
        "best_upstream": "best upstream adapter (class of the upstream adapters)",
        "sgd_lora": "SGD-LoRA (PAC-Bayes, Gaussian posterior; Gibbs risks)",
    }
    for method, label in names.items():
        for k in shots:
            row = [
                value(methods, method, k, m)
                for m in (
                    "query_accuracy",
                    "empirical_risk",
                    "certificate_mean",
                    "non_vacuous",
                    "violation_rate",
                    "kl_certificate_mean",
                    "kl_below_chance",
                )
            ]
            lines.append(f"| {label} | {k} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    lines += [
        "",
        "SGD-LoRA's query accuracy is its deterministic adapter's; its empirical risk, certificate and violation rate "
        "are those of the Gaussian posterior the PAC-Bayes bound certifies. Its 32-bit parameter-count bound:",
        "",
        "| shots | SGD deterministic emp. risk | parameter-count bound | non-vacuous | Gibbs query acc | median prior sigma "
        "| median KL (nats) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in shots:
        sgd = methods["sgd_lora"][str(k)]
        lines.append(
            f"| {k} | {sgd['deterministic_empirical_risk']:.3f} | {sgd['parameter_count_bound_mean']:.3f} | "
            f"{sgd['parameter_count_non_vacuous']:.3f} | {sgd['gibbs_query_accuracy']:.3f} | "
            f"{sgd['prior_sigma_median']:.4g} | {sgd['kl_divergence_median']:.4g} |"
        )
    lines += [
        "",
        f"SGD-LoRA chosen on validation: {sgd_choice['chosen']['name']}. Seeds of the class draws: {settings['seeds']} (mean over seeds shown).",
    ]
    return lines


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json` and `.md` through the shared reporting module."""
    s = results["settings"]
    write_results(
        stem,
        results,
        TITLE,
        sections=report_sections(results),
        settings_line=f"|Theta| = {s['num_hypotheses']}, delta = {s['delta']}, {s['num_episodes']} test episodes, shots {s['shots']}",
    )


def main(argv=None):
    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        write_report(results, args.output)
        return results
    torch.set_num_threads(1)
    proxy = load_proxy(args.classifier_path)
    pipe = SampleThenEvaluatePipeline.from_pretrained(args.model_dir)
    from diffusers import DDIMScheduler

    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    from safetensors.torch import load_file

    upstream = load_file(os.path.join(args.model_dir, "upstream_adapters.safetensors"))["vectors"]
    validation = build_episodes(proxy, "validation", args.num_validation_episodes, args.shots, 0)
    test = build_episodes(proxy, "test", args.num_episodes, args.shots, 0)
    k_max = max(args.shots)

    # SGD-LoRA: steps and learning rate on validation (16-shot query accuracy), then frozen
    grid = [{"steps": s, "lr": lr} for s in (30, 100) for lr in (0.01, 0.05)]
    sgd_choice = choose_on_validation(
        grid,
        lambda c, split: sgd_method(proxy, validation, k_max, c["steps"], c["lr"], args.delta),
        lambda m: m["query_accuracy"],
        names=lambda c: f"steps={c['steps']},lr={c['lr']}",
        test=False,
    )
    chosen = sgd_choice["chosen"]["candidate"]

    methods = {"steel": {}, "gaussian": {}, "best_upstream": {}, "sgd_lora": {}, "frozen_backbone": {}}
    for k in args.shots:
        steel, gauss = [], []
        for seed in args.seeds:
            generator = torch.Generator().manual_seed(seed)
            # the class is drawn by the pipeline before any support risk is computed; evaluate_fn sees every episode
            out = pipe(
                num_hypotheses=args.num_hypotheses,
                evaluate_fn=lambda h, k=k: class_risks(proxy, h, test, k),
                num_support=5 * k,
                delta=args.delta,
                generator=generator,
                num_inference_steps=args.num_inference_steps,
            )
            oracle = args.oracle_episodes if k == k_max else 0
            steel.append(
                finite_class_method(proxy, out.hypotheses, test, k, args.delta, out.risks, oracle_episodes=oracle)
            )
            gauss.append(
                finite_class_method(
                    proxy, gaussian_fit_sample(upstream, args.num_hypotheses, generator), test, k, args.delta
                )
            )
        methods["steel"][str(k)] = {"seeds": steel, **{m: mean_spread(r[m] for r in steel) for m in steel[0]}}
        methods["gaussian"][str(k)] = {"seeds": gauss, **{m: mean_spread(r[m] for r in gauss) for m in gauss[0]}}
        methods["best_upstream"][str(k)] = finite_class_method(proxy, upstream, test, k, args.delta)
        methods["sgd_lora"][str(k)] = sgd_method(
            proxy, test, k, chosen["steps"], chosen["lr"], args.delta, num_draws=args.pac_bayes_draws
        )
        zero = torch.zeros(1, proxy.dim)
        frozen = query_errors(proxy, zero.expand(len(test), -1), test, k)
        methods["frozen_backbone"][str(k)] = {"query_accuracy": float(1 - frozen.mean())}

    headroom = {
        "frozen_backbone_query_accuracy": {
            str(k): value(methods, "frozen_backbone", k, "query_accuracy") for k in args.shots
        },
        f"oracle_pick_from_steel_class_{k_max}_shots_{args.oracle_episodes}_episodes": value(
            methods, "steel", k_max, "oracle_pick_query_accuracy"
        ),
    }
    results = {
        "command": command(__file__, argv, omit=("--model_dir", "--output")),
        "settings": {k: v for k, v in vars(args).items() if k not in ("model_dir", "output", "from_results")},
        "model": model_record(args.model_dir),
        "complexity_term": {
            str(k): math.sqrt((math.log(args.num_hypotheses) + math.log(1 / args.delta)) / (10 * k))
            for k in args.shots
        },
        "summary": {"headroom": headroom},
        "sgd_validation": sgd_choice,
        "methods": methods,
    }
    results["summary"] = {"targets": targets_from_results(results), **results["summary"]}
    write_report(results, args.output)
    print(f"wrote {args.output}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
