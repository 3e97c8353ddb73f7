"""Page moves beside the forward: does lazy compaction on a side stream, on a
bounded grid, add step time? (issue 16 item 6, last point)

A case is one step shape on one model (random weights built on the GPU, as
`bench_real_decode.py` builds them), every step moving pages:
- `decode`: B requests of `context` tokens decode one token each through
  the CUDA graph of `sim.real.graphs.DecodeGraphs` (HBM-bound: the moves
  compete with the forward for bandwidth);
- `prefill`: one request prefills `chunk` tokens over a cached prefix of
  `prefix` tokens, eagerly, packed layout (tensor-core bound: HBM has room).
  Its chunk is given back at the start of the next step, so every step is
  the same.
Churn, every step with moves: a resident of `resident_tokens` tokens that no
forward reads enters the pool (its pages extend the bands), then the oldest
of `residents` residents leaves (its pages become holes below the others);
the lazy flush after the forward's launch moves up to `move_cap` top pages
per band into those holes.

Modes (`--modes`): `none` (no churn, no flush: the baseline step);
`control` (the churn of `side-early`, its streams and orderings, but no
flush: the holes are left, and the next resident refills them; what the
churn costs with or without compaction); `same`
(the pool's work and moves on the forward's stream: the moves add to the
step); `side` (the pool on a side stream, one program per tile: the move
takes every SM while it runs); `side-pN` (the pool on a side stream, each
move launch on at most N programs: `CudaBackend(move_programs=N)`). The
forward runs on a stream of priority `--forward-priority` in every mode
(default -1: above the side stream's 0, torch's default and CUDA's lowest).
On a CPU (`--smoke`) there are no streams: every mode runs on one, as
`same` does, and the output says so.

Orderings in the side modes, and why each wait is there:
1. The side stream waits for the last forward's done event before the
   step's pool work: that work frees pages the last forward read (the
   prefill's chunk, a leaving resident), refills holes, and commits the
   last flush's remaps to the device tables the last forward read.
2. The forward's stream waits for the side stream (all its work so far):
   the forward reads the committed tables, the uploaded rows and ids, and
   the pages the last flush moved.
3. The moves the flush issues after the forward's launch wait for nothing:
   the pool never moves a page the forward writes (`set_inflight_forward`:
   a flush stops at such a page), moves into holes no forward reads, and
   keeps a page moved out of a place the in-flight forward reads from reuse
   until its done event fires (both only read the source meanwhile). The
   remap reaches the device tables at the next step's commit, after wait 1.
4. `side-early` / `side-early-pN` issue the flush before the forward's
   launch, right after the step's commit, so the moves can start as soon
   as the forward does (an eager forward's host launches otherwise hold
   the flush back until the forward is nearly done). The forward waits for
   the commit only (an event recorded before the moves), and reads the
   tables committed before the flush: every page it reads is still at its
   old place (the pool keeps a moved-out page from reuse until the
   forward's done event; `LaterEvent` is that event, declared before the
   launch and recorded after it), and it writes no moved page (the flush
   stops at the declared writes). The next forward reads the moved pages
   at their new places: its commit runs on the side stream after these
   moves, and it waits for that commit.

Per case and mode: the step (wall, host work included, synchronised every
step: median over the measured steps, and over those that moved pages), the
forward (CUDA events on its stream), moves and bytes per moving step, the
pool's page moves over the whole run (`pool_moves`, setup included: 0 in
`none` and `control`), and the host time of each of the step's phases
(`PHASES`, `<phase>_ms`: the case's own pool work, the churn, the table
commit, the flush, the forward's launch, and `wait`, the host waiting for
the device at the step's end; `time.perf_counter` around each, no device
sync added). The
moving rows' added time is split against the control (`against_control`):
(a) `churn_added_ms`, the control's step less none's (the churn's cost
with or without compaction); (b) `compaction_host_ms`, commit + flush host
time less the control's (planning and issuing the moves, committing the
moved pages); (c) `forward_lost_ms`, the forward's GPU time less the
control's; `step_vs_control_ms`, the step less the control's, is what
compaction costs the step (the target: none while the forward is longer
than the moves). From
a torch.profiler Chrome trace of one more step (`traces/<case>_<mode>.json.gz`;
mode none's trace is the baseline): the move kernels' time, how much of it
ran while forward kernels ran, the forward's kernel time (sum of its
kernels) and span (first start to last end), and their growth against mode
none: what the moves really cost the forward. Last, rows of case `alone`:
each grid's move kernel by itself on an idle GPU (`--alone-mb` MB in 1 MiB
pages), the time and bandwidth to set the moves beside the forward against.
Rows go to `<out>/move_overlap.csv`, the split as markdown tables to
`<out>/move_overlap.md`, the run's settings to `<out>/config.json`. Each
trace's GPU rows are named after what ran on them (`stream 7: forward`,
`stream 13: page moves`). `--trace` is the one command for the trace of
one moving step: decode in modes none, control and side-early (unless
given), and it fails unless each side mode's traced step moved pages on a
stream other than the forward's. CUDA only: a CPU step has no streams.

    python benchmarks/bench_move_overlap.py --out results/real/h200/move_overlap
    python benchmarks/bench_move_overlap.py --trace --out /tmp/step_trace   # traces/decode_side-early.json.gz
    python benchmarks/bench_move_overlap.py --smoke CONFIG --out /tmp/move_overlap   # CPU check, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import gzip
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PS = 16
MOVE_KERNEL = "_copy_rows_kernel"
FORWARD_RANGE = "unikv.forward"
MODES = ("none", "control", "same", "side", "side-p4", "side-p8", "side-p16", "side-p32", "side-early",
         "side-early-p4", "side-early-p32")
PHASES = ("pool", "churn", "commit", "flush", "launch", "wait")  # a step's parts, in order (`Phases`)
HOST_PHASES = PHASES[:-1]  # the host's work; `wait` is the host waiting for the device


def decode_bench():
    """`bench_real_decode.py` (this folder) as a module: its `Case`, configs
    and CSV writer (loaded by path: `python -P` puts no script folder on sys.path)."""
    if "bench_real_decode" in sys.modules:
        return sys.modules["bench_real_decode"]
    spec = importlib.util.spec_from_file_location("bench_real_decode", Path(__file__).with_name("bench_real_decode.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_real_decode"] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Mode:
    """Where the pool's work runs, and the move kernel's grid bound."""

    name: str
    side: bool
    churn: bool
    programs: int | None = None
    early: bool = False  # the flush before the forward's launch (side-early*)
    flush: bool = True  # False: the churn's holes are left (control)


def parse_mode(name: str) -> Mode:
    """`none`, `control`, `same`, `side`, `side-pN`, `side-early` or
    `side-early-pN` (N >= 1); ValueError naming it otherwise."""
    if name in ("none", "same", "side"):
        return Mode(name, side=name == "side", churn=name != "none", flush=name != "none")
    if name == "control":
        return Mode(name, side=True, churn=True, early=True, flush=False)
    if name == "side-early":
        return Mode(name, side=True, churn=True, early=True)
    early = name.startswith("side-early-p")
    n = name[len("side-early-p" if early else "side-p"):]
    if (early or name.startswith("side-p")) and n.isdigit() and int(n) > 0:
        return Mode(name, side=True, churn=True, programs=int(n), early=early)
    raise ValueError(f"--modes: {name!r} is not none, same, side, side-pN, side-early, side-early-pN "
                     "(N a positive integer) or control")


class LaterEvent:
    """The forward's done event made before its launch and recorded after
    it (the early flush declares the forward before launching it). Until
    `record` it reads as not done, where an unrecorded CUDA event would read
    as done and let the pool forget the forward's writes."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.event = torch.cuda.Event() if cuda else None
        self.recorded = False

    def record(self, stream=None) -> None:
        if self.event is not None:
            self.event.record(stream)
        self.recorded = True

    def query(self) -> bool:
        return self.recorded and (self.event is None or self.event.query())

    def wait(self, stream) -> None:  # torch's Stream.wait_event(e) calls e.wait(stream)
        if not self.recorded:
            raise RuntimeError("LaterEvent: waited on before the forward was launched")
        if self.event is not None:
            self.event.wait(stream)

    def synchronize(self) -> None:
        if self.event is not None and self.recorded:
            self.event.synchronize()


