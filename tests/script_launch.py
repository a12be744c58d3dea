"""How the tests start a training script with N real processes on the CPU: one spelling for every script test.

`accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's simple launcher handles `--cpu`; the
run logs `Num processes: 1` and its checkpoints hold only `random_states_0.pkl`). Two processes on a CPU are
`torchrun --standalone --nproc_per_node 2` with `ACCELERATE_USE_CPU=true`, which makes each process's `Accelerator`
join a gloo process group (`DistributedType.MULTI_CPU`). Run as a script, this file is that launcher:

    python tests/script_launch.py --nproc_per_node 2 training/train_ddpm.py --output_dir out ...

is `ACCELERATE_USE_CPU=true torchrun --standalone --nproc_per_node 2 ...` (the command the README documents): a port
the OS assigns for each job's rendezvous, and one job at a time on the machine (`one_launch_at_a_time`), so tests can
run side by side.
"""

import contextlib
import os
import sys
from pathlib import Path


# What the documented command sets (mixed precision and dynamo keep accelerate's defaults, "no").
CPU_LAUNCH_ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}

# Whether the running pytest test carries `@pytest.mark.two_process` (set by an autouse fixture in conftest.py; None
# outside pytest). A multi-process launch from an unmarked test fails, so the marker, the CI step that selects it and
# the docs' list of two-process tests (checked by tests/test_repository.py) cannot miss one.
current_test_is_marked_two_process: bool | None = None


def accelerate_cpu_launch(num_processes: int = 2) -> list[str]:
    """The command prefix that runs a training script as `num_processes` data-parallel CPU processes (gloo); the
    script and its arguments follow it. Assert the world size with [`assert_world_size`]."""
    if num_processes > 1 and current_test_is_marked_two_process is False:
        raise AssertionError(
            f"a test that starts {num_processes} processes must be marked `@pytest.mark.two_process` (and listed in "
            "docs/testing.md, 'Tests with two real processes')."
        )
    return [sys.executable, os.path.abspath(__file__), "--nproc_per_node", str(num_processes)]


def assert_world_size(log: str, checkpoint: str | os.PathLike, num_processes: int = 2) -> None:
    """Check that a run really had `num_processes` processes: accelerate's state line in `log` says so, and the
    checkpoint folder holds one random-state file per process (accelerate writes `random_states_<rank>.pkl`)."""
    assert f"Num processes: {num_processes}" in log, f"the run did not log 'Num processes: {num_processes}'"
    states = sorted(path.name for path in Path(checkpoint).glob("random_states_*.pkl"))
    assert states == [f"random_states_{rank}.pkl" for rank in range(num_processes)], states


# Runs a script as `__main__` once per argument list, in one interpreter, and prints `[exit code, stderr]` per run.
_AS_MAIN_DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback
script, runs = sys.argv[1], json.loads(sys.stdin.read())
for argv in runs:
    err, code = io.StringIO(), 0
    sys.argv = [script, *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    print(json.dumps([code, err.getvalue()]), flush=True)
"""


def run_as_main(script: str, runs: list[list[str]], env: dict | None = None, timeout: int = 300):
    """`[(exit code, stderr)]`: `script` run as `python SCRIPT *argv` for each `argv` of `runs`, all in ONE fresh
    interpreter (`runpy`, as `__main__`), so that a list of argument-error checks pays for one import of torch and
    diffusers instead of one each. An uncaught exception is exit code 1 with its traceback in stderr, as it would be
    from the command line."""
    import json
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", _AS_MAIN_DRIVER, script],
        input=json.dumps(runs),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert result.returncode == 0 and len(lines) == len(runs), result.stderr[-3000:]
    return [tuple(json.loads(line)) for line in lines]


@contextlib.contextmanager
def as_command_line(script: str, argv: list[str]):
    """Within the block, `sys.argv` is `[script, *argv]`, as if `python SCRIPT ARGV` had started this process: a
    script's `main(argv)` called in-process then writes the right command into its model card (which reads
    `sys.argv`), whatever runner started the test process (pytest-xdist workers run as `python -c`)."""
    saved = sys.argv
    sys.argv = [os.path.relpath(script), *argv]
    try:
        yield
    finally:
        sys.argv = saved


def run_bad_arguments(script: str, cases: list, root, common: list[str] = (), env: dict | None = None):
    """`run_as_main` over argument-error `cases` (`[(argv, expected message)]`): case `i` runs with
    `--output_dir root/case<i>`, then `common`, then its own argv."""
    runs = [["--output_dir", str(root / f"case{i}"), *common, *args] for i, (args, _) in enumerate(cases)]
    return run_as_main(script, runs, env=env, timeout=300)


def assert_one_line_argument_error(run: tuple, message: str) -> None:
    """An argparse-style failure: exit code 2, `message` and "error" on the last stderr line, no traceback."""
    code, stderr = run
    assert code == 2, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert message in last and "error" in last, stderr[-2000:]
    assert "Traceback" not in stderr


@contextlib.contextmanager
def one_launch_at_a_time():
    """Hold a machine-wide lock (a `flock` on a file in the temporary folder) while a multi-process job runs, so the
    two-process tests of parallel pytest-xdist workers run one job after the other. Two jobs side by side put four
    gloo processes on a 2-core machine, and a job that timed out at 300 s beside another passed in 11 s alone."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "diffusers-ext-multi-process-launch.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    from torch.distributed.run import main

    os.environ.update(CPU_LAUNCH_ENV)
    # `--standalone`: a c10d rendezvous on a port the OS assigns (localhost:0), so parallel jobs never share one.
    with one_launch_at_a_time():
        main(["--standalone", *sys.argv[1:]])
