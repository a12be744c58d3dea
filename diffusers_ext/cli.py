"""The `diffusers-ext` command."""

import argparse
import os
import sys


def _demo(args) -> int:
    from .demo import run_demo

    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ValueError(f"--output_dir {args.output_dir!r} exists and is not a folder.")
    path = run_demo(args.output_dir, quick=args.quick, seed=args.seed, device=args.device)
    print(f"Report written to {os.path.abspath(path)}")
    return 0


def _zoo(args) -> int:
    from . import zoo

    if args.zoo_command == "list":
        for name in zoo.names():
            print(f"{name:20s} {zoo.ENTRIES[name].description}")
    elif args.zoo_command == "path":
        print(zoo.path(args.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffusers-ext",
        description="Recent diffusion methods as diffusers classes: demo report and bundled zoo checkpoints.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run each method on the zoo and write an HTML report")
    demo.add_argument("--output_dir", default="demo_output", help="report folder (default: demo_output)")
    demo.add_argument("--quick", action="store_true", help="fewer samples: under 2 minutes on a 2-core CPU")
    demo.add_argument("--seed", type=int, default=0, help="seed of every sample (default: 0)")
    demo.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    demo.set_defaults(func=_demo)

    zoo = commands.add_parser("zoo", help="list or locate the bundled checkpoints")
    zoo_commands = zoo.add_subparsers(dest="zoo_command", required=True, metavar="ZOO_COMMAND")
    zoo_commands.add_parser("list", help="list the bundled checkpoints")
    zoo_path = zoo_commands.add_parser("path", help="print the folder of a bundled checkpoint")
    zoo_path.add_argument("name", help="a name from `diffusers-ext zoo list`")
    zoo.set_defaults(func=_zoo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        parser.exit(2, f"diffusers-ext: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
