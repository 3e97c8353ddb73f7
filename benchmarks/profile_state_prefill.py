"""Where one prefill chunk's (or decode step's) time goes in a model with
recurrent state: its forward under torch.profiler, grouped by module kind.

Each point is one chunk of C tokens over K cached tokens, run exactly as
`benchmarks/profile_model.py` measures a prefill point of such a model
(`state_point`: the chunk alone, packed, eager, its state gathered from its
pool slot before the forward and scattered back after by `StateBinder`).
After WARMUPS untimed runs, `--reps` runs are timed with CUDA events (the
profile's number) and `--reps` more run under torch.profiler (CPU and CUDA
activities). Kernels are attributed to the innermost `record_function`
range this script opens around the decoder layers' mixers and their parts
(forward hooks, removed after; the model's classes are not changed) and
around the binder's gather and scatter:

- `mamba2`: the causal conv and the chunked scan, its `mamba2.in_proj`,
  `mamba2.norm` (the gated RMSNorm) and `mamba2.out_proj` apart; `moe`:
  the residual add, its `moe.gate` (router), `moe.experts` and
  `moe.shared_experts` apart; `attention`, `mlp`, `short_conv` (whichever
  the model has); a line "by kind" sums each mixer with its parts;
- `state.gather` / `state.scatter`: the binder's copies between the pool's
  state slots and the model's cache;
- `other`: the rest of the forward (embedding, norms, residuals, lm_head);
  `outside`: the step outside the forward (the kept row's argmax).

Printed per point: the grouped table (CUDA ms and share, host CPU ms, aten
ops, kernels and host syncs per forward), each group's top aten ops, the
top 20 ops and kernels by self CUDA time (self CPU time on the CPU), and the
forward's wall time against its summed kernel time (a host-bound forward
shows CUDA time well below wall time). Everything written under `--out`
(the report, a JSON summary, with `--trace` a Chrome trace per point) is
packed into one `--out`.tar.gz (a device call returns few files); the
traces then live only there.

Random weights, bf16 on CUDA, as profile_model.py builds them.
`--smoke CONFIG` runs on the CPU (bf16, a tiny config) to test the script.
`--compiled` runs the chunk through the compiled blocks instead (as the
executor does with --compile-prefill: `CompiledPrefill.forward_state`);
the kernels are then grouped only as the forward, the state's gather and
scatter, and `other` (a compiled block is one graph: no mixer ranges).
`--decode B ...` adds decode points: B requests at `--context` tokens,
one eager `[B, 1]` forward (the decode graphs replay the same kernels
without module ranges), once per `--scans` entry but einsum: "kernels" as
the executor's decode bucket runs it, uncaptured: the Mamba-2 mixers
update the state in its pool slots with unikv's kernel
(`sim.real.slot_decode`); "transformers" between the binder's gather and
scatter, the state updated with transformers' own function.

    python benchmarks/profile_state_prefill.py --out results/real/h200/hybrid_prefill --trace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

import bench_real_decode as brd  # the device the helpers below use (this folder)
import profile_model as pm
from profile_coverage import check, config_file

DEFAULT_MODEL = "nemotron-3-nano-30b-a3b"
MIXERS = (("mamba2", ("Mamba2Mixer", "MambaMixer")), ("moe", ("MoE", "SparseMoeBlock")),
          ("attention", ("Attention",)), ("short_conv", ("ShortConv",)), ("mlp", ("MLP",)))
"""A decoder layer's child module's kind, by a fragment of its class name (first match)."""
PARTS = {"mamba2": ("in_proj", "norm", "out_proj"), "moe": ("gate", "experts", "shared_experts")}
"""The parts of a mixer timed apart (its children by attribute name)."""
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize")
"""Ops that wait for the device (`.item()`, `.nonzero()`, explicit syncs)."""
PREFIX = "unikv::"
ARCHIVE_LIMIT_BYTES = 15 << 20
"""A device call returns files of up to 16 MiB: traces are left out past this."""


def decoder_layers(lm):
    """The model's decoder layers (its `layers` ModuleList)."""
    import torch

    for name, module in lm.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    raise ValueError(f"{type(lm).__name__}: no decoder `layers` ModuleList found")


