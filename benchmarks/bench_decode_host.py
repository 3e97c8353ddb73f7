"""Host time and device syncs per steady decode step: the 3-band UnifiedPool on
CudaBackend vs a plain torch paged allocator (one static pool per band).

One step = finish one request every `--finish-every` steps, decode one token
for every running request, release the sliding window's pages that left the
window (one call for the batch), flush, and produce the device slot ids the
forward writes. Host lengths are known to the engine (as in a serving
engine). unikv's virtual ids live on the host (the pool hands them out
there) and its step ends with `translate` to device slot ids (which commits
the step's page-table changes: one upload, one launch); the baseline keeps
its ids on the device.

Host microseconds are wall time around the step (no explicit synchronize:
the syncs inside the step are what costs). Syncs are counted in a separate
pass under `torch.cuda.set_sync_debug_mode("warn")`, and each is attributed
to the innermost line of this repository that issued it. Torch calls are
counted in another pass (any device, `TorchCalls`): every call from Python
into torch's C functions and tensor methods, per phase; `torch_ops` leave
out the light ones (`LIGHT`: attribute reads and host wrapping, no dispatch).
On a CUDA device each op costs several microseconds of host time (a launch
or an upload), so the allocator's host time there is about its Python time
plus its ops times that cost. On a CPU device an upload of a fresh host
array is no call (the backend aliases it) where CUDA makes one `to`.

    PYTHONPATH=. python benchmarks/bench_decode_host.py --out results/kernels/decode_host.csv
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import os
import statistics
import sys
import time
import traceback
import warnings

import torch

MIB = 1 << 20
PS = 16
WINDOW = 256
TOTAL_MIB = 4096  # the 3-band pool's buffer
SLOTS = "device"  # where the forward's slot ids are translated (--slots)
ALLOC = "tokens"  # the pool's surface the engine calls (--alloc)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the unikv pool --


def unikv_engine(batch: int, device: str):
    import numpy as np

    from unikv import Band, Layout, UnifiedPool
    from unikv.backends.cuda import CudaBackend

    layout = Layout(total_bytes=TOTAL_MIB * MIB, bands=[
        Band("mamba", entry_bytes=64 * 1024, grow="up", unit="request"),
        Band("swa", entry_bytes=4096, grow="float", page_size=PS, blocks_per_page=8),
        Band("full", entry_bytes=12288, grow="down", page_size=PS, blocks_per_page=24),
    ])
    pool = UnifiedPool(layout, CudaBackend(device), compaction="lazy")
    lens = np.array([300 + (37 * i) % 400 for i in range(batch)])
    ids = pool.alloc_extend([0] * batch, lens, [0] * batch, int(lens.sum())).numpy()
    states = pool.alloc_state("mamba", batch).numpy()
    table = np.zeros((batch, int(lens.max()) + 4096), dtype=np.int64)  # the engine's host req_to_token
    for r, (n, end) in enumerate(zip(lens, np.cumsum(lens))):
        table[r, :n] = ids[end - n:end]
    pool.commit()
    return {"pool": pool, "lens": lens, "table": table, "released": np.zeros(batch, dtype=np.int64),
            "states": states, "rows": np.arange(batch)}


def unikv_step(e: dict, step: int, finish_every: int) -> None:
    """Virtual ids live on the host (the pool hands them out there); the
    step ends with what the forward needs to find its slots: with
    `--slots device` (the real executor's path, `sim.real.batch`) the page
    tables committed (one upload + one `index_put_`: the "translate" phase)
    and the new virtual ids uploaded with the engine's positions and
    lengths in one copy ("inputs", the engine's), the forward translating
    them on the device; with
    `--slots host` the device slot ids translated on the host tables per
    band (`pool.translate`: commit, translate, one upload each)."""
    import numpy as np

    pool, lens, table = e["pool"], e["lens"], e["table"]
    clock = Phases(e)
    rows = e["rows"]
    if finish_every and step % finish_every == finish_every - 1 and len(rows) > 1:
        r = int(rows[0])  # finished by the previous forward
        rows = e["rows"] = rows[1:]
        pool.free(table[r, :lens[r]])
        pool.free_state("mamba", e["states"][r:r + 1])
    clock.lap("finish")
    seq = lens[rows] + 1
    last = table[rows, seq - 2]
    if ALLOC == "pages":  # the engine knows which requests open a page (vLLM's block tables)
        opens = ((seq - 1) & (PS - 1)) == 0
        n_open = int(np.count_nonzero(opens))
    clock.lap("decode_args")  # the engine's own bookkeeping: seq_lens and last_loc (pages: who opens one)
    if ALLOC == "tokens":  # SGLang's contract: the pool checks last_loc and places every token
        new = pool.alloc_decode(seq, last).numpy()
    else:  # fresh pages only
        fresh = pool.take_pages(n_open)
    clock.lap("alloc_decode")
    if ALLOC == "pages":  # the engine places the new tokens
        new = last + 1
        new[opens] = fresh.numpy() * PS
    table[rows, seq - 1] = new
    lens[rows] = seq
    ends = np.maximum(0, seq - WINDOW) // PS * PS
    crossing = np.flatnonzero(ends > e["released"][rows])
    reps = None
    if len(crossing):  # one id per page that left the window, one call for the batch
        r, start, end = rows[crossing], e["released"][rows[crossing]], ends[crossing]
        if (end - start == PS).all():  # steady state: one page each
            reps = table[r, start]
        else:
            reps = np.concatenate([table[i, a:b:PS] for i, a, b in zip(r, start, end)])
        e["released"][r] = end
        if ALLOC == "pages":
            reps = (reps // PS).tolist()  # the engine's page ids
    clock.lap("engine")  # the engine's own bookkeeping: which pages left the window
    if reps is not None:
        if ALLOC == "tokens":
            pool.release(reps, band="swa")
        else:
            pool.release_pages(reps, "swa")
    clock.lap("release")
    pool.flush()
    clock.lap("flush")
    if SLOTS == "host":  # the forward's slot ids translated on the host tables, one upload per band
        pool.translate(new, "full")
        pool.translate(new, "swa")
        clock.lap("translate")
    else:  # the tables committed; the forward translates the virtual ids on the device (`sim.real.batch`)
        pool.commit()
        clock.lap("translate")
        # the engine's inputs in one upload: the new virtual ids travel with the positions and lengths
        pool.backend.upload(np.stack([new, seq - 1, seq]))
        clock.lap("inputs")


class Phases:
    """Host time of each phase of one step, appended to `e["phases"]`; while
    a `TorchCalls` counts (`e["torch_calls"]`), the phase's calls go to it."""

    def __init__(self, e: dict) -> None:
        self.out = e.setdefault("phases", collections.defaultdict(list))
        self.calls = e.get("torch_calls")
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.out[name].append((now - self.t) * 1e6)
        if self.calls is not None:
            self.calls.close_phase(name)
        self.t = now


# Torch calls that read an attribute or a flag or wrap host memory: no
# dispatch, no launch, no copy (well under a microsecond each), left out of
# `torch_ops`.
LIGHT = frozenset({"dim", "is_contiguous", "get_device", "numel", "size", "stride", "data_ptr",
                   "element_size", "storage_offset", "numpy", "from_numpy",
                   "_get_deterministic_algorithms"})


class TorchCalls:
    """Calls from Python into torch's C functions and tensor methods, by
    phase and by name, counted through `sys.setprofile` while `active`."""

    def __init__(self) -> None:
        self.by_phase: collections.Counter = collections.Counter()  # (phase, name) -> calls
        self.open: collections.Counter = collections.Counter()  # name -> calls since the last lap

    @staticmethod
    def name_of(fn) -> str | None:
        """`Tensor.<method>` or `<module>.<function>` for a torch C callable, else None."""
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.Tensor):
            return f"Tensor.{fn.__name__}"
        module = getattr(fn, "__module__", None) or ""
        if module.startswith("torch"):
            return f"{module}.{fn.__name__}"
        if owner is not None and type(owner).__module__.startswith("torch"):
            return f"{type(owner).__name__}.{fn.__name__}"
        return None

    def hook(self, frame, event, arg) -> None:
        if event == "c_call":
            name = self.name_of(arg)
            if name is not None:
                self.open[name] += 1

    def close_phase(self, phase: str) -> None:
        for name, n in self.open.items():
            self.by_phase[phase, name] += n
        self.open.clear()

    def per_phase(self, steps: int, ops: bool) -> dict[str, float]:
        """Calls per step of each phase (`ops`: only those not in `LIGHT`)."""
        out: collections.Counter = collections.Counter()
        for (phase, name), n in self.by_phase.items():
            if not ops or name.rsplit(".", 1)[-1] not in LIGHT:
                out[phase] += n
        return {k: v / steps for k, v in out.items()}


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """Host ints -> device, asynchronously through pinned memory."""
    cuda = device.type == "cuda"
    return torch.tensor(values, dtype=torch.int64, pin_memory=cuda).to(device, non_blocking=cuda)


# -- the baseline: a plain torch paged allocator per band --


class PlainPagedAllocator:
    """What engines do today: a static page pool per band (a free-page list
    on the device), tail-page reuse in torch ops, `torch.unique` on free."""

    def __init__(self, pages: int, page_size: int, device: str) -> None:
        self.ps = page_size
        self.free_pages = torch.arange(1, pages, dtype=torch.int64, device=device)

    def alloc_decode(self, seq: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        need = (seq - 1) % self.ps == 0
        n = int(need.sum())  # the host must know how many pages to hand out
        if n > self.free_pages.numel():
            raise RuntimeError("baseline pool exhausted")
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        if n == 0:
            return last + 1
        k = (torch.cumsum(need, 0) - 1).clamp(min=0)
        return torch.where(need, pages[k] * self.ps, last + 1)

    def release_run(self, ids: torch.Tensor) -> None:
        """A page-aligned run of one request's ids: one id per page."""
        self.free_pages = torch.cat([self.free_pages, ids[::self.ps] // self.ps])

    def free(self, ids: torch.Tensor) -> None:
        self.free_pages = torch.cat([self.free_pages, torch.unique(ids // self.ps)])


def baseline_engine(batch: int, device: str):
    full = PlainPagedAllocator(3072 * MIB // (12288 * PS), PS, device)
    swa = PlainPagedAllocator(1024 * MIB // (4096 * PS), PS, device)
    states = torch.arange(1, 1 + batch, device=device)
    lens = [300 + (37 * i) % 400 for i in range(batch)]
    tables = {}
    for name, alloc in (("full", full), ("swa", swa)):
        t = torch.zeros(batch, max(lens) + 4096, dtype=torch.int64, device=device)
        for r, n in enumerate(lens):
            pages = alloc.free_pages[:-(-n // PS)]
            alloc.free_pages = alloc.free_pages[pages.numel():]
            t[r, :n] = (pages[:, None] * PS + torch.arange(PS, device=device)).reshape(-1)[:n]
        tables[name] = t
    return {"alloc": {"full": full, "swa": swa}, "tables": tables, "lens": lens, "released": [0] * batch,
            "states": states, "state_free": [], "rows": list(range(batch))}


def baseline_step(e: dict, step: int, finish_every: int) -> None:
    lens, rows = e["lens"], e["rows"]
    clock = Phases(e)
    dev = e["tables"]["full"].device
    seq, row_idx = upload([lens[r] + 1 for r in rows], dev), upload(rows, dev)
    for name, alloc in e["alloc"].items():
        t = e["tables"][name]
        t[row_idx, seq - 1] = alloc.alloc_decode(seq, t[row_idx, seq - 2])
    clock.lap("alloc_decode")
    for r in rows:
        lens[r] += 1
        end = (max(0, lens[r] - WINDOW) // PS) * PS
        start = e["released"][r]
        if end > start:
            e["alloc"]["swa"].release_run(e["tables"]["swa"][r, start:end])
            e["released"][r] = end
    clock.lap("release")
    if finish_every and step % finish_every == finish_every - 1 and len(rows) > 1:
        r = rows.pop(0)
        e["alloc"]["full"].free(e["tables"]["full"][r, :lens[r]])
        e["alloc"]["swa"].free(e["tables"]["swa"][r, e["released"][r]:lens[r]])
        e["state_free"].append(e["states"][r:r + 1])
    clock.lap("finish")


ENGINES = {"unikv_cuda": (unikv_engine, unikv_step), "plain_torch": (baseline_engine, baseline_step)}
# the allocator's host work per step the issue budgets (<= 100 us at batch 256): alloc_decode, the
# window release, flush, and translate / commit of the step's table changes
ALLOCATOR_PHASES = ("alloc_decode", "release", "flush", "translate")


# -- the real executor's batch build (sim.real.batch) --


def time_build_batch(batch: int, context: int, device: str, steps: int) -> list[dict]:
    """Host ms of `build_batch` for a decode step of `batch` requests of
    `context` tokens: the kept rows translated on the device (the
    executor's path) against `readable=True` (every page translated on the
    host tables and uploaded: the path it replaced)."""
    import numpy as np
    from unikv.sim.real.batch import BlockRows, build_batch
    from unikv.sim.real.tokens import TokenSource
    from unikv.sim.request import Request
    from unikv.sim.scheduler import StepPlan

    from unikv import Band, Layout, UnifiedPool
    from unikv.backends.cuda import CudaBackend

    pages = -(-context // PS) + 1
    layout = Layout(total_bytes=128 * PS * (batch * pages + 64), bands=[  # small entries: only ids matter here
        Band("swa", entry_bytes=64, grow="up", page_size=PS, blocks_per_page=2),
        Band("full", entry_bytes=64, grow="down", page_size=PS, blocks_per_page=2)])
    pool = UnifiedPool(layout, CudaBackend(device), compaction="lazy", ids="numpy")
    reqs = []
    for i in range(batch):
        ids = np.asarray(pool.alloc(pages * PS))
        r = Request(i, 0.0, 1, 1 << 30)
        r.pages, r.seq, r.prefill_target, r.prefilled = sorted(set((ids // PS).tolist())), context, 1, 1
        reqs.append(r)
    generated = {r.rid: list(range(context)) for r in reqs}
    source, bands = TokenSource(vocab_size=256, block_tokens=None), ["full", "swa"]
    plan = StepPlan(0, [], reqs, 0, np.zeros(batch, np.int64), True)
    rows, out = BlockRows(pool, bands, device), []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for path in ("device", "readable"):
        times = []
        for _ in range(steps):
            sync()
            t0 = time.perf_counter()
            built = build_batch(plan, pool, source, generated, bands, device, block_rows=rows,
                                readable=path == "readable")
            tables = [built.block_tables[b] for b in bands]  # the device path gathers when read
            t1 = time.perf_counter()
            sync()
            times.append((t1 - t0) * 1e3)
        out.append({"bench": "build_batch", "path": path, "batch": batch, "context": context,
                    "host_ms_median": round(statistics.median(times[2:]), 3), "tables": len(tables)})
    return out


# -- measurement --


def time_steps(step, e, steps: int, finish_every: int, first: int) -> list[float]:
    out = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(e, first + i, finish_every)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def count_syncs(step, e, steps: int, finish_every: int, first: int) -> collections.Counter:
    """Syncs per repository source line over `steps` steps."""
    sites: collections.Counter = collections.Counter()

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        if stack and stack[-1].name == "set_sync_debug_mode":
            return  # the mode switch's own notice, not a sync
        frames = [f for f in stack if f.filename.startswith(REPO)]
        inner = frames[-1] if frames else None
        outer = next((f for f in frames if "/unikv/" in f.filename), None)
        key = "?" if inner is None else f"{os.path.relpath(inner.filename, REPO)}:{inner.lineno} {inner.name}"
        via = "" if outer is None else f" (via {outer.name})"
        lib = stack[-1] if stack and not stack[-1].filename.startswith(REPO) else None
        at = "" if lib is None else f" [in {os.path.basename(lib.filename)}:{lib.lineno} {lib.name}]"
        sites[key + via + at] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(steps):
                step(e, first + i, finish_every)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sites


def count_torch_calls(step, e, steps: int, finish_every: int, first: int) -> TorchCalls:
    """Torch calls of `steps` steps, by phase (`TorchCalls`)."""
    calls = e["torch_calls"] = TorchCalls()
    sys.setprofile(calls.hook)
    try:
        for i in range(steps):
            step(e, first + i, finish_every)
    finally:
        sys.setprofile(None)
        del e["torch_calls"]
    return calls


def run(batch: int, engine: str, args) -> tuple[dict, list[dict]]:
    build, step = ENGINES[engine]
    e = build(batch, args.device)
    time_steps(step, e, args.warmup, args.finish_every, 0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    us = time_steps(step, e, args.steps, args.finish_every, args.warmup)
    sync()
    phases = {k: v[-args.steps:] for k, v in e.get("phases", {}).items()}
    sites = collections.Counter()
    if args.device == "cuda":
        sites = count_syncs(step, e, args.sync_steps, args.finish_every, args.warmup + args.steps)
    calls = count_torch_calls(step, e, args.sync_steps, args.finish_every,
                              args.warmup + args.steps + (args.sync_steps if args.device == "cuda" else 0))
    n_calls, n_ops = calls.per_phase(args.sync_steps, ops=False), calls.per_phase(args.sync_steps, ops=True)
    mine = ALLOCATOR_PHASES if "pool" in e else ()
    core = [a + r for a, r in zip(phases.get("alloc_decode", []), phases.get("release", []))]
    work = [sum(x) for x in zip(*(phases.get(k, []) for k in ALLOCATOR_PHASES))] if "pool" in e else []
    total = sum(sites.values())
    stats = e["pool"].stats() if "pool" in e else {}
    summary = {"bench": "decode_host", "allocator": engine, "batch": batch, "steps": args.steps,
               "total_mib": TOTAL_MIB if "pool" in e else None,
               "ladder_runs": stats.get("ladder_runs"), "page_moves": stats.get("moves"),
               "host_us_median": round(statistics.median(us), 1), "host_us_mean": round(statistics.fmean(us), 1),
               "host_us_p90": round(sorted(us)[int(0.9 * (len(us) - 1))], 1),
               "syncs_per_step": round(total / args.sync_steps, 2), "finish_every": args.finish_every,
               "alloc_decode_release_us_median": round(statistics.median(core), 1) if core else None,
               "allocator_us_median": round(statistics.median(work), 1) if work else None,
               # a shared host's quieter steps (its median moves with the load)
               "allocator_us_p10": round(sorted(work)[len(work) // 10], 1) if work else None,
               "slots": SLOTS if "pool" in e else None, "alloc": ALLOC if "pool" in e else None,
               "torch_calls_per_step": round(sum(n_calls.values()), 2),
               "torch_ops_per_step": round(sum(n_ops.values()), 2),
               "allocator_torch_calls": round(sum(n_calls.get(k, 0.0) for k in mine), 2) if mine else None,
               "allocator_torch_ops": round(sum(n_ops.get(k, 0.0) for k in mine), 2) if mine else None,
               **{f"{k}_us_median": round(statistics.median(v), 1) for k, v in sorted(phases.items())},
               **{f"{k}_torch_ops": round(n_ops.get(k, 0.0), 2) for k in mine}}
    site_rows = [{"bench": "sync_sites", "allocator": engine, "batch": batch, "site": k,
                  "syncs_per_step": round(v / args.sync_steps, 3)} for k, v in sites.most_common()]
    site_rows += [{"bench": "torch_calls", "allocator": engine, "batch": batch, "phase": phase, "site": name,
                   "calls_per_step": round(n / args.sync_steps, 3)}
                  for (phase, name), n in sorted(calls.by_phase.items())]
    return summary, site_rows


def stamp(device: str) -> dict:
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def append_csv(path: str, rows: list[dict]) -> None:
    """Append `rows`; a file whose header lacks some of their columns is
    rewritten with the union of the columns (runs of other modes add some)."""
    if not rows:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    old: list[dict] = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            if set(fields) <= set(header):
                fields, old = header, []
            else:
                old = list(reader)
                fields = list(dict.fromkeys(header + fields))
        if not old and set(fields) == set(header):
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=fields).writerows(rows)
            return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(old + rows)


def main(argv=None) -> int:
    global TOTAL_MIB, SLOTS, ALLOC
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/kernels/decode_host.csv")
    ap.add_argument("--sites-out", default=None, help="sync sites and torch call sites CSV (default: beside --out)")
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 64, 256])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sync-steps", type=int, default=40)
    ap.add_argument("--finish-every", type=int, default=8)
    ap.add_argument("--device", default="cuda", help="'cpu' is a dry run of the script (no sync counts)")
    ap.add_argument("--total-mib", type=int, default=TOTAL_MIB,
                    help="the 3-band pool's buffer; at 4096 the full band reaches the float during the run, "
                         "so the shortfall ladder slides it (page moves); larger buffers keep them apart")
    ap.add_argument("--slots", choices=("device", "host"), default=SLOTS,
                    help="device: commit the tables and upload the new virtual ids (the forward translates "
                         "them; the real executor's path); host: pool.translate per band on the host tables")
    ap.add_argument("--engines", nargs="*", choices=sorted(ENGINES), default=list(ENGINES))
    ap.add_argument("--alloc", choices=("tokens", "pages"), default=ALLOC,
                    help="tokens: alloc_decode and release of token ids (the pool checks last_loc); pages: the "
                         "engine takes fresh pages for the requests that open one (take_pages) and releases "
                         "page ids (release_pages), as an engine with its own block tables does")
    ap.add_argument("--build-batch", nargs="*", type=int, default=None, metavar="CONTEXT",
                    help="instead: time sim.real.batch.build_batch at --batch x these contexts, the kept rows "
                         "against the host rebuild (readable=True)")
    args = ap.parse_args(argv)
    TOTAL_MIB, SLOTS, ALLOC = args.total_mib, args.slots, args.alloc
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_decode_host: needs a CUDA device", file=sys.stderr)
        return 2
    sites_out = args.sites_out or os.path.join(os.path.dirname(args.out) or ".", "decode_sync_sites.csv")
    row0 = stamp(args.device)
    if args.build_batch is not None:
        rows = [{**row0, **r} for b in args.batch for c in args.build_batch
                for r in time_build_batch(b, c, args.device, 12)]
        for r in rows:
            print(f"build_batch {r['path']:8} batch {r['batch']:4d} x {r['context']:6d}: {r['host_ms_median']:8.3f} ms",
                  flush=True)
        append_csv(args.out, rows)
        return 0
    summaries, sites = [], []
    for batch in args.batch:
        for engine in args.engines:
            s, site_rows = run(batch, engine, args)
            summaries.append({**row0, **s})
            sites += [{**row0, **r} for r in site_rows]
            parts = ", ".join(f"{k[:-10]} {v}" for k, v in s.items() if k.endswith("_us_median")
                              and k != "host_us_median")
            print(f"{engine:12} batch {batch:4d}: {s['host_us_median']:9.1f} us/step median "
                  f"({s['host_us_p90']:.1f} p90), {s['syncs_per_step']:.2f} syncs/step; {parts}", flush=True)
            if s["allocator_torch_ops"] is not None:
                ops = ", ".join(f"{k} {s[k + '_torch_ops']}" for k in ALLOCATOR_PHASES)
                print(f"{'':12} allocator: {s['allocator_us_median']} us median ({s['allocator_us_p10']} p10), "
                      f"{s['allocator_torch_calls']} "
                      f"torch calls / {s['allocator_torch_ops']} ops a step ({ops}); whole step "
                      f"{s['torch_calls_per_step']} calls / {s['torch_ops_per_step']} ops", flush=True)
    append_csv(args.out, summaries)
    append_csv(sites_out, sites)
    for r in sites:
        if r["allocator"] != "unikv_cuda" or r["batch"] != args.batch[-1]:
            continue
        if r["bench"] == "sync_sites":
            print(f"  {r['syncs_per_step']:7.3f} syncs/step  {r['site']}")
        elif r["phase"] in ALLOCATOR_PHASES:
            print(f"  {r['calls_per_step']:7.3f} calls/step  {r['phase']:12} {r['site']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
