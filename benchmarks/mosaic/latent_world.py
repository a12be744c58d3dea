#!/usr/bin/env python
"""DIRP, Divide-and-Denoise and constrained unlearning on the latent text-to-image zoo model `mosaic-t2i`.

    python benchmarks/mosaic/latent_world.py                       # every part, one process
    python benchmarks/mosaic/latent_world.py --parts dirp unlearning

Each part is its own script (`benchmarks/latent_world_<part>.py`, runnable alone, writing
`results/latent_world_<part>.json`); this one runs the chosen parts' `run()` in one process, one after the other,
with the options each part defines (all prefixed by the part's name, see `--help`), and writes
`benchmarks/mosaic/results/latent_world.json` (`summary.<part>`: the part's numbers and its computed `targets`;
`summary.targets`: every part's targets, named by part) and `latent_world.md`.

`--assemble` runs nothing: it gathers the parts' own committed results files (each from one complete invocation of
its script, whose command and code hash it keeps) into `latent_world.json`, saying so in the file. `--from_results`
measures nothing either: it rebuilds every part's targets from the part's recorded measurements with that part's own
`targets_from_results`.
"""

import argparse
import hashlib
import json
import os
import time


HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.dirname(HERE)
REPO = os.path.dirname(BENCHMARKS)
RESULTS = os.path.join(HERE, "results")
PARTS = ("dirp", "divide_and_denoise", "unlearning")


def part_script(name: str) -> str:
    """`benchmarks/<name>/latent_world_<name>.py`: each part is in its method's record."""
    return os.path.join(BENCHMARKS, name, f"latent_world_{name}.py")


def load_part(name: str):
    """The part's script as a module (benchmarks/ is not a package)."""
    from diffusers_ext.evaluation.reporting import load_script

    return load_script(part_script(name))


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="Parts to run, in order.")
    parser.add_argument(
        "--assemble",
        action="store_true",
        help="Run nothing: gather the parts' committed results files (latent_world_<part>.json).",
    )
    parser.add_argument("--output_dir", default=RESULTS, help="Where latent_world.json and .md go.")
    add_from_results_argument(parser)
    for name in PARTS:
        load_part(name).add_arguments(parser)
    return parser.parse_args(argv)


def part_targets(results: dict, part: str) -> list[dict]:
    """The targets of one part, computed by that part's own `targets_from_results` from what the file records of it
    (`parts.<part>` and `summary.<part>`)."""
    return load_part(part).targets_from_results({**results["parts"][part], "summary": results["summary"][part]})


def targets_from_results(results: dict) -> list[dict]:
    """Every part's computed targets, each name prefixed by its part (the run, `--assemble` and `--from_results`)."""
    return [dict(t, name=f"{part}: {t['name']}") for part in results["parts"] for t in part_targets(results, part)]


def report_sections(results: dict) -> list[str]:
    """One section per part (its own targets table), after the standard header and the table of every target."""
    from diffusers_ext.evaluation.protocol import targets_status
    from diffusers_ext.evaluation.reporting import targets_table

    lines = []
    for part in results["parts"]:
        part_summary = results["summary"][part]
        lines += [
            f"## {part}: {targets_status(part_summary['targets'])}",
            "",
            f"Part results: [latent_world_{part}.md](../../{part}/results/latent_world_{part}.md) "
            f"(`{results['parts'][part]['command']}`)",
            "",
            *targets_table(part_summary["targets"]),
            "",
        ]
    return lines


def write_report(results: dict, stem: str) -> None:
    """`<stem>.json` and `.md` through the shared reporting module."""
    from diffusers_ext.evaluation.reporting import write_results

    write_results(
        stem,
        results,
        "The latent world: DIRP, Divide-and-Denoise and unlearning on `mosaic-t2i`",
        report_sections(results),
        settings_line=f"How: {results['how']} (targets of all parts below).",
    )


def main(argv=None) -> dict:
    from diffusers_ext.evaluation.reporting import command, rebuild_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, targets_from_results, rel_to=REPO)
        for part in results["parts"]:  # the parts' own rows, as rebuilt (the check above compared them)
            results["summary"][part]["targets"] = part_targets(results, part)
        write_report(results, os.path.join(args.output_dir, os.path.splitext(os.path.basename(args.from_results))[0]))
        return results
    run_command = command(__file__, argv)
    parts, summaries = {}, {}
    start = time.perf_counter()
    for name in args.parts:
        if args.assemble:
            path = os.path.join(BENCHMARKS, name, "results", f"latent_world_{name}.json")
            with open(path, "rb") as f:
                raw = f.read()
            part = json.loads(raw)
            part["file_sha256"] = hashlib.sha256(raw).hexdigest()
            part.setdefault("command", f"python benchmarks/{name}/latent_world_{name}.py")
        else:
            part_start = time.perf_counter()
            part = load_part(name).run(args)
            part["seconds"] = time.perf_counter() - part_start
            part.setdefault("command", run_command)
        parts[name] = part
        summaries[name] = part["summary"]
    results = {
        "command": run_command,
        "how": "assembled from the parts' own results files, each from one complete invocation of its script"
        if args.assemble
        else "every part run in this one process",
        "seconds": time.perf_counter() - start,
        "parts": {name: {k: v for k, v in part.items() if k != "summary"} for name, part in parts.items()},
        "summary": summaries,
    }
    results["summary"]["targets"] = targets_from_results(results)
    write_report(results, os.path.join(args.output_dir, "latent_world"))
    return results


if __name__ == "__main__":
    main()
