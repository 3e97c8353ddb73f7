"""Time a recurrent model's prefill chunk at sizes the profile grid does not hold.

The validation (results/validation/h200/README.md, "Nemotron-3-Nano") found
the real executor's chunks above the largest packed bucket 9-20 % slower
than the profile, which measures round sizes (multiples of 16) and reads a
chunk with a few cached tokens between a first chunk (0 cached) and one with
8,192. This script times single chunks exactly as `profile_model.state_point`
measures a profile point (the same pool, binder, compiled blocks and
padded buckets), at pairs that separate the candidate causes:

- size: a round size against one token less (4,096 / 4,095; 8,192 / 8,191),
  first chunks (Triton specialises an integer argument that is a multiple
  of 16 apart from one that is not);
- state: a first chunk against a continuing one over a few cached tokens
  (8,192 over 0 / 256 cached) and over 8,192.

    # on the H200, installed as benchmarks/gpu_suite.sh installs it:
    python3 benchmarks/probe_state_chunks.py --model nemotron-3-nano-30b-a3b
    # on the CPU (a tiny config; checks the script, not the numbers):
    python benchmarks/probe_state_chunks.py --smoke CONFIG --points 16:0 15:0

Prints one line a point (median, fastest and slowest of --reps, after the
warm-up steps `profile_model.timed` runs, in which a new shape compiles).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_real_decode as brd  # noqa: E402  (this folder)
import profile_model as pm  # noqa: E402

POINTS = ("4096:0", "4095:0", "8192:0", "8191:0", "8192:256", "8192:8192")
"""chunk:cached pairs, in the order they run."""


def parse_point(text: str) -> tuple[int, int]:
    """'chunk:cached' as two integers (chunk >= 1, cached >= 0)."""
    try:
        chunk, cached = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"point {text!r}: expected chunk:cached, two integers") from None
    if chunk < 1 or cached < 0:
        raise argparse.ArgumentTypeError(f"point {text!r}: chunk must be >= 1 and cached >= 0")
    return chunk, cached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-3-nano-30b-a3b", help="a bundled model id with recurrent state")
    ap.add_argument("--points", nargs="+", type=parse_point, default=[parse_point(p) for p in POINTS],
                    metavar="CHUNK:CACHED")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG", help="the CPU and this (small) config")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model
    from unikv.sim.real.padded_chunk import padded_ready

    if args.smoke is not None:
        config_json, dtype = args.smoke.resolve(), "bf16"
        brd.DEVICE = "cpu"
    else:
        config_json, dtype = pm.config_file(args.model), "bf16"
        if not torch.cuda.is_available():
            print("error: probe_state_chunks needs a CUDA device (or --smoke)", file=sys.stderr)
            return 2
    spec = load_model(str(config_json), kv_cache_dtype=dtype)
    if not spec.state_bytes:
        print(f"error: {args.model}: no recurrent state; this probe is for a model with it", file=sys.stderr)
        return 2
    lm = real_model.build_model(config_json, dtype=dtype, device=brd.DEVICE, seed=0)
    why = padded_ready(lm)  # as profile_model refuses --prefill-graphs: the points run padded up to 2,048
    if why is not None:
        print(f"error: {args.model}: {why}", file=sys.stderr)
        return 2
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype))
    lm.set_attn_implementation(attention.register(mask=False))
    print(f"built ({time.perf_counter() - started:.0f} s since the start)", flush=True)
    for chunk, cached in args.points:
        t0 = time.perf_counter()
        times = pm.state_point(lm, spec, placed, chunk, cached, 0, 0, args.reps, compiled=True,
                               packed_graphs=True)
        print(f"chunk {chunk} x {cached} cached: {1e3 * statistics.median(times):.2f} ms "
              f"(reps {1e3 * min(times):.2f} .. {1e3 * max(times):.2f}; {time.perf_counter() - t0:.1f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
