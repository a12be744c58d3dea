import os
import re
import subprocess
import sys

import pytest

from diffusers_ext.cli import main


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
    [(["zoo", "path", "digits-gan"], "unknown zoo name 'digits-gan'"), (["frobnicate"], "invalid choice")],
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
