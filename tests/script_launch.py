"""How the tests start a training script under `accelerate launch` on the CPU: one spelling for every script test."""

import sys


def accelerate_cpu_launch(num_processes: int = 2) -> list[str]:
    """The command prefix `python -m accelerate.commands.launch --cpu --num_processes N` (one machine, no mixed
    precision, no dynamo); the script and its arguments follow it."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
