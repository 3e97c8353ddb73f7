"""Output folders (issue 14, items 5 and 6): a run is written whole or not
at all, in one format, and a place that cannot be written is refused
before any simulation starts."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli

TINY = ["--trace-end-s", "3", "--no-oracle", "--no-figures", "-q"]
COMPARE = ["compare", "--trace-end-s", "3", "--layouts", "end_end", "--compactions", "lazy", "-q"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    """Staging folders beside `folder` (a swap that did not finish)."""
    return [p.name for p in folder.parent.iterdir() if ".unikv-staging-" in p.name]


def replay(out: Path, *extra: str):
    return run_cli(["replay", *TINY, "--out", out, *extra])


@pytest.fixture
def old_run(tmp_path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "run"
    assert replay(out).rc == 0
    return out, snapshot(out)


def _fail_on(name: str, exc: BaseException):
    """A DataFrame.to_parquet that truncates `name` and then raises `exc`."""
    real = pd.DataFrame.to_parquet

    def to_parquet(self, path, *args, **kwargs):
        if Path(path).name == name:
            Path(path).write_bytes(b"PAR1")  # a truncated table, as a crash leaves it
            raise exc
        return real(self, path, *args, **kwargs)

    return to_parquet


def test_a_writer_failing_mid_write_leaves_the_old_run_whole(old_run, monkeypatch):
    out, before = old_run
    full = OSError(errno.ENOSPC, "No space left on device", "requests.parquet")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _fail_on("requests.parquet", full))
    res = replay(out, "--trace-end-s", "5")
    assert_refused(res, "requests.parquet", "no space left")
    assert snapshot(out) == before and leftovers(out) == []


def test_ctrl_c_mid_write_leaves_the_old_run_whole(old_run, monkeypatch):
    out, before = old_run
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _fail_on("requests.parquet", KeyboardInterrupt()))
    res = replay(out, "--trace-end-s", "5")
    assert res.rc == 130 and "Traceback" not in res.stderr and "interrupted" in res.stderr
    assert snapshot(out) == before and leftovers(out) == []


KILLER = """
import os, signal, sys
from pathlib import Path
import pandas as pd
real = pd.DataFrame.to_parquet
def to_parquet(self, path, *args, **kwargs):
    if Path(path).name == "requests.parquet":
        Path(path).write_bytes(b"PAR1")
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, path, *args, **kwargs)
pd.DataFrame.to_parquet = to_parquet
from unikv.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_mid_write_leaves_the_old_run_whole_and_the_next_run_cleans_up(old_run):
    out, before = old_run
    child = subprocess.run([sys.executable, "-c", KILLER, "replay", *TINY, "--trace-end-s", "5",
                            "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert snapshot(out) == before
    assert leftovers(out)  # the killed run's staging folder, never the output itself
    assert replay(out, "--trace-end-s", "5").rc == 0
    assert leftovers(out) == [] and snapshot(out) != before
    assert_complete_or_absent(out)


def test_a_run_in_the_other_format_replaces_every_table(old_run):
    out, _ = old_run
    assert replay(out, "--format", "csv").rc == 0
    assert_complete_or_absent(out, "csv")


def test_figures_are_only_those_of_the_run_just_made(tmp_path):
    out = tmp_path / "run"
    assert run_cli(["replay", "--trace-end-s", "3", "--no-oracle", "-q", "--out", out]).rc == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["capacity_over_time.png", "compaction_cost.png",
                                                           "frontiers.png"]
    assert replay(out, "--format", "csv").rc == 0  # no figures this time: none may be left
    assert list(out.glob("*.png")) == []
    assert_complete_or_absent(out, "csv")


def test_an_interrupted_compare_leaves_the_old_comparison_whole(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    assert run_cli([*COMPARE, "--out", out]).rc == 0
    before = snapshot(out)
    assert "comparison.csv" in before and "end_end_lazy/summary.json" in before

    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "comparison.png")

    monkeypatch.setattr("unikv.sim.figures.comparison", broken)
    assert_refused(run_cli([*COMPARE, "--trace-end-s", "5", "--out", out]), "comparison.png")
    assert snapshot(out) == before and leftovers(out) == []


# --- item 6: output locations checked before the simulation starts --------


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if a simulation starts."""
    def run(*args, **kwargs):
        raise AssertionError("the simulation started before --out was checked")

    monkeypatch.setattr("unikv.sim.run.run", run)


@pytest.mark.parametrize("command", [["replay", *TINY], COMPARE])
def test_out_that_is_a_file_is_refused_at_once(tmp_path, no_run, command):
    path = tmp_path / "taken"
    path.write_text("mine")
    assert_refused(run_cli([*command, "--out", path]), str(path), "file")
    assert path.read_text() == "mine"


@pytest.mark.parametrize("command", [["replay", *TINY], COMPARE])
def test_out_under_a_file_is_refused_at_once(tmp_path, no_run, command):
    (tmp_path / "f").write_text("mine")
    assert_refused(run_cli([*command, "--out", tmp_path / "f" / "deeper" / "run"]), "f", "is a file")


def test_a_folder_that_is_not_a_run_is_refused_and_left_alone(tmp_path, no_run):
    (tmp_path / "notes.txt").write_text("mine")
    assert_refused(replay(tmp_path), "not a unikv run", str(tmp_path))
    assert snapshot(tmp_path) == {"notes.txt": b"mine"}


def test_a_read_only_folder_is_refused_at_once(tmp_path, no_run):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root (or without permission checks): chmod does not stop writes")
        assert_refused(replay(ro / "run"), str(ro), "permission denied")
    finally:
        ro.chmod(0o700)


def test_a_location_where_no_folder_can_be_made_is_refused_at_once(no_run):
    """/proc takes no new folders, even for root."""
    if not Path("/proc/self").exists():
        pytest.skip("no /proc on this system")
    assert_refused(replay(Path("/proc/unikv-run")), "/proc", "cannot make a folder")


def test_a_failed_write_removes_the_parent_folders_it_made(tmp_path, monkeypatch):
    full = OSError(errno.ENOSPC, "No space left on device", "steps.parquet")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _fail_on("steps.parquet", full))
    assert_refused(replay(tmp_path / "a" / "b" / "run"), "no space left")
    assert list(tmp_path.iterdir()) == []
