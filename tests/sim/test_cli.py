"""The command line: --version, python -m unikv, progress bars, --quiet, --hardware."""

import io
import json
import re
import subprocess
import sys
import warnings
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


class FakeTTY(io.StringIO):
    """A stderr that says it is a terminal, so progress bars are drawn."""

    def isatty(self) -> bool:
        return True


def _failing_run(exc: BaseException):
    """A `sim.run.run` that advances the bar, warns, then raises `exc`."""
    def run(config, *, progress=None, **kwargs):
        if progress is not None:  # None: no bar (stderr is not a terminal)
            progress(1, 10)
            progress(2, 10)
        warnings.warn("3 rows re-sorted", UserWarning, stacklevel=1)
        raise exc

    return run


def screen(text: str) -> list[str]:
    """The lines a terminal shows for `text`: each carriage return goes back
    to the line's start and overwrites what it covers (as tqdm redraws)."""
    lines = []
    for raw in text.split("\n"):
        shown: list[str] = []
        for part in raw.split("\r"):
            shown = list(part) + shown[len(part):]
        lines.append("".join(shown).rstrip())
    return lines


def test_a_warning_and_an_error_under_a_progress_bar_start_on_their_own_lines(tmp_path, monkeypatch):
    err = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr("unikv.sim.run.run", _failing_run(ValueError("trace t.csv: row 3: bad time")))
    rc = main(["replay", "--out", str(tmp_path / "run")])
    text = err.getvalue()
    assert rc == 2 and "\r" in text  # the bar was drawn
    shown = screen(text)
    assert [line for line in shown if "error:" in line] == ["error: trace t.csv: row 3: bad time"], shown
    warned = [line for line in shown if "UserWarning: 3 rows re-sorted" in line]
    assert len(warned) == 1 and "req" not in warned[0] and warned[0].startswith(__file__), shown
    assert not (tmp_path / "run").exists()


def test_an_internal_error_shows_its_traceback_and_asks_for_a_bug_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("unikv.sim.run.run", _failing_run(KeyError("steps")))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with pytest.warns(UserWarning):
        rc = main(["replay", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 70 and "Traceback" in err and "KeyError: 'steps'" in err
    assert "internal error" in err and "bug" in err and "report" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("exc", "words"), [
    (PermissionError(13, "Permission denied", "/data/trace.csv"), ["/data/trace.csv", "Permission denied"]),
    (IsADirectoryError(21, "Is a directory", "/data"), ["/data", "Is a directory"]),
    (OSError(28, "No space left on device", "/runs/steps.parquet"), ["/runs/steps.parquet", "No space"]),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), ["utf-8", "invalid start byte"]),
    (ValueError("model m.json: field\nnum_hidden_layers=0"), ["m.json", "num_hidden_layers=0"]),
])
def test_bad_input_errors_are_one_line_with_exit_code_2(tmp_path, capsys, monkeypatch, exc, words):
    monkeypatch.setattr("unikv.sim.run.run", _failing_run(exc))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with pytest.warns(UserWarning):
        rc = main(["replay", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: ")
    assert all(w in err for w in words), err


def test_traces_errors_follow_the_same_policy(tmp_path, capsys, monkeypatch):
    import unikv.traces.cli as traces_cli

    def load(*args, **kwargs):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(traces_cli, "load", load)
    rc = main(["traces", "describe", str(tmp_path / "t.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.startswith("error: ") and "invalid start byte" in err


def test_ctrl_c_during_a_replay_is_exit_130_without_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("unikv.sim.run.run", _failing_run(KeyboardInterrupt()))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with pytest.warns(UserWarning):
        rc = main(["replay", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err and "interrupted" in err


def test_results_cmd_follows_the_same_policy(tmp_path):
    out = subprocess.run([sys.executable, "-m", "unikv.sim.results_cmd", "--replot", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ") and "layouts.csv" in out.stderr and out.stderr.count("\n") == 1