def mixer_kind(module) -> str | None:
    """`MIXERS`' kind of a decoder layer's child module (None: not a mixer)."""
    name = type(module).__name__
    return next((kind for kind, frags in MIXERS if any(f in name for f in frags)), None)


@contextlib.contextmanager
def ranges(lm, mixers: bool = True):
    """Open a `record_function` range around the model's forward, each
    decoder layer's mixer and `PARTS` of it (not with `mixers` off: a
    compiled block is traced whole, hooks inside it would break its
    graph), and `StateBinder`'s gather and scatter while inside; all
    removed after."""
    import torch
    from torch.profiler import record_function
    from unikv.sim.real.state import StateBinder

    handles, open_ = [], defaultdict(list)

    def enter(name):
        def pre(module, *_):
            rf = record_function(PREFIX + name)
            rf.__enter__()
            open_[id(module)].append(rf)
        return pre

    def leave(module, *_):
        open_[id(module)].pop().__exit__(None, None, None)

    def hook(module, name):
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))

    hook(lm, "forward")
    for layer in decoder_layers(lm) if mixers else ():
        for child in layer.children():
            kind = mixer_kind(child)
            if kind is not None:
                hook(child, kind)
                for part in PARTS.get(kind, ()):
                    if isinstance(getattr(child, part, None), torch.nn.Module):
                        hook(getattr(child, part), f"{kind}.{part}")
    real = {n: getattr(StateBinder, n) for n in ("gather", "scatter")}
    for n, fn in real.items():
        setattr(StateBinder, n, _ranged(fn, f"state.{n}"))
    try:
        yield
    finally:
        for n, fn in real.items():
            setattr(StateBinder, n, fn)
        for h in handles:
            h.remove()


def _ranged(fn, name: str):
    from torch.profiler import record_function

    def wrapped(*args, **kwargs):
        with record_function(PREFIX + name):
            return fn(*args, **kwargs)
    return wrapped


def profiling_run(reps: int, got: dict):
    """A `state_point` runner: `reps` timed runs after WARMUPS
    (`profile_model.timed`), then `reps` under torch.profiler into `got`
    ("wall_s", "profile")."""
    def run(step, _reps):
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        got["wall_s"] = pm.timed(step, reps)
        cuda = brd.DEVICE == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(reps):
                with record_function(PREFIX + "step"):
                    step()
            if cuda:
                torch.cuda.synchronize()
        got["profile"] = prof
        return got["wall_s"]
    return run


def group_of(event) -> str:
    """The innermost script range holding a profiler event ("outside": none
    below the step's own)."""
    e = event
    while e is not None:
        if e.name.startswith(PREFIX) and e.name not in (PREFIX + "step",):
            name = e.name[len(PREFIX):]
            return "other" if name == "forward" else name
        e = e.cpu_parent
    return "outside"


def grouped(prof, reps: int) -> dict:
    """Per group, per forward: CUDA ms, host CPU ms (self), aten ops,
    kernels, host syncs, and its ops' self CUDA / CPU ms by name."""
    from torch.autograd import DeviceType

    rows: dict = defaultdict(lambda: dict(cuda_ms=0.0, cpu_ms=0.0, ops=0, kernels=0, syncs=0,
                                          by_op=defaultdict(lambda: [0.0, 0.0])))
    for e in prof.events():
        if e.device_type != DeviceType.CPU or e.name == PREFIX + "step":
            continue
        row = rows[group_of(e)]
        cuda, cpu = e.self_device_time_total / 1e3 / reps, e.self_cpu_time_total / 1e3 / reps
        row["cuda_ms"] += cuda
        row["cpu_ms"] += cpu
        row["kernels"] += len(e.kernels) / reps
        row["ops"] += e.name.startswith("aten::") / reps
        row["syncs"] += (e.name in SYNC_OPS) / reps
        if not e.name.startswith(PREFIX):
            row["by_op"][e.name][0] += cuda
            row["by_op"][e.name][1] += cpu
    return dict(rows)


def forward_host_ms(prof, reps: int) -> float:
    """Host wall ms per forward: the model forward range's CPU span."""
    spans = [e.cpu_time_total for e in prof.events() if e.name == PREFIX + "forward"]
    return sum(spans) / 1e3 / max(reps, 1)


