"""Acceptance soak: 3-band pools survive 100,000 random operations.

A lazy pool and an eager pool (mamba up | swa float | full down, real bytes)
each run `--ops` random engine operations from `unikv.testing.Driver`, with
`Driver.check()` after every one (the conformance harness's invariant,
`unikv.testing.checks.pool_violations`): `verify() == []`, bound pages and
slots as the engine holds them, every live slot's bytes intact on every band
still binding it, no two live slots sharing a byte, exact capacity views. At the end everything is
freed and the pool must match a fresh one (invariant 7).

    python benchmarks/soak.py                      # 100,000 ops each, both pools
    python benchmarks/soak.py --ops 2000 --jobs 1  # quick look

Writes `results/soak/soak.md` and `results/soak/soak.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (the pool runs on it; reported in the stamp)

from unikv import UnifiedPool, __version__  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402
from unikv.testing import Driver, make_layout  # noqa: E402
from unikv.testing.checks import fresh_violations  # noqa: E402

CHAIN = "mamba|swa|full"


def build(mode: str, page_size: int, tokens: int) -> UnifiedPool:
    layout = make_layout(CHAIN, page_size, tokens)
    return UnifiedPool(layout, backend=SimBackend(materialize=True), compaction=mode)


def soak_one(args: tuple) -> dict:
    """Run one pool; returns its row of the report."""
    mode, ops, seed, page_size, tokens, progress = args
    torch.set_num_threads(1)
    pool = build(mode, page_size, tokens)
    driver = Driver(pool, random.Random(seed))
    violations: list[str] = []
    start = time.perf_counter()
    done = 0
    try:
        for done in range(1, ops + 1):
            driver.step()
            found = driver.check()
            if found:
                violations = found + [f"at op {done}; recent ops: {list(driver.history)}"]
                break
            if progress and done % progress == 0:
                rate = done / (time.perf_counter() - start)
                print(f"  [{mode}] {done:>7} ops, {rate:,.0f} ops/s, "
                      f"{driver.counts['shortfall']} shortfalls", flush=True)
    except Exception as exc:  # noqa: BLE001 - a crash is a finding too: record it with the history
        violations = [f"exception at op {done}: {exc!r}", f"recent ops: {list(driver.history)}"]
    seconds = time.perf_counter() - start
    if not violations:
        violations = drain_violations(driver, mode, page_size, tokens)
    stats = pool.stats()
    return {
        "pool": f"3-band {mode}", "mode": mode, "ops": done, "seconds": round(seconds, 1),
        "us_per_op": round(seconds / max(done, 1) * 1e6), "shortfalls": driver.counts["shortfall"],
        "moves": stats["moves"], "moved_mib": round(stats["moved_bytes"] / 2**20, 1),
        "flushes": stats["flushes"], "urgent_flushes": stats["urgent_flushes"],
        "relocations": stats["relocations"], "settles": stats["settles"],
        "pending_peak": stats["pending_peak"], "ladder_runs": stats["ladder_runs"],
        "ladder_failures": stats["ladder_failures"], "forwards_fired": driver.counts["fired"],
        "violations": len(violations), "first_violations": violations[:3],
        "op_counts": dict(sorted(driver.counts.items())),
    }


def drain_violations(driver: Driver, mode: str, page_size: int, tokens: int) -> list[str]:
    """Free everything; the pool must then match a fresh one."""
    driver.free_all()
    driver.pool.flush(urgent=True)
    return driver.check() + fresh_violations(driver.pool, build(mode, page_size, tokens))


def source_digest() -> str:
    """Short hash of the `unikv/` sources this run imported (the tree may be
    ahead of the last commit)."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "unikv").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "unikv"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + (" (unikv/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


COLUMNS = ["pool", "ops", "seconds", "us_per_op", "shortfalls", "moves", "moved_mib", "flushes",
           "urgent_flushes", "relocations", "settles", "pending_peak", "ladder_runs",
           "forwards_fired", "violations"]


def report(rows: list[dict], cfg: dict) -> str:
    layout = make_layout(CHAIN, cfg["page_size"], cfg["tokens"])
    bands = ", ".join(f"{b.name} {b.grow.value} {b.entry_bytes} B/{b.unit.value}" for b in layout.bands)
    lines = [
        "# Soak: 3-band pools under random operations",
        "",
        (f"Layout `{CHAIN}`: {bands}; page_size {cfg['page_size']}; "
         f"{layout.total_bytes:,} bytes (sink {layout.sink_bytes:,}). Real bytes (materialised sim backend)."),
        f"Seed {cfg['seed']}; check after every operation: `verify() == []`, every live slot's bytes intact,",
        "no two live slots share a byte, bound pages and slots as the engine holds them, exact capacity views, and",
        "in-flight forwards' reads undisturbed / writes landing where the data lives. At the end",
        "everything is freed and the pool must equal a fresh one.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['pool']} op mix: " + ", ".join(f"{k} {v}" for k, v in r["op_counts"].items()))
        for v in r["first_violations"]:
            lines.append(f"  - VIOLATION: {v[:2000]}")
    lines += ["", f"Command: `python benchmarks/soak.py --ops {cfg['ops']} --seed {cfg['seed']}`",
              (f"Revision {cfg['git']} (unikv/ sources sha256 {cfg['unikv_sha256']}); "
               f"unikv {__version__}, torch {torch.__version__}, "
               f"Python {platform.python_version()}, {platform.machine()}."), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--tokens", type=int, default=640, help="token capacity of the buffer past the sink")
    p.add_argument("--modes", default="lazy,eager")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--progress", type=int, default=10_000, help="print every N ops (0: quiet)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "soak")
    a = p.parse_args(argv)
    cfg = {"ops": a.ops, "seed": a.seed, "page_size": a.page_size, "tokens": a.tokens,
           "git": git_revision(), "unikv_sha256": source_digest()}  # before the run: what it imports
    modes = a.modes.split(",")
    jobs = [(m, a.ops, a.seed, a.page_size, a.tokens, a.progress) for m in modes]
    if a.jobs > 1:
        with multiprocessing.Pool(min(a.jobs, len(jobs))) as workers:
            rows = workers.map(soak_one, jobs)
    else:
        rows = [soak_one(j) for j in jobs]
    text = report(rows, cfg)
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "soak.md").write_text(text)
    (a.out / "soak.json").write_text(json.dumps({"config": cfg, "runs": rows}, indent=2))
    return 0 if all(r["violations"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
