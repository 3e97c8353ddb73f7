"""The simulator against the real engine, end to end (issue 17 item 3).

The same trace slices replayed twice: on the GPU with the real executor
(transformers forwards through the pool, the measured clock) and on the CPU
with the cost-model executor, which reads the model's measured profile
(`sim/data/profiles/<model>__h200.json`). Both runs use one scheduler and
one allocator, so they differ only in how long each step takes.

    # on the H200 (one call; each run is written as it ends):
    python benchmarks/validate_real.py real --out results/validation/h200
    # here, on the CPU: the cost-model replays, the side-by-side table, the timelines
    python benchmarks/validate_real.py compare --out results/validation/h200

`compare` writes `validation.md` (TTFT p50 / p90, TPOT, throughput, mean
running requests and retractions side by side, with the relative
difference), `validation.csv`, and `timeline.md`: for every cell, how many
leading steps the two runs planned alike (the same prefill and decode
tokens, admissions, finishes and retractions) and whether their memory
timeline (live / hole / pending bytes per band, moves, moved bytes) is
identical over those steps, as it must be where step boundaries coincide;
`steps.md` (median step time by kind of step), `decode_batches.md` (median
decode step time by batch) and `requests.md` (per-request TTFT and TPOT
agreement).

Each real cell also writes `parts.csv`: its forward taken apart
(`forward_parts`), every prefill chunk and decode batch the executor ran,
timed on its own with CUDA events, and each step's whole forward span and
step time. `compare` sets each part beside the profile's time for that
part alone (`parts.md`), which says whether a difference lies in the
forwards the profile measures or between them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gemma-3-12b": ROOT / "benchmarks/configs/gemma-3-12b-text_config.json",
          "gpt-oss-20b": ROOT / "tests/data/configs/openai--gpt-oss-20b_config.json",
          "nemotron-3-nano-30b-a3b": ROOT / "tests/data/configs/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"}
"""The bundled model name the cost replay uses (its profile) -> the config.json the GPU builds."""
TRACES = {"azure_conv": dict(trace="azure_conv", max_requests=64, rate_scale=4.0, max_context_tokens=4096,
                             kv_budget_gib=12.0),
          "azure_code": dict(trace="azure_code", max_requests=48, rate_scale=4.0, max_context_tokens=4096,
                             kv_budget_gib=12.0),
          "mooncake_conversation": dict(trace="mooncake_conversation", max_requests=24, rate_scale=2.0,
                                        max_context_tokens=16384, kv_budget_gib=16.0)}
"""Each trace's slice: the first requests of the bundled sample, sped up, clipped, at a KV budget."""
NO_PREFIX_CACHE = {"nemotron-3-nano-30b-a3b"}
"""Models whose cells run without the prefix cache, in both runs: the real
executor keeps one state slot per request, not the state at each cached
block's end, so it refuses a prefix hit for a model with recurrent state
(`sim.real.executor`, prefix_cache)."""
LAYOUTS = ("end_end", "sglang")
PLAN_COLUMNS = ("prefill_tokens", "decode_tokens", "admitted", "finished", "retracted")
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_mean_s", "throughput_tok_s", "mean_running", "retractions")


def cells(models, traces, layouts):
    """(model, trace, layout) of every run, in the order they run."""
    return [(m, t, lay) for m in models for t in traces for lay in layouts]


def config(model: str, trace: str, layout: str, executor: str, compiled: bool = False, graphs: bool = False):
    """The run of one cell: the real executor on the GPU (bf16, CUDA-graph
    decode, the measured clock; `compiled`: decode and prefill / mixed
    steps with compiled layers, --compiled; `graphs`: prefill / mixed steps
    through the token buckets' CUDA graphs, --prefill-graphs) or the cost
    model on the CPU."""
    from unikv.sim.config import RunConfig, SchedulerConfig

    common = dict(TRACES[trace], trace_end_s=None, layout=layout, compaction="lazy", oversize="reject",
                  kv_cache_dtype="bf16", gpu="h200", seed=0)
    if model in NO_PREFIX_CACHE:
        common["scheduler"] = SchedulerConfig(prefix_cache=False)
    if executor == "real":
        return RunConfig(model=str(MODELS[model]), executor="real", device="cuda", dtype="bf16",
                         decode_graphs=True, compile_decode=compiled, compile_prefill=compiled,
                         prefill_graphs=graphs, real_clock="measured", **common)
    # The bundled name: its spec equals the one the real run parses from the config (state
    # dtypes included, sim.models), and it finds the model's profile.
    return RunConfig(model=model, **common)


