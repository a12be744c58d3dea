"""The `diffusers-ext` command."""

import argparse
import os
import sys

from .utils import nonnegative_float_arg, positive_float_arg, positive_int_arg


def _check_device(device: str) -> None:
    """Refuse a `--device` this torch can not use (a bad name, or CUDA/MPS/XPU absent) before any model loads."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device!r} is not a torch device name (e.g. cpu, cuda, cuda:1, mps).") from None
    backend = getattr(torch, kind, None) if kind in ("cuda", "mps", "xpu") else None
    if backend is not None and not backend.is_available():
        build = f"torch {torch.__version__}"
        raise ValueError(f"--device {device!r}: {build} sees no {kind.upper()} device here; use --device cpu.")


def _demo(args) -> int:
    from .demo import DemoSectionsFailed, run_demo

    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ValueError(f"--output_dir {args.output_dir!r} exists and is not a folder.")
    _check_device(args.device)
    mode = "quick" if args.quick else "full" if args.full else "default"
    try:
        path, _ = run_demo(args.output_dir, mode=mode, seed=args.seed, device=args.device)
    except DemoSectionsFailed as failed:  # each failure was printed as one line when it happened
        print(f"Report written to {os.path.abspath(failed.path)} ({len(failed.failures)} sections failed)")
        return 1
    print(f"Report written to {os.path.abspath(path)}")
    return 0


def _version() -> str:
    """The installed distribution's version, or the package's `__version__` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("diffusers-ext")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def _zoo(args) -> int:
    from . import zoo

    if args.zoo_command == "list":
        for name in zoo.names():
            print(f"{name:20s} {zoo.ENTRIES[name].description}")
    elif args.zoo_command == "path":
        print(zoo.path(args.name))
    return 0


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _image_files(inputs: list[str]) -> list[str]:
    """Image files named by `inputs` (files, or folders whose images are taken in name order)."""
    files = []
    for item in inputs:
        if os.path.isdir(item):
            files += [os.path.join(item, f) for f in sorted(os.listdir(item)) if f.lower().endswith(IMAGE_SUFFIXES)]
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise FileNotFoundError(f"input {item!r} is neither an image file nor a folder")
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found in {inputs}")
    return files


def _native_size(pipe) -> tuple[int, int] | None:
    """`(width, height)` in pixels of the images the pipeline's model was built for, or None if it does not say."""
    size = getattr(pipe.denoiser.config, "sample_size", None)
    if isinstance(size, int):
        size = (size, size)
    if not (isinstance(size, (list, tuple)) and len(size) == 2):
        return None
    height, width = (int(side) * pipe.vae_scale_factor for side in size)
    return width, height


def _output_names(files: list[str]) -> list[str]:
    """One output PNG name per input: its basename, with `-2`, `-3`, ... added where inputs share one (so that
    `a/x.png` and `b/x.jpg` do not overwrite each other)."""
    names, taken = [], set()
    for f in files:
        stem = os.path.splitext(os.path.basename(f))[0]
        name, copy = f"{stem}.png", 1
        while name in taken:
            copy += 1
            name = f"{stem}-{copy}.png"
        if copy > 1:
            print(f"{f}: written as {name} ({stem}.png is taken by another input)")
        taken.add(name)
        names.append(name)
    return names


def _check_purify_model(name: str, folder: str) -> None:
    """Refuse a `--model` folder DIRP cannot run before anything loads: a pipeline folder with a denoiser (a UNet, or
    an SD3 / Flux transformer) and a scheduler (a classifier's or a VAE's folder holds a model, not a pipeline)."""
    import json

    from .utils import check_saved_folder

    check_saved_folder(
        "--model", folder, "pipeline", example="digits-ddpm or a saved DDPMPipeline / StableDiffusionPipeline"
    )
    with open(os.path.join(folder, "model_index.json"), encoding="utf-8") as f:
        index = json.load(f)

    def holds(part: str) -> bool:
        return isinstance(index.get(part), list) and None not in index[part]

    missing = [
        p
        for p, ok in (
            ("unet or transformer", holds("unet") or holds("transformer")),
            ("scheduler", holds("scheduler")),
        )
        if not ok
    ]
    if missing:
        raise ValueError(
            f"--model {name!r} is a {index['_class_name']} without {' or '.join(missing)}; DIRP purifies with a "
            "diffusion pipeline (e.g. digits-ddpm, or a saved DDPMPipeline / StableDiffusion(XL) / StableDiffusion3 / "
            "Flux pipeline)."
        )


