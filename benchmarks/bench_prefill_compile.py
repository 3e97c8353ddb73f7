"""Prefill chunks with eager against compiled decoder layers: ms per step (issue 17 items 2-3).

Each point is one packed forward of a chunk of C tokens over K tokens
already in the pool, measured as `benchmarks/profile_model.py` measures a
prefill point (`packed_point`: CUDA events, the median of --reps after its
untimed warm-ups), once with transformers' eager layers and once with the
layers compiled (`sim.real.prefill.CompiledPrefill`, inductor). The first
compiled point compiles the graphs (its wall seconds say how long); the
other chunk sizes reuse them, and a point whose layers fail to compile
stops the script (it would time the eager forward).

With --graphs each point is also run as a step of the real executor with
`--prefill-graphs` (`sim.real.packed_graphs.PackedGraphs`): the batch
copied into its token bucket's static buffers (padded to the bucket, the
request slots `min(--max-requests, bucket)`), then the bucket's CUDA graph
replayed, of the eager layers ("graph") and of the compiled ones
("graph+compiled"); the first rep's warm-ups capture the bucket, off the
clock. A chunk past the largest bucket (2,048 tokens) has no graph point
("-"). A point whose graph was not captured (or not compiled) stops the
script. `picks` says whether the graph's greedy pick of the chunk's last
token equals the eager forward's.

    PYTHONPATH=/tmp/site python benchmarks/bench_prefill_compile.py --model gemma-3-12b
    PYTHONPATH=/tmp/site python benchmarks/bench_prefill_compile.py --model gemma-3-12b --graphs \
        --chunks 16 128 384 1024 2048 4096 --cached 0 4096
    python benchmarks/bench_prefill_compile.py --model gemma-3-12b --smoke CONFIG   # CPU, fp32, small config

Prints one line per point and mode, then a table: chunk, cached, eager ms,
compiled ms (with --graphs: graph ms, graph+compiled ms, picks), eager /
the fastest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import bench_real_decode as brd  # the device and the configs (this folder)
import profile_model
from bench_real_decode import CONFIGS
from unikv.sim.real.packed_graphs import PACKED_BUCKETS, PackedGraphs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-12b", help=f"a bundled model with a config here: {sorted(CONFIGS)}")
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 384, 1024, 4096])
    ap.add_argument("--cached", type=int, nargs="+", default=[0, 4096])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32, this (small) config")
    ap.add_argument("--graphs", action="store_true",
                    help="also time the steps through the captured per-token-bucket graphs (--prefill-graphs)")
    ap.add_argument("--max-requests", type=int, default=256,
                    help="with --graphs: the request cap the buckets are sized for (a run's --max-running)")
    args = ap.parse_args(argv)
    if min(args.chunks) < 1 or min(args.cached) < 0 or args.reps < 1 or args.max_requests < 1:
        print(f"error: expected --chunks >= 1, --cached >= 0, --reps >= 1 and --max-requests >= 1; got --chunks "
              f"{args.chunks} --cached {args.cached} --reps {args.reps} --max-requests {args.max_requests}",
              file=sys.stderr)
        return 2
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model

    dtype = "bf16"
    if args.smoke is not None:
        brd.DEVICE, dtype = "cpu", "fp32"
        CONFIGS[args.model] = args.smoke.resolve()
        spec = load_model(str(args.smoke), kv_cache_dtype=dtype)
    elif not torch.cuda.is_available():
        print("error: bench_prefill_compile needs a CUDA device (or --smoke CONFIG)", file=sys.stderr)
        return 2
    elif args.model not in CONFIGS:
        print(f"error: --model {args.model!r}: no config here; expected one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    else:
        spec = load_model(args.model)
    lm = real_model.build_model(CONFIGS[args.model], dtype=dtype, device=brd.DEVICE, seed=0)
    lm.set_attn_implementation(attention.register(mask=False))
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype))
    modes = ["eager", "compiled"] + (["graph", "graph+compiled"] if args.graphs else [])
    got, picks = {}, {}
    for mode in modes:
        for cached in args.cached:
            for chunk in args.chunks:
                if mode.startswith("graph") and chunk > max(PACKED_BUCKETS):
                    continue  # past the largest bucket a step runs as without graphs: "-" in the table
                t0 = time.perf_counter()
                if mode.startswith("graph"):
                    times, picks[(chunk, cached, mode)] = graph_point(
                        lm, spec, placed, chunk, cached, args.reps, mode == "graph+compiled", args.max_requests)
                else:
                    times = profile_model.packed_point(lm, spec, placed, chunk, cached, 0, 0, args.reps,
                                                       mode == "compiled")
                ms = got[(chunk, cached, mode)] = 1e3 * statistics.median(times)
                print(f"{mode} chunk {chunk} cached {cached}: {ms:.2f} ms (reps {1e3 * min(times):.2f} .. "
                      f"{1e3 * max(times):.2f}; wall {time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"\n{args.model} ({dtype}, {brd.DEVICE}): prefill step, ms (median of {args.reps})")
    head = modes + (["picks"] if args.graphs else [])
    print(f"| chunk | cached | {' | '.join(head)} | eager / fastest |")
    print("| ---: | ---: |" + " ---: |" * len(modes) + (" :---: |" if args.graphs else "") + " ---: |")
    for cached in args.cached:
        for chunk in args.chunks:
            ms = [got.get((chunk, cached, m)) for m in modes]
            cells = " | ".join("-" if x is None else f"{x:.2f}" for x in ms)
            if args.graphs:
                cells += " | " + "/".join({True: "yes", False: "NO", None: "-"}[picks.get((chunk, cached, m))]
                                          for m in modes[2:])
            print(f"| {chunk} | {cached} | {cells} | {ms[0] / min(x for x in ms if x is not None):.2f}x |")
    return 0


def graph_point(lm, spec, placed, chunk: int, cached: int, reps: int, compiled: bool,
                max_requests: int) -> tuple[list[float], bool]:
    """Seconds of each of `reps` packed steps of a chunk of `chunk` tokens
    over `cached` cached tokens through `PackedGraphs` (the batch's copy
    into the bucket, then its graph's replay; the compiled layers with
    `compiled`), and whether its pick equals the eager forward's.

    Raises:
        RuntimeError: on CUDA, a bucket that was not captured, or not
            compiled with `compiled` (it would time another path).
    """
    import numpy as np
    import torch
    from unikv.sim.real.attention import StepContext, use_step
    from unikv.sim.real.batch import StepBatch, device_tables
    from unikv.sim.real.prefill import CompiledPrefill

    dev, ps = brd.DEVICE, profile_model.PS
    pool, views = profile_model.pool_for(spec, placed, cached + 4, 1, unwindowed_tokens=chunk)
    pre = brd.Case(pool, views, spec, 1, cached, dev) if cached else None
    got = np.asarray(pool.alloc(-(-chunk // ps) * ps))[:chunk]  # the chunk: no ratchet inside it
    pages = (pre.pages[0] if pre else []) + sorted(set((got // ps).tolist()))
    pool.commit()  # the device tables the graph reads

    def ints(x, dtype=torch.int64):
        return torch.as_tensor(np.asarray(x), device=dev).to(dtype)

    tables = {b: torch.as_tensor(pool.page_table(b)) for b in views.bands}
    batch = StepBatch(layout="packed", input_ids=torch.randint(0, 256, (1, chunk), device=dev),
                      position_ids=ints(np.arange(cached, cached + chunk)).view(1, chunk),
                      cu_q=ints([0, chunk], torch.int32), seq_lens=ints([cached + chunk], torch.int32),
                      sample_rows=ints([chunk - 1]), samplers=(), requests=(None,),
                      **device_tables(ints([pages]), ints(got), tables, ps))
    max_pages = -(-int(lm.config.max_position_embeddings) // ps) + 1  # the executor's, on a pool that holds it
    prefill = CompiledPrefill(lm, views, device=dev) if compiled else None
    packed = PackedGraphs(lm, views, views.bands, device=dev, max_pages=max(max_pages, len(pages)),
                          max_requests=max_requests, prefill=prefill)
    times = profile_model.timed(lambda: packed.run(batch), reps)
    stats = packed.stats()
    if dev == "cuda" and (not stats["captured"] or (compiled and not stats["compiled"])):
        raise RuntimeError(f"graph chunk {chunk} cached {cached}: not captured{' compiled' if compiled else ''} "
                           f"({stats})")
    ctx = StepContext(views=views, block_tables=dict(batch.block_tables), cu_q=batch.cu_q, seq_lens=batch.seq_lens,
                      write_slots=dict(batch.write_slots), layout="packed")
    with torch.inference_mode(), use_step(ctx):
        eager = lm(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                   logits_to_keep=batch.sample_rows).logits[0].argmax(-1)
    with torch.inference_mode():
        return times, bool(torch.equal(packed.run(batch), eager))


if __name__ == "__main__":
    sys.exit(main())
