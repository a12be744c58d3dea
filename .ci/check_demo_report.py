"""Check a `diffusers-ext demo` report: every section is there, none failed, each ran with the expected settings.

python .ci/check_demo_report.py demo_output/index.html default
python .ci/check_demo_report.py report/index.html quick
"""

import sys

from diffusers_ext.demo import MODES, SECTIONS


def main(path: str, mode: str) -> None:
    if mode not in MODES:
        sys.exit(f"mode must be one of {MODES}, got {mode!r}")
    page = open(path, encoding="utf-8").read()
    sections = page.count('<section class="demo-section"')
    failed = page.count('<section class="demo-section failed"')
    with_mode = page.count(f"{mode} settings: ")
    if sections != len(SECTIONS) or failed or with_mode != len(SECTIONS):
        sys.exit(
            f"{path}: {sections} of {len(SECTIONS)} sections, {failed} failed, {with_mode} with {mode!r} settings"
        )
    print(f"{path}: all {len(SECTIONS)} sections of the demo ran with {mode} settings")


if __name__ == "__main__":
    main(*sys.argv[1:])
