#!/usr/bin/env python
"""Time `diffusers-ext demo`: the default settings against `--quick`, section by section, in one process.

    python benchmarks/demo_timing.py

Writes `benchmarks/results/demo_timing.json` and `demo_timing.md`. Both modes run here one after the other on the
same seed and device, so `ratio` (default / quick) holds even on a shared, noisy machine; `default_seconds` is the
wall-clock a new user waits on this machine (the target: at most 3 minutes on 2 cores). The number of torch threads
used is recorded beside it.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEFAULT_SECONDS_TARGET = 180.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of both demo runs.")
    parser.add_argument("--device", default="cpu", help="torch device of both runs.")
    parser.add_argument("--output_dir", default=RESULTS, help="Where demo_timing.json/.md go.")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    import torch

    from diffusers_ext.demo import run_demo

    args = parse_args(argv)
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
        "targets": [
            {
                "name": "default demo wall-clock seconds on this machine",
                "value": default_seconds,
                "threshold": DEFAULT_SECONDS_TARGET,
                "met": default_seconds <= DEFAULT_SECONDS_TARGET,
            }
        ],
    }
    result = {
        "command": "python benchmarks/demo_timing.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "device": args.device,
        },
        "summary": summary,
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "demo_timing.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    lines = [
        "# `diffusers-ext demo` timing",
        "",
        f"Measured by `{result['command'].strip()}` ({os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        "threads; both modes in one process).",
        "",
        "| section | quick (s) | default (s) |",
        "| --- | --- | --- |",
        *(f"| {name} | {t['quick']:.1f} | {t['default']:.1f} |" for name, t in summary["sections"].items()),
        f"| **all** | **{quick_seconds:.1f}** | **{default_seconds:.1f}** |",
        "",
        f"Default / quick: {summary['ratio']:.2f}x. Target: the default demo in at most {DEFAULT_SECONDS_TARGET:.0f} s "
        f"({'met' if summary['targets'][0]['met'] else 'missed'}).",
        "",
    ]
    with open(os.path.join(args.output_dir, "demo_timing.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
