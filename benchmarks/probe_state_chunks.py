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
  (8,192 over 0 / 256 cached) and over 8,192;
- path: with `--cells`, the validation's trace slices replayed after the
  points in the same process, as `validate_real.py real` replays them (its
  warm pass first, end_end), each prefill chunk the executor ran outside
  the packed graphs timed on its own (`validate_real.forward_parts`, CUDA
  events around `RealExecutor._prefill_state`: the bind, the compiled
  forward, the scatter, as `state_point` times them), then the largest shapes those
  chunks took timed again through `state_point` (`--after`): the same
  shape through the executor and through the profile's path, one process,
  one sitting.

    # on the H200, installed as benchmarks/gpu_suite.sh installs it:
    python3 benchmarks/probe_state_chunks.py --model nemotron-3-nano-30b-a3b
    # on the CPU (a tiny config; checks the script, not the numbers):
    python benchmarks/probe_state_chunks.py --smoke CONFIG --points 16:0 15:0
    # the executor's own chunks against the profile's path (the H200):
    python3 benchmarks/probe_state_chunks.py --cells azure_code mooncake_conversation

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
import validate_real as vr  # noqa: E402

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


def by_shape(chunks: list[tuple[int, int, float]]) -> dict[tuple[int, int], list[float]]:
    """(chunk, cached) -> the seconds of each chunk of that shape, largest chunks first."""
    out: dict[tuple[int, int], list[float]] = {}
    for tokens, cached, seconds in sorted(chunks, key=lambda c: (-c[0], c[1])):
        out.setdefault((tokens, cached), []).append(seconds)
    return out


def replay_cells(model: str, traces: list[str]) -> list[tuple[int, int, float]]:
    """Replay `model`'s validation slices `traces` (end_end) as
    `validate_real.py real --compiled --prefill-graphs` does, its warm pass
    first; returns (chunk, cached, seconds) of each prefill chunk the
    measured replays ran through `RealExecutor._prefill_state`, and prints
    each replay's large steps and the caching allocator's retries."""
    import gc

    import torch
    from unikv.sim.run import run

    selected = [(model, t, "end_end") for t in traces]
    vr.warm_pass(model, selected, compiled=True, graphs=True)
    chunks: list[tuple[int, int, float]] = []
    for _, trace, layout in selected:
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        t0 = time.perf_counter()
        with vr.forward_parts(vr.cuda_mark, vr.cuda_seconds) as parts:
            result = run(vr.config(model, trace, layout, "real", True, True))
        mine = [(n, c, ms / 1e3) for _, kind, n, c, _, ms in parts if kind == "chunk"]
        chunks += mine
        steps = result.steps
        large = steps[steps["prefill_tokens"] > 2048]["step_time_s"]
        print(f"cell {model}__{trace}__{layout}: {len(steps)} steps, wall {time.perf_counter() - t0:.1f} s, "
              f"{len(mine)} chunks through _prefill_state, steps over 2,048 prefill tokens {len(large)} "
              f"(median {1e3 * large.median():.1f} ms), allocator retries "
              f"{torch.cuda.memory_stats().get('num_alloc_retries', 0) - retries}", flush=True)
        for (n, c), times in by_shape(mine).items():
            print(f"  executor chunk {n} x {c} cached: {1e3 * statistics.median(times):.2f} ms "
                  f"(x{len(times)}: {1e3 * min(times):.2f} .. {1e3 * max(times):.2f})", flush=True)
        del result
        gc.collect()
        torch.cuda.empty_cache()
    return chunks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-3-nano-30b-a3b", help="a bundled model id with recurrent state")
    ap.add_argument("--points", nargs="+", type=parse_point, default=[parse_point(p) for p in POINTS],
                    metavar="CHUNK:CACHED")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cells", nargs="+", default=[], choices=list(vr.TRACES), metavar="TRACE",
                    help="then replay these validation slices (end_end) and time their chunks (module docstring)")
    ap.add_argument("--after", type=int, default=4, metavar="N",
                    help="with --cells: time the N largest chunk shapes the replays ran through state_point")
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG", help="the CPU and this (small) config")
    args = ap.parse_args(argv)
    if args.cells and args.smoke is not None:
        print("error: --cells replays the validation's slices on the H200; not with --smoke", file=sys.stderr)
        return 2
    if args.cells and args.model not in vr.MODELS:
        print(f"error: --cells: {args.model!r} is not a validation model ({', '.join(vr.MODELS)})", file=sys.stderr)
        return 2
    started = time.perf_counter()
    import torch
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model
    from unikv.sim.real.fuse import fuse_projections
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
    if args.cells:  # the replays' executors take these weights (validate_real's builds, keyed as they call it)
        vr.memoize_builds()
        config_json = vr.MODELS[args.model]
    lm = real_model.build_model(real_model.config_path(str(config_json)), dtype=dtype, device=brd.DEVICE,
                                weights=None, seed=0)
    why = padded_ready(lm)  # as profile_model refuses --prefill-graphs: the points run padded up to 2,048
    if why is not None:
        print(f"error: {args.model}: {why}", file=sys.stderr)
        return 2
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype))
    # as the profile's model: its calibration replay's executor fused q/k/v and gate/up in place
    print(f"fused {fuse_projections(lm)}", flush=True)
    lm.set_attn_implementation(attention.register(mask=False))
    print(f"built ({time.perf_counter() - started:.0f} s since the start)", flush=True)

    def point(chunk: int, cached: int, label: str = "") -> None:
        t0 = time.perf_counter()
        times = pm.state_point(lm, spec, placed, chunk, cached, 0, 0, args.reps, compiled=True,
                               packed_graphs=True)
        print(f"{label}chunk {chunk} x {cached} cached: {1e3 * statistics.median(times):.2f} ms "
              f"(reps {1e3 * min(times):.2f} .. {1e3 * max(times):.2f}; {time.perf_counter() - t0:.1f} s)",
              flush=True)

    for chunk, cached in args.points:
        point(chunk, cached)
    if args.cells:
        shapes = list(by_shape(replay_cells(args.model, args.cells)))[:args.after]
        lm.set_attn_implementation(attention.register(mask=False))
        for chunk, cached in shapes:
            point(chunk, cached, "after the replays, state_point ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
