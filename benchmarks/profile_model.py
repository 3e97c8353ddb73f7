"""Measure a model's step-time profile on a GPU with the real executor's
forwards (issue 17 item 1), in the format `sim.profile.StepProfile` reads.

Forwards run as the real executor runs them: the model's attention reads
and writes the pool through `unikv.tensors.KVViews` and the Triton
paged-attention kernel. Decode steps go through `sim.real.graphs.DecodeGraphs`
(one CUDA graph per batch-size bucket); prefill and mixed steps are packed
`[1, T]` eager forwards, as the executor runs them. Each point is the median
of `--reps` timed forwards (CUDA events) after WARMUPS untimed ones:

- decode: B requests at `context` tokens, one token each;
- prefill: one chunk of `chunk` tokens over `cached` tokens already in the
  pool;
- mixed: one chunk of `chunk` tokens (no cache) packed with B decoders at
  `--mixed-context` tokens;
- a model with recurrent state (Nemotron-H's Mamba-2 layers: the real
  executor binds them, `sim.real.state.StateBinder`) runs each point as
  the executor runs its steps (`sim.real.executor.state_plans`): its pool
  has a state band and every request a state slot; the chunk runs alone
  (packed, one request, eager), its state gathered from its slot before
  and scattered back after; the decoders run as one `[B, 1]` step through
  the bucket's CUDA graph (`DecodeGraphs` with the state binder: the
  gather from the requests' slots and the scatter back are captured
  inside it), all inside the timed span as in the executor's forward
  time. A model whose decode forward cannot be captured
  (`sim.real.graphs.capture_hazard`: transformers' eager MoE loop)
  decodes eagerly, as the executor then does, and the method says why.
  The profile says `"step_forwards": "per_chunk"` (`sim.profile`). Its
  grids are STATE_FIT / STATE_HELDOUT: its first profiles ran
  transformers' reference Mamba-2 scan at about 0.35 ms a token, so the
  mixed and cached axes are coarser, to keep a run near 200 s (with
  unikv's SSD kernels and --compiled the run took 202 s at 2efa8c2, most
  of it the decode grid and compiles); its chunk axes reach 8,192 tokens
  since 2026-12-03 (4,096 before);
- non-forward time: the real executor's own step time outside its forward
  (batch build, flush and moves, reading the sampled tokens back),
  measured on a replay of a calibration slice no validation cell replays
  (`CALIBRATION`); `--calibrate-only` re-measures it into existing files
  (after a change to the executor's host work).

A model `benchmarks/profile_coverage.py` finds unprofilable (no bundled
config.json, not buildable, layers the executor does not run (MLA,
unbound recurrent layers), weights that do not fit) is refused in one line
naming why.

A point whose KV the GPU cannot hold beside the weights (the large-batch,
long-context corner) is not measured: `sim.profile.fill_unmeasured`
extrapolates it from its measured neighbours and the grid's `filled` mask
marks it, so the cost model flags every step that reads it. Held-out
points that cannot be held are marked in the held-out file's `filled` mask
too, and `benchmarks/profile_accuracy.py` skips them (a held-out cell no
measured neighbour can reach holds the grid's largest time, never read).

Two files are written: FIT (the grids the cost model interpolates) and
HELDOUT (points between them, never used for fitting), so that
`benchmarks/profile_accuracy.py FIT HELDOUT` gives the accuracy table.
Random weights (no checkpoint can be loaded on the GPU machine); a forward's
time does not depend on the weights' values.

    python benchmarks/profile_model.py --model gemma-3-12b --gpu h200 \\
        --out sim/data/profiles/gemma-3-12b__h200.json \\
        --heldout results/profiles/gemma-3-12b__h200_heldout.json
    python benchmarks/profile_model.py --model nemotron-3-nano-30b-a3b --gpu h200 --reps 3 \\
        --out sim/data/profiles/nemotron-3-nano-30b-a3b__h200.json \\
        --heldout results/profiles/h200/nemotron-3-nano-30b-a3b__h200_heldout.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_real_decode as brd  # the decode case (this folder)
from bench_real_decode import PS, Case
from profile_coverage import check, config_file

FIT = {"decode": ([1, 2, 4, 8, 16, 32, 64, 128, 256], [512, 2048, 8192, 32768]),
       "prefill": ([16, 64, 128, 256, 512, 1024, 2048, 4096, 8192], [0, 2048, 8192, 32768]),
       "mixed": ([64, 256, 512, 1024, 2048, 4096, 8192], [1, 4, 16, 64, 256])}
HELDOUT = {"decode": ([3, 12, 48, 192], [1024, 4096, 16384]),
           "prefill": ([32, 384, 1536, 6144], [1024, 4096, 16384]),
           "mixed": ([128, 384, 1536, 6144], [2, 8, 32, 128])}
"""The grids: batch and chunk axes double (MoE expert touch and the host-bound
small chunks bend between points a factor 4 apart); held-out points lie at
the geometric middle of fitted cells. The small prefill and mixed rows (16,
64; held out 32, 128) cover the packed steps of a few dozen tokens that a
chat trace's arrivals make (azure_conv: steps of 48-256 tokens, whose time
the profiles of 2026-12-02 could only bound from the decode grid); every
row pads to its own bucket of `PACKED_BUCKETS` in every column, as
`sim.profile.StepProfile` requires of a profile measured with
--prefill-graphs."""
SMOKE_FIT = {"decode": ([1, 2], [16, 40]), "prefill": ([16, 32], [0, 24]), "mixed": ([16, 32], [1, 2])}
SMOKE_HELDOUT = {"decode": ([1, 2], [24, 32]), "prefill": ([24, 48], [8, 16]), "mixed": ([24, 48], [1, 2])}
"""--smoke's grids (the CPU, a tiny config): chunks that pad to distinct
buckets too (16, 32, 48, 64)."""
CONTINUING = 16
"""The state grid's first cached column after 0: a chunk that continues its
request over one page (`StepProfile.continuing_cached_tokens`)."""
STATE_FIT = {"decode": FIT["decode"],
             "prefill": ([16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], [0, CONTINUING, 8192, 32768]),
             "mixed": ([256, 1024, 4096, 8192], [1, 4, 16, 64, 256])}
STATE_HELDOUT = {"decode": HELDOUT["decode"],
                 "prefill": ([48, 384, 1536, 6144], [1024, 4096, 16384]),
                 "mixed": ([512, 2048, 6144], [2, 8, 32, 128])}
"""The grids of a model with recurrent state (see the module doc): decode
as FIT; prefill and mixed chunks up to 8,192 tokens (the scheduler's
default step budget), cached context and the smaller mixed chunks 4x
apart (held-out points between them). Until 2026-12-03 the chunk axes
stopped at 4,096, and the validation's 8,192-token chunks of
Nemotron-3-Nano (results/validation/h200) were extrapolated. The prefill
chunks start at 16 tokens: a small chunk is a forward of its own, read on
the prefill grid below the mixed grid's first row (`StepProfile.
_mixed_at`); the cached axis holds a continuing chunk one page in
(CONTINUING)."""
CALIBRATION = dict(trace="mooncake_synthetic", max_requests=32, rate_scale=1.0, max_context_tokens=8192,
                   kv_budget_gib=12.0)
"""The slice the real executor replays to measure `non_forward_s`: a trace
the end-to-end validation (benchmarks/validate_real.py) does not replay."""
STATE_CALIBRATION = dict(max_requests=8, max_context_tokens=2048)
"""CALIBRATION's changes for a model with recurrent state: its first 8
requests (450 steps in a roofline replay, against 1,758 for 32) clipped to
2,048 tokens, as its eager steps take 55-90 ms (decode) and its prefill
about 0.35 ms a token (results/real/h200/session_2026-12-02/hybrid/)."""
STATE_BAND = "mamba"
"""The state band `sim.layouts.build_layout` gives a model with recurrent state."""


def pool_for(spec, placed, tokens: int, requests: int, unwindowed_tokens: int = 0):
    """A unified pool (end_end) holding `requests` requests of `tokens`
    (the window band holding a window of each) and one of
    `unwindowed_tokens` whole on every band (a prefill chunk), and a state
    slot for each of them (a model with recurrent state)."""
    import torch
    from unikv.sim.layouts import build_layout

    from unikv.backends import CudaBackend
    from unikv.tensors import KVViews

    window = min(tokens, spec.window_tokens or tokens)
    need = requests * ((tokens + 4 * PS) * spec.full_token_bytes + (window + 4 * PS) * spec.swa_token_bytes)
    need += (unwindowed_tokens + 4 * PS) * (spec.full_token_bytes + spec.swa_token_bytes)
    need += (requests + 1) * spec.state_bytes
    budget = int(need * 1.1) + (1 << 30)
    free = torch.cuda.mem_get_info()[0] if brd.DEVICE == "cuda" else 8 << 30
    if budget > free - (6 << 30):
        raise MemoryError(f"needs {budget / 2**30:.1f} GiB of KV, {free / 2**30:.1f} GiB free")
    plan = build_layout(spec, kv_budget_gib=budget / 2**30, page_size=PS, kind="end_end")
    pool = plan.make_pool(CudaBackend(brd.DEVICE), "lazy", ids="numpy")
    return pool, KVViews(pool, placed.kv)


WARMUPS = 2
"""Untimed runs before a point's timed ones (the first run of a shape
compiles kernels and grows the allocator's blocks)."""


def timed(fn, reps: int) -> list[float]:
    """Seconds of `fn()` in each of `reps` runs after WARMUPS untimed ones
    (CUDA events; perf_counter on the CPU, --smoke)."""
    import torch

    for _ in range(WARMUPS):
        fn()
    times = []
    for _ in range(reps):
        if brd.DEVICE != "cuda":
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times


def decode_point(lm, spec, placed, batch: int, context: int, reps: int, compiled: bool = False) -> list[float]:
    """Seconds of each of `reps` decode steps of `batch` requests at
    `context` through the bucket's CUDA graph (after the capture and
    WARMUPS untimed steps); `compiled`: of the compiled layers (--compiled)."""
    import torch
    from unikv.sim.real.graphs import DecodeGraphs

    pool, views = pool_for(spec, placed, context + WARMUPS + reps + 4, batch)
    case = Case(pool, views, spec, batch, context, brd.DEVICE)
    graphs = DecodeGraphs(lm, views, views.bands, device=brd.DEVICE, max_pages=-(-(context + 64) // PS) + 1,
                          compile=compiled)
    steps = []
    with torch.inference_mode():
        graphs.run(case.host_step())  # captures the bucket
        for k in range(WARMUPS + reps):
            t = _replay(graphs, case.host_step())
            if k >= WARMUPS:
                steps.append(t)
    if brd.DEVICE == "cuda" and not graphs.stats()["captured"]:
        raise RuntimeError(f"decode batch {batch}: the graph was not captured ({graphs.stats()['failures']})")
    if compiled and graphs.stats()["compile_failures"]:
        raise RuntimeError(f"decode batch {batch}: not compiled ({graphs.stats()['compile_failures']})")
    return steps


def _replay(graphs, batch_in) -> float:
    """Seconds of one graph replay (CUDA events; perf_counter on the CPU)."""
    import torch

    if brd.DEVICE != "cuda":
        t0 = time.perf_counter()
        graphs.run(batch_in)
        return time.perf_counter() - t0
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graphs.run(batch_in)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1e3


def packed_point(lm, spec, placed, chunk: int, cached: int, decoders: int, context: int, reps: int,
                 compiled: bool = False, graphs: bool = False) -> list[float]:
    """Seconds of each of `reps` packed forwards: a chunk of `chunk` tokens
    over `cached` cached tokens, plus `decoders` requests at `context`
    decoding one token; `compiled`: through the compiled layers
    (`sim.real.prefill.CompiledPrefill`, --compiled); `graphs`: as the
    executor's `--prefill-graphs` runs it, the step copied into its token
    bucket's buffers and the bucket's graph replayed
    (`sim.real.packed_graphs.PackedGraphs`, --prefill-graphs)."""
    import numpy as np
    import torch
    from unikv.sim.real.attention import StepContext, use_step

    pool, views = pool_for(spec, placed, max(cached, context) + 4, decoders + 1, unwindowed_tokens=chunk)
    dec = Case(pool, views, spec, decoders, context, brd.DEVICE) if decoders else None
    pre = Case(pool, views, spec, 1, cached, brd.DEVICE) if cached else None
    got = np.asarray(pool.alloc(-(-chunk // PS) * PS))[:chunk]  # the chunk: no ratchet inside it
    pages = (pre.pages[0] if pre else []) + sorted(set((got // PS).tolist()))
    if dec:
        dec.seq += 1
        new = np.asarray(pool.alloc_decode(dec.seq, dec.last))
        for b, t in enumerate(new.tolist()):  # a decoder at a page boundary opens a page: the table holds it
            if t // PS != dec.pages[b][-1]:
                dec.pages[b].append(t // PS)
    else:
        new = np.zeros(0, dtype=np.int64)
    rows = (dec.pages if dec else []) + [pages]
    bands = views.bands
    ids = np.concatenate([new, got])
    dev = brd.DEVICE
    seq = [int(s) for s in (dec.seq if dec else [])] + [cached + chunk]
    pos = [s - 1 for s in seq[:-1]] + list(range(cached, cached + chunk))
    cu = list(range(len(seq))) + [len(seq) - 1 + chunk]
    ctx = StepContext(views=views, block_tables={b: views.block_table(rows, b) for b in bands},
                      cu_q=torch.tensor(cu, dtype=torch.int32, device=dev),
                      seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),
                      write_slots={b: torch.as_tensor(pool.translate(ids, b), device=dev).long() for b in bands},
                      layout="packed")
    input_ids = torch.randint(0, 256, (1, len(pos)), device=dev)
    position_ids = torch.tensor([pos], device=dev)
    keep = torch.tensor(list(range(len(seq) - 1)) + [len(pos) - 1], device=dev)

    def forward():
        with torch.inference_mode(), use_step(ctx):
            lm(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=keep)

    from unikv.sim.real.packed_graphs import PACKED_BUCKETS

    if graphs and len(pos) <= max(PACKED_BUCKETS):  # a larger step runs as without, in the executor too
        return _graph_times(lm, pool, views, rows, ids, ctx, input_ids, position_ids, keep, reps, compiled,
                            f"packed {chunk} x {cached} + {decoders}")
    if not compiled:
        return timed(forward, reps)
    from unikv.sim.real.prefill import CompiledPrefill

    prefill = CompiledPrefill(lm, views, device=dev)
    times = timed(lambda: prefill.forward(ctx, input_ids, position_ids, keep), reps)
    if prefill.stats()["failure"] is not None:
        raise RuntimeError(f"packed {chunk} x {cached} + {decoders}: not compiled ({prefill.stats()['failure']})")
    return times


def _graph_times(lm, pool, views, rows, ids, ctx, input_ids, position_ids, keep, reps: int, compiled: bool,
                 what: str) -> list[float]:
    """`packed_point`'s step through `PackedGraphs`: its virtual rows and
    write ids as the executor's batch carries them (`StepBatch`), one
    bucket built (captured on CUDA) and replayed `reps` times.

    Raises:
        RuntimeError: on CUDA, a bucket not captured, or not compiled with
            `compiled` (it would time another path)."""
    from unikv.sim.real.packed_graphs import PackedGraphs
    from unikv.sim.real.prefill import CompiledPrefill

    dev = brd.DEVICE
    batch = _packed_batch(pool, views, rows, ids, ctx, input_ids, position_ids, keep)
    packed = PackedGraphs(lm, views, views.bands, device=dev, max_pages=_max_pages(lm, rows),
                          max_requests=len(rows), prefill=CompiledPrefill(lm, views, device=dev) if compiled else None)
    times = timed(lambda: packed.run(batch), reps)
    _check_packed(packed, compiled, what)
    return times


def _packed_batch(pool, views, rows, ids, ctx, input_ids, position_ids, keep):
    """The packed step as the executor's batch carries it (`StepBatch`:
    virtual page rows and write ids, the device tables committed)."""
    import numpy as np
    import torch
    from unikv.sim.real.batch import StepBatch, device_tables

    dev = brd.DEVICE
    pool.commit()  # the device tables the graph reads
    width = max(len(r) for r in rows)
    page_rows = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        page_rows[i, :len(r)] = torch.as_tensor(np.asarray(r, dtype=np.int64))
    tables = {b: torch.as_tensor(pool.page_table(b)) for b in views.bands}
    return StepBatch(layout="packed", input_ids=input_ids, position_ids=position_ids, cu_q=ctx.cu_q,
                     seq_lens=ctx.seq_lens, sample_rows=keep, samplers=(), requests=(None,) * len(rows),
                     **device_tables(page_rows.to(dev), torch.as_tensor(ids, device=dev).long(), tables, PS))


def _max_pages(lm, rows) -> int:
    """The packed buckets' table width, as the executor's (`sim.real.executor._max_pages`)."""
    return max(-(-int(lm.config.max_position_embeddings) // PS) + 1, max(len(r) for r in rows))


def _check_packed(packed, compiled: bool, what: str) -> None:
    """On CUDA, refuse a point whose bucket was not captured, or not
    compiled with `compiled`: it would time another path."""
    stats = packed.stats()
    if brd.DEVICE == "cuda" and (not stats["captured"] or (compiled and not stats["compiled"])):
        raise RuntimeError(f"{what}: not captured{' compiled' if compiled else ''} ({stats})")


def state_point(lm, spec, placed, chunk: int, cached: int, decoders: int, context: int, reps: int,
                graphs: bool = True, run=None, compiled: bool = False, packed_graphs: bool = False,
                capture: bool | None = None) -> list[float]:
    """Seconds of each of `reps` steps of a model with recurrent state, run
    as the real executor runs them (`RealExecutor.launch` / `_forward`): a
    chunk of `chunk` tokens over `cached` cached tokens alone (0: none),
    eager, its state gathered from its pool slot before and scattered back
    after (`StateBinder`); then `decoders` requests at `context` as one
    `[B, 1]` step (0: none) through the bucket's graph (`DecodeGraphs` with
    the binder: a Mamba-2 model's mixers update the state in its slots,
    `sim.real.slot_decode`, other recurrent layers gather and scatter it
    inside the graph; captured on CUDA in the first WARMUPS step unless
    `capture` is False: the bucket's forward then runs eagerly), or with
    `graphs` off as one eager forward between the binder's gather and
    scatter. `run(step, reps)` times the step
    (None: `timed`; benchmarks/profile_state_prefill.py profiles it).
    `compiled`: the chunk through the compiled blocks with the binder's
    cache (`CompiledPrefill.forward_state`, as the executor runs it with
    --compile-prefill; the first WARMUPS step compiles). `packed_graphs`:
    a chunk of up to the largest bucket runs as the executor's
    `--prefill-graphs` runs it: padded to its token bucket, the state's
    gather, the padded Mamba-2 path (`sim.real.padded_chunk`) and the
    scatter in the bucket's graph (`PackedGraphs` with the binder;
    captured on CUDA before the reps), over the compiled blocks with
    `compiled`.

    Raises:
        RuntimeError: with `compiled`, a chunk whose compiled forward failed
            (it would time the eager one); on CUDA, a bucket not captured."""
    import torch
    from unikv.sim.real.graphs import DecodeGraphs
    from unikv.sim.real.ssd import scan_for
    from unikv.sim.real.state import StateBinder, cache_kwarg, pool_state_views

    pool, views = pool_for(spec, placed, max(cached, context) + 4, decoders + 1, unwindowed_tokens=chunk)
    binder = StateBinder(lm, pool_state_views(lm, pool, STATE_BAND))
    kwarg = cache_kwarg(lm)  # the executor reads it once (`RealExecutor.cache_kwarg`)
    scan = scan_for(lm)  # as once (`RealExecutor.scan`), outside the timed step
    parts = []
    prefill = packed = padded = None
    if chunk:
        from unikv.sim.real.packed_graphs import PACKED_BUCKETS, PackedGraphs

        ctx_of, inputs, states, fresh, rows, ids = _chunk_forward(pool, views, spec, chunk, cached)
        if compiled:
            from unikv.sim.real.prefill import CompiledPrefill

            prefill = CompiledPrefill(lm, views, device=brd.DEVICE)
        if packed_graphs and chunk <= max(PACKED_BUCKETS):  # a larger chunk runs as without, in the executor too
            padded = (_packed_batch(pool, views, rows, ids, ctx_of(), inputs["input_ids"], inputs["position_ids"],
                                    inputs["logits_to_keep"]), states, fresh)
            packed = PackedGraphs(lm, views, views.bands, device=brd.DEVICE, max_pages=_max_pages(lm, rows),
                                  max_requests=1, prefill=prefill, binder=binder)
        else:
            parts.append((ctx_of, inputs, states, fresh))
    decode = graph = None
    if decoders and graphs:
        decode = _decode_batch(pool, views, spec, decoders, context)
        graph = DecodeGraphs(lm, views, views.bands, device=brd.DEVICE, max_pages=-(-(context + 64) // PS) + 1,
                             binder=binder, capture=capture)
    elif decoders:
        parts.append(_decode_forward(pool, views, spec, decoders, context))

    def step():
        if padded is not None:
            batch, states, fresh = padded
            with torch.inference_mode():
                packed.run(batch, pool.translate(states, STATE_BAND), fresh)
        for ctx_of, inputs, states, fresh in parts:
            _state_forward(lm, binder, ctx_of(), inputs, pool.translate(states, STATE_BAND), fresh, kwarg, scan,
                           prefill)
        if decode is not None:
            batch, states = decode
            with torch.inference_mode():
                if graph.run(batch, pool.translate(states, STATE_BAND)) is None:
                    raise RuntimeError(f"decode batch {decoders}: no bucket takes it")

    times = (run or timed)(step, reps)
    if packed is not None:
        _check_packed(packed, compiled, f"prefill {chunk} x {cached}")
    if prefill is not None and prefill.stats()["failure"] is not None:
        raise RuntimeError(f"prefill {chunk} x {cached}: not compiled ({prefill.stats()['failure']})")
    if graph is not None and brd.DEVICE == "cuda" and capture is not False and not graph.stats()["captured"]:
        raise RuntimeError(f"decode batch {decoders}: the graph was not captured ({graph.stats()['failures']})")
    return times


def _chunk_forward(pool, views, spec, chunk: int, cached: int):
    """One request's prefill chunk over its `cached` tokens, as
    `_state_forward` takes it: (its step context's maker, the model's
    inputs, its state slot id, fresh: the chunk starts the request), then
    its virtual page row and written ids (`_packed_batch`'s)."""
    import numpy as np
    import torch
    from unikv.sim.real.attention import StepContext

    pre = Case(pool, views, spec, 1, cached, brd.DEVICE) if cached else None
    got = np.asarray(pool.alloc(-(-chunk // PS) * PS))[:chunk]
    pages = (pre.pages[0] if pre else []) + sorted(set((got // PS).tolist()))
    dev = brd.DEVICE
    tables = {b: views.block_table([pages], b) for b in views.bands}
    writes = {b: torch.as_tensor(pool.translate(got, b), device=dev).long() for b in views.bands}
    ctx = StepContext(views=views, block_tables=tables, cu_q=torch.tensor([0, chunk], dtype=torch.int32, device=dev),
                      seq_lens=torch.tensor([cached + chunk], dtype=torch.int32, device=dev), write_slots=writes,
                      layout="packed")
    inputs = dict(input_ids=torch.randint(0, 256, (1, chunk), device=dev),
                  position_ids=torch.arange(cached, cached + chunk, device=dev).view(1, chunk),
                  logits_to_keep=torch.tensor([chunk - 1], device=dev))
    return (lambda: ctx), inputs, pool.alloc_state(STATE_BAND, 1), cached == 0, [pages], got


def _decode_batch(pool, views, spec, decoders: int, context: int):
    """`decoders` requests at `context` decoding one token each: the step's
    batch (`Case.host_step`'s: the executor's device tables, translated
    when the forward reads them) and their state slot ids."""
    batch = Case(pool, views, spec, decoders, context, brd.DEVICE).host_step()
    return batch, pool.alloc_state(STATE_BAND, decoders)


def _decode_forward(pool, views, spec, decoders: int, context: int):
    """`_decode_batch`'s step as `_state_forward` takes it (eager decode)."""
    from unikv.sim.real.attention import StepContext

    batch, states = _decode_batch(pool, views, spec, decoders, context)

    def ctx():  # the executor builds it inside its forward's timed span (`RealExecutor._forward`)
        return StepContext(views=views, block_tables=dict(batch.block_tables), cu_q=batch.cu_q,
                           seq_lens=batch.seq_lens, write_slots=dict(batch.write_slots), layout="padded")

    inputs = dict(input_ids=batch.input_ids, position_ids=batch.position_ids, logits_to_keep=0)
    return ctx, inputs, states, False


def _state_forward(lm, binder, ctx, inputs: dict, slots, fresh: bool, kwarg: str, scan, prefill=None) -> None:
    """One forward with recurrent state, as `RealExecutor._forward` runs
    it: the state gathered from `slots` into a cache (`fresh`: a new one),
    the forward over the pool (its cache passed as `kwarg`) inside `scan()`
    (`sim.real.ssd.scan_for`), the state scattered back, the greedy token
    of each kept row taken. `prefill`: a packed chunk runs through this
    `CompiledPrefill` (`forward_state`, as `RealExecutor._prefill_state`)."""
    import torch
    from unikv.sim.real.attention import use_step

    if prefill is not None and ctx.layout == "packed":
        out, cache = prefill.forward_state(ctx, inputs["input_ids"], inputs["position_ids"],
                                           inputs["logits_to_keep"], bind=lambda: binder.before(slots, fresh=fresh))
        with torch.inference_mode():
            binder.after(cache, slots)
        out.logits[0].argmax(-1)
        return
    cache = binder.before(slots, fresh=fresh)
    with torch.inference_mode(), use_step(ctx), scan():
        out = lm(use_cache=True, **inputs, **{kwarg: cache})
        binder.after(cache, slots)
    (out.logits[0] if ctx.layout == "packed" else out.logits[:, -1]).argmax(-1)


def measure(lm, spec, placed, grids, reps: int, mixed_context: int, heldout: bool, compiled: bool = False,
            graphs: bool = False, state_graphs: bool = True) -> dict:
    """Every grid point's median forward seconds (each point's fastest,
    median and slowest rep printed), unmeasurable cells filled;
    `state_graphs`: a model with recurrent state decodes through the
    buckets' graphs (`state_point`)."""
    import torch
    from unikv.sim.profile import fill_unmeasured

    out = {}
    for grid, (rows, cols) in grids.items():
        table = []
        for r in rows:
            line = []
            for c in cols:
                t0 = time.perf_counter()
                try:
                    if placed.recurrent:  # the executor's forwards of a model with state
                        times = state_point(lm, spec, placed, *{"decode": (0, 0, r, c), "prefill": (r, c, 0, 0),
                                                                "mixed": (r, 0, c, mixed_context)}[grid], reps,
                                             state_graphs, compiled=compiled, packed_graphs=graphs)
                    elif grid == "decode":
                        times = decode_point(lm, spec, placed, r, c, reps, compiled)
                    elif grid == "prefill":
                        times = packed_point(lm, spec, placed, r, c, 0, 0, reps, compiled, graphs)
                    else:
                        times = packed_point(lm, spec, placed, r, 0, c, mixed_context, reps, compiled, graphs)
                    t = statistics.median(times)
                    print(f"{grid} {r} x {c}: {1e3 * t:.2f} ms (reps {1e3 * min(times):.2f} .. {1e3 * max(times):.2f}; "
                          f"{time.perf_counter() - t0:.1f} s)", flush=True)
                except (MemoryError, torch.cuda.OutOfMemoryError) as exc:
                    t = None
                    print(f"{grid} {r} x {c}: not measured, the GPU cannot hold it ({str(exc).splitlines()[0]})",
                          flush=True)
                line.append(t)
                gc.collect()
                if brd.DEVICE == "cuda":
                    torch.cuda.empty_cache()
            table.append(line)
        axes = {"decode": ("batch", "context_tokens"), "prefill": ("chunk_tokens", "cached_tokens"),
                "mixed": ("chunk_tokens", "batch")}[grid]
        try:
            filled, mask = fill_unmeasured(rows, cols, table)
        except ValueError:
            if not heldout:
                raise
            # a held-out cell nothing can reach: marked filled, so the accuracy table skips it
            top = max(t for line in table for t in line if t is not None)
            filled, mask = [[top if t is None else t for t in line] for line in table], \
                [[t is None for t in line] for line in table]
        out[grid] = {axes[0]: rows, axes[1]: cols, "forward_s": filled}
        if any(any(m) for m in mask):
            out[grid]["filled"] = mask
    out["mixed"]["context_tokens"] = mixed_context
    return out


def non_forward(config_json: Path, dtype: str, state: bool, compiled: bool = False, graphs: bool = False) -> dict:
    """The real executor's step time outside its forward, measured on the
    CALIBRATION slice (decode through CUDA graphs, the measured clock): the
    median over all steps, and over decode-only and prefill steps apart
    (`sim.real.executor.non_forward_summary`). A model with recurrent
    `state` replays STATE_CALIBRATION's shorter slice without the prefix
    cache (the executor refuses it there), as many running as the slice
    holds (so the start-up captures no larger bucket); its decode graphs gather and
    scatter the state inside them (the summary's `graph_off` says why
    when the executor refused them)."""
    from unikv.sim.config import RunConfig, SchedulerConfig
    from unikv.sim.run import run

    calibration = CALIBRATION | (STATE_CALIBRATION if state else {})
    # a slice of 8 requests never runs more: the executor's start-up then captures decode buckets up to 8 only,
    # not up to the default 256 (whose static state store alone is 11.8 GiB for Nemotron-3-Nano)
    running = {"max_running": calibration["max_requests"]} if state else {}
    config = RunConfig(model=str(config_json), executor="real", device=brd.DEVICE, dtype=dtype,
                       decode_graphs=brd.DEVICE == "cuda", compile_decode=compiled and brd.DEVICE == "cuda",
                       compile_prefill=compiled, prefill_graphs=graphs, real_clock="measured", trace_end_s=None,
                       layout="end_end", compaction="lazy", oversize="reject", kv_cache_dtype=dtype, gpu="h200",
                       seed=0, scheduler=SchedulerConfig(prefix_cache=not state, **running), **calibration)
    s = run(config).summary
    got = {k: s[f"real_non_forward_s{k}_median"] for k in ("", "_decode", "_prefill")}
    decode = ("decode graphs" if s.get("graph_steps") else
              f"eager decode ({s['graph_off']})" if s.get("graph_off") else "eager decode")
    print(f"non-forward time on {calibration['trace']} ({s['real_steps']} steps): "
          + ", ".join(f"{k or 'all'} {1e3 * v:.2f} ms" for k, v in got.items() if v is not None), flush=True)
    return {"non_forward_s": got[""], "non_forward_method": (
        f"the real executor's measured step minus its forward (CUDA events), median over the "
        f"{s['real_steps']} steps of a replay of {calibration}, end_end, lazy, "
        f"{'no prefix cache, ' if state else ''}{decode}; "
        f"decode-only steps {got['_decode']!r} s, steps with a prefill chunk {got['_prefill']!r} s")}


METHOD = ("real executor forwards: decode through CUDA graphs per bucket, prefill / mixed packed eager; "
          "median of reps after a warm-up, CUDA events")
COMPILED_METHOD = ("real executor forwards: decode through CUDA graphs per bucket of compiled layers, prefill / mixed "
                   "packed with compiled layers (--compiled), q/k/v and gate/up fused; median of reps after a "
                   "warm-up, CUDA events")
STATE_METHOD = ("real executor forwards as it runs a model with recurrent state: each prefill chunk alone (packed "
                "eager, its state gathered from its pool slot before and scattered back after: StateBinder; a "
                "Mamba-2 mixer's chunked scan through unikv's Triton SSD kernels, sim.real.ssd), the "
                "decoders as one [B, 1] step through the bucket's CUDA graph (DecodeGraphs with the StateBinder: "
                "Mamba-2 mixers update the state in the requests' pool slots, sim.real.slot_decode; other recurrent "
                "layers' state gathered from the slots and scattered back inside the graph), inside the timed "
                "span; median of reps after a warm-up, CUDA events")
STATE_EAGER_METHOD = ("real executor forwards as it runs a model with recurrent state: each prefill chunk alone "
                      "(packed eager; a Mamba-2 mixer's chunked scan through unikv's Triton SSD kernels, sim.real.ssd), the "
                      "decoders as one eager [B, 1] forward ({why}), each forward's state "
                      "gathered from the requests' pool slots before it and scattered back after (StateBinder), "
                      "inside the timed span; median of reps after a warm-up, CUDA events")


def provenance(command: str, revision: str, method: str = METHOD) -> dict:
    import torch
    import transformers
    import triton

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        driver = "none (no nvidia-smi)"
    return {"gpu_name": torch.cuda.get_device_name() if brd.DEVICE == "cuda" else "cpu (--smoke)", "driver": driver, "torch": torch.__version__,
            "triton": triton.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "git_revision": revision,
            "weights": "random (seed 0): a forward's time does not depend on the weights' values",
            "method": method}


def _smoke(args) -> tuple[Path, str]:
    """--smoke: the CPU, tiny grids and calibration slice; returns (the
    config, the dtype: fp32, or bf16 for a model with recurrent state,
    whose conv state unikv sizes in 2 bytes as the executor's pool check
    needs)."""
    from unikv.sim.models import load_model

    config_json = args.smoke.resolve()
    brd.DEVICE, dtype = "cpu", "bf16" if load_model(str(config_json)).state_bytes else "fp32"
    FIT.update(SMOKE_FIT)
    HELDOUT.update(SMOKE_HELDOUT)
    STATE_FIT.update(FIT, prefill=(FIT["prefill"][0], [0, CONTINUING, *FIT["prefill"][1][1:]]))
    STATE_HELDOUT.update(HELDOUT)
    args.mixed_context = min(args.mixed_context, 32)
    CALIBRATION.update(max_requests=4, max_context_tokens=96, kv_budget_gib=0.05)
    STATE_CALIBRATION.update(max_requests=6, max_context_tokens=96)  # its first 4 requests decode no token
    return config_json, dtype


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a bundled model id (benchmarks/profile_coverage.py: which ones)")
    ap.add_argument("--gpu", required=True, help="the bundled GPU name the profile is for (h200)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--heldout", required=True, type=Path)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--mixed-context", type=int, default=2048)
    ap.add_argument("--revision", default="unknown", help="the git revision measured (the GPU machine has no git)")
    ap.add_argument("--calibrate-only", action="store_true",
                    help="measure only non_forward_s and write it into the existing --out and --heldout files")
    ap.add_argument("--prefill-graphs", action="store_true",
                    help="prefill / mixed steps through the token-count buckets' CUDA graphs (the executor's "
                         "prefill_graphs; with --compiled, of the compiled layers); steps no bucket takes are "
                         "measured as without")
    ap.add_argument("--compiled", action="store_true",
                    help="decode graphs and prefill / mixed steps with compiled decoder layers (the executor's "
                         "compile_decode and compile_prefill)")
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32 (bf16 with recurrent state), this (small) config, "
                         "tiny grids")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model

    if args.smoke is not None:
        config_json, dtype = _smoke(args)
    else:
        config_json, dtype = config_file(args.model), "bf16"
        try:
            why = check(args.model, args.gpu).refusal()
        except ValueError as exc:
            why = str(exc)
        if why is not None:
            print(f"error: --model {args.model!r} cannot be profiled on one {args.gpu}: {why}", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("error: profile_model needs a CUDA device", file=sys.stderr)
            return 2
    spec = load_model(str(config_json), kv_cache_dtype=dtype)  # the state bytes the executor's pool holds
    if args.calibrate_only:
        for path in (args.out, args.heldout):
            if not path.exists():
                print(f"error: --calibrate-only: {path} does not exist", file=sys.stderr)
                return 2
    lm = real_model.build_model(config_json, dtype=dtype, device=brd.DEVICE, seed=0)
    real_model.build_model = lambda *_a, **_k: lm  # the calibration replay runs on these weights too
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype))
    state = bool(placed.recurrent)
    if state and args.prefill_graphs:
        from unikv.sim.real.padded_chunk import padded_ready

        why = padded_ready(lm)
        if why is not None:
            print(f"error: --prefill-graphs: {args.model}: {why}", file=sys.stderr)
            return 2
    from unikv.sim.real.graphs import capture_hazard

    graphs_off = capture_hazard(lm) if brd.DEVICE == "cuda" else None  # the executor's DecodeGraphs refuses it
    calibrated = non_forward(config_json, dtype, state, args.compiled, args.prefill_graphs)
    print(f"calibrated ({time.perf_counter() - started:.0f} s since the start)", flush=True)
    command = "python benchmarks/profile_model.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.calibrate_only:
        for path in (args.out, args.heldout):
            profile = json.loads(path.read_text())
            profile["non_forward_s"] = calibrated["non_forward_s"]
            profile["provenance"].update(non_forward_method=calibrated["non_forward_method"],
                                         non_forward_command=command, non_forward_revision=args.revision)
            path.write_text(json.dumps(profile, indent=1) + "\n")
            print(f"wrote non_forward_s into {path}", flush=True)
        return 0
    lm.set_attn_implementation(attention.register(mask=False))
    fit, held = (STATE_FIT, STATE_HELDOUT) if state else (FIT, HELDOUT)
    for path, grids in ((args.out, fit), (args.heldout, held)):
        data = measure(lm, spec, placed, grids, args.reps, args.mixed_context, heldout=grids is held,
                       compiled=args.compiled, graphs=args.prefill_graphs, state_graphs=graphs_off is None)
        method = COMPILED_METHOD if args.compiled else METHOD
        if state:
            method = STATE_METHOD if graphs_off is None else STATE_EAGER_METHOD.format(why=graphs_off)
            if args.compiled:  # the executor's --compile-prefill: each chunk through the compiled blocks
                method = method.replace("(packed eager", "(packed, its blocks compiled with the binder's cache: "
                                        "CompiledPrefill.forward_state, --compiled")
        if args.prefill_graphs:
            method += "; prefill / mixed steps of up to 2,048 tokens through CUDA graphs per token bucket"
            if state:
                method += (" (each chunk padded to its bucket, the state's gather, the Mamba-2 mixers' padded path "
                           "that stops the conv and the scan at the real length (sim.real.padded_chunk) and the "
                           "scatter captured in the bucket's graph: PackedGraphs with the StateBinder)")
        prov = provenance(command, args.revision, method)
        prov["non_forward_method"] = calibrated["non_forward_method"]
        profile = {"format": "unikv-step-profile", "version": 1, "model": args.model, "gpu": args.gpu,
                   "provenance": prov, "non_forward_s": calibrated["non_forward_s"], "moe_touch": [], **data}
        if state:  # each chunk its own forward (sim.profile.STEP_FORWARDS)
            profile["step_forwards"] = "per_chunk"
            if grids is fit:  # a continuing chunk's own path, measured at one page (the held-out grid has no 0)
                profile["continuing_cached_tokens"] = CONTINUING
        if args.prefill_graphs:  # the buckets the packed points were padded to (sim.profile: StepProfile.padded)
            from unikv.sim.real.packed_graphs import PACKED_BUCKETS

            profile["packed_buckets"] = list(PACKED_BUCKETS)
        if not state or graphs_off is None:  # decode through DecodeGraphs, each batch padded to its bucket
            from unikv.sim.profile import padding_routes_as_one
            from unikv.sim.real.graphs import BUCKETS

            profile["decode_buckets"] = list(BUCKETS)
            profile["decode_padding_routes_as_one"] = padding_routes_as_one(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {path} ({time.perf_counter() - started:.0f} s since the start)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