def report(point: str, wall_s: list[float], rows: dict, host_ms: float, top: str) -> tuple[str, dict]:
    """The point's text report and its JSON summary."""
    import statistics

    cuda_ms = sum(r["cuda_ms"] for r in rows.values())
    wall_ms = 1e3 * statistics.median(wall_s)
    lines = [f"== {point}: wall {wall_ms:.2f} ms a step (median of {len(wall_s)}, CUDA events; perf_counter on "
             f"the CPU); kernels {cuda_ms:.2f} ms ({100 * cuda_ms / wall_ms:.0f} % of wall); host span of the "
             f"forward {host_ms:.2f} ms; {sum(r['kernels'] for r in rows.values()):.0f} kernel launches, "
             f"{sum(r['ops'] for r in rows.values()):.0f} aten ops, "
             f"{sum(r['syncs'] for r in rows.values()):.0f} host syncs a step",
             f"{'group':<22}{'CUDA ms':>10}{'CUDA %':>8}{'CPU ms':>10}{'aten ops':>10}{'kernels':>10}{'syncs':>7}"]
    order = sorted(rows, key=lambda g: (-rows[g]["cuda_ms"], -rows[g]["cpu_ms"]))
    for g in order:
        r = rows[g]
        share = 100 * r["cuda_ms"] / cuda_ms if cuda_ms else 0.0
        lines.append(f"{g:<22}{r['cuda_ms']:>10.3f}{share:>8.1f}{r['cpu_ms']:>10.3f}{r['ops']:>10.0f}"
                     f"{r['kernels']:>10.0f}{r['syncs']:>7.0f}")
    kinds: dict = defaultdict(lambda: [0.0, 0.0])
    for g, r in rows.items():
        kinds[g.split(".")[0]][0] += r["cuda_ms"]
        kinds[g.split(".")[0]][1] += r["cpu_ms"]
    lines.append("by kind (a mixer with its parts): " + "; ".join(
        f"{k} {c:.3f} ms CUDA ({100 * c / cuda_ms if cuda_ms else 0.0:.1f} %), {h:.3f} ms CPU"
        for k, (c, h) in sorted(kinds.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))))
    lines.append("top ops of each group (self CUDA ms, self CPU ms a step):")
    for g in order:
        ops = sorted(rows[g]["by_op"].items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:5]
        lines.append(f"  {g}: " + "; ".join(f"{n} {c:.3f} / {h:.3f}" for n, (c, h) in ops))
    lines += [f"top 20 ops and kernels by self {'CUDA' if brd.DEVICE == 'cuda' else 'CPU'} time (all reps):", top]
    summary = {"point": point, "wall_ms": wall_ms, "kernel_ms": cuda_ms, "forward_host_ms": host_ms,
               "groups": {g: {k: v for k, v in r.items() if k != "by_op"} for g, r in rows.items()},
               "kinds": {k: {"cuda_ms": c, "cpu_ms": h} for k, (c, h) in kinds.items()}}
    return "\n".join(lines), summary


SCANS = ("kernels", "einsum", "transformers")
"""How a Mamba-2 mixer's prefill chunk scans: "kernels", as the real
executor runs it (`sim.real.ssd.kernel_chunk_scan`: unikv's Triton SSD
kernels on CUDA), "einsum", the kernels' torch reference (one einsum a
contraction, fp32), or "transformers", the installed transformers' own
`mamba2_chunk_scan` (5.17: broadcast products of 2-17 GB per layer at
4,096 tokens)."""


@contextlib.contextmanager
def scanning(scan: str):
    """Within the block, `profile_model`'s state forwards scan as `scan` says."""
    from unikv.sim.real import ssd

    saved = ssd.kernel_chunk_scan
    if scan == "einsum":
        ssd.kernel_chunk_scan = ssd.einsum_chunk_scan
    elif scan == "transformers":
        ssd.kernel_chunk_scan = contextlib.nullcontext
    try:
        yield
    finally:
        ssd.kernel_chunk_scan = saved


def profiled_report(point: str, got: dict, reps: int, trace: Path | None) -> tuple[str, dict]:
    """`report` of a `profiling_run`'s result `got`: its groups, host span
    and top-20 table by self CUDA time (self CPU time on the CPU); the
    Chrome trace written to `trace` (None: none)."""
    prof = got["profile"]
    key = "self_device_time_total" if brd.DEVICE == "cuda" else "self_cpu_time_total"
    top = prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=70)
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    return report(point, got["wall_s"], grouped(prof, reps), forward_host_ms(prof, reps), top)


