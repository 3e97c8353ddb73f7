"""The command line: --version, python -m unikv, progress bars, --quiet, --hardware."""

import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from unikv.sim.cli import compare, replay
from unikv.sim.cost import HardwareSpec

from unikv.cli import main

SMALL = ["--trace-end-s", "10", "--no-figures", "--no-oracle"]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # any control character but tab and newline


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"unikv {metadata.version('unikv')}"


def test_python_dash_m_unikv_is_the_same_cli():
    out = subprocess.run([sys.executable, "-m", "unikv", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"unikv {metadata.version('unikv')}"
    helptext = subprocess.run([sys.executable, "-m", "unikv", "replay", "-h"], capture_output=True, text=True,
                              check=True).stdout
    assert "--quiet" in helptext and "--hardware" in helptext


def _replay(tmp_path, capsys, *extra, tty: bool, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    rc = replay([*SMALL, "--out", str(tmp_path / "run"), *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_progress_bar_is_drawn_on_a_terminal(tmp_path, capsys, monkeypatch):
    rc, out, err = _replay(tmp_path, capsys, tty=True, monkeypatch=monkeypatch)
    assert rc == 0 and "\r" in err and "req" in err and "throughput" in out


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    rc, out, err = _replay(tmp_path, capsys, tty=False, monkeypatch=monkeypatch)
    assert rc == 0 and err == "" and "throughput" in out and not CONTROL.search(out)


def test_quiet_draws_no_progress_and_prints_nothing_on_a_terminal(tmp_path, capsys, monkeypatch):
    rc, out, err = _replay(tmp_path, capsys, "--quiet", tty=True, monkeypatch=monkeypatch)
    assert (rc, out, err) == (0, "", "")
    assert (tmp_path / "run" / "summary.json").exists()  # the outputs are written all the same


def test_compare_quiet_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc = compare(["--trace-end-s", "10", "--layouts", "end_end", "--compactions", "lazy", "-q",
                  "--out", str(tmp_path / "cmp")])
    captured = capsys.readouterr()
    assert (rc, captured.out, captured.err) == (0, "", "")
    assert (tmp_path / "cmp" / "comparison.csv").exists()


def test_every_summary_carries_the_hardware_it_was_charged_at(tmp_path, capsys, monkeypatch):
    data = HardwareSpec.h200().as_dict()
    data["name"] = "slow-mover"
    data["coefficients"]["move_bytes_per_s"] = {"value": 1.15e12, "source": "torch indexing moves"}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    rc, out, _ = _replay(tmp_path, capsys, "--hardware", str(path), tty=False, monkeypatch=monkeypatch)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert rc == 0 and "slow-mover" in out
    assert summary["identity"]["hardware"] == data
    assert json.loads((tmp_path / "run" / "config.json").read_text())["hardware"] == str(path)
    default = _replay(tmp_path, capsys, tty=False, monkeypatch=monkeypatch)
    assert default[0] == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["identity"]["hardware"] == HardwareSpec.h200().as_dict()


def test_a_bad_hardware_file_is_one_line_naming_the_field(tmp_path, capsys, monkeypatch):
    data = HardwareSpec.h200().as_dict()
    data["coefficients"]["mfu"]["value"] = 2.0
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    rc, out, err = _replay(tmp_path, capsys, "--hardware", str(path), tty=False, monkeypatch=monkeypatch)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: hardware file") and "mfu=2.0" in err
    assert not (tmp_path / "run").exists()  # refused before the replay
