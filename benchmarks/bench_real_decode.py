"""Decode step time of the real executor on a GPU: the unified pool against a
static split, CUDA-graph decode, against the HBM roofline (issue 16 item 6).

For each model (random bf16 weights built on the GPU), layout (`end_end`:
the unified pool; `fixed_ratio`: a static split, the same executor), batch
size and context, the script fills B requests of `context` tokens into the
pool (releasing the window band's pages that left the window, as the
engine's ratchet does), then times `--steps` steady decode steps. Each step
does what the engine does per decode step:

- host: `alloc_decode` (one token per request), the window ratchet's
  release when a page leaves the window, a lazy `flush`, the commit of the
  page tables, and the requests' virtual page rows: kept on the device
  across steps (`unikv.tensors.PageRows`), a step writes only the pages it
  opened, then one gather of the batch's rows;
- device: the decode forward through `sim.real.graphs.DecodeGraphs` (one
  CUDA graph per batch-size bucket; the virtual rows, ids, lengths in
  static buffers the graph reads; the graph translates rows and ids to
  physical pages and slots from the pool's device page tables), its
  attention reading the pool's views through the Triton paged-attention
  kernel.

Reported per case (median over the steps): the whole step (wall, host work
included, synchronised), the host allocator work alone, the graph replay
alone (CUDA events), and the roofline: (weight bytes + KV bytes read) /
HBM bandwidth (4.8 TB/s, the H200 datasheet). After the steps: whether the
device-translated tables equal `KVViews.block_table` (the readable host
path; `tables_equal`), and what that host rebuild of every band's table
costs at the case's size (`host_rebuild_ms`, the per-step path it replaced). A case whose KV does not fit
the GPU's free memory is reported as skipped, with the bytes it needs.

    python benchmarks/bench_real_decode.py --out results/real/h200/decode.csv
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"gemma-3-12b": ROOT / "benchmarks/configs/gemma-3-12b-text_config.json",
           "gpt-oss-20b": ROOT / "tests/data/configs/openai--gpt-oss-20b_config.json",
           "llama-3.1-8b": ROOT / "tests/data/configs/meta-llama--Meta-Llama-3.1-8B_config.json",
           # from this folder, not the package: an installed (non-editable) unikv has no tests/data beside it
           "nemotron-3-nano-30b-a3b": ROOT / "tests/data/configs/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"}
HBM = 4.8e12
PS = 16
DEVICE, DTYPE = "cuda", "bf16"  # --smoke: "cpu", "fp32"


class Case:
    """B requests of `context` tokens in one pool, decoding together."""

    def __init__(self, pool, views, spec, batch: int, context: int, device: str) -> None:
        self.pool, self.views, self.spec, self.device = pool, views, spec, device
        self.bands = views.bands
        self.vocab = 256  # token ids drawn below every bundled vocabulary's size
        self.window = spec.window_tokens if "swa" in pool.bands else None
        self.seq = np.full(batch, context, dtype=np.int64)
        self.pages = []  # per request: its virtual pages, in position order
        self.alloc_s: list[float] = []  # per host_step: the allocator's part (alloc, release, flush, commit)
        self.last = np.zeros(batch, dtype=np.int64)  # its newest token id
        self.released = [0] * batch  # leading pages released on the window band
        from unikv.tensors import PageRows

        self.rows = PageRows(device, rows=batch, width=64)  # the engine's block table, virtual pages
        self.row = np.array([self.rows.open() for _ in range(batch)], dtype=np.int64)
        for b in range(batch):
            self.pages.append([])
            self._fill(b, context)
        self.last_page = np.array([p[-1] for p in self.pages], dtype=np.int64)
        import torch

        self.cu_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
        self.sample_rows = torch.arange(batch, dtype=torch.int64, device=device)

    def _fill(self, b: int, context: int) -> None:
        """Request b's `context` tokens, allocated chunk by chunk with the
        window released as it goes (the engine's ratchet); its row written."""
        pool = self.pool
        chunk = max(PS, (self.window or context) // PS * PS)
        for start in range(0, context, chunk):
            got = pool.alloc(-(-min(chunk, context - start) // PS) * PS)
            if got is None:
                raise MemoryError("the layout cannot hold the batch")
            got = np.asarray(got)
            self.pages[b].extend(sorted(set((got // PS).tolist())))
            self.last[b] = got[min(chunk, context - start) - 1]
            self.seq[b] = min(context, start + chunk)
            self._ratchet(b)
        self.seq[b] = context
        self.rows.write(int(self.row[b]), 0, self.pages[b])

    def replace(self, b: int, context: int = PS) -> None:
        """Request b finished (its last forward is done): its pages freed,
        leaving holes a lazy flush fills by moving pages; a new request of
        `context` tokens takes its place (in a fresh row)."""
        self.pool.free_pages(self.pages[b])
        self.rows.close(int(self.row[b]))
        self.row[b] = self.rows.open()
        self.pages[b], self.released[b] = [], 0
        self._fill(b, context)
        self.last_page[b] = self.pages[b][-1]

    def _ratchet(self, b: int) -> None:
        """Release request b's window-band pages wholly before its window."""
        gone = self._window_out(b)
        if gone:
            self.pool.release_pages(gone, "swa")

    def _window_out(self, b: int) -> list[int]:
        """Request b's window-band pages that left its window since the last
        call (marked released: the caller releases them)."""
        if self.window is None:
            return []
        done = max(0, int(self.seq[b]) - self.window) // PS
        if done <= self.released[b]:
            return []
        gone = self.pages[b][self.released[b]:done]
        self.released[b] = done
        return gone

    def host_step(self, flush: bool = True):
        """One decode step's allocator work; returns the forward's batch.
        `flush=False`: the caller flushes after launching the forward."""
        import torch
        from unikv.sim.real.batch import StepBatch, device_tables

        t0 = time.perf_counter()
        self.seq += 1
        new = np.asarray(self.pool.alloc_decode(self.seq, self.last))
        self.last = new
        for b in np.flatnonzero(new // PS != self.last_page).tolist():  # requests that opened a page
            page = int(new[b]) // PS
            self.rows.write(int(self.row[b]), len(self.pages[b]), [page])
            self.pages[b].append(page)
        self.last_page = new // PS
        if self.window is not None:  # one release for the batch: the pages that left the window
            gone = [p for b in np.flatnonzero((self.seq - self.window) % PS == 0).tolist()
                    for p in self._window_out(b)]
            if gone:
                self.pool.release_pages(gone, "swa")
        if flush:
            self.pool.flush(urgent=False)
        self.pool.commit()  # the step's table changes to the device (views.page_tables() below: nothing left)
        self.alloc_s.append(time.perf_counter() - t0)
        dev = self.device
        n = len(self.pages)
        width = max(len(p) for p in self.pages)
        page_rows = self.rows.gather(self.row, width)
        host = torch.from_numpy(np.stack([new, self.seq - 1, self.seq]))
        up = host.to(dev, non_blocking=True) if dev == "cuda" else host
        tables = self.views.page_tables()  # commits the step's table changes
        return StepBatch(layout="padded",
                         input_ids=torch.randint(0, self.vocab, (n, 1), device=dev),
                         position_ids=up[1].view(n, 1), cu_q=self.cu_q, seq_lens=up[2].to(torch.int32),
                         sample_rows=self.sample_rows, samplers=(), requests=tuple(range(n)),
                         **device_tables(page_rows, up[0], tables, PS))


def kv_bytes_per_request(spec, context: int) -> int:
    """KV bytes one request holds (and a decode step reads) at `context`."""
    window = min(context, spec.window_tokens or context)
    return context * spec.full_token_bytes + window * spec.swa_token_bytes


def sized_splits(spec, kind: str, batch: int, context: int, steps: int, need: int):
    """The splits `run_case` tries, as (static ratio, KV bytes to hold), then
    None: SGLang's default ratio at the case's own need; for a fixed_ratio
    split of window + full layers whose default cannot hold long contexts,
    then a split sized to the case (window tokens / full tokens: at most two
    windows a request while `Case` fills it chunk by chunk, plus the decode
    steps), at the need of that split. The step time compared is the
    executor's; the static split only has to hold the batch."""
    yield None, need
    if kind == "fixed_ratio" and spec.window_tokens and spec.swa_token_bytes:
        full = context + steps + 2 * PS
        swa = min(context, 2 * spec.window_tokens) + steps + 2 * PS
        if swa < full:
            yield swa / full, batch * (full * spec.full_token_bytes + swa * spec.swa_token_bytes)
    yield None


KERNEL_KINDS = (("attention", ("_attention_kernel", "_combine_kernel", "attention")),
                ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "sm90_", "cublas")),
                ("fused", ("triton_",)), ("copy", ("memcpy", "memset", "copy")))


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel, by its name: attention (unikv's paged
    attention), matmul (cuBLAS / CUTLASS), fused (inductor's Triton
    kernels), copy, or other (eager elementwise, reductions, indexing)."""
    low = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def kernel_breakdown(run_step, reps: int, table: Path | None = None) -> dict:
    """Device time per step of each kernel kind over `reps` calls of
    `run_step` under torch.profiler (CUPTI records the kernels a graph
    replay launches), and the kernel count; the `table` file gets the 25
    kernels that took longest in all."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run_step()
        torch.cuda.synchronize()
    sums: dict[str, float] = {}
    count = 0
    for e in prof.key_averages():
        us = e.self_device_time_total  # a runtime call's own device time is 0: no kernel counts twice
        if not us or e.key.startswith(("cudaGraph", "cudaLaunch", "cudaStream", "cudaEvent", "cudaMemcpyAsync")):
            continue
        kind = kernel_kind(e.key)
        sums[kind] = sums.get(kind, 0.0) + us / 1e3 / reps
        count += e.count
    out = {f"k_{kind}_ms": round(ms, 4) for kind, ms in sorted(sums.items())}
    out["k_total_ms"] = round(sum(sums.values()), 4)
    out["k_per_step"] = count // reps
    if table is not None:
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
    return out


def run_case(lm, spec, placed, kind: str, batch: int, context: int, steps: int, max_pages: int,
             compile_mode: str | None = None, kernels: Path | None = None):
    """One grid case; `compile_mode`: the decode forward through
    `torch.compile` in that mode (None: uncompiled); `kernels`: a folder
    for the case's kernel table, and the kernel kinds' device time per
    step in the row (`kernel_breakdown` over the last step's batch)."""
    import torch
    from unikv.sim.layouts import build_layout
    from unikv.sim.real.graphs import DecodeGraphs
    from unikv.sim.real.layers import check_layout

    from unikv.backends import CudaBackend
    from unikv.tensors import KVViews

    need = batch * (kv_bytes_per_request(spec, context + steps + 2 * PS) + 2 * PS * spec.full_token_bytes)
    free = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else 64 << 30
    ratio = None  # fixed_ratio: SGLang's default split first
    for attempt in sized_splits(spec, kind, batch, context, steps, need):
        if attempt is None:
            return {"status": f"skipped: the {kind} split cannot hold {batch} x {context} tokens"}
        ratio, need_kind = attempt
        budget = int(need_kind * 1.25) + (1 << 30)
        if budget > free - (6 << 30):
            return {"status": f"skipped: needs {budget / 2**30:.1f} GiB of KV, {free / 2**30:.1f} GiB free"}
        plan = build_layout(spec, kv_budget_gib=budget / 2**30, page_size=PS, kind=kind, static_ratio=ratio)
        pool = plan.make_pool(CudaBackend(DEVICE), "lazy", ids="numpy")
        check_layout(placed, pool.layout)
        views = KVViews(pool, placed.kv)
        try:
            case = Case(pool, views, spec, batch, context, DEVICE)
            break
        except MemoryError:
            del views, pool
    graphs = DecodeGraphs(lm, views, views.bands, device=DEVICE, max_pages=max_pages,
                          compile=compile_mode is not None, compile_mode=compile_mode)
    whole, host, device = [], [], []
    cuda = DEVICE == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        for i in range(steps + 3):
            sync()
            t0 = time.perf_counter()
            batch_in = case.host_step()
            t1 = time.perf_counter()
            if cuda:
                start.record()
            picks = graphs.run(batch_in)
            if cuda:
                stop.record()
            sync()
            t2 = time.perf_counter()
            if picks is None:
                return {"status": "skipped: no graph bucket fits"}
            if i >= 3:  # the first steps compile and capture the bucket's graph
                whole.append(t2 - t0)
                host.append(t1 - t0)
                device.append(start.elapsed_time(stop) / 1e3 if cuda else t2 - t1)
    stats = graphs.stats()
    breakdown = {}
    if kernels is not None and cuda:
        name = f"{spec.name}_{kind}_b{batch}_c{context}_" \
               f"{'compiled' if compile_mode else 'eager'}.txt"
        breakdown = kernel_breakdown(lambda g=graphs, b=batch_in: g.run(b), 5, kernels / name)
    # the device path against the readable one after the last step, and what
    # rebuilding the tables on the host (the old per-step path) would cost now
    equal = all(torch.equal(views.translate_pages(batch_in.page_rows, band), views.block_table(case.pages, band))
                for band in case.bands)
    agree = _eager_agreement(lm, views, case, batch_in, picks.clone())
    rebuild = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for band in case.bands:
            views.block_table(case.pages, band)
        sync()
        rebuild.append(time.perf_counter() - t0)
    weights = spec.weight_bytes or 0
    roof = (weights + batch * kv_bytes_per_request(spec, context)) / HBM
    del views, pool, graphs
    if cuda:
        torch.cuda.empty_cache()
    return {"status": "ok", "static_ratio": ratio, "kv_budget_gib": budget / 2**30,
            "step_ms": 1e3 * statistics.median(whole), "host_ms": 1e3 * statistics.median(host),
            "graph_ms": 1e3 * statistics.median(device), "roofline_ms": 1e3 * roof,
            "x_roofline": statistics.median(whole) / roof, "graph_x_roofline": statistics.median(device) / roof,
            "captured": bool(stats["captured"]), "compiled": bool(stats.get("compiled")),
            "compile_s": sum(stats.get("compile_s", {}).values()) if compile_mode is not None else None,
            "compile_failure": "; ".join(stats.get("compile_failures", {}).values())[:300],
            "host_alloc_ms": 1e3 * statistics.median(case.alloc_s[-len(host):]),
            "tables_equal": equal, "picks_equal_eager": agree, "host_rebuild_ms": 1e3 * statistics.median(rebuild),
            "host_ms_p90": 1e3 * sorted(host)[int(0.9 * (len(host) - 1))],
            "capture_failure": "; ".join(stats["failures"].values())[:200], **breakdown}


def run_overlap(lm, spec, placed, batch: int, context: int, steps: int, churn: int, mode: str,
                trace: Path | None = None) -> dict:
    """Lazy compaction during decode: every `churn` steps a request finishes
    (its pages freed: holes) and a short one takes its place; the flush after
    the forward's launch moves pages into the holes. `mode`: "none" (no
    churn, no moves), "same" (the pool's work and moves on the forward's
    stream: moves add to the step), "side" (the pool on a side stream
    ordered by events: the forward waits for the step's table commit, the
    moves run beside the forward, the next step's pool work waits for the
    forward's done event). `trace`: a torch.profiler Chrome trace of the
    last step that churns (its flush moves pages)."""
    import torch
    from unikv.sim.layouts import build_layout
    from unikv.sim.real.graphs import DecodeGraphs

    from unikv import UnifiedPool
    from unikv.backends import CudaBackend
    from unikv.tensors import KVViews

    need = batch * (kv_bytes_per_request(spec, context + steps + 2 * PS) + 2 * PS * spec.full_token_bytes)
    plan = build_layout(spec, kv_budget_gib=(int(need * 1.3) + (1 << 30)) / 2**30, page_size=PS, kind="end_end")
    cuda = DEVICE == "cuda"  # on the CPU (--smoke) there are no streams: "side" runs as "same"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    side = torch.cuda.Stream() if mode == "side" and cuda else None
    pool = UnifiedPool(plan.layout, CudaBackend(DEVICE, stream=side), compaction="lazy", ids="numpy")
    views = KVViews(pool, placed.kv)
    on_side = (lambda: torch.cuda.stream(side)) if side is not None else contextlib.nullcontext
    with on_side():
        case = Case(pool, views, spec, batch, context, DEVICE)
    graphs = DecodeGraphs(lm, views, views.bands, device=DEVICE, max_pages=-(-(context + steps + 4 * PS) // PS) + 1)
    main = torch.cuda.current_stream() if cuda else None
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    times, moving, moves, prev = [], [], 0, None
    victim, warm = 0, 3
    traced = max(i for i in range(steps + warm) if i % churn == churn - 1)  # the last step that churns
    with torch.inference_mode():
        for i in range(steps + warm):
            sync()
            prof = None
            if trace is not None and i == traced:
                prof = torch.profiler.profile(activities=activities)
                prof.__enter__()
            t0 = time.perf_counter()
            with on_side():
                if prev is not None and side is not None:
                    side.wait_event(prev)  # the last forward read its rows and tables
                if mode != "none" and i % churn == churn - 1:
                    case.replace(victim)
                    victim = (victim + 1) % batch
                batch_in = case.host_step(flush=False)
            if side is not None:
                main.wait_stream(side)  # the forward reads the committed tables and the uploads
            graphs.run(batch_in)
            done = pool.backend.new_event("forward") if main is None else torch.cuda.Event()
            if main is not None:
                done.record(main)
            with on_side():
                pool.set_inflight_forward(done, case.last)
                moved = pool.flush(urgent=False)
            prev = done
            sync()
            dt = time.perf_counter() - t0
            if prof is not None:
                prof.__exit__(None, None, None)
                prof.export_chrome_trace(str(trace))
            if i >= warm:
                times.append(dt)
                moves += moved
                if moved:
                    moving.append(dt)
    with on_side():
        views.page_tables()  # the last flush's remaps committed
    sync()
    # rows kept since the start, translated on the device after every move, against the host rebuild
    equal = all(torch.equal(views.translate_pages(batch_in.page_rows, band), views.block_table(case.pages, band))
                for band in case.bands)
    stats = pool.stats()
    out = {"status": "ok", "mode": mode, "tables_equal": equal, "step_ms": 1e3 * statistics.median(times),
           "step_ms_moving": 1e3 * statistics.median(moving) if moving else None,
           "steps_moving": len(moving), "moves": moves, "moved_bytes": stats.get("moved_bytes"),
           "page_bytes_full": plan.layout.geometry("full").page_bytes}
    del views, pool, graphs, case
    if cuda:
        torch.cuda.empty_cache()
    return out


def overlap_summary(trace: Path) -> str:
    """From a Chrome trace: the page-move kernels' time, and how much of it
    ran while a kernel of another stream was running."""
    events = [e for e in json.loads(trace.read_text()).get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") == "kernel"]
    moves = [e for e in events if "copy_rows" in e["name"]]
    others = [e for e in events if "copy_rows" not in e["name"]]
    total = sum(e["dur"] for e in moves)
    hidden = 0.0
    for m in moves:
        a, b = m["ts"], m["ts"] + m["dur"]
        spans = sorted((max(a, o["ts"]), min(b, o["ts"] + o["dur"])) for o in others
                       if o.get("tid") != m.get("tid") and o["ts"] < b and o["ts"] + o["dur"] > a)
        end = a
        for lo, hi in spans:  # union of the overlapping spans
            lo = max(lo, end)
            if hi > lo:
                hidden += hi - lo
                end = hi
    streams = sorted({str(e.get("tid")) for e in moves})
    return (f"{len(moves)} move kernels, {total:.1f} us, {hidden:.1f} us of it beside kernels of other "
            f"streams; move streams {streams}; {len(others)} other kernels")


def _eager_agreement(lm, views, case: Case, batch_in, picks) -> float:
    """The last step again, eagerly, its tables and slots built on the host
    (`KVViews.block_table`, `pool.translate`: the readable path); the
    fraction of requests whose greedy token equals the graph's. The forward
    rewrites the same K/V (same tokens, same positions)."""
    import torch
    from unikv.sim.real.attention import StepContext, use_step

    n = len(case.pages)
    ctx = StepContext(views=views, block_tables={b: views.block_table(case.pages, b) for b in case.bands},
                      cu_q=batch_in.cu_q, seq_lens=batch_in.seq_lens, layout="padded",
                      write_slots={b: torch.as_tensor(case.pool.translate(case.last, b), device=DEVICE).long()
                                   for b in case.bands})
    with torch.inference_mode(), use_step(ctx):
        logits = lm(input_ids=batch_in.input_ids, position_ids=batch_in.position_ids, use_cache=False).logits
    return float((logits[:, -1].argmax(-1) == picks[:n]).float().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="*", default=["gemma-3-12b", "gpt-oss-20b"])
    ap.add_argument("--batch", nargs="*", type=int, default=[1, 64, 256])
    ap.add_argument("--context", nargs="*", type=int, default=[1024, 8192])
    ap.add_argument("--layouts", nargs="*", default=["end_end", "fixed_ratio"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                    help="each case also with the decode forward through torch.compile (DecodeGraphs(compile=True)), "
                         "beside the uncompiled run; MODE: torch.compile's mode (default, or "
                         "max-autotune-no-cudagraphs: inductor tunes the matmuls, a longer compile)")
    ap.add_argument("--overlap", default=None, metavar="MODEL:BATCH:CONTEXT",
                    help="instead of the grid: lazy compaction during decode, moves on the forward's stream "
                         "against a side stream (run_overlap), with a profiler trace of one step")
    ap.add_argument("--churn", type=int, default=2, help="--overlap: a request finishes every N steps")
    ap.add_argument("--trace-dir", type=Path, default=None, help="--overlap: where the Chrome traces go")
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32, this (small) config")
    ap.add_argument("--fuse", action="store_true",
                    help="the model's q/k/v and gate/up projections fused, one matmul each (sim.real.fuse), "
                         "as the real executor runs them with --compile-decode")
    ap.add_argument("--kernels", type=Path, default=None, metavar="DIR",
                    help="also profile each case's graph replay (torch.profiler): device time per step of each "
                         "kernel kind in the rows (k_*_ms), the top kernels' table per case in DIR")
    args = ap.parse_args(argv)
    import torch

    global DEVICE, DTYPE
    if args.smoke is not None:
        DEVICE, DTYPE = "cpu", "fp32"
        CONFIGS["smoke"] = args.smoke.resolve()
        args.models = ["smoke"]
    elif not torch.cuda.is_available():
        print("error: bench_real_decode needs a CUDA device", file=sys.stderr)
        return 2
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real.model import build_model, torch_dtype

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.overlap is not None:
        return overlap_main(args, out)
    rows = []
    for name in args.models:
        path = CONFIGS[name]
        spec = load_model(str(path), kv_cache_dtype=DTYPE)
        lm = build_model(path, dtype=DTYPE, device=DEVICE, seed=0)
        lm.set_attn_implementation(attention.register(mask=False))
        if args.fuse:
            from unikv.sim.real.fuse import fuse_projections

            print(f"{name}: fused {fuse_projections(lm)}", flush=True)
        placed = layers.model_layers(lm.config, torch_dtype(DTYPE))
        max_pages = -(-(max(args.context) + args.steps + 4 * PS) // PS) + 1
        for kind in args.layouts:
            for context in args.context:
                for batch in args.batch:
                    for compiled in (False, True) if args.compile is not None else (False,):
                        row = {"model": name, "layout": kind, "batch": batch, "context": context,
                               "compile": args.compile if compiled else False, "fused": args.fuse,
                               "weight_bytes": spec.weight_bytes}
                        try:
                            row.update(run_case(lm, spec, placed, kind, batch, context, args.steps, max_pages,
                                                compile_mode=args.compile if compiled else None,
                                                kernels=args.kernels))
                        except Exception as exc:  # one case's failure is reported; the grid goes on
                            row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                        finally:  # the case's pool, views and graphs go before the next is sized
                            gc.collect()
                            if DEVICE == "cuda":
                                torch.cuda.empty_cache()
                        rows.append(row)
                        print(row, flush=True)
        del lm
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    write_rows(rows, out)
    print(summary(rows))
    return 0


def summary(rows: list[dict]) -> str:
    """The grid as a table: step, host and graph-replay time, the step and
    the replay against the roofline, compile seconds, and each unified
    (`end_end`) step against the static split's (`fixed_ratio`) of the same
    case and compile setting."""
    static = {(r["model"], r["batch"], r["context"], r.get("compile")): r["step_ms"] for r in rows
              if r.get("layout") == "fixed_ratio" and r.get("status") == "ok"}
    lines = ["model layout batch context compile | step_ms host_ms graph_ms | x_roof graph_x_roof | compile_s "
             "| vs_static"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['model']} {r['layout']} {r['batch']} {r['context']} {r.get('compile')} | {r['status']}")
            continue
        base = static.get((r["model"], r["batch"], r["context"], r.get("compile")))
        vs = f"{100 * (r['step_ms'] / base - 1):+.2f} %" if base and r["layout"] == "end_end" else "-"
        comp = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
        fail = f" compile failed: {r['compile_failure']}" if r.get("compile_failure") else ""
        lines.append(f"{r['model']} {r['layout']} {r['batch']} {r['context']} {r.get('compile')} | "
                     f"{r['step_ms']:.2f} {r['host_ms']:.2f} {r['graph_ms']:.2f} | {r['x_roofline']:.2f} "
                     f"{r['graph_x_roofline']:.2f} | {comp} | {vs}{fail}")
    return "\n".join(lines)


def write_rows(rows: list[dict], out: Path) -> None:
    """`rows` as CSV, every key a column (the first row's keys first)."""
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in rows[0], k))
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def overlap_main(args, out: Path) -> int:
    """`--overlap`: the three modes on one case, rows to `out`, traces beside."""
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real.model import build_model, torch_dtype

    name, batch, context = args.overlap.split(":")
    spec = load_model(str(CONFIGS[name]), kv_cache_dtype=DTYPE)
    lm = build_model(CONFIGS[name], dtype=DTYPE, device=DEVICE, seed=0)
    lm.set_attn_implementation(attention.register(mask=False))
    placed = layers.model_layers(lm.config, torch_dtype(DTYPE))
    rows = []
    for mode in ("none", "same", "side"):
        trace = args.trace_dir / f"step_{mode}.json" if args.trace_dir and mode != "none" else None
        if trace is not None:
            trace.parent.mkdir(parents=True, exist_ok=True)
        row = {"model": name, "batch": int(batch), "context": int(context), "churn": args.churn}
        try:
            row.update(run_overlap(lm, spec, placed, int(batch), int(context), args.steps, args.churn, mode, trace))
            if trace is not None:
                row["trace"] = overlap_summary(trace)
        except Exception as exc:  # one mode's failure is reported; the others go on
            row.update(mode=mode, status=f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    write_rows(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