def profile_point(lm, spec, placed, chunk: int, cached: int, reps: int, trace: Path | None,
                  scan: str = "kernels", compiled: bool = False) -> tuple[str, dict]:
    """One prefill point profiled (`state_point` with `profiling_run`),
    its Mamba-2 chunks scanning as `scan` (SCANS) says; `compiled`: the
    chunk through the compiled blocks (`state_point(compiled=True)`, the
    executor's --compile-prefill), its kernels then not grouped by mixer
    (one compiled graph a block: they count as `other`)."""
    got: dict = {}
    with ranges(lm, mixers=not compiled), scanning(scan):
        pm.state_point(lm, spec, placed, chunk, cached, 0, 0, reps, run=profiling_run(reps, got), compiled=compiled)
    how = f"{scan} scan" + (", compiled blocks" if compiled else "")
    text, summary = profiled_report(f"prefill chunk {chunk} over {cached} cached, {how}", got, reps, trace)
    summary["scan"] = scan
    summary["compiled"] = compiled
    return text, summary


def profile_decode(lm, spec, placed, batch: int, context: int, reps: int, trace: Path | None,
                   scan: str = "kernels") -> tuple[str, dict]:
    """One decode point profiled: `batch` requests at `context` tokens
    decoding one token each, as one eager `[B, 1]` forward (a captured
    replay's kernels carry no module ranges to group them by). `scan`
    "kernels": the executor's decode bucket uncaptured
    (`state_point(capture=False)`): the Mamba-2 mixers update the state in
    its slots with unikv's kernel (`sim.real.slot_decode`); otherwise
    between the binder's gather and scatter (`state_point(graphs=False)`)
    with transformers' own update."""
    got: dict = {}
    kernels = scan == "kernels"
    with ranges(lm), scanning(scan):
        pm.state_point(lm, spec, placed, 0, 0, batch, context, reps, graphs=kernels, capture=False,
                       run=profiling_run(reps, got))
    update = "kernel update in slot" if kernels else "transformers' update, gathered and scattered"
    text, summary = profiled_report(f"decode batch {batch} at {context} tokens, eager, {update}", got, reps, trace)
    summary.update(decode=batch, context=context, scan=scan)
    return text, summary


def refusal(args) -> tuple[str | None, Path | None, str]:
    """(why the input cannot be profiled or None, the config, the dtype)."""
    from unikv.sim.models import load_model

    if any(c <= 0 for c in args.chunks):
        return f"--chunks {args.chunks}: every chunk must be a positive token count", None, ""
    if any(b <= 0 for b in args.decode) or args.context <= 0:
        return (f"--decode {args.decode} --context {args.context}: batches and the context must be positive",
                None, "")
    if args.reps <= 0:
        return f"--reps {args.reps}: must be positive", None, ""
    if any(k < 0 for k in args.cached):
        return f"--cached {args.cached}: cached token counts must be >= 0", None, ""
    if args.smoke is not None:
        config, dtype, label = args.smoke.resolve(), "bf16", f"--smoke {args.smoke}"
    else:
        config, dtype, label = config_file(args.model), "bf16", f"--model {args.model!r}"
        if config is None:
            return f"{label}: unknown model (no bundled config.json; benchmarks/profile_coverage.py lists them)", \
                None, ""
    try:
        spec = load_model(str(config), kv_cache_dtype=dtype)
    except (ValueError, OSError) as exc:
        return f"{label}: {str(exc).splitlines()[0]}", None, ""
    if not spec.state_bytes:
        return f"{label}: {spec.name} keeps no recurrent state (profile_model.py profiles its prefill)", None, ""
    return None, config, dtype


