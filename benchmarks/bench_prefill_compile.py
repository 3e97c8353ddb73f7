"""Prefill chunks with eager against compiled decoder layers: ms per step (issue 17 items 2-3).

Each point is one packed forward of a chunk of C tokens over K tokens
already in the pool, measured as `benchmarks/profile_model.py` measures a
prefill point (`packed_point`: CUDA events, the median of --reps after its
untimed warm-ups), once with transformers' eager layers and once with the
layers compiled (`sim.real.prefill.CompiledPrefill`, inductor). The first
compiled point compiles the graphs (its wall seconds say how long); the
other chunk sizes reuse them, and a point whose layers fail to compile
stops the script (it would time the eager forward).

    PYTHONPATH=/tmp/site python benchmarks/bench_prefill_compile.py --model gemma-3-12b
    python benchmarks/bench_prefill_compile.py --model gemma-3-12b --smoke CONFIG   # CPU, fp32, small config

Prints one line per point and mode, then a table: chunk, cached, eager ms,
compiled ms, eager / compiled.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-12b", help=f"a bundled model with a config here: {sorted(CONFIGS)}")
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 384, 1024, 4096])
    ap.add_argument("--cached", type=int, nargs="+", default=[0, 4096])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32, this (small) config")
    args = ap.parse_args(argv)
    if min(args.chunks) < 1 or min(args.cached) < 0 or args.reps < 1:
        print(f"error: expected --chunks >= 1, --cached >= 0 and --reps >= 1; got --chunks {args.chunks} "
              f"--cached {args.cached} --reps {args.reps}", file=sys.stderr)
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
    rows = []
    for compiled in (False, True):
        for cached in args.cached:
            for chunk in args.chunks:
                t0 = time.perf_counter()
                times = profile_model.packed_point(lm, spec, placed, chunk, cached, 0, 0, args.reps, compiled)
                ms = 1e3 * statistics.median(times)
                print(f"{'compiled' if compiled else 'eager'} chunk {chunk} cached {cached}: {ms:.2f} ms "
                      f"(reps {1e3 * min(times):.2f} .. {1e3 * max(times):.2f}; wall "
                      f"{time.perf_counter() - t0:.1f} s)", flush=True)
                rows.append((chunk, cached, compiled, ms))
    got = {(c, k, x): ms for c, k, x, ms in rows}
    print(f"\n{args.model} ({dtype}, {brd.DEVICE}): prefill step, ms (median of {args.reps})")
    print("| chunk | cached | eager | compiled | eager / compiled |\n| ---: | ---: | ---: | ---: | ---: |")
    for cached in args.cached:
        for chunk in args.chunks:
            eager, comp = got[(chunk, cached, False)], got[(chunk, cached, True)]
            print(f"| {chunk} | {cached} | {eager:.2f} | {comp:.2f} | {eager / comp:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
