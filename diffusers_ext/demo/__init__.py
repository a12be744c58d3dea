"""`diffusers-ext demo`: run each available method on the zoo and write an HTML report."""

import os
import time
from collections.abc import Callable

from .digits import digits_section
from .dirp import dirp_section
from .divide_and_denoise import divide_and_denoise_section
from .e2po import e2po_section
from .report import Section, write_report
from .semantic_nvs import semantic_nvs_section
from .soar import soar_section
from .unlearning import unlearning_section


# (name, section builder). Each method adds its own: builder(output_dir, quick, seed, device) -> Section.
SECTIONS: list[tuple[str, Callable[[str, bool, int, str], Section]]] = [
    ("digits zoo", digits_section),
    ("SOAR decoding", soar_section),
    ("divide-and-denoise", divide_and_denoise_section),
    ("e2po", e2po_section),
    ("SemanticNVS", semantic_nvs_section),
    ("constrained unlearning", unlearning_section),
    ("DIRP", dirp_section),
]


def run_demo(output_dir: str, quick: bool = False, seed: int = 0, device: str = "cpu", progress: bool = True) -> str:
    """Run every demo section and write `output_dir/index.html`; return its path."""
    from tqdm.auto import tqdm

    os.makedirs(output_dir, exist_ok=True)
    sections, timings = [], []
    bar = tqdm(SECTIONS, desc="diffusers-ext demo", unit="section", disable=not progress)
    for name, build in bar:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        sections.append(build(output_dir, quick, seed, device))
        timings.append(f"{name}: {time.perf_counter() - start:.1f} s")
    intro = (
        "What each method of diffusers-ext does on the bundled zoo checkpoints, run just now on this machine "
        f"({'quick' if quick else 'full'} settings, device {device}, seed {seed}). Timings: {'; '.join(timings)}."
    )
    return write_report(output_dir, "diffusers-ext demo", intro, sections)
