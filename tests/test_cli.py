import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from diffusers_ext.cli import main
from diffusers_ext.demo.plots import MIN_TEXT_PX


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "diffusers_ext.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_help_and_zoo_list():
    result = _cli("--help")
    assert result.returncode == 0 and "demo" in result.stdout and "zoo" in result.stdout
    result = _cli("zoo", "list")
    assert result.returncode == 0 and "digits-ddpm" in result.stdout and "digits-classifier" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["zoo", "path", "digits-gan"], "unknown zoo name 'digits-gan'"),
        (["frobnicate"], "invalid choice"),
        (["purify", __file__, "--out", "unused"], f"input {__file__!r} is not an image"),
    ],
)
def test_bad_input_is_a_one_line_error(args, message):
    result = _cli(*args)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_demo_rejects_a_file_as_output_dir(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--quick", "--output_dir", str(target)])
    assert exit_info.value.code == 2
    assert "--output_dir" in capsys.readouterr().err


# 80 s; `.ci/run` runs the same quick demo from a bare install on every CI run and checks that every section
# rendered and none failed, so the default tier leaves the report's layout checks here to the slow tier.
@pytest.mark.slow
def test_quick_demo_writes_a_self_contained_report(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--output_dir", str(out)]) == 0
    assert str(out / "index.html") in capsys.readouterr().out
    page = (out / "index.html").read_text(encoding="utf-8")
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) >= 3
    for name in images:
        assert not name.startswith(("http", "/")) and os.path.getsize(out / name) > 1000
    assert "Digits zoo" in page and "http" not in page
    # Every figure at the size the page shows it: no text under MIN_TEXT_PX, none cut off (see demo/plots.py).
    for name in images:
        with Image.open(out / name) as png:
            assert png.text["texts_outside_figure"] == "0", name
            shown = png.text["displayed_min_text_px"]
            assert shown == "" or float(shown) >= MIN_TEXT_PX, (name, shown)
    assert page.count("quick settings: ") == 8  # every section names what it ran with
    assert page.count('<section class="demo-section">') == 8 and "demo-section failed" not in page
    assert "Committed benchmark results (not run now" in page


def test_version():
    from importlib.metadata import version

    result = _cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"diffusers-ext {version('diffusers-ext')}"


def test_demo_help_and_readme_state_the_measured_times():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    timing = json.loads((root / "benchmarks" / "scale" / "results" / "demo_timing.json").read_text(encoding="utf-8"))
    default, quick = round(timing["summary"]["default_seconds"]), round(timing["summary"]["quick_seconds"])
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert f"({default} s; `--quick` {quick} s;" in readme
    demo_help = _cli("demo", "--help").stdout
    assert f"({default} s on 2 CPU cores; --quick {quick} s)" in " ".join(demo_help.split())
    assert f"the smallest settings ({quick} s on 2 CPU cores)" in " ".join(demo_help.split())


def test_a_failed_demo_section_keeps_the_others(tmp_path, capsys, monkeypatch):
    import diffusers_ext.demo as demo

    def broken(output_dir, mode, seed, device):
        raise ModuleNotFoundError("No module named 'datasets'\nsecond line not shown")

    by_name = {entry[0]: entry for entry in demo.SECTIONS}
    name, module, _, benchmark = by_name["DIRP"]
    # two cheap real sections around the broken one: the one after it must still run
    monkeypatch.setattr(
        demo, "SECTIONS", [by_name["mosaic"], (name, module, broken, benchmark), by_name["SOAR decoding"]]
    )
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--output_dir", str(out)]) == 1
    captured = capsys.readouterr()
    error = "ModuleNotFoundError: No module named 'datasets'"
    assert f"demo section 'DIRP' failed: {error}" in captured.err.splitlines()
    assert "second line not shown" not in captured.err and "Traceback" not in captured.err
    assert f"Report written to {out / 'index.html'} (1 sections failed)" in captured.out
    page = (out / "index.html").read_text(encoding="utf-8")
    assert (
        page.count('<section class="demo-section">') == 2 and page.count('<section class="demo-section failed">') == 1
    )
    assert f'<p class="error">This section failed: {error.replace(chr(39), "&#x27;")}</p>' in page
    assert "<h2>mosaic: " in page and "<h2>DIRP</h2>" in page and "<h2>SOAR" in page
    assert page.count("quick settings: ") == 3


def test_demo_modes_are_exclusive_and_complete(capsys):
    from diffusers_ext.demo import MODES, SECTIONS, run_demo

    with pytest.raises(SystemExit):
        main(["demo", "--quick", "--full"])
    assert "not allowed with argument" in capsys.readouterr().err
    for name, module, _, _ in SECTIONS:
        assert set(module.SETTINGS) == set(MODES), name
    with pytest.raises(ValueError, match="`mode` must be one of"):
        run_demo("unused", mode="fast")


def _digit_pngs(folder, count):
    import numpy as np
    import PIL.Image

    from diffusers_ext.data.digits import load_digits_images

    images, _ = load_digits_images("heldout", resolution=8)
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        array = ((images[i, 0].numpy() + 1) * 127.5).round().astype(np.uint8)
        PIL.Image.fromarray(array, mode="L").save(os.path.join(folder, f"digit{i}.png"))


def test_purify_writes_images_and_a_report(tmp_path, capsys):
    import json

    import PIL.Image

    _digit_pngs(tmp_path / "in", 3)
    out = tmp_path / "out"
    code = main(
        [
            "purify",
            str(tmp_path / "in"),
            "--out",
            str(out),
            "--num_iterations",
            "2",
            "--num_inversion_steps",
            "2",
            "--batch_size",
            "2",
        ]
    )
    assert code == 0
    assert sorted(os.listdir(out)) == ["digit0.png", "digit1.png", "digit2.png", "purification.json"]
    assert PIL.Image.open(out / "digit1.png").size == (8, 8)
    report = json.loads((out / "purification.json").read_text())
    assert set(report["images"]) == {"digit0.png", "digit1.png", "digit2.png"}
    assert all(v["recon_error_after"] >= 0 for v in report["images"].values())
    assert "Purified 3 images" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--perceptual_budget", "0"], "perceptual_budget"),
        (["--model", "no-such-model"], "--model"),
        (["--resolution", "9"], "multiple of 2"),
    ],
)
def test_purify_rejects_bad_options_before_work(tmp_path, extra, message):
    _digit_pngs(tmp_path / "in", 1)
    result = _cli("purify", str(tmp_path / "in"), "--out", str(tmp_path / "out"), *extra)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_purify_needs_images(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _cli("purify", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no images" in result.stderr


def test_every_training_script_is_listed_in_the_readme_and_answers_help():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    scripts = sorted((root / "training").glob("train_*.py"))
    for script in scripts:
        assert f"accelerate launch training/{script.name}`" in readme, f"{script.name} is missing from the README"
    # Every script run as `python SCRIPT --help` (as `__main__`), all in one fresh interpreter: one import of torch
    # and diffusers instead of one per script. Prints each script's exit code and whether its output has a usage line.
    driver = (
        "import contextlib, io, runpy, sys\n"
        "for path in sys.argv[1:]:\n"
        "    sys.argv = [path, '--help']\n"
        "    out = io.StringIO()\n"
        "    code = 0\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as exit:\n"
        "        code = exit.code or 0\n"
        "    print(path, code, 'usage' in out.getvalue().lower())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", driver, *map(str, scripts)], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answers = [line.rsplit(" ", 2) for line in result.stdout.strip().splitlines()]
    assert [a[0] for a in answers] == [str(s) for s in scripts], result.stdout
    assert all(code == "0" and usage == "True" for _, code, usage in answers), result.stdout


def test_purify_checks_options_and_inputs_before_importing_torch(tmp_path):
    # A mistake costs a second, not the import of torch and diffusers (~10 s on a 2-core machine).
    _digit_pngs(tmp_path / "in", 1)
    (tmp_path / "text.png").write_text("not an image")
    cases = [
        [str(tmp_path / "in"), "--perceptual_budget", "0"],
        [str(tmp_path / "in"), "--learning_rate", "-1"],
        [str(tmp_path / "in"), "--model", "no-such-model"],
        [str(tmp_path / "text.png")],
    ]
    driver = (
        "import sys\n"
        "from diffusers_ext.cli import main\n"
        "try:\n"
        "    main(['purify', *sys.argv[1:], '--out', sys.argv[1] + '-out'])\n"
        "except SystemExit as exit:\n"
        "    print('exit', exit.code, 'torch' in sys.modules)\n"
    )
    for case in cases:
        result = subprocess.run([sys.executable, "-c", driver, *case], capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == "exit 2 False", (case, result.stdout, result.stderr[-500:])