class Streams:
    """The forward's stream and the pool's (a side stream, or the forward's)."""

    def __init__(self, mode: Mode, cuda: bool, priority: int) -> None:
        import torch

        self.fwd = torch.cuda.Stream(priority=priority) if cuda else None
        self.side = torch.cuda.Stream() if cuda and mode.side else None
        self.pool_stream = self.side if self.side is not None else self.fwd

    def on(self, stream):
        import torch

        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class Residents:
    """Pool residents no forward reads, `tokens` each: `turn()` admits one
    (its pages extend the bands), then the oldest of `count` leaves (holes)."""

    def __init__(self, pool, window: int | None, count: int, tokens: int) -> None:
        self.pool, self.window, self.tokens = pool, window, tokens
        self.held = [fill(pool, window, tokens) for _ in range(count)]

    def turn(self) -> None:
        self.held.append(fill(self.pool, self.window, self.tokens))
        self.pool.free_pages(self.held.pop(0))


def fill(pool, window: int | None, tokens: int) -> list[int]:
    """Virtual pages of a new request of `tokens` tokens (a multiple of the
    page size), allocated a window at a time, its window-band pages released
    as they leave the window (the engine's ratchet)."""
    chunk = max(PS, (window or tokens) // PS * PS)
    pages: list[int] = []
    released = 0
    for start in range(0, tokens, chunk):
        got = pool.alloc(min(chunk, tokens - start))
        if got is None:
            raise MemoryError("the layout cannot hold the case")
        pages.extend(page_list(got))
        done = max(0, min(tokens, start + chunk) - window) // PS if window else 0
        if done > released:
            pool.release_pages(pages[released:done], "swa")
            released = done
    return pages


def page_list(ids) -> list[int]:
    """The virtual pages of whole-page token ids, in position order."""
    ids = np.asarray(ids, dtype=np.int64)
    pages = ids[::PS] // PS
    if not np.array_equal(ids // PS, np.repeat(pages, PS)):
        raise AssertionError("alloc returned ids that are not whole pages in position order")
    return pages.tolist()


# -- the two step shapes --


class DecodeCase:
    """`bench_real_decode.Case`'s B requests decoding through CUDA graphs."""

    def __init__(self, lm, pool, views, spec, args, device: str) -> None:
        from unikv.sim.real.graphs import DecodeGraphs

        self.views = views
        self.case = decode_bench().Case(pool, views, spec, args.batch, args.context, device)
        width = -(-(args.context + args.steps + 4 * PS) // PS) + 1
        self.graphs = DecodeGraphs(lm, views, views.bands, device=device, max_pages=width,
                                   buckets=(args.batch,))  # one capture: this batch's
        self.batch = None

    def warm_up(self) -> None:
        self.graphs.capture_buckets(len(self.case.pages))

    def pool_work(self):
        """The step's allocator work (one token each) and its batch."""
        self.batch = self.case.host_step(flush=False)
        return self.batch

    def writes(self) -> np.ndarray:
        return self.case.last

    def forward(self, batch):
        picks = self.graphs.run(batch)
        if picks is None:
            raise RuntimeError("no decode graph bucket fits the batch")
        return picks

    def tables_equal(self) -> bool:
        """The device-translated rows of the last batch equal the host rebuild."""
        import torch

        v = self.views
        return all(torch.equal(v.translate_pages(self.batch.page_rows, b), v.block_table(self.case.pages, b))
                   for b in v.bands)


class PrefillCase:
    """One request prefilling `chunk` tokens over a cached `prefix`."""

    def __init__(self, lm, pool, views, spec, args, device: str) -> None:
        import torch

        self.lm, self.pool, self.views, self.device = lm, pool, views, device
        self.window = spec.window_tokens if "swa" in pool.bands else None
        self.prefix, self.chunk = args.prefix, args.chunk
        self.pages = fill(pool, self.window, args.prefix)
        self.chunk_ids: np.ndarray | None = None
        self.chunk_pages: list[int] = []
        self.vocab = min(256, lm.config.vocab_size)
        self.cu_q = torch.tensor([0, args.chunk], dtype=torch.int32, device=device)
        self.seq_lens = torch.tensor([args.prefix + args.chunk], dtype=torch.int32, device=device)
        self.positions = torch.arange(args.prefix, args.prefix + args.chunk, device=device).view(1, -1)
        self.sample = torch.tensor([args.chunk - 1], dtype=torch.int64, device=device)
        self.batch = None

    def warm_up(self) -> None:
        return None

    def pool_work(self):
        """Give the last chunk back, allocate this step's; its batch."""
        import torch
        from unikv.sim.real.batch import StepBatch, device_tables

        pool = self.pool
        if self.chunk_pages:
            pool.free_pages(self.chunk_pages)
        got = pool.alloc(self.chunk)
        if got is None:
            raise MemoryError("the layout cannot hold the chunk")
        self.chunk_ids = np.asarray(got, dtype=np.int64)
        self.chunk_pages = page_list(self.chunk_ids)
        rows = np.array([self.pages + self.chunk_pages], dtype=np.int64)
        up = [torch.from_numpy(a).to(self.device, non_blocking=True) for a in (rows, self.chunk_ids)]
        self.batch = StepBatch(layout="packed",
                               input_ids=torch.randint(0, self.vocab, (1, self.chunk), device=self.device),
                               position_ids=self.positions, cu_q=self.cu_q, seq_lens=self.seq_lens,
                               sample_rows=self.sample, samplers=(), requests=(0,),
                               **device_tables(up[0], up[1], self.views.page_tables(), PS))
        return self.batch

    def writes(self) -> np.ndarray:
        return self.chunk_ids

    def forward(self, batch):
        """The eager packed forward (`RealExecutor._forward`'s path); the greedy pick."""
        from unikv.sim.real.attention import StepContext, use_step

        ctx = StepContext(views=self.views, block_tables=dict(batch.block_tables), cu_q=batch.cu_q,
                          seq_lens=batch.seq_lens, write_slots=dict(batch.write_slots), layout="packed")
        with use_step(ctx):
            out = self.lm(input_ids=batch.input_ids, position_ids=batch.position_ids,
                          logits_to_keep=batch.sample_rows, use_cache=False)
        return out.logits[0].argmax(-1)

    def tables_equal(self) -> bool:
        import torch

        v, pages = self.views, [self.pages + self.chunk_pages]
        return all(torch.equal(v.translate_pages(self.batch.page_rows, b), v.block_table(pages, b))
                   for b in v.bands)


CASES = {"decode": DecodeCase, "prefill": PrefillCase}


# -- one case in one mode --

DEVICE, DTYPE = "cuda", "bf16"  # --smoke: "cpu", "fp32"


def budget_bytes(kind: str, spec, args) -> int:
    """The pool's bytes: the case's KV, the residents (two more in flight), 30 % room."""
    kv = decode_bench().kv_bytes_per_request
    if kind == "decode":
        need = args.batch * (kv(spec, args.context + args.steps + 2 * PS) + 2 * PS * spec.full_token_bytes)
    else:
        need = kv(spec, args.prefix + args.chunk)
    need += (args.residents + 2) * kv(spec, args.resident_tokens)
    return int(need * 1.3) + ((1 << 30) if DEVICE == "cuda" else (1 << 20))


def run_mode(kind: str, mode: Mode, lm, spec, placed, args, trace: Path | None) -> dict:
    """`args.warm + args.steps` measured-or-warm steps of case `kind` in
    `mode`, then one profiled step (its trace to `trace`, gzipped)."""
    import torch
    from unikv.sim.layouts import build_layout
    from unikv.sim.real.layers import check_layout

    from unikv import UnifiedPool
    from unikv.backends import CudaBackend
    from unikv.tensors import KVViews

    streams = Streams(mode, DEVICE == "cuda", args.forward_priority)
    plan = build_layout(spec, kv_budget_gib=budget_bytes(kind, spec, args) / 2**30, page_size=PS, kind="end_end")
    backend = CudaBackend(DEVICE, stream=streams.pool_stream, move_programs=mode.programs)
    pool = UnifiedPool(plan.layout, backend, compaction="lazy", ids="numpy", move_cap=args.move_cap)
    check_layout(placed, pool.layout)
    views = KVViews(pool, placed.kv)
    window = spec.window_tokens if "swa" in pool.bands else None
    with torch.inference_mode():
        with streams.on(streams.pool_stream):
            case = CASES[kind](lm, pool, views, spec, args, DEVICE)
            residents = Residents(pool, window, args.residents, args.resident_tokens)
            pool.commit()
        with streams.on(streams.fwd):
            case.warm_up()  # graph capture, outside the measured steps
        sync()
        prev, records = None, []
        for _ in range(args.warm + args.steps):
            rec, prev = one_step(case, pool, residents, streams, mode, prev)
            records.append(rec)
        prof = profiler() if trace is not None else contextlib.nullcontext()
        with prof:
            rec, prev = one_step(case, pool, residents, streams, mode, prev, ranges=trace is not None)
        with streams.on(streams.pool_stream):
            views.page_tables()  # the last flush's remaps committed
        sync()
        equal = case.tables_equal()
    out = summarize(records[args.warm:])
    out.update(status="ok", tables_equal=equal, pool_moves=pool.stats()["moves"], page_bytes=json.dumps(
        {b: pool.layout.geometry(b).page_bytes for b in pool.bands}), trace_step_moves=rec["moves"],
               trace_step_moved_mb=rec["moved_bytes"] / 1e6)
    if trace is not None:
        out.update(save_trace(prof, trace))
    del case, residents, views, pool
    return out


class Phases:
    """Host seconds of a step's phases (`PHASES`), by `time.perf_counter`
    around each (no device sync added); on a traced step each phase is
    also a profiler range `unikv.<phase>`, so the trace's host row shows them."""

    def __init__(self, ranges: bool) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.ranges = ranges

    @contextlib.contextmanager
    def __call__(self, name: str):
        import torch

        t0 = time.perf_counter()
        with torch.profiler.record_function(f"unikv.{name}") if self.ranges else contextlib.nullcontext():
            yield
        self.seconds[name] += time.perf_counter() - t0


def one_step(case, pool, residents: Residents, streams: Streams, mode: Mode, prev, ranges: bool = False):
    """One step: the pool's work, the forward, the flush (see the module
    docstring for the orderings), each phase timed (`Phases`); returns its
    record and done event."""
    import torch

    moved0 = pool.stats()["moved_bytes"]
    moves = 0
    sync()
    t0 = time.perf_counter()
    phase = Phases(ranges)
    with streams.on(streams.pool_stream):
        with phase("pool"):
            if streams.side is not None and prev is not None:
                streams.side.wait_event(prev)  # ordering 1: the last forward read what this work frees and remaps
            batch = case.pool_work()
        with phase("churn"):
            if mode.churn:
                residents.turn()
        with phase("commit"):
            pool.commit()
        if mode.early:  # ordering 4: the moves start before the forward's launch
            with phase("flush"):
                done = LaterEvent(streams.fwd is not None)
                committed = mark(streams.side)
                pool.set_inflight_forward(done, case.writes())
                if mode.flush:  # control: the holes are left
                    moves = pool.flush(urgent=False)
    with streams.on(streams.fwd), phase("launch"):
        if mode.early and streams.side is not None:
            streams.fwd.wait_event(committed)  # ordering 4: the commit, not the moves just issued
        elif streams.side is not None:
            streams.fwd.wait_stream(streams.side)  # ordering 2: tables, uploads and moved pages are ready
        start = mark(streams.fwd)
        with torch.profiler.record_function(FORWARD_RANGE):
            case.forward(batch)
        stop = mark(streams.fwd)
        if mode.early:
            done.record(streams.fwd)
        else:
            done = torch.cuda.Event() if streams.fwd is not None else pool.backend.new_event("forward")
            if streams.fwd is not None:
                done.record(streams.fwd)
    if mode.churn and not mode.early:  # mode none: no flush either
        with streams.on(streams.pool_stream), phase("flush"):  # ordering 3: the moves wait for nothing
            pool.set_inflight_forward(done, case.writes())
            moves = pool.flush(urgent=False)
    with phase("wait"):
        sync()
    forward_s = start.elapsed_time(stop) / 1e3 if streams.fwd is not None else stop - start
    return {"step_s": time.perf_counter() - t0, "forward_s": forward_s, "moves": moves,
            "moved_bytes": pool.stats()["moved_bytes"] - moved0, **{f"{k}_s": v for k, v in phase.seconds.items()}}, done


def mark(stream):
    """A timing point: a CUDA event recorded on `stream`, or the host clock."""
    if stream is None:
        return time.perf_counter()
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


def sync() -> None:
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def summarize(records: list[dict]) -> dict:
    """Medians over the measured steps, and over those that moved pages;
    each phase's host time (`<phase>_ms`, `host_ms` their sum less `wait`)
    over the moving steps when some moved, else over all."""
    ms = lambda key, rs: 1e3 * statistics.median(r[key] for r in rs) if rs else None  # noqa: E731
    moving = [r for r in records if r["moves"]]
    phased = moving or records
    for r in phased:
        r["host_s"] = sum(r[f"{k}_s"] for k in HOST_PHASES)
    return {"steps": len(records), "steps_moving": len(moving),
            "step_ms": ms("step_s", records), "step_ms_moving": ms("step_s", moving),
            "forward_ms": ms("forward_s", records), "forward_ms_moving": ms("forward_s", moving),
            "moves_per_moving_step": statistics.mean(r["moves"] for r in moving) if moving else 0,
            "moved_mb_per_moving_step": statistics.mean(r["moved_bytes"] for r in moving) / 1e6 if moving else 0.0,
            "phase_steps": len(phased), "host_ms": ms("host_s", phased),
            **{f"{k}_ms": ms(f"{k}_s", phased) for k in PHASES}}


# -- the trace of one step --


def profiler():
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


def save_trace(prof, path: Path) -> dict:
    """Write `prof`'s Chrome trace to `path` (gzipped), its GPU stream rows
    named after what ran on them (`label_streams`); its kernel summary."""
    raw = path.with_suffix("")  # x.json.gz -> x.json
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_bytes())
    raw.unlink()
    events = trace.get("traceEvents", [])
    summary = trace_summary(events)
    label_streams(events)
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return summary


def step_kernels(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The forward's kernels (launched inside its `FORWARD_RANGE`: matched by
    the launch's correlation id, so a graph's kernels count too) and the
    move kernels, of one step's trace events."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "user_annotation" and e.get("name") == FORWARD_RANGE]
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
                and any(a <= e["ts"] <= b for a, b in ranges)}
    moves = [e for e in kernels if MOVE_KERNEL in e["name"]]
    forward = [e for e in kernels if e.get("args", {}).get("correlation") in launched and MOVE_KERNEL not in e["name"]]
    return forward, moves


def stream_of(kernel: dict) -> int:
    """A kernel event's CUDA stream (its `args.stream`, else its row)."""
    return kernel.get("args", {}).get("stream", kernel.get("tid"))


def trace_summary(events: list[dict]) -> dict:
    """The forward's kernels and the move kernels of one step (`step_kernels`):
    counts, summed time, the forward's span, the move time that ran while a
    forward kernel ran, the streams each ran on and whether the moves ran on
    none of the forward's. Empty on a CPU trace."""
    if not any(e.get("ph") == "X" and e.get("cat") == "kernel" for e in events):
        return {}
    forward, moves = step_kernels(events)
    busy = merged([(e["ts"], e["ts"] + e["dur"]) for e in forward])
    beside = sum(max(0.0, min(m["ts"] + m["dur"], hi) - max(m["ts"], lo)) for m in moves for lo, hi in busy)
    fwd_streams, move_streams = sorted({stream_of(e) for e in forward}), sorted({stream_of(e) for e in moves})
    return {"move_kernels": len(moves), "move_us": sum(e["dur"] for e in moves),
            "move_beside_forward_us": beside, "move_grids": json.dumps(sorted({str(e["args"].get("grid"))
                                                                                for e in moves})),
            "forward_kernels": len(forward), "forward_kernel_us": sum(e["dur"] for e in forward),
            "forward_span_us": (max(e["ts"] + e["dur"] for e in forward) - min(e["ts"] for e in forward)
                                if forward else None),
            "forward_streams": json.dumps(fwd_streams), "move_streams": json.dumps(move_streams),
            "moves_off_forward_stream": bool(moves) and not set(fwd_streams) & set(move_streams)}


def label_streams(events: list[dict]) -> None:
    """Name the GPU rows of a trace after what ran on them, in place: the
    row of each stream with forward kernels and of each with move kernels
    (`stream 7: forward`, `stream 13: page moves`), so a viewer shows the
    forward's stream and the side stream by name."""
    forward, moves = step_kernels(events)
    roles: dict[tuple, list[str]] = {}
    for role, kernels in (("forward", forward), ("page moves", moves)):
        for key in sorted({(e.get("pid"), e.get("tid")) for e in kernels}, key=str):
            roles.setdefault(key, []).append(role)
    events[:] = [e for e in events if not (e.get("ph") == "M" and e.get("name") == "thread_name"
                                           and (e.get("pid"), e.get("tid")) in roles)]
    for (pid, tid), names in roles.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"stream {tid}: {' + '.join(names)}"}})


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def moves_alone(modes: list[Mode], megabytes: int, repeats: int = 5) -> list[dict]:
    """Each move-kernel grid of `modes` alone on an idle device: a disjoint
    move of `megabytes` MB in 1 MiB pages (CPU: 8 pages of 4 KiB), median of
    `repeats` after one that compiles; the times to set the moves' times
    beside the forward against."""
    import torch

    try:
        from unikv.kernels.move import kernel as move
    except ImportError:
        print("alone: no Triton, no move kernel to time")
        return []
    page = 1 << 20 if DEVICE == "cuda" else 4096
    n = max(1, megabytes * 10**6 // page) if DEVICE == "cuda" else 8
    buf = torch.zeros(2 * n * page, dtype=torch.uint8, device=DEVICE)
    src = torch.arange(n, device=DEVICE)
    rows = []
    for programs in sorted({m.programs for m in modes if m.churn}, key=lambda p: p or 0):
        copy = functools.partial(move.move_pages, buf, page, src, src + n, disjoint=True, max_programs=programs)
        times = [timed_us(copy) for _ in range(repeats + 1)]
        us = statistics.median(times[1:])
        rows.append({"case": "alone", "mode": "full-grid" if programs is None else f"p{programs}",
                     "move_programs": programs, "status": "ok", "moved_mb_per_moving_step": n * page / 1e6,
                     "move_us": us, "move_gb_per_s": 2 * n * page / us / 1e3})
    return rows


def timed_us(fn) -> float:
    """Microseconds `fn()` takes: CUDA events on the device, else the host clock."""
    import torch

    if DEVICE != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3


def against_none(rows: list[dict]) -> None:
    """Each row's cost against its case's mode-none row, in place."""
    base = {r["case"]: r for r in rows if r.get("mode") == "none" and r.get("status") == "ok"}
    for r in rows:
        b = base.get(r["case"])
        if b is None or r.get("status") != "ok":
            continue
        if r.get("step_ms_moving") is not None:
            r["step_added_ms"] = r["step_ms_moving"] - b["step_ms"]
            r["forward_added_ms"] = r["forward_ms_moving"] - b["forward_ms"]
        for key in ("forward_kernel_us", "forward_span_us"):
            if r.get(key) is not None and b.get(key) is not None:
                r[key.replace("_us", "_growth_us")] = r[key] - b[key]


def against_control(rows: list[dict]) -> None:
    """Split each moving row's added step time against its case's control
    row (the same churn, no flush), in place:
    `churn_added_ms` (control row: its step less mode none's, what the
    churn costs with or without compaction) and, per moving row,
    `step_vs_control_ms` (its moving step less the control's step: what
    compaction costs the step), `compaction_host_ms` (its commit + flush
    host time less the control's: planning and issuing the moves,
    committing the moved pages' tables), `forward_lost_ms` (its forward's
    GPU time less the control's) and `rest_ms` (the step's difference
    less those two: negative where the flush's host work ran beside the
    forward, as in `side` and `side-pN`, which flush after the launch)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("step_ms") is not None]
    control = {r["case"]: r for r in ok if r["mode"] == "control"}
    none = {r["case"]: r for r in ok if r["mode"] == "none"}
    for case, c in control.items():
        if case in none:
            c["churn_added_ms"] = c["step_ms"] - none[case]["step_ms"]
    for r in ok:
        c = control.get(r["case"])
        if c is None or r.get("step_ms_moving") is None:
            continue
        r["step_vs_control_ms"] = r["step_ms_moving"] - c["step_ms"]
        r["compaction_host_ms"] = r["commit_ms"] + r["flush_ms"] - c["commit_ms"] - c["flush_ms"]
        r["forward_lost_ms"] = r["forward_ms_moving"] - c["forward_ms"]
        r["rest_ms"] = r["step_vs_control_ms"] - r["compaction_host_ms"] - r["forward_lost_ms"]
        for key in ("forward_kernel_us", "forward_span_us"):  # from the traced steps, where there are kernels
            if r.get(key) is not None and c.get(key) is not None:
                r[key.replace("_us", "_vs_control_us")] = r[key] - c[key]


SPLIT_COLUMNS = (("mode", "mode"), ("step_ms_moving", "step ms (moving)"), ("step_added_ms", "vs none"),
                 ("churn_added_ms", "(a) churn: control vs none"), ("step_vs_control_ms", "vs control"),
                 ("compaction_host_ms", "(b) compaction host"), ("forward_lost_ms", "(c) forward lost"),
                 ("rest_ms", "rest"), ("moved_mb_per_moving_step", "moved MB"),
                 *((f"{k}_ms", k) for k in PHASES))


def write_markdown(rows: list[dict], path: Path) -> None:
    """Per case, the split of a moving step's added time (`against_control`)
    and the host phases' medians, as markdown tables (milliseconds)."""
    lines = ["# Added step time of page moves, split (ms; medians)", "",
             "(a) the churn's cost with or without compaction (control against none); "
             "(b) compaction's own host work (commit + flush against the control's); "
             "(c) the forward's GPU time against the control's; rest: the step's difference less (b) and (c). "
             "The phase columns are host time (`wait`: the host waiting for the device)."]
    for case in dict.fromkeys(r["case"] for r in rows if r["case"] != "alone"):
        lines += ["", f"## {case}", "", "| " + " | ".join(h for _, h in SPLIT_COLUMNS) + " |",
                  "|" + "---|" * len(SPLIT_COLUMNS)]
        for r in rows:
            if r["case"] != case:
                continue
            if r.get("status") != "ok":
                lines.append(f"| {r['mode']} | {r.get('status')} |")
                continue
            shown = dict(r, step_ms_moving=r["step_ms"] if r.get("step_ms_moving") is None else r["step_ms_moving"])
            lines.append("| " + " | ".join(cell(shown.get(k)) for k, _ in SPLIT_COLUMNS) + " |")
    path.write_text("\n".join(lines) + "\n")


def cell(value) -> str:
    """A markdown cell: floats to 3 decimals, missing values empty."""
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


# -- command line --

TRACE = dict(cases=["decode"], modes=["none", "control", "side-early"], alone_mb=0)  # --trace's defaults
SMOKE = dict(batch=2, context=64, prefix=64, chunk=32, residents=2, resident_tokens=64, move_cap=4, steps=2,
             warm=1, modes=["none", "same", "side-p2", "side-early-p2"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for move_overlap.csv, config.json, traces/")
    ap.add_argument("--model", default="gemma-3-12b", help="a model of bench_real_decode.CONFIGS")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--modes", nargs="*", default=list(MODES), help="none, same, side, side-pN, side-early, side-early-pN")
    ap.add_argument("--batch", type=int, default=64, help="decode: requests")
    ap.add_argument("--context", type=int, default=8192, help="decode: tokens per request")
    ap.add_argument("--prefix", type=int, default=8192, help="prefill: cached prefix tokens")
    ap.add_argument("--chunk", type=int, default=4096, help="prefill: tokens prefilled per step")
    ap.add_argument("--residents", type=int, default=2, help="churn: residents no forward reads")
    ap.add_argument("--resident-tokens", type=int, default=8192, help="churn: tokens per resident")
    ap.add_argument("--move-cap", type=int, default=512, help="most pages one flush moves per band")
    ap.add_argument("--steps", type=int, default=6, help="measured steps per mode (then one traced)")
    ap.add_argument("--warm", type=int, default=2, help="unmeasured steps first")
    ap.add_argument("--alone-mb", type=int, default=900,
                    help="then each mode's move grid alone on an idle GPU, this many MB (0: skip)")
    ap.add_argument("--forward-priority", type=int, default=-1,
                    help="the forward stream's priority (lower = higher; the side stream has 0)")
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32, this (small) config, tiny sizes")
    ap.add_argument("--trace", action="store_true",
                    help="the trace of one moving step (CUDA only): unless given, --cases decode, --modes "
                         f"{' '.join(TRACE['modes'])}, --alone-mb 0; checks the moves ran off the forward's stream")
    args = ap.parse_args(argv)
    import torch

    brd = decode_bench()
    global DEVICE, DTYPE
    if args.trace and (args.smoke is not None or not torch.cuda.is_available()):
        print("error: --trace needs a CUDA device (a CPU step has no streams to show)", file=sys.stderr)
        return 2
    if args.trace:
        for key, value in TRACE.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    if args.smoke is not None:
        DEVICE, DTYPE = "cpu", "fp32"
        for key, value in SMOKE.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
        brd.CONFIGS["smoke"] = args.smoke.resolve()
        args.model = "smoke"
        print("smoke: CPU, fp32; no CUDA streams on a CPU: every mode runs on one stream, as 'same'")
    elif not torch.cuda.is_available():
        print("error: bench_move_overlap needs a CUDA device (or --smoke CONFIG)", file=sys.stderr)
        return 2
    try:
        modes = [parse_mode(m) for m in args.modes]
        check_sizes(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.model not in brd.CONFIGS:
        print(f"error: --model {args.model!r} is not one of {sorted(brd.CONFIGS)}", file=sys.stderr)
        return 2
    rows = run_all(args, modes, brd)
    against_none(rows)
    against_control(rows)
    brd.write_rows(rows, args.out / "move_overlap.csv")
    write_markdown(rows, args.out / "move_overlap.md")
    print_table(rows)
    problems = trace_problems(rows) if args.trace else []
    for line in problems:
        print(f"trace: {line}", file=sys.stderr)
    return 0 if all(r.get("status") == "ok" for r in rows) and not problems else 1


def trace_problems(rows: list[dict]) -> list[str]:
    """What `--trace` found wrong in the traced steps of the flushing side
    modes (empty: each moved pages on a stream of its own); prints where
    each trace is and what it shows."""
    out = []
    for r in rows:
        mode = parse_mode(r["mode"]) if r["case"] != "alone" else None
        if mode is None or not (mode.side and mode.flush) or r.get("status") != "ok":
            continue
        print(f"trace: traces/{r['case']}_{r['mode']}.json.gz: forward on streams {r.get('forward_streams')}, "
              f"{r.get('move_kernels')} move kernels ({cell(r.get('move_us'))} us) on streams "
              f"{r.get('move_streams')}, {cell(r.get('move_beside_forward_us'))} us of them beside forward kernels; "
              f"step vs control {cell(r.get('step_vs_control_ms'))} ms")
        if not r.get("trace_step_moves"):
            out.append(f"{r['case']} {r['mode']}: the traced step moved no page")
        elif not r.get("moves_off_forward_stream"):
            out.append(f"{r['case']} {r['mode']}: the moves ran on the forward's stream, or no move kernel was traced")
    return out


def check_sizes(args) -> None:
    """ValueError naming the first size that is not a positive multiple of the page size."""
    for key in ("context", "prefix", "chunk", "resident_tokens"):
        v = getattr(args, key)
        if v <= 0 or v % PS:
            raise ValueError(f"--{key.replace('_', '-')}={v} must be a positive multiple of {PS}")
    for key in ("batch", "residents", "move_cap", "steps"):
        if getattr(args, key) <= 0:
            raise ValueError(f"--{key.replace('_', '-')}={getattr(args, key)} must be positive")
    for key in ("warm", "alone_mb"):
        if getattr(args, key) < 0:
            raise ValueError(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= 0")


def run_all(args, modes: list[Mode], brd) -> list[dict]:
    """Build the model once; every case in every mode; the rows."""
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real.model import build_model, torch_dtype

    path = brd.CONFIGS[args.model]
    spec = load_model(str(path), kv_cache_dtype=DTYPE)
    lm = build_model(path, dtype=DTYPE, device=DEVICE, seed=0)
    lm.set_attn_implementation(attention.register(mask=False))
    placed = layers.model_layers(lm.config, torch_dtype(DTYPE))
    (args.out / "traces").mkdir(parents=True, exist_ok=True)
    write_config(args, path)
    rows = []
    for kind in args.cases:
        for mode in modes:
            row = {"case": kind, "mode": mode.name, "model": args.model, "move_programs": mode.programs,
                   "shape": f"{args.batch}x{args.context}" if kind == "decode" else f"{args.chunk}+{args.prefix}"}
            trace = args.out / "traces" / f"{kind}_{mode.name}.json.gz"
            try:
                row.update(run_mode(kind, mode, lm, spec, placed, args, trace))
            except Exception as exc:  # one mode's failure is reported; the others go on
                row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            print(row, flush=True)
    if args.alone_mb:
        for row in moves_alone(modes, args.alone_mb):
            rows.append(row)
            print(row, flush=True)
    return rows


def write_config(args, model_path: Path) -> None:
    """The run's settings and versions, beside its rows."""
    from importlib import metadata

    import torch

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    cfg.update(device=DEVICE, dtype=DTYPE, model_config=str(model_path),
               versions={n: version(n) for n in ("torch", "triton", "transformers", "unikv")},
               gpu=torch.cuda.get_device_name() if DEVICE == "cuda" else None)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def print_table(rows: list[dict]) -> None:
    """The rows that matter, one line per case and mode."""
    cols = ("case", "mode", "step_ms", "step_ms_moving", "step_added_ms", "forward_added_ms", "churn_added_ms",
            "step_vs_control_ms", "compaction_host_ms", "forward_lost_ms", "moved_mb_per_moving_step", "move_us", "move_gb_per_s", "move_beside_forward_us", "forward_kernel_growth_us",
            "forward_span_growth_us", "tables_equal", "status")
    print(" | ".join(cols))
    for r in rows:
        cells = [r.get(c) for c in cols]
        print(" | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells))


if __name__ == "__main__":
    sys.exit(main())