def memoize_builds() -> None:
    """Build each model once per process: every cell of a model runs on the
    same weights (random, seed 0); a run binds them to its own pool."""
    from unikv.sim.real import model as real_model

    built: dict = {}
    build = real_model.build_model

    def cached(path, **kw):
        key = (str(path), tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in built:
            built[key] = build(path, **kw)
        return built[key]

    real_model.build_model = cached


def warm_pass(model: str, selected, compiled: bool, graphs: bool) -> None:
    """One unmeasured replay of each of `model`'s selected trace slices
    (its first selected layout), its results dropped, before the model's
    measured cells: the process then holds every compiled graph and every
    Triton specialization those slices need, as an engine that has served
    for a while does. Without it the first steps of a new shape paid
    them on the clock: Nemotron-3-Nano's first cells had steps of 2-3.4 s
    (its Triton kernels compiling for an integer argument's new
    specialization, 1, a multiple of 16 or neither) where the same step
    took 0.21 s once warm. Prints each pass's slowest step."""
    import gc

    import torch
    from unikv.sim.run import run

    done: set[str] = set()
    for m, trace, layout in selected:
        if m != model or trace in done:
            continue
        done.add(trace)
        t0 = time.perf_counter()
        result = run(config(model, trace, layout, "real", compiled, graphs))
        steps = result.steps["step_time_s"]
        print(f"warm-up pass {model}__{trace}__{layout}: {len(steps)} steps, slowest {steps.max():.3f} s, "
              f"{int((steps > 1.0).sum())} over 1 s, wall {time.perf_counter() - t0:.1f} s (dropped)", flush=True)
        del result
        gc.collect()
        torch.cuda.empty_cache()


PART_COLUMNS = ("step", "part", "tokens", "cached", "batch", "ms")
"""parts.csv: the step's number as steps.csv counts it (from 1); "chunk" (a prefill chunk through the compiled
prefill, `RealExecutor._prefill_state`), "packed" (a packed batch through
a token bucket's graph, `PackedGraphs.run`), "decode" (decoders through a
decode bucket's graph, `DecodeGraphs.run`), "forward" (the step's forward
span, the executor's own marks) or "step" (its measured step time); the
part's tokens, the tokens its requests held before it (cached keys, or
the decoders' context), its requests, and its milliseconds."""


@contextlib.contextmanager
def forward_parts(mark, seconds):
    """Record the real executor's forwards part by part while the block is
    open (PART_COLUMNS): yields a list that gets one row a part, complete
    once the run is over (the marks are read then). `mark()` makes a mark
    (a CUDA event recorded on the current stream, or a host clock) and
    `seconds(a, b)` reads two. A part the graphs decline (None: the
    executor runs it otherwise) is not recorded. A request holds `seq`
    tokens once its part is in (`sim.real.executor.state_plans`), so the
    tokens before it are `seq` less the part's."""
    from unikv.sim.real.executor import RealExecutor
    from unikv.sim.real.graphs import DecodeGraphs
    from unikv.sim.real.packed_graphs import PackedGraphs

    rows: list[tuple] = []
    marks: list[tuple] = []  # (step, part, tokens, cached, requests, start mark, end mark) of each part
    launches: list[tuple] = []  # (step, tokens, executor) of each launch, in order
    now = {"step": None}
    saved = {(cls, name): getattr(cls, name) for cls, name in (
        (RealExecutor, "launch"), (RealExecutor, "_prefill_state"), (PackedGraphs, "run"), (DecodeGraphs, "run"))}

    def held(batch) -> int:
        return int(sum(int(r.seq) for r in batch.requests)) - int(batch.num_tokens)

    def timed(kind, original, batch_of):
        def wrapper(self, *args, **kwargs):
            batch = batch_of(args)
            start = mark()
            out = original(self, *args, **kwargs)
            if out is not None:
                marks.append((now["step"], kind, int(batch.num_tokens), held(batch), len(batch.requests), start,
                              mark()))
            return out
        return wrapper

    def launch(self, plan):
        now["step"] = plan.index + 1  # steps.csv's step: the scheduler's count once the step is done
        got = saved[(RealExecutor, "launch")](self, plan)
        launches.append((now["step"], plan.prefill_tokens + len(plan.decode), self))
        return got

    RealExecutor.launch = launch
    RealExecutor._prefill_state = timed("chunk", saved[(RealExecutor, "_prefill_state")], lambda a: a[1])
    PackedGraphs.run = timed("packed", saved[(PackedGraphs, "run")], lambda a: a[0])
    DecodeGraphs.run = timed("decode", saved[(DecodeGraphs, "run")], lambda a: a[0])
    try:
        yield rows
    finally:
        for (cls, name), original in saved.items():
            setattr(cls, name, original)
        seen: dict[int, int] = {}  # executor -> its launches so far: the index of its step_s / forward_s
        for step, tokens, ex in launches:
            i = seen[id(ex)] = seen.get(id(ex), -1) + 1
            if i < len(ex.forward_s):  # a step the run timed (duration_s)
                rows.append((step, "forward", tokens, 0, 0, 1e3 * ex.forward_s[i]))
                rows.append((step, "step", tokens, 0, 0, 1e3 * ex.step_s[i]))
        rows += [(step, kind, n, c, b, 1e3 * seconds(a, z)) for step, kind, n, c, b, a, z in marks]
        rows.sort(key=lambda r: (r[0], ("chunk", "packed", "decode", "forward", "step").index(r[1])))


def cuda_mark():
    """A CUDA event recorded now on the current stream."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def cuda_seconds(start, end) -> float:
    return start.elapsed_time(end) / 1e3


def write_parts(rows, path: Path) -> None:
    import pandas as pd

    pd.DataFrame(rows, columns=list(PART_COLUMNS)).to_csv(path, index=False, float_format="%.4f")


def run_real(out: Path, selected, compiled: bool = False, graphs: bool = False, warm: bool = True) -> int:
    import gc

    import torch
    from unikv.sim.run import run, write_run

    memoize_builds()
    warmed: set[str] = set()
    for model, trace, layout in selected:
        dest = out / "real" / f"{model}__{trace}__{layout}"
        if (dest / "summary.json").exists():
            print(f"{dest.name}: done before, kept", flush=True)
            continue
        if warm and model not in warmed:
            warm_pass(model, selected, compiled, graphs)
            warmed.add(model)
        t0 = time.perf_counter()
        with forward_parts(cuda_mark, cuda_seconds) as parts:
            result = run(config(model, trace, layout, "real", compiled, graphs))
        write_run(result, dest, fmt="csv")
        write_parts(parts, dest / "parts.csv")
        s = result.summary
        print(f"{dest.name}: {s['steps']} steps, {s.get('graph_steps')} through graphs, {s['finished']} finished, "
              f"TTFT p50 {s['ttft_p50_s']:.3f} s, TPOT {s['tpot_mean_s'] * 1e3:.1f} ms, "
              f"wall {time.perf_counter() - t0:.1f} s"
              + (f", packed steps compiled {s['prefill_compiled_steps']} / eager {s['prefill_eager_steps']}"
                 if compiled else "")
              + (f", packed steps captured {s['packed_graph_steps_captured']} / not {s['packed_graph_steps_uncaptured']}"
                 if graphs else ""), flush=True)
        del result
        gc.collect()
        torch.cuda.empty_cache()
    return 0


def run_compare(out: Path, selected) -> int:
    import pandas as pd
    from unikv.sim.run import run, write_run

    rows, lines, step_lines, request_lines, batch_lines, part_lines = [], [], [], [], [], []
    profiles: dict = {}  # model -> its bundled profile (parts.md), read once
    for model, trace, layout in selected:
        name = f"{model}__{trace}__{layout}"
        real_dir = out / "real" / name
        if not (real_dir / "summary.json").exists():
            print(f"{name}: no real run in {real_dir}, skipped", file=sys.stderr)
            continue
        real = json.loads((real_dir / "summary.json").read_text())
        result = run(config(model, trace, layout, "cost"))
        write_run(result, out / "cost" / name, fmt="csv")
        cost = result.summary
        row = {"model": model, "trace": trace, "layout": layout, "steps_real": real["summary"]["steps"],
               "steps_cost": cost["steps"], "step_time_model": cost["step_time_model"],
               "extrapolated_steps": cost.get("step_time_extrapolated_steps")}
        for k in METRICS:
            a, b = real["summary"][k], cost[k]
            row[f"{k}_real"], row[f"{k}_cost"] = a, b
            row[f"{k}_diff"] = (b - a) / a if a else (0.0 if b == a else float("inf"))
        rows.append(row)
        real_steps = pd.read_csv(real_dir / "steps.csv")
        lines.append(timeline_line(name, real_steps, result.steps))
        step_lines.append(step_line(name, real_steps, result.steps))
        request_lines.append(request_line(name, pd.read_csv(real_dir / "requests.csv"), result.requests))
        batch_lines.append(batch_line(name, real_steps, result.steps))
        if (real_dir / "parts.csv").exists():
            from unikv.sim.profile import StepProfile, profile_path

            if model not in profiles:
                profiles[model] = StepProfile.load(profile_path(model, "h200"))
            part_lines.append(parts_line(name, pd.read_csv(real_dir / "parts.csv"), profiles[model]))
    if not rows:
        print("error: no real runs to compare", file=sys.stderr)
        return 2
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "validation.csv", index=False)
    (out / "validation.md").write_text(table(frame) + "\n" + agreement(frame))
    figure(frame, out / "validation.png")
    (out / "timeline.md").write_text(
        "| cell | steps planned alike | decision columns compared | live bytes and moves identical over "
        "those steps | hole and pending bytes identical |\n"
        "| --- | ---: | ---: | --- | --- |\n" + "\n".join(lines) + "\n")
    (out / "steps.md").write_text(
        "Median step time in ms, real / cost (steps), by kind of step: decode only; with a prefill chunk "
        "under 1,024 tokens; with a larger chunk. Slow decode steps: decode-only steps slower than "
        f"{OUTLIER:g}x their run's median, real / cost (the slowest, ms).\n\n"
        "| cell | decode only | small chunk | large chunk | slow decode steps |\n"
        "| --- | ---: | ---: | ---: | ---: |\n"
        + "\n".join(step_lines) + "\n")
    (out / "requests.md").write_text(
        "Per request, |cost - real| / real of its TTFT and of its TPOT (requests with both; TPOT of those "
        "with more than one output token): median and p90 over the cell's requests. A percentile over a "
        "cell can sit on the edge of a group of requests (one request crossing it moves it), which these "
        "do not. The last column: the cell's TTFT p90 (ms), real / cost / cost with its one request whose TTFT "
        "differs most taken at its real value, to show how much of a p90 difference one request makes.\n\n"
        "| cell | requests | TTFT median | TTFT p90 | TPOT median | TPOT p90 | TTFT p90 real / cost / one swapped |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(request_lines) + "\n")
    (out / "decode_batches.md").write_text(
        f"Median decode-only step time in ms by decode batch (1 to {max(BATCHES)}), real / cost; '-' where "
        "either run has no such step. The decode graphs pad a batch to its bucket (1, 2, 4, 8, 16, 32).\n\n"
        "| cell | " + " | ".join(str(b) for b in BATCHES) + " |\n"
        "| --- |" + " ---: |" * len(BATCHES) + "\n" + "\n".join(batch_lines) + "\n")
    if part_lines:
        (out / "parts.md").write_text(PARTS_HEAD + "\n".join(part_lines) + "\n")
    print((out / "validation.md").read_text())
    print((out / "timeline.md").read_text())
    return 0


PARTS_HEAD = (
    "The real runs' forwards taken apart (`parts.csv`, `forward_parts`): each part's measured time against "
    "the profile's time for that part alone, as real / profile, median over the parts (their count; the "
    "median of the real parts in ms). Chunks: one request's prefill chunk (its tokens, over the tokens it "
    "held), through the compiled prefill (over 2,048 tokens) or a token bucket's graph; the profile's "
    "prefill grid at (chunk, cached). Decode: the decoders of a step through their bucket's graph; the "
    "decode grid at (batch, mean context) plus the bucket's padding. Gap: the step's forward span less its "
    "parts, in steps with a chunk (host time between forwards the GPU waits for; the profile's mixed points "
    "hold one such gap), ms. Outside: the step less its forward, ms, against the profile's non_forward_s.\n\n"
    "| cell | chunks over 2,048 | chunks up to 2,048 | decode | gap (ms) | outside (ms) / profile |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: |\n")


def parts_line(name: str, parts, profile) -> str:
    """`parts.md`'s line of one cell: its parts (parts.csv) against `profile`."""
    import statistics

    one = parts[parts.part.isin(["chunk", "packed"]) & (parts.batch == 1)]
    dec = parts[parts.part == "decode"]

    def ratios(frame, predict) -> str:
        if frame.empty:
            return "-"
        r = [ms / (1e3 * predict(row)) for row, ms in zip(frame.itertuples(), frame.ms)]
        return f"{statistics.median(r):.3f} ({len(r)}; {frame.ms.median():.1f})"

    def chunk(row) -> float:  # a prefill forward alone
        return profile.forward_s(chunk_tokens=row.tokens, cached_tokens=row.cached, batch=0, context_tokens=0)[0]

    def decode(row) -> float:  # a decode-only forward, its bucket's padding in
        return profile.forward_s(chunk_tokens=0, cached_tokens=0, batch=row.batch,
                                 context_tokens=row.cached / row.batch)[0]

    by_step = parts.pivot_table(index="step", columns="part", values="ms", aggfunc="sum")
    inside = by_step.reindex(columns=["chunk", "packed", "decode"]).fillna(0.0).sum(axis=1)
    with_chunk = by_step.index.isin(one.step)
    gap = (by_step["forward"] - inside)[with_chunk]
    outside = by_step["step"] - by_step["forward"]
    return (f"| {name} | {ratios(one[one.tokens > 2048], chunk)} | {ratios(one[one.tokens <= 2048], chunk)} | "
            f"{ratios(dec, decode)} | {gap.median():.2f} (max {gap.max():.1f}) | "
            f"{outside.median():.2f} / {1e3 * profile.non_forward_s:.2f} |")


def request_line(name: str, real, cost) -> str:
    """Per-request agreement of TTFT and TPOT: the median and p90 of
    |cost - real| / real over the requests both runs finished; then the
    cell's TTFT p90 real / cost / cost with the one request whose TTFT
    differs most at its real value (the percentile as the run summaries
    take it, `sim.summary`: pandas' linear quantile over the requests
    with a first token)."""
    both = real[["rid", "ttft_s", "tpot_s"]].merge(cost[["rid", "ttft_s", "tpot_s"]], on="rid",
                                                    suffixes=("_real", "_cost"))
    pair = both.dropna(subset=["ttft_s_real", "ttft_s_cost"])
    ttft = (pair.ttft_s_cost - pair.ttft_s_real).abs() / pair.ttft_s_real
    swapped = cost.set_index("rid").ttft_s.dropna()
    if len(pair):
        worst = pair.loc[(pair.ttft_s_cost - pair.ttft_s_real).abs().idxmax()]
        swapped[worst.rid] = worst.ttft_s_real
    p90s = (real.ttft_s.dropna(), cost.ttft_s.dropna(), swapped)
    p90 = " / ".join(f"{1e3 * float(t.quantile(0.9)):.1f}" if len(t) else "-" for t in p90s)
    tpot = both.dropna(subset=["tpot_s_real", "tpot_s_cost"])
    tpot = tpot[tpot.tpot_s_real > 0]
    tpot = ((tpot.tpot_s_cost - tpot.tpot_s_real).abs() / tpot.tpot_s_real)

    def pct(x, q):
        return f"{100 * x.quantile(q):.1f} %" if len(x) else "-"

    return (f"| {name} | {len(ttft)} | {pct(ttft, 0.5)} | {pct(ttft, 0.9)} | {pct(tpot, 0.5)} | "
            f"{pct(tpot, 0.9)} | {p90} |")


BATCHES = tuple(range(1, 17))
"""The decode batches `decode_batches.md` compares (the validation's cells
decode 1-27 requests at once, most steps 1-16)."""


def batch_line(name: str, real, cost) -> str:
    """The median decode-only step time per decode batch, real / cost (ms)."""
    cells = []
    for b in BATCHES:
        a = real[(real.prefill_tokens == 0) & (real.decode_tokens == b)].step_time_s
        c = cost[(cost.prefill_tokens == 0) & (cost.decode_tokens == b)].step_time_s
        cells.append(f"{1e3 * a.median():.1f} / {1e3 * c.median():.1f}" if len(a) and len(c) else "-")
    return f"| {name} | " + " | ".join(cells) + " |"


def timeline_line(name: str, real, cost) -> str:
    """How far the two runs' step plans coincide, and whether the memory
    timeline is identical over that stretch (it must be: one allocator):
    the allocator's decisions (live bytes per band, moves, moved bytes)
    apart from the hole and pending bytes, which also depend on when the
    in-flight forward's event is seen to fire (on the device, or at the
    simulated step's end)."""
    n = min(len(real), len(cost))
    same = (real[list(PLAN_COLUMNS)].iloc[:n].to_numpy() == cost[list(PLAN_COLUMNS)].iloc[:n].to_numpy()).all(axis=1)
    alike = int(n if same.all() else same.argmin())
    decided = [c for c in real.columns if c.endswith("_live_bytes") or c in ("live_bytes", "moves", "moved_bytes")]
    timed = [c for c in real.columns if c.endswith(("_hole_bytes", "_pending_bytes"))
             or c in ("hole_bytes", "pending_bytes")]

    def differing(columns: list[str]) -> int:
        a, b = real[columns].iloc[:alike].to_numpy(), cost[columns].iloc[:alike].to_numpy()
        return int((a != b).any(axis=1).sum())

    d, t = differing(decided), differing(timed)
    return (f"| {name} | {alike} of {len(real)} (real) / {len(cost)} (cost) | {len(decided)} | "
            f"{'yes' if d == 0 else f'NO ({d} steps differ)'} | {'yes' if t == 0 else f'{t} steps differ'} |")


OUTLIER = 5.0
"""A decode-only step slower than OUTLIER x its run's median decode-only step
is counted apart in `steps.md` (a compile or a stall on the real clock)."""


def step_line(name: str, real, cost) -> str:
    """The median step time of each kind of step in both runs, then the
    decode-only steps slower than OUTLIER x their run's median (count and
    the slowest, ms)."""
    kinds = (lambda d: d.prefill_tokens == 0, lambda d: (d.prefill_tokens > 0) & (d.prefill_tokens < 1024),
             lambda d: d.prefill_tokens >= 1024)
    cells = []
    for pick in kinds:
        a, b = real[pick(real)].step_time_s, cost[pick(cost)].step_time_s
        cells.append(f"{1e3 * a.median():.1f} / {1e3 * b.median():.1f} ({len(a)} / {len(b)})" if len(a) and len(b)
                     else "-")
    slow = []
    for run in (real, cost):
        decode = run[run.prefill_tokens == 0].step_time_s
        out = decode[decode > OUTLIER * decode.median()] if len(decode) else decode
        slow.append(f"{len(out)}" + (f" ({1e3 * out.max():.0f})" if len(out) else ""))
    return f"| {name} | " + " | ".join(cells) + " | " + " / ".join(slow) + " |"


def figure(frame, path: Path) -> None:
    """Cost model against real, one panel per metric, one point per cell
    (marker: layout, colour: model), with the y = x line and a 10 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4))
    colours = {m: f"C{i}" for i, m in enumerate(sorted(frame["model"].unique()))}
    markers = {lay: mk for lay, mk in zip(LAYOUTS, "os^")}
    for ax, k in zip(axes, METRICS):
        for r in frame.to_dict("records"):
            ax.scatter(r[f"{k}_real"], r[f"{k}_cost"], c=colours[r["model"]], marker=markers[r["layout"]],
                       label=f"{r['model']} {r['layout']}")
        lo = min(frame[f"{k}_real"].min(), frame[f"{k}_cost"].min())
        hi = max(frame[f"{k}_real"].max(), frame[f"{k}_cost"].max())
        xs = [lo, hi]
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, [0.9 * x for x in xs], [1.1 * x for x in xs], color="0.85")
        ax.set(title=k, xlabel="real executor (H200)", ylabel="cost model (profile)")
    handles, labels = axes[0].get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    fig.legend(keep.values(), keep.keys(), loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("Cost model (measured H200 profile) against the real executor on the H200, "
                 "3 trace slices x 2 models x 2 layouts")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def agreement(frame) -> str:
    """Per metric: the cells whose cost-model value is within 10 % of the
    real one, and the median and largest absolute relative difference."""
    out = ["| metric | cells within 10 % | median abs. difference | largest |", "| --- | ---: | ---: | ---: |"]
    for k in METRICS:
        d = frame[f"{k}_diff"].abs()
        out.append(f"| {k} | {int((d <= 0.10).sum())} of {len(d)} | {100 * d.median():.1f} % | {100 * d.max():.1f} % |")
    return "\n".join(out) + "\n"


def table(frame) -> str:
    """The side-by-side markdown table: real, cost model, relative difference."""
    head = "| model | trace | layout | " + " | ".join(f"{k} real / cost (diff)" for k in METRICS) + " |"
    out = [head, "| --- | --- | --- |" + " ---: |" * len(METRICS)]
    for r in frame.to_dict("records"):
        cells = []
        for k in METRICS:
            a, b, d = r[f"{k}_real"], r[f"{k}_cost"], r[f"{k}_diff"]
            scale = 1e3 if k.startswith(("ttft", "tpot")) else 1
            cells.append(f"{a * scale:.4g} / {b * scale:.4g} ({100 * d:+.1f} %)")
        out.append(f"| {r['model']} | {r['trace']} | {r['layout']} | " + " | ".join(cells) + " |")
    return "TTFT and TPOT in ms, throughput in tokens/s; diff = (cost - real) / real.\n\n" + "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("real", "compare"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--compiled", action="store_true",
                    help="real: decode and prefill / mixed steps with compiled decoder layers (compile_decode, "
                         "compile_prefill)")
    ap.add_argument("--prefill-graphs", action="store_true",
                    help="real: prefill / mixed steps through the token buckets' CUDA graphs (prefill_graphs)")
    ap.add_argument("--no-warm-pass", dest="warm", action="store_false",
                    help="real: measure each model's cells without the unmeasured replay of its slices first "
                         "(warm_pass)")
    args = ap.parse_args(argv)
    selected = cells(args.models, args.traces, args.layouts)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "real":
        return run_real(args.out, selected, args.compiled, args.prefill_graphs, args.warm)
    return run_compare(args.out, selected)


if __name__ == "__main__":
    sys.exit(main())
