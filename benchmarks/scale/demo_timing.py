#!/usr/bin/env python
"""Time `diffusers-ext demo`: the default settings against `--quick`, section by section, in one process.

    python benchmarks/scale/demo_timing.py

Writes `benchmarks/scale/results/demo_timing.json` and `demo_timing.md`. Both modes run here one after the other on the
same seed and device, so `ratio` (default / quick) holds even on a shared, noisy machine; `default_seconds` is the
wall-clock a new user waits on this machine (the target: at most 3 minutes on 2 cores). The number of torch threads
used is recorded beside it.
"""

import argparse
import os
import platform
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
DEFAULT_SECONDS_TARGET = 180.0


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of both demo runs.")
    parser.add_argument("--device", default="cpu", help="torch device of both runs.")
    parser.add_argument("--output_dir", default=RESULTS, help="Where demo_timing.json/.md go.")
    add_from_results_argument(parser)
    return parser.parse_args(argv)


def demo_targets(summary: dict) -> list[dict]:
    """The wall-clock target, from the measured default seconds."""
    from diffusers_ext.evaluation.protocol import target

    return [
        target(
            "default demo wall-clock seconds on this machine", summary["default_seconds"], DEFAULT_SECONDS_TARGET, "<="
        )
    ]


def report_sections(result: dict) -> list[str]:
    """The per-section timing table after the standard header and targets table."""
    summary = result["summary"]
    return [
        "| section | quick (s) | default (s) |",
        "| --- | --- | --- |",
        *(f"| {name} | {t['quick']:.1f} | {t['default']:.1f} |" for name, t in summary["sections"].items()),
        f"| **all** | **{summary['quick_seconds']:.1f}** | **{summary['default_seconds']:.1f}** |",
        "",
        f"Default / quick: {summary['ratio']:.2f}x.",
    ]


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        result = rebuild_results(args.from_results, lambda r: demo_targets(r["summary"]), rel_to=REPO)
    else:
        result = measure(args, argv)
    machine = result["machine"]
    write_results(
        os.path.join(args.output_dir, "demo_timing"),
        result,
        "`diffusers-ext demo` timing",
        report_sections(result),
        settings_line=f"{machine['cpu_count']} CPUs, {machine['torch_threads']} "
        "torch threads; both modes in one process.",
    )
    return result


def measure(args, argv) -> dict:
    import torch

    from diffusers_ext.demo import run_demo
    from diffusers_ext.evaluation.reporting import command

    runs = {}
    for mode in ("quick", "default"):
        with tempfile.TemporaryDirectory() as report_dir:
            start = time.perf_counter()
            _, sections = run_demo(report_dir, mode=mode, seed=args.seed, device=args.device, progress=False)
            runs[mode] = {"seconds": time.perf_counter() - start, "sections": sections}
        print(f"{mode}: {runs[mode]['seconds']:.1f} s", file=sys.stderr)

    default_seconds, quick_seconds = runs["default"]["seconds"], runs["quick"]["seconds"]
    summary = {
        "default_seconds": default_seconds,
        "quick_seconds": quick_seconds,
        "ratio": default_seconds / quick_seconds,
        "sections": {
            name: {"default": runs["default"]["sections"][name], "quick": runs["quick"]["sections"][name]}
            for name in runs["default"]["sections"]
        },
    }
    summary["targets"] = demo_targets(summary)
    return {
        "command": command(__file__, argv),
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "device": args.device,
        },
        "summary": summary,
    }


if __name__ == "__main__":
    main()
