"""Host time of the move-overlap churn's steps, phase by phase, with no
forward and no GPU: where compaction's own host work goes (issue 16 item 6).

The pool and the churn of `bench_move_overlap.py`'s decode case at its
H200 page counts (Gemma-3-12B's end_end layout, `--batch` requests of
`--context` tokens, `--residents` residents of `--resident-tokens`
tokens, `--move-cap`), on `CudaBackend("cpu")`. Every byte count is
divided by `--scale` (the page counts, tables and plans stay the H200's;
the buffer shrinks) and the page copy itself is skipped (on the GPU it is
an asynchronous launch: device time, not host time); the move's upload
of its page lists stays, and the commit's scatter runs on the CPU, on
one thread. One step: the decode (one token each,
`alloc_decode`, the window release), the churn (a resident enters, the
oldest leaves), the commit, the flush (`set_inflight_forward` with a
forward still running, then `flush(urgent=False)`), then the forward's
done event fires. `--modes control` skips the flush (the holes are left,
as `bench_move_overlap.py`'s control). Prints per mode and phase the
median and p10 microseconds over `--steps` steps after `--warm`, and the
moves per step; `--profile N` then prints cProfile's N costliest
functions of the flush phase.

    python benchmarks/bench_flush_host.py --steps 200
    python benchmarks/bench_flush_host.py --steps 100 --modes side-early --profile 25
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent
PHASES = ("decode", "churn", "commit", "flush")


def overlap_bench():
    """`bench_move_overlap.py` (this folder) as a module: its churn and events."""
    if "bench_move_overlap" in sys.modules:
        return sys.modules["bench_move_overlap"]
    spec = importlib.util.spec_from_file_location("bench_move_overlap", FOLDER / "bench_move_overlap.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_move_overlap"] = module
    spec.loader.exec_module(module)
    return module


def scaled_layout(args):
    """The decode case's layout with every byte count divided by
    `args.scale`, and the model's window (None without a window band);
    ValueError when the scale does not divide a band's entry bytes."""
    from unikv.sim.layouts import build_layout
    from unikv.sim.models import load_model

    from unikv import Band, Layout

    mo = overlap_bench()
    spec = load_model(str(args.config), kv_cache_dtype="bf16")
    budget = mo.budget_bytes("decode", spec, args) - ((1 << 30) if mo.DEVICE == "cuda" else (1 << 20))  # less its slack
    big = build_layout(spec, kv_budget_gib=budget / 2**30, page_size=mo.PS, kind="end_end").layout
    for band in big.bands:
        if band.entry_bytes % args.scale:
            raise ValueError(f"--scale={args.scale} does not divide band {band.name}'s entry_bytes={band.entry_bytes}")
    layout = Layout(total_bytes=big.total_bytes // args.scale, bands=[
        Band(b.name, entry_bytes=b.entry_bytes // args.scale, grow=b.grow, page_size=b.page_size, unit=b.unit,
             blocks_per_page=b.blocks_per_page) for b in big.bands])
    return layout, spec.window_tokens if any(b.name == "swa" for b in layout.bands) else None


def scaled_pool(args):
    """The pool over `scaled_layout`, the move's copy skipped; and the window."""
    from unikv import UnifiedPool
    from unikv.backends import CudaBackend

    layout, window = scaled_layout(args)
    backend = CudaBackend("cpu")
    backend.ops.move_pages = lambda *a, **kw: None  # device work, not host work
    return UnifiedPool(layout, backend, compaction="lazy", ids="numpy", move_cap=args.move_cap), window


class Decoding:
    """`batch` requests of `context` tokens decoding one token a step, their
    window-band pages released as they leave the window."""

    def __init__(self, pool, window: int | None, batch: int, context: int) -> None:
        mo = overlap_bench()
        self.pool, self.window, self.ps = pool, window, mo.PS
        self.pages = [mo.fill(pool, window, context) for _ in range(batch)]
        self.seq = np.full(batch, context, dtype=np.int64)
        self.last = np.array([p[-1] * self.ps + self.ps - 1 for p in self.pages], dtype=np.int64)
        self.released = [max(0, context - window) // self.ps if window else 0 for _ in range(batch)]

    def step(self) -> None:
        self.seq += 1
        new = np.asarray(self.pool.alloc_decode(self.seq, self.last))
        for b in np.flatnonzero(new // self.ps != self.last // self.ps).tolist():
            self.pages[b].append(int(new[b]) // self.ps)
        self.last = new
        if self.window is None:
            return
        gone = []
        for b in np.flatnonzero((self.seq - self.window) % self.ps == 0).tolist():
            done = int(self.seq[b] - self.window) // self.ps
            gone += self.pages[b][self.released[b]:done]
            self.released[b] = done
        if gone:
            self.pool.release_pages(gone, "swa")


def run(args, mode: str, profile: cProfile.Profile | None = None) -> dict:
    """`args.warm + args.steps` steps of `mode`; per phase the host µs of the measured steps."""
    mo = overlap_bench()
    pool, window = scaled_pool(args)
    decoding = Decoding(pool, window, args.batch, args.context)
    residents = mo.Residents(pool, window, args.residents, args.resident_tokens)
    pool.commit()
    done = None
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    moves = []
    for step in range(args.warm + args.steps):
        if done is not None:
            done.record()  # the last forward finished
        t = [time.perf_counter()]
        decoding.step()
        t.append(time.perf_counter())
        residents.turn()
        t.append(time.perf_counter())
        pool.commit()
        t.append(time.perf_counter())
        done = mo.LaterEvent(cuda=False)  # the forward runs while the flush plans
        if profile is not None and step >= args.warm:
            profile.enable()
        pool.set_inflight_forward(done, decoding.last)
        moved = pool.flush(urgent=False) if mode != "control" else 0
        if profile is not None:
            profile.disable()
        t.append(time.perf_counter())
        if step >= args.warm:
            for k, a, b in zip(PHASES, t, t[1:]):
                times[k].append((b - a) * 1e6)
            moves.append(moved)
    problems = pool.verify()
    if problems:
        raise AssertionError(f"{mode}: the pool is unhealthy after the run: {problems[:3]}")
    row = {"mode": mode, "moves_per_step": statistics.mean(moves)}
    for k in PHASES:
        row[f"{k}_us"] = statistics.median(times[k])
        row[f"{k}_p10_us"] = float(np.percentile(times[k], 10))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=FOLDER / "configs" / "gemma-3-12b-text_config.json")
    ap.add_argument("--modes", nargs="*", default=["control", "side-early"], choices=["control", "side-early"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--residents", type=int, default=2)
    ap.add_argument("--resident-tokens", type=int, default=8192)
    ap.add_argument("--move-cap", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--scale", type=int, default=64, help="divide every byte count by this")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's N costliest flush functions")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the commit's CPU scatter stands in for a launch: no thread pool beside it
    mo = overlap_bench()
    try:
        mo.check_sizes(argparse.Namespace(**vars(args), prefix=mo.PS, chunk=mo.PS, alone_mb=0))
        if args.scale <= 0:
            raise ValueError(f"--scale={args.scale} must be positive")
        scaled_layout(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("mode | moves/step | " + " | ".join(f"{k} us (p10)" for k in PHASES))
    for mode in args.modes:
        profile = cProfile.Profile() if args.profile else None
        r = run(args, mode, profile)
        print(f"{mode} | {r['moves_per_step']:.1f} | "
              + " | ".join(f"{r[f'{k}_us']:.1f} ({r[f'{k}_p10_us']:.1f})" for k in PHASES), flush=True)
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
