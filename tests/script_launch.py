"""How the tests start a training script with N real processes on the CPU: one spelling for every script test.

`accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's simple launcher handles `--cpu`; the
run logs `Num processes: 1` and its checkpoints hold only `random_states_0.pkl`). Two processes on a CPU are
`torchrun --standalone --nproc_per_node 2` with `ACCELERATE_USE_CPU=true`, which makes each process's `Accelerator`
join a gloo process group (`DistributedType.MULTI_CPU`). Run as a script, this file is that launcher:

    python tests/script_launch.py --nproc_per_node 2 training/train_ddpm.py --output_dir out ...

is `ACCELERATE_USE_CPU=true torchrun --standalone --nproc_per_node 2 ...` (the command the README documents) with a free port picked for each run, so tests can run side by side.
"""

import os
import sys
from pathlib import Path


# What the documented command sets (mixed precision and dynamo keep accelerate's defaults, "no").
CPU_LAUNCH_ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}


def accelerate_cpu_launch(num_processes: int = 2) -> list[str]:
    """The command prefix that runs a training script as `num_processes` data-parallel CPU processes (gloo); the
    script and its arguments follow it. Assert the world size with [`assert_world_size`]."""
    return [sys.executable, os.path.abspath(__file__), "--nproc_per_node", str(num_processes)]


def assert_world_size(log: str, checkpoint: str | os.PathLike, num_processes: int = 2) -> None:
    """Check that a run really had `num_processes` processes: accelerate's state line in `log` says so, and the
    checkpoint folder holds one random-state file per process (accelerate writes `random_states_<rank>.pkl`)."""
    assert f"Num processes: {num_processes}" in log, f"the run did not log 'Num processes: {num_processes}'"
    states = sorted(path.name for path in Path(checkpoint).glob("random_states_*.pkl"))
    assert states == [f"random_states_{rank}.pkl" for rank in range(num_processes)], states


if __name__ == "__main__":
    from torch.distributed.run import main

    os.environ.update(CPU_LAUNCH_ENV)
    main(["--standalone", *sys.argv[1:]])
