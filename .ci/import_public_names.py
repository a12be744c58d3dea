"""Import every public name of `diffusers_ext` and `diffusers_ext.evaluation` (both lazy), so an API that an installed
dependency lacks fails here, by name, rather than on a user's first call.

    python .ci/import_public_names.py
"""

import importlib
import sys


def main() -> None:
    failures, count = [], 0
    for package in ("diffusers_ext", "diffusers_ext.evaluation"):
        module = importlib.import_module(package)
        for name in module.__all__:
            count += 1
            try:
                getattr(module, name)
            except Exception as error:  # report every failing name, not only the first
                failures.append(f"{package}.{name}: {type(error).__name__}: {error}")
    if failures:
        sys.exit("names that do not import:\n" + "\n".join(failures))
    print(f"all {count} public names of diffusers_ext and diffusers_ext.evaluation import")


if __name__ == "__main__":
    main()