def archive(out: Path) -> Path:
    """`out` packed into `out`.tar.gz, traces left out past
    ARCHIVE_LIMIT_BYTES; the traces then removed from `out` (a device call
    returns at most 8 files: the report and summary stay beside the archive)."""
    tar = out.with_name(out.name + ".tar.gz")
    for keep_traces in (True, False):
        with tarfile.open(tar, "w:gz") as t:
            for f in sorted(out.iterdir()):
                if keep_traces or not f.name.endswith(".trace.json"):
                    t.add(f, arcname=f"{out.name}/{f.name}")
        if tar.stat().st_size <= ARCHIVE_LIMIT_BYTES:
            break
        print(f"{tar} over {ARCHIVE_LIMIT_BYTES >> 20} MiB with the traces: packed without them", flush=True)
    for f in out.glob("*.trace.json"):
        f.unlink()
    return tar


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a bundled model id with recurrent state")
    ap.add_argument("--gpu", default="h200", help="the bundled GPU name (profile_coverage's fit check)")
    ap.add_argument("--chunks", type=int, nargs="*", default=[512, 4096], help="prefill chunk tokens (none: no "
                    "prefill point)")
    ap.add_argument("--decode", type=int, nargs="*", default=[], help="decode batch sizes, each profiled as one "
                    "eager [B, 1] step at --context tokens, after the prefill points")
    ap.add_argument("--context", type=int, default=4096, help="the decoders' context tokens")
    ap.add_argument("--cached", type=int, nargs="+", default=[0], help="tokens already cached before the chunk")
    ap.add_argument("--reps", type=int, default=2, help="timed runs, and as many profiled runs, a point")
    ap.add_argument("--out", type=Path, default=Path("results/real/h200/hybrid_prefill"))
    ap.add_argument("--trace", action="store_true", help="write a Chrome trace of each point")
    ap.add_argument("--scans", nargs="+", choices=SCANS, default=list(SCANS),
                    help="how a Mamba-2 chunk scans: kernels (the executor's Triton SSD), einsum (their torch "
                         "reference), transformers (its own function)")
    ap.add_argument("--compiled", action="store_true",
                    help="the chunk through the compiled blocks, as the executor runs it with --compile-prefill "
                         "(inductor; the kernels are then not grouped by mixer)")
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: bf16, this (small) config with recurrent state")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    why, config, dtype = refusal(args)
    if why is None and args.smoke is None:
        why = _gpu_refusal(args)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    brd.DEVICE = "cpu" if args.smoke is not None else "cuda"
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model

    spec = load_model(str(config), kv_cache_dtype=dtype)
    lm = real_model.build_model(config, dtype=dtype, device=brd.DEVICE, seed=0)
    lm.set_attn_implementation(attention.register(mask=False))
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype))
    print(f"built {spec.name} on {brd.DEVICE} ({time.perf_counter() - started:.0f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    texts, summaries = [], []
    for cached, chunk, scan in ((k, c, s) for k in args.cached for c in args.chunks for s in args.scans):
        tag = "_compiled" if args.compiled else ""
        trace = args.out / f"chunk{chunk}_cached{cached}_{scan}{tag}.trace.json" if args.trace else None
        text, summary = profile_point(lm, spec, placed, chunk, cached, args.reps, trace, scan, args.compiled)
        print(text + f"\n({time.perf_counter() - started:.0f} s since the start)", flush=True)
        texts.append(text)
        summaries.append(summary)
    for batch, scan in ((b, s) for b in args.decode for s in args.scans if s != "einsum"):
        trace = args.out / f"decode{batch}_context{args.context}_{scan}.trace.json" if args.trace else None
        text, summary = profile_decode(lm, spec, placed, batch, args.context, args.reps, trace, scan)
        print(text + f"\n({time.perf_counter() - started:.0f} s since the start)", flush=True)
        texts.append(text)
        summaries.append(summary)
    (args.out / "report.txt").write_text("\n\n".join(texts) + "\n")
    prov = pm.provenance("python benchmarks/profile_state_prefill.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv), "unknown")
    (args.out / "summary.json").write_text(json.dumps({"model": spec.name, "provenance": prov,
                                                       "points": summaries}, indent=1) + "\n")
    print(f"wrote {archive(args.out)} ({time.perf_counter() - started:.0f} s since the start)", flush=True)
    return 0


def _gpu_refusal(args) -> str | None:
    """Why `--model` cannot run on one `--gpu` here (profile_model's checks), or None."""
    import torch

    try:
        why = check(args.model, args.gpu).refusal()
    except ValueError as exc:
        why = str(exc)
    if why is not None:
        return f"--model {args.model!r} cannot be profiled on one {args.gpu}: {why}"
    return None if torch.cuda.is_available() else "profile_state_prefill needs a CUDA device (or --smoke CONFIG)"


if __name__ == "__main__":
    sys.exit(main())
