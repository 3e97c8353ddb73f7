"""Every kernel, its Triton launcher against its torch reference, as long-format CSV rows.

One row per (kernel, size, impl): date, device, versions, git revision,
kernel, impl ("triton" or "torch"), the shape parameters (a `params` string
and the numeric columns `n`, `page_bytes`, `pages`), bytes touched, median
microseconds and GB/s, and `ok` (the Triton output equalled the reference's
on that input before timing). Rows are appended, so one CSV collects runs.

Timing: CUDA events around each call, the median over `--reps` calls; a
kernel that changes its tables (free_unbind, remap_moved) gets them restored
before each call, outside the timed span. Bytes touched: ids and table
entries read + written (8 bytes each), or 2 x pages x page_bytes for a move.

    python benchmarks/bench_kernels.py --out results/kernels/kernels.csv        # on a GPU
    python benchmarks/bench_kernels.py --smoke --out /tmp/kernels_smoke.csv     # anywhere

`--smoke` runs tiny sizes; without CUDA it runs the kernels through Triton's
interpreter (it sets TRITON_INTERPRET=1 before Triton is imported).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SIZES = [1024, 16384, 262144]  # ids per table / paged call
MOVE_SIZES = [(4096, 1024), (65536, 1024), (65536, 16384), (1 << 20, 1024)]  # (page_bytes, pages)
SMOKE_SIZES = [7]
SMOKE_MOVE_SIZES = [(100, 7)]
PAGE_SIZE = 16
FIELDS = ["date", "device", "torch", "triton", "python", "git_rev", "kernel", "impl", "params", "n",
          "page_bytes", "pages", "bytes", "time_us", "gbps", "ok"]


@dataclass
class Case:
    """One kernel at one size: a call per impl, and the bytes it touches.

    `restore` (if any) puts the inputs back before each timed call;
    `result` turns a call's return value (and mutated state) into a tensor
    or tuple of tensors to compare between the impls.
    """

    kernel: str
    params: dict
    bytes_moved: int
    calls: dict[str, Callable[[], object]]
    restore: Callable[[], None] | None = None
    result: Callable[[object], object] = field(default=lambda out: out)
    check_restore: Callable[[], None] | None = None  # before each call of the check only (default: restore)


# -- inputs --


def _tables(n: int, dev, gen):
    """Tables of 4n virtual and physical pages, the first n bound at random;
    returns (v2p, p2v, bound v, bound p, free v, free p)."""
    import torch

    size = 4 * n + 1
    v = torch.randperm(size - 1, generator=gen)[: 2 * n] + 1
    p = torch.randperm(size - 1, generator=gen)[: 2 * n] + 1
    v2p = torch.full((size,), -1, dtype=torch.int64)
    p2v = torch.full((size,), -1, dtype=torch.int64)
    v2p[v[:n]], p2v[p[:n]] = p[:n], v[:n]
    return [t.to(dev) for t in (v2p, p2v, v[:n], p[:n], v[n:], p[n:])]


def _paged_inputs(bs: int, dev, gen, decode: bool):
    """(prefix, seq, last_loc, new_pages) of a batch: decode adds one token,
    extend 1-64 tokens to prefixes of 0-4096."""
    import torch

    from unikv.kernels.paged import reference

    prefix = torch.randint(0, 4096, (bs,), generator=gen)
    seq = prefix + (1 if decode else torch.randint(1, 65, (bs,), generator=gen))
    last = torch.randint(1, 1 << 20, (bs,), generator=gen) * PAGE_SIZE + (prefix - 1) % PAGE_SIZE
    count = int(reference.new_page_counts(prefix, seq, PAGE_SIZE).sum())
    pages = torch.randperm(1 << 22, generator=gen)[:count] + 1
    return [t.to(dev) for t in (prefix, seq, last, pages)]


# -- cases, one builder per kernel --


def table_cases(n: int, dev, gen) -> list[Case]:
    from unikv.kernels.tables import kernel, reference

    v2p, p2v, v, p, free_v, free_p = _tables(n, dev, gen)
    saved = (v2p.clone(), p2v.clone())

    def restore():
        v2p.copy_(saved[0])
        p2v.copy_(saved[1])

    state = lambda out: tuple(t.clone() for t in (out, v2p, p2v) if t is not None)  # noqa: E731
    src, dst = p, free_p  # survivors to free physical pages
    cases = []
    for name, nbytes, call in [
        ("bind", 32 * n, lambda m: m.bind(free_v, free_p, v2p, p2v)),
        ("alloc_bind", 32 * n, lambda m: m.alloc_bind(free_v, 4 * n + 1 - n, v2p, p2v)),
        ("free_unbind", 40 * n, lambda m: m.free_unbind(v, v2p, p2v)),
        ("remap_moved", 64 * n, lambda m: m.remap_moved(src, dst, v2p, p2v)),
    ]:
        calls = {"triton": lambda c=call: c(kernel), "torch": lambda c=call: c(reference)}
        cases.append(Case(name, {"n": n}, nbytes, calls, restore, state))
    return cases


def translate_cases(n: int, dev, gen) -> list[Case]:
    import torch

    from unikv.kernels.translate import kernel, reference

    v2p = _tables(n, dev, gen)[0]
    tokens = torch.randint(0, v2p.numel() * PAGE_SIZE, (n,), generator=gen).to(dev)
    calls = {"triton": lambda: kernel.translate(tokens, v2p, PAGE_SIZE, 2),
             "torch": lambda: reference.translate(tokens, v2p, PAGE_SIZE, 2)}
    return [Case("translate", {"n": n, "page_size": PAGE_SIZE, "multiplier": 2}, 24 * n, calls)]


def paged_cases(bs: int, dev, gen) -> list[Case]:
    from unikv.kernels.paged import kernel, reference

    _, seq, last, pages = _paged_inputs(bs, dev, gen, decode=True)
    decode = {"triton": lambda: kernel.paged_decode(seq, last, pages, PAGE_SIZE),
              "torch": lambda: reference.paged_decode(seq, last, pages, PAGE_SIZE)}
    prefix, seq_e, last_e, pages_e = _paged_inputs(bs, dev, gen, decode=False)
    total = int((seq_e - prefix).sum())
    extend = {
        "triton": lambda: kernel.paged_extend(prefix, seq_e, last_e, pages_e, PAGE_SIZE, total_tokens=total),
        "torch": lambda: reference.paged_extend(prefix, seq_e, last_e, pages_e, PAGE_SIZE, total_tokens=total),
    }
    params = {"n": bs, "page_size": PAGE_SIZE}
    return [Case("paged_decode", params, 8 * (3 * bs + pages.numel()), decode),
            Case("paged_extend", {**params, "tokens": total}, 8 * (3 * bs + pages_e.numel() + total), extend)]


def move_cases(page_bytes: int, pages: int, dev, gen) -> list[Case]:
    import torch

    from unikv.kernels.move import kernel, reference

    buf = torch.empty(2 * pages * page_bytes, dtype=torch.uint8, device=dev).random_(0, 256)
    saved = buf.clone()
    perm = torch.randperm(2 * pages, generator=gen)
    src, dst = perm[:pages].to(dev), perm[pages:].to(dev)  # disjoint random pages
    calls = {"triton": lambda: kernel.move_pages(buf, page_bytes, src, dst, disjoint=True),
             "torch": lambda: reference.move_pages(buf, page_bytes, src, dst)}
    params = {"page_bytes": page_bytes, "pages": pages, "shape": "disjoint"}
    # A disjoint move repeats the same copy: only the check restores the bytes.
    return [Case("move_pages", params, 2 * pages * page_bytes, calls, result=lambda _: buf.clone(),
                 check_restore=lambda: buf.copy_(saved))]


# -- timing and rows --


def time_us(fn, restore, reps: int, cuda: bool) -> float:
    """Median microseconds of `fn` over `reps` calls (after two warm-ups)."""
    import torch

    samples = []
    for i in range(reps + 2):
        if restore:
            restore()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3
        else:
            t0 = time.perf_counter()
            fn()
            us = (time.perf_counter() - t0) * 1e6
        if i >= 2:
            samples.append(us)
    return statistics.median(samples)


def agree(case: Case) -> bool:
    """Whether the Triton call gives the reference's result from equal inputs."""
    import torch

    got = []
    restore = case.check_restore or case.restore
    for impl in ("triton", "torch"):
        if restore:
            restore()
        got.append(case.result(case.calls[impl]()))
    flat = [x if isinstance(x, tuple) else (x,) for x in got]
    return all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(*flat))


