"""Page-move study: Triton `move_pages` vs a device-to-device copy of the
same bytes vs torch indexing `rows[dst] = rows[src]`, over page sizes, batch
shapes (disjoint, sequential, overlapping shifts), tile / warp variants,
CUDA-graph replay and the host launch path. `bench_kernels.py` times every
kernel (this one included) in one uniform format; this script goes deeper
into the move kernel's tuning.

Bandwidth counts bytes read + written (2 x pages x page_bytes) per second.
Each timing is the median of `triton.testing.do_bench` (which flushes the L2
between runs). Rows are appended to a long-format CSV (one row per config and
method) stamped with the GPU, torch, Triton and git revision.

    python benchmarks/bench_move_pages.py --out results/kernels/move_pages.csv
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys

import torch
from bench_kernels import write_rows  # one CSV appender for the kernel benchmarks (this folder)

KIB = 1024
PAGE_BYTES = [4 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB]
PAGES = [64, 256, 1024, 4096, 16384]
VARIANTS = [(8 * KIB, 4, False), (16 * KIB, 4, False), (32 * KIB, 8, False), (16 * KIB, 4, True),
            (32 * KIB, 8, True)]
SHAPES = ["disjoint", "sequential", "shift", "shift1"]
FIELDS = ["ts", "gpu", "torch", "triton", "git_rev", "bench", "shape", "method", "page_bytes", "pages",
          "bytes_rw", "time_us", "gbps", "frac_of_copy", "x_vs_index", "time_us_graph", "gbps_graph",
          "frac_of_copy_graph", "tile_bytes", "num_warps", "ok"]


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def stamp() -> dict:
    import triton

    return {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "git_rev": git_rev()}


def bench(fn, budget_ms: float) -> float:
    """Median microseconds of `fn` (events, L2 flushed between runs)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=max(5, budget_ms / 4), rep=budget_ms, return_mode="median") * 1e3


