"""Peak memory of reading a large trace: `unikv traces describe` and the replay's loader.

Writes two generated traces of about 60 MB each (a Mooncake-like JSONL with
prefix hashes and an Azure-2023-like CSV, seeded), then runs each reader in
a fresh child process and reports its peak resident set (`ru_maxrss`) above
the process's size after imports, next to the file's size. Not a test:

    python results/traces/measure_memory.py [--dir /tmp/unikv_mem] [--mb 60]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import json, resource, sys, warnings
warnings.simplefilter("ignore")
from unikv.traces.cli import main
from unikv.sim.config import RunConfig
from unikv.sim.run import load_trace
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = rss()
what, path = sys.argv[1], sys.argv[2]
if what == "describe":
    import io, contextlib
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["describe", path]) == 0
elif what == "replay_load":
    n = len(load_trace(RunConfig(trace=path, trace_end_s=None)))
else:
    n = len(load_trace(RunConfig(trace=path, trace_end_s=None, max_requests=1000)))
print(json.dumps({"base": base, "peak": rss()}))
"""


def write_mooncake(path: Path, target_bytes: int, rng: np.random.Generator) -> int:
    """Rows like the Mooncake conversation trace: ms timestamps, 512-token hash blocks."""
    rows, size, next_id, t = 0, 0, 0, 0
    with open(path, "w") as f:
        while size < target_bytes:
            n_in = int(rng.lognormal(8.8, 0.8)) + 1
            blocks = -(-n_in // 512)
            ids = list(range(next_id, next_id + blocks))
            next_id += blocks
            t += int(rng.exponential(50))
            line = json.dumps({"timestamp": t, "input_length": n_in, "output_length": int(rng.integers(1, 800)),
                               "hash_ids": ids}) + "\n"
            f.write(line)
            size += len(line)
            rows += 1
    return rows


def write_azure(path: Path, target_bytes: int, rng: np.random.Generator) -> int:
    """Rows like the Azure 2023 CSV: naive timestamps with 7 decimals."""
    rows, size = 0, 0
    start = np.datetime64("2023-11-16T18:15:46", "us")
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        t = 0
        while size < target_bytes:
            t += int(rng.exponential(200_000))
            stamp = str(start + np.timedelta64(t, "us")).replace("T", " ")
            line = f"{stamp}0,{int(rng.integers(1, 8000))},{int(rng.integers(1, 800))}\n"
            f.write(line)
            size += len(line)
            rows += 1
    return rows


def measure(what: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(path)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/unikv_mem"))
    parser.add_argument("--mb", type=float, default=60.0)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = {"mooncake-like JSONL": (args.dir / "mooncake.jsonl", write_mooncake),
             "azure-like CSV": (args.dir / "azure.csv", write_azure)}
    print("| file | rows | MB | reader | peak RSS above imports, MB | x file size |")
    print("|---|---|---|---|---|---|")
    for label, (path, write) in files.items():
        rows = write(path, int(args.mb * 1e6), rng)
        mb = path.stat().st_size / 1e6
        for what in ("describe", "replay_load", "replay_load_max1000"):
            m = measure(what, path)
            extra = (m["peak"] - m["base"]) / 1e6
            print(f"| {label} | {rows:,} | {mb:.1f} | {what} | {extra:,.0f} | {extra / mb:.1f} |", flush=True)


if __name__ == "__main__":
    main()