def run_case(case: Case, reps: int, cuda: bool, stamp: dict) -> list[dict]:
    ok = agree(case)
    rows = []
    for impl, fn in case.calls.items():
        us = time_us(fn, case.restore, reps, cuda)
        rows.append({**stamp, "kernel": case.kernel, "impl": impl,
                     "params": ";".join(f"{k}={v}" for k, v in case.params.items()),
                     "n": case.params.get("n", ""), "page_bytes": case.params.get("page_bytes", ""),
                     "pages": case.params.get("pages", ""), "bytes": case.bytes_moved,
                     "time_us": round(us, 3), "gbps": round(case.bytes_moved / us / 1e3, 3),
                     "ok": ok if impl == "triton" else ""})
    return rows


def stamp_row(cuda: bool) -> dict:
    import torch
    import triton

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=False).stdout.strip() or "unknown"
    except OSError:
        rev = "unknown"
    device = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "git_rev": rev}


def write_rows(path: str, rows: list[dict], fields: list[str] = FIELDS) -> None:
    """Append `rows` to the CSV at `path` (header `fields` when the file is
    new). `bench_move_pages.py` appends its own columns through it too."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(rows)


def all_cases(sizes, move_sizes, dev, gen):
    """Every kernel's cases (built lazily: one size's inputs live at a time)."""
    for n in sizes:
        yield from table_cases(n, dev, gen)
        yield from translate_cases(n, dev, gen)
        yield from paged_cases(n, dev, gen)
    for page_bytes, pages in move_sizes:
        yield from move_cases(page_bytes, pages, dev, gen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/kernels/kernels.csv")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; the Triton interpreter without CUDA")
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="ids per call (table and paged kernels)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per (case, impl)")
    args = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("bench_kernels: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    if not cuda:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_kernels: Triton was imported before TRITON_INTERPRET=1 could be set", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels import Triton
    sizes = args.sizes or (SMOKE_SIZES if args.smoke else SIZES)
    move_sizes = SMOKE_MOVE_SIZES if args.smoke else MOVE_SIZES
    reps = args.reps or (3 if args.smoke else 50)
    gen = torch.Generator().manual_seed(0)
    stamp = stamp_row(cuda)
    rows = []
    for case in all_cases(sizes, move_sizes, torch.device("cuda" if cuda else "cpu"), gen):
        got = run_case(case, reps, cuda, stamp)
        rows += got
        t, r = got[0], got[1]
        print(f"{case.kernel:13} {t['params']:40} triton {t['time_us']:10.2f} us {t['gbps']:9.2f} GB/s"
              f" | torch {r['time_us']:10.2f} us | ok={t['ok']}", flush=True)
    write_rows(args.out, rows)
    bad = [r for r in rows if r["ok"] is False]
    if bad:
        print(f"bench_kernels: {len(bad)} cases where Triton differed from the reference", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