def bench_graph(fn, budget_ms: float) -> float:
    """Median microseconds of `fn` replayed from a CUDA graph: device time
    without the Python launch cost (the L2 is not flushed between replays)."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=budget_ms, return_mode="median") * 1e3


def placement(n: int, gen: torch.Generator, shape: str):
    """(src, dst) page indices: disjoint random pages; disjoint sequential
    runs (the copy's access pattern); a run shifted down over itself by a
    quarter of its length (4 disjoint waves) or by one page (staged)."""
    if shape == "disjoint":
        perm = torch.randperm(2 * n, generator=gen)
        return perm[:n], perm[n:]
    if shape == "sequential":
        return torch.arange(n), torch.arange(n, 2 * n)
    d = max(1, n // 4) if shape == "shift" else 1
    src = torch.arange(d, d + n)
    return src, src - d


def one_config(buf, page_bytes, n, gen, shape, budget_ms, variants, stamp_row):
    from unikv.kernels.move import kernel as triton_move

    dev = buf.device
    src, dst = (t.to(dev) for t in placement(n, gen, shape))
    rows = buf[: (buf.numel() // page_bytes) * page_bytes].view(-1, page_bytes)
    nbytes = n * page_bytes
    copy_src, copy_dst = buf[:nbytes], buf[nbytes:2 * nbytes]
    methods = {"copy": lambda: copy_dst.copy_(copy_src),
               "torch_index": lambda: rows.__setitem__(dst, rows[src])}
    disjoint = shape in ("disjoint", "sequential")
    if disjoint:
        methods["triton"] = lambda: triton_move.move_pages(buf, page_bytes, src, dst, disjoint=True)
        methods["triton_checked"] = lambda: triton_move.move_pages(buf, page_bytes, src, dst)
        for tile, warps, stream in variants:
            methods[f"triton_t{tile // KIB}k_w{warps}{'_cs' if stream else ''}"] = (
                lambda t=tile, w=warps, c=stream: triton_move.move_pages(
                    buf, page_bytes, src, dst, disjoint=True, tile_bytes=t, num_warps=w, streaming=c))
    else:
        methods["triton"] = lambda: triton_move.move_pages(buf, page_bytes, src, dst)
    ok = check(buf, rows, page_bytes, src, dst, shape) if nbytes <= (2 << 30) else ""
    times = {m: bench(fn, budget_ms) for m, fn in methods.items()}
    graphed = {m: bench_graph(fn, budget_ms) for m, fn in methods.items()
               if m == "copy" or (m.startswith("triton") and m != "triton_checked" and disjoint)}
    out = []
    for m, t in times.items():
        tile, warps = (m.split("_t")[1].split("_cs")[0].split("k_w") if "_t" in m and "_w" in m else ("", ""))
        out.append({**stamp_row, "bench": "move_pages", "shape": shape, "method": m, "page_bytes": page_bytes,
                    "pages": n, "bytes_rw": 2 * nbytes, "time_us": round(t, 3),
                    "gbps": round(2 * nbytes / t / 1e3, 1), "frac_of_copy": round(times["copy"] / t, 3),
                    "x_vs_index": round(times["torch_index"] / t, 2),
                    "time_us_graph": round(graphed[m], 3) if m in graphed else "",
                    "gbps_graph": round(2 * nbytes / graphed[m] / 1e3, 1) if m in graphed else "",
                    "frac_of_copy_graph": round(graphed["copy"] / graphed[m], 3) if m in graphed else "",
                    "tile_bytes": int(tile) * KIB if tile else "", "num_warps": warps,
                    "ok": ok if m.startswith("triton") else ""})
    return out


def check(buf, rows, page_bytes, src, dst, shape) -> bool:
    """The Triton move equals torch indexing on fresh random bytes."""
    from unikv.kernels.move import kernel as triton_move

    hi = int(max(src.max(), dst.max())) + 1
    buf[: hi * page_bytes].random_(0, 256)
    want = rows[:hi].clone()
    want[dst] = want[src]
    triton_move.move_pages(buf, page_bytes, src, dst, disjoint=True if shape in ("disjoint", "sequential") else None)
    return bool(torch.equal(rows[:hi], want))


def launch_overhead(buf, stamp_row, calls: int = 2000) -> list[dict]:
    """Host microseconds per call of each method on a tiny move (4 KiB x 64),
    back to back, one synchronize at the end; the GPU work is ~1 us, so this
    is the launch path. `triton_raw` calls the jitted kernel directly."""
    import time

    from unikv.kernels.move import kernel as triton_move

    gen = torch.Generator().manual_seed(1)
    page_bytes, n = 4 * KIB, 64
    src, dst = (t.cuda() for t in placement(n, gen, "disjoint"))
    rows = buf[: (buf.numel() // page_bytes) * page_bytes].view(-1, page_bytes)
    flat, width = triton_move.word_view(buf, page_bytes)
    t = triton_move.tiling(page_bytes // width, width)
    grid = t.grid(n)
    methods = {
        "copy": lambda: buf[n * page_bytes:2 * n * page_bytes].copy_(buf[:n * page_bytes]),
        "torch_index": lambda: rows.__setitem__(dst, rows[src]),
        "triton": lambda: triton_move.move_pages(buf, page_bytes, src, dst, disjoint=True),
        "triton_raw": lambda: triton_move._copy_rows_kernel[grid](
            flat, flat, src, dst, n, page_bytes // width, t.chunks_per_row, ROWS=t.rows, BLOCK=t.block,
            STREAMING=False, num_warps=t.num_warps),
        "triton_checked": lambda: triton_move.move_pages(buf, page_bytes, src, dst),
    }
    out = []
    for m, fn in methods.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / calls * 1e6
        print(f"launch path {m:15} {us:8.2f} us/call", flush=True)
        out.append({**stamp_row, "bench": "launch_overhead", "shape": "disjoint", "method": m,
                    "page_bytes": page_bytes, "pages": n, "bytes_rw": 2 * n * page_bytes, "time_us": round(us, 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/kernels/move_pages.csv")
    ap.add_argument("--page-bytes", type=int, nargs="*", default=PAGE_BYTES)
    ap.add_argument("--pages", type=int, nargs="*", default=PAGES)
    ap.add_argument("--budget-ms", type=float, default=40.0, help="do_bench rep time per method")
    ap.add_argument("--variants", action="store_true", help="also time tile / warp variants")
    ap.add_argument("--launch", action="store_true", help="also time the host launch path of a tiny move")
    ap.add_argument("--shapes", nargs="*", default=["disjoint"], choices=SHAPES)
    ap.add_argument("--shape-pages", type=int, nargs="*", default=None,
                    help="page counts for shapes other than 'disjoint' (default: --pages)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_move_pages: needs a CUDA device", file=sys.stderr)
        return 2
    row0 = stamp()
    gen = torch.Generator().manual_seed(0)
    need = 2 * max(args.pages) * max(args.page_bytes) + max(args.page_bytes)
    buf = torch.empty(need, dtype=torch.uint8, device="cuda")
    buf.random_(0, 256)
    rows = launch_overhead(buf, row0) if args.launch else []
    for shape in args.shapes:
        for pb in args.page_bytes:
            for n in (args.pages if shape == "disjoint" or not args.shape_pages else args.shape_pages):
                variants = VARIANTS if args.variants and n in (1024, 16384) else []
                got = one_config(buf, pb, n, gen, shape, args.budget_ms, variants, row0)
                rows += got
                by = {r["method"]: r for r in got}
                print(f"{shape:8} {pb // KIB:5d} KiB x {n:6d}: triton {by['triton']['gbps']:7.1f} GB/s "
                      f"copy {by['copy']['gbps']:7.1f} index {by['torch_index']['gbps']:7.1f} "
                      f"-> {by['triton']['frac_of_copy']:.2f} of copy, {by['triton']['x_vs_index']:.1f}x index "
                      f"| graph {by['triton']['gbps_graph'] or '-'} vs {by['copy']['gbps_graph']} "
                      f"ok={by['triton']['ok']}", flush=True)
    write_rows(args.out, rows, FIELDS)
    summarize(rows)
    return 0


def summarize(rows: list[dict]) -> None:
    target = [r for r in rows if r["method"] == "triton" and r["shape"] == "disjoint"
              and r["pages"] >= 1024 and r["page_bytes"] >= 32 * KIB]
    if target:
        worst_copy = min(target, key=lambda r: r["frac_of_copy"])
        worst_index = min(target, key=lambda r: r["x_vs_index"])
        worst_graph = min(target, key=lambda r: r["frac_of_copy_graph"])
        print(f"target region, graph-replayed: worst {worst_graph['frac_of_copy_graph']:.2f} of copy "
              f"({worst_graph['page_bytes'] // KIB} KiB x {worst_graph['pages']})")
        print(f"target region (>=1024 pages of >=32 KiB): worst {worst_copy['frac_of_copy']:.2f} of copy "
              f"({worst_copy['page_bytes'] // KIB} KiB x {worst_copy['pages']}), worst "
              f"{worst_index['x_vs_index']:.1f}x index ({worst_index['page_bytes'] // KIB} KiB x "
              f"{worst_index['pages']})")
    variants = [r for r in rows if r["method"].startswith("triton_t")]
    for r in variants:
        print(f"variant {r['method']:18} {r['page_bytes'] // KIB:5d} KiB x {r['pages']:6d}: {r['gbps']:7.1f} GB/s"
              f" (graph {r['gbps_graph']})")


if __name__ == "__main__":
    sys.exit(main())
