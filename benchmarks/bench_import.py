"""Import time of the light base install: `import unikv` and `import unikv.sim`.

Each statement runs in a fresh interpreter (`python -c STMT`, from the
repository root), several times; the table gives the time of the statement
itself inside that interpreter (the import, timed around it: what the target
is about), and the wall time of the whole interpreter (start-up included), as
min and median, the same for `pass` and `import numpy` as the floor a numpy
library cannot go below, and which heavy modules (torch, triton, pandas,
matplotlib) the statement loads. Target: `import unikv` and `import
unikv.sim` under 0.5 s. Not a test: prints a
markdown table, and with `--out` writes it with the date, machine and Python.

    python benchmarks/bench_import.py --runs 15 --out results/import_time.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATEMENTS = ("pass", "import numpy", "import unikv", "import unikv.sim", "import unikv.traces")
HEAVY = ("torch", "triton", "pandas", "matplotlib")
LOADED = "import sys; print(' '.join(m for m in {heavy!r} if m in sys.modules))"


def wall_times(stmt: str, runs: int) -> list[float]:
    """Seconds of `runs` fresh interpreters running `stmt`, each end to end."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", stmt], cwd=ROOT, check=True)
        out.append(time.perf_counter() - t0)
    return out


TIMED = "import time; t0 = time.perf_counter()\n{stmt}\nprint(time.perf_counter() - t0)"


def statement_times(stmt: str, runs: int) -> list[float]:
    """Seconds `stmt` itself takes in each of `runs` fresh interpreters."""
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", TIMED.format(stmt=stmt)], cwd=ROOT, check=True,
                              capture_output=True, text=True)
        out.append(float(done.stdout.strip().splitlines()[-1]))
    return out


def heavy_modules(stmt: str) -> str:
    """The heavy modules a fresh interpreter holds after `stmt`."""
    code = f"{stmt}\n{LOADED.format(heavy=HEAVY)}"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout.strip() or "none"


def table(runs: int) -> str:
    """The markdown table: one row per statement."""
    lines = ["| statement | import min s | import median s | process min s | process median s "
             "| heavy modules loaded |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for stmt in STATEMENTS:
        s, t = statement_times(stmt, runs), wall_times(stmt, runs)
        lines.append(f"| `{stmt}` | {min(s):.3f} | {statistics.median(s):.3f} | {min(t):.3f} "
                     f"| {statistics.median(t):.3f} | {heavy_modules(stmt)} |")
    return "\n".join(lines)


def header(runs: int) -> str:
    """Where the numbers come from: date, machine, load, Python, runs."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"Date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine {platform.machine()} "
            f"{platform.processor() or ''}, {os.cpu_count()} CPUs, load average {load} at start; "
            f"Python {platform.python_version()} ({sys.executable}); {runs} fresh interpreters per "
            f"statement: the import timed inside the interpreter, and the whole process's wall time "
            f"(start-up included).")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="fresh interpreters per statement")
    p.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs={args.runs} must be >= 1")
    head = header(args.runs)
    body = table(args.runs)
    text = f"# Import time\n\n`python benchmarks/bench_import.py --runs {args.runs}`\n\n{head}\n\n{body}\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
