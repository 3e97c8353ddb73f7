"""Host cost of the pool's hot calls on the sim backend (byte accounting only).

A 3-band pool (mamba up | swa float | full down, page_size 16) holds `B`
running requests; each decode step the engine calls

- `alloc_decode`: one call for the whole batch of B requests;
- `release`: the window ratchet, one call per request whose oldest window
  page left the window (`band="swa"`, with `start_pos`);
- `flush`: once per step (lazy END bands absorb / pack the holes the churn
  leaves; eager ones return at once);

and every 8 steps `max(1, B // 16)` requests finish and are replaced, so
holes exist. `free` is timed apart: one call freeing B requests' ids out of
2B live ones (eager compaction then moves the survivors).

    python benchmarks/bench_sim_ops.py            # table + profile -> results/sim_ops/sim_ops.md

Reports µs per call (mean) for eager and lazy compaction, then a cProfile of
a batch-256 lazy decode loop (top 10 functions by cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from unikv import Band, Layout, UnifiedPool, __version__  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
PAGE = 16
WINDOW = 256  # sliding window, tokens
PROMPT = (256, 768)  # prompt length range, tokens
STATE_BYTES, SWA_BYTES, FULL_BYTES = 1 * MIB, 8 * KIB, 24 * KIB


def layout_for(batch: int) -> Layout:
    """Room for 2B + 8 requests of up to 2048 tokens: no shortfall in the run."""
    requests = 2 * batch + 8
    total = requests * (2048 * (SWA_BYTES + FULL_BYTES) + STATE_BYTES) + 64 * MIB
    return Layout(total_bytes=total, bands=[
        Band("mamba", entry_bytes=STATE_BYTES, grow="up", unit="request"),
        Band("swa", entry_bytes=SWA_BYTES, grow="float", page_size=PAGE),
        Band("full", entry_bytes=FULL_BYTES, grow="down", page_size=PAGE),
    ])


class Batch:
    """Running requests: their virtual pages, lengths and state slots."""

    def __init__(self, pool: UnifiedPool, rng: random.Random) -> None:
        self.pool, self.rng = pool, rng
        self.profiler: cProfile.Profile | None = None  # profiles the timed pool calls only
        self.profile_ops: set[str] = set()
        self.pages: list[list[int]] = []  # virtual page ids per request
        self.lens: list[int] = []
        self.released: list[int] = []  # window pages already released
        self.states: list[int] = []

    def admit(self, k: int) -> None:
        lens = [self.rng.randint(*PROMPT) for _ in range(k)]
        ids = self.pool.alloc_extend([0] * k, lens, [0] * k, sum(lens))
        states = self.pool.alloc_state("mamba", k)
        assert ids is not None and states is not None, "benchmark buffer too small"
        pos = 0
        for n, s in zip(lens, states.tolist()):
            self.pages.append((ids[pos:pos + n:PAGE] // PAGE).tolist())
            self.lens.append(n)
            self.released.append(0)
            self.states.append(s)
            pos += n

    def timed(self, op: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` and its seconds (profiled when asked)."""
        prof = self.profiler if op in self.profile_ops else None
        if prof is not None:
            prof.enable()
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        dt = time.perf_counter() - t
        if prof is not None:
            prof.disable()
        return out, dt

    def token_ids(self, i: int) -> torch.Tensor:
        pages = torch.tensor(self.pages[i])
        return (pages[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)[: self.lens[i]]

    def finish(self, idx: list[int]) -> float:
        """Free requests `idx` in one call; returns its seconds."""
        ids = torch.cat([self.token_ids(i) for i in idx])
        _, dt = self.timed("free", self.pool.free, ids)
        self.pool.free_state("mamba", [self.states[i] for i in idx])
        for i in sorted(idx, reverse=True):
            for col in (self.pages, self.lens, self.released, self.states):
                col.pop(i)
        return dt

    def decode(self) -> float:
        seq = torch.tensor(self.lens) + 1
        last = torch.tensor([p[-1] * PAGE + (n - 1) % PAGE for p, n in zip(self.pages, self.lens)])
        out, dt = self.timed("alloc_decode", self.pool.alloc_decode, seq, last)
        assert out is not None, "benchmark buffer too small"
        for i, tok in enumerate(out.tolist()):
            if self.lens[i] % PAGE == 0:
                self.pages[i].append(tok // PAGE)
            self.lens[i] += 1
        return dt

    def ratchet(self) -> list[float]:
        """Release each request's window pages that left the window."""
        times = []
        for i in range(len(self.lens)):
            out_pages = max(0, self.lens[i] - WINDOW) // PAGE
            while self.released[i] < out_pages:
                k = self.released[i]
                ids = self.pages[i][k] * PAGE + torch.arange(PAGE)
                times.append(self.timed("release", self.pool.release, ids, band="swa", start_pos=k * PAGE)[1])
                self.released[i] += 1
        return times


def decode_loop(mode: str, batch: int, steps: int, seed: int = 0,
                profiler: cProfile.Profile | None = None, profile_ops=()) -> dict[str, list[float]]:
    """Timed decode steps after an untimed set-up (admit, first ratchet)."""
    pool = UnifiedPool(layout_for(batch), backend=SimBackend(materialize=False), compaction=mode)
    run = Batch(pool, random.Random(seed))
    run.admit(batch)
    run.ratchet()
    pool.flush(urgent=True)
    run.profiler, run.profile_ops = profiler, set(profile_ops)
    times: dict[str, list[float]] = {"alloc_decode": [], "release": [], "flush": []}
    for step in range(steps):
        times["alloc_decode"].append(run.decode())
        times["release"] += run.ratchet()
        if step % 8 == 7:
            k = max(1, batch // 16)
            run.finish(run.rng.sample(range(len(run.lens)), k))
            run.admit(k)
        times["flush"].append(run.timed("flush", pool.flush, urgent=False)[1])
    return times


def free_loop(mode: str, batch: int, rounds: int, seed: int = 0) -> list[float]:
    pool = UnifiedPool(layout_for(batch), backend=SimBackend(materialize=False), compaction=mode)
    run = Batch(pool, random.Random(seed))
    times = []
    for _ in range(rounds):
        run.admit(2 * batch)
        times.append(run.finish(run.rng.sample(range(2 * batch), batch)))
        run.finish(list(range(len(run.lens))))
        pool.flush(urgent=True)
    return times


def measure(batches, steps: int, rounds: int, repeats: int) -> dict:
    """(op, batch, mode) -> (µs per call, calls): the best of `repeats`
    runs' means (a shared machine only ever adds time)."""
    rows: dict = {}
    for _ in range(repeats):
        for batch in batches:
            for mode in ("eager", "lazy"):
                n = max(steps // max(1, batch // 16), 64)
                decode_loop(mode, batch, 8)  # warm-up
                times = decode_loop(mode, batch, n)
                times["free"] = free_loop(mode, batch, rounds)
                for op, ts in times.items():
                    us = statistics.fmean(ts) * 1e6 if ts else float("nan")
                    best = rows.get((op, batch, mode), (float("inf"), 0))
                    rows[(op, batch, mode)] = min(best, (us, len(ts)))
    return rows


def table(rows: dict, batches) -> str:
    ops = ["alloc_decode", "release", "free", "flush"]
    what = {"alloc_decode": "one call, B requests", "release": "one call, one request page (start_pos)",
            "free": "one call, B requests of 2B", "flush": "one call per step (urgent=False)"}
    out = ["| op | call | batch B | eager µs/call | lazy µs/call | calls timed (eager / lazy) |",
           "|---|---|---|---|---|---|"]
    for op in ops:
        for b in batches:
            (e, ne), (z, nz) = rows[(op, b, "eager")], rows[(op, b, "lazy")]
            out.append(f"| {op} | {what[op]} | {b} | {e:,.0f} | {z:,.0f} | {ne} / {nz} |")
    return "\n".join(out)


def profile(batch: int, steps: int, ops, top: int = 10) -> str:
    """Top functions by cumulative time inside the pool calls `ops` of a
    lazy decode loop (the benchmark's own bookkeeping is not profiled)."""
    prof = cProfile.Profile()
    decode_loop("lazy", batch, steps, profiler=prof, profile_ops=ops)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("cumulative").print_stats(top + 8)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    body = [ln for ln in lines[head + 1:] if "bench_sim_ops.py" not in ln
            and "_lsprof" not in ln and "disable" not in ln][:top]
    total = lines[0].strip()
    return "\n".join([total, "", lines[head]] + body)


def revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "unikv"], cwd=ROOT, capture_output=True,
                           text=True, check=False).stdout.strip()
    return rev + (" + uncommitted unikv/ changes" if dirty else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--steps", type=int, default=512, help="decode steps at batch <= 16 (fewer above)")
    p.add_argument("--rounds", type=int, default=20, help="free rounds per batch")
    p.add_argument("--repeats", type=int, default=3, help="runs per cell; the table keeps the best mean")
    p.add_argument("--profile-steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "sim_ops")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    batches = [int(b) for b in a.batches.split(",")]
    rev = revision()  # before the run: what it imports
    rows = measure(batches, a.steps, a.rounds, a.repeats)
    prof_all = profile(256, a.profile_steps, ("alloc_decode", "release", "free", "flush"))
    prof_decode = profile(256, a.profile_steps, ("alloc_decode",))
    text = "\n".join([
        "# Sim-backend op cost (host µs per call)",
        "",
        (f"Pool: mamba up ({STATE_BYTES // MIB} MiB/state) | swa float ({SWA_BYTES // KIB} KiB/token) | "
         f"full down ({FULL_BYTES // KIB} KiB/token), page_size {PAGE}, `SimBackend(materialize=False)`; "
         f"window {WINDOW} tokens, prompts {PROMPT[0]}-{PROMPT[1]} tokens, buffer sized so no call falls short."),
        ("Decode loop: each step `alloc_decode` for the batch, the window ratchet, and one `flush()`; every "
         "8 steps B/16 requests finish (one batched `free`) and are replaced. `free` row: one call freeing B "
         "requests out of 2B live."),
        f"Each cell: the best of {a.repeats} runs' mean µs per call.",
        "",
        table(rows, batches),
        "",
        (f"## cProfile: batch-256 lazy decode loop ({a.profile_steps} steps after set-up), "
         "top 10 by cumulative time"),
        "",
        "Every pool call of the loop (`alloc_decode`, the ratchet's `release`s, the churn's `free`, `flush`):",
        "",
        "```",
        prof_all,
        "```",
        "",
        "`alloc_decode` alone:",
        "",
        "```",
        prof_decode,
        "```",
        "",
        (f"Command: `python benchmarks/bench_sim_ops.py` (torch threads {a.threads}). Revision {rev}; "
         f"unikv {__version__}, "
         f"torch {torch.__version__}, Python {platform.python_version()}, "
         f"{platform.processor() or platform.machine()}."),
        "",
    ])
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sim_ops.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
