"""Where the tests find the research record: `benchmarks/<method>/<script>.py` and `benchmarks/<method>/results/`.

One spelling for every test that runs a benchmark script or reads its committed results:

    bench = load_benchmark("divide_and_denoise")           # benchmarks/divide_and_denoise/divide_and_denoise.py
    results = json.loads(results_file("soar.json").read_text())
"""

from pathlib import Path

from diffusers_ext.evaluation.reporting import load_script


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _unique(pattern: str) -> Path:
    found = sorted(BENCHMARKS.glob(pattern))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one benchmarks/{pattern}, found {[str(p) for p in found]}")
    return found[0]


def benchmark_script(name: str) -> Path:
    """The path of the benchmark script `name` (`"soar"` -> `benchmarks/soar/soar.py`), whatever its method folder."""
    return _unique(f"*/{name}.py")


def load_benchmark(name: str, module_name: str | None = None):
    """The benchmark script `name` as a module (benchmarks/ is not a package); `module_name` defaults to `name`."""
    return load_script(str(benchmark_script(name)), module_name or name)


def results_file(file_name: str) -> Path:
    """The committed results file `file_name` (`"soar.json"` -> `benchmarks/soar/results/soar.json`)."""
    return _unique(f"*/results/{file_name}")


def all_results_files(pattern: str = "*.json") -> list[Path]:
    """Every committed results file matching `pattern`, over all method folders, sorted."""
    return sorted(BENCHMARKS.glob(f"*/results/{pattern}"))