def _purify(args) -> int:
    import json

    import PIL.Image

    from . import zoo

    # what needs neither torch nor the model first: a mistake here is an error in a second, not after the imports
    files = _image_files(args.inputs)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} exists and is not a folder.")
    model = zoo.path(args.model) if args.model in zoo.names() else args.model
    if not os.path.isdir(model):
        raise FileNotFoundError(f"--model {args.model!r} is neither a zoo name ({zoo.names()}) nor a folder")
    _check_purify_model(args.model, model)
    opened = []
    for f in files:
        try:
            image = PIL.Image.open(f)
            image.load()  # read now, which also closes the file (a folder of thousands stays under the fd limit)
            opened.append(image)
        except PIL.UnidentifiedImageError:
            raise ValueError(f"input {f!r} is not an image PIL can read") from None

    import torch

    from . import DIRPPipeline

    _check_device(args.device)
    # float32 whatever the stored weights (some zoo entries store float16; DIRP optimises the image in float32)
    pipe = DIRPPipeline.from_pretrained(model, dtype=torch.float32).to(args.device)
    options = {
        "prompt": args.prompt,
        "num_inversion_steps": args.num_inversion_steps,
        "inversion_strength": args.inversion_strength,
        "num_iterations": args.num_iterations,
        "learning_rate": args.learning_rate,
        "perceptual": args.perceptual,
        "perceptual_budget": args.perceptual_budget,
        "perceptual_weight": args.perceptual_weight,
    }
    # check every option and every image before the first (expensive) batch
    pipe.check_inputs(
        options["num_inversion_steps"],
        options["inversion_strength"],
        options["num_iterations"],
        options["learning_rate"],
        options["perceptual_budget"],
        options["perceptual_weight"],
        0.0,
        "pil",
        None,
    )
    channels = pipe.image_channels
    native = _native_size(pipe)
    images = []
    for f, image in zip(files, opened):
        bands = len(image.getbands())
        if bands != channels or image.mode == "P":
            target = "L" if channels == 1 else "RGB"
            if not args.convert:
                raise ValueError(
                    f"input {f!r} is {image.mode} ({bands} channels), but {args.model!r} takes {channels}-channel "
                    f"({target}) images; pass --convert to convert it to {target}."
                )
            print(f"{f}: converted {image.mode} -> {target} (--convert)")
            image = image.convert(target)
        if args.resolution is not None:
            if image.size != (args.resolution, args.resolution):
                print(f"{f}: resized {image.size[0]}x{image.size[1]} -> {args.resolution}x{args.resolution}")
                image = image.resize((args.resolution, args.resolution), PIL.Image.BICUBIC)
        elif native is not None and image.size != native:
            raise ValueError(
                f"input {f!r} is {image.size[0]}x{image.size[1]}, but {args.model!r} works at {native[0]}x{native[1]}; "
                f"pass --resolution {native[0]} to resize it (or another size the model can take)."
            )
        pipe.preprocess(image)
        images.append(image)
    names = _output_names(files)
    os.makedirs(args.out, exist_ok=True)
    report = {"model": args.model, "options": options, "images": {}}
    for start in range(0, len(images), args.batch_size):
        batch = images[start : start + args.batch_size]
        out = pipe(batch, generator=torch.Generator().manual_seed(args.seed), **options)
        for i, image in enumerate(out.images):
            name = names[start + i]
            image.save(os.path.join(args.out, name))
            report["images"][name] = {
                "source": files[start + i],
                "recon_error_before": float(out.recon_error_before[i]),
                "recon_error_after": float(out.recon_error_after[i]),
                "perceptual_distance": float(out.perceptual_distance[i]),
            }
    with open(os.path.join(args.out, "purification.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"Purified {len(files)} images into {os.path.abspath(args.out)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffusers-ext",
        description="Recent diffusion methods as diffusers classes: demo report, DIRP purification, zoo checkpoints.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo_help = "run each method on the zoo and write an HTML report (157 s on 2 CPU cores; --quick 97 s)"
    demo = commands.add_parser(
        "demo",
        help=demo_help,
        description=demo_help[0].upper()
        + demo_help[1:]
        + ". Timings measured by `python benchmarks/scale/demo_timing.py`. "
        "A section that fails is marked in the report with its error; the others still run, and the exit status is 1.",
    )
    demo.add_argument("--output_dir", default="demo_output", help="report folder (default: demo_output)")
    size = demo.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the smallest settings (97 s on 2 CPU cores)")
    size.add_argument(
        "--full", action="store_true", help="larger settings, the first releases' defaults (several times longer)"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of every sample (default: 0)")
    demo.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    demo.set_defaults(func=_demo)

    purify = commands.add_parser("purify", help="purify images of anti-mimicry perturbations with DIRP")
    purify.add_argument("inputs", nargs="+", metavar="IN", help="image files or folders of images")
    purify.add_argument("--out", required=True, help="folder for the purified PNGs and purification.json")
    purify.add_argument(
        "--model", default="digits-ddpm", help="a zoo name or a pipeline folder (default: digits-ddpm)"
    )
    purify.add_argument("--prompt", default="", help="prompt of a text-conditioned model during inversion")
    purify.add_argument(
        "--resolution",
        type=positive_int_arg,
        default=None,
        help="resize images to this square side first (default: images must have the model's size)",
    )
    purify.add_argument(
        "--convert",
        action="store_true",
        help="convert images whose channels differ from the model's (e.g. RGB to grayscale); off: refuse them",
    )
    purify.add_argument("--num_inversion_steps", type=positive_int_arg, default=10)
    purify.add_argument("--inversion_strength", type=positive_float_arg, default=0.5)
    purify.add_argument("--num_iterations", type=positive_int_arg, default=100)
    purify.add_argument("--learning_rate", type=positive_float_arg, default=0.003)
    purify.add_argument(
        "--perceptual",
        default="ssim",
        choices=["ssim", "l2"],
        help="distance of the perceptual budget (default: ssim)",
    )
    purify.add_argument("--perceptual_budget", type=positive_float_arg, default=0.02)
    purify.add_argument("--perceptual_weight", type=nonnegative_float_arg, default=1.0)
    purify.add_argument("--batch_size", type=positive_int_arg, default=8)
    purify.add_argument("--seed", type=int, default=0)
    purify.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    purify.set_defaults(func=_purify)

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
