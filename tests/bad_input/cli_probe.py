"""Run the `unikv` command line on bad input and check how it refuses.

The bad-input corpus (one test file per area in this folder) runs each
case through the CLI exactly as a user would and asserts: exit code 2, one
line on stderr that starts with "error:" and names the problem, no Python
traceback, and an output folder that is either complete or absent.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The outputs a complete `unikv replay` folder holds, by table format.
RUN_FILES = {"parquet": ("steps.parquet", "requests.parquet", "summary.json", "config.json"),
             "csv": ("steps.csv", "requests.csv", "summary.json", "config.json")}


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


def run_cli(args: Sequence[str], *, cwd: Path | None = None) -> Result:
    """`unikv ARGS` in this process (fast); stdout and stderr captured.

    An exception the CLI lets escape propagates to the test: a raw
    traceback is a failure of the case.
    """
    from unikv.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in args])
            except SystemExit as exc:  # argparse exits 2 on a bad flag
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return Result(int(rc or 0), out.getvalue(), err.getvalue())


def run_cli_subprocess(args: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 120,
                       stdin: str | None = None) -> Result:
    """`python -m unikv ARGS` in a child process, killed after `timeout_s`
    (a hang fails the test with subprocess.TimeoutExpired)."""
    proc = subprocess.run([sys.executable, "-m", "unikv", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=timeout_s)
    return Result(proc.returncode, proc.stdout, proc.stderr)


# "error: ..." from unikv, "unikv replay: error: ..." from argparse (after its usage line)
_ERROR_LINE = re.compile(r"^(unikv[\w -]*: )?error: ")


def assert_refused(result: Result, *words: str) -> str:
    """Exit code 2, no traceback, and one stderr line "error: ..." naming
    every one of `words` (case-insensitive). Returns that line."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.rc == 2, (result.rc, result.stderr)
    lines = [line for line in result.stderr.splitlines() if _ERROR_LINE.match(line)]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    missing = [w for w in words if w.lower() not in line.lower()]
    assert not missing, f"{missing} not named in {line!r}"
    return line


def assert_complete_or_absent(out_dir: Path, fmt: str = "parquet") -> None:
    """`out_dir` is absent, or holds a whole run of `fmt` and no table of
    the other format."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    names = {p.name for p in out_dir.iterdir()}
    want = set(RUN_FILES[fmt])
    assert want <= names, f"{out_dir} is missing {sorted(want - names)}"
    other = "csv" if fmt == "parquet" else "parquet"
    stale = [n for n in names if n.endswith(f".{other}")]
    assert not stale, f"{out_dir} holds tables of the other format: {stale}"
