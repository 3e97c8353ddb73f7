"""Probe unikv as a new user would: bad and good inputs, every outcome classified.

Each probe is a command line (`unikv ...`) or a library call, with the
outcome it must have: `refuse` (exit code 2 and one line "error: ..." naming
the given words, no traceback, no partial output folder; for a library call:
a ValueError naming the words, and the pool's state unchanged) or `run`
(exit code 0, a complete output folder). Every probe runs in a forked child
with a time limit, so a hang is seen as a hang.

Outcomes: `ok` (as expected), `traceback`, `hang`, `unclear error` (a
refusal that does not name the problem, or not in one line), `wrong refusal`
(a good input refused), `silent wrong result` (a bad input that ran),
`partial output` (a folder neither complete nor absent).

    python benchmarks/probe_inputs.py --out results/probes       # all classes
    python benchmarks/probe_inputs.py --classes traces options   # some

Writes probes.csv (one row per probe) and probes.md (counts per class and
outcome, then every probe that is not ok) under --out; exits 1 when any
probe is not ok.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

ERROR_LINE = re.compile(r"^(unikv[\w -]*: )?error: ")
RUN_FILES = ("steps.parquet", "requests.parquet", "summary.json", "config.json")
FAST = ("--max-requests", "30", "--no-figures", "--no-oracle", "--quiet")


@dataclass(frozen=True)
class Probe:
    """One probe: a CLI command (`argv`) or a library call (`call`).

    `files` maps a file name (inside the probe's own temporary folder) to
    its bytes, or to None for a folder; `{dir}` in argv is that folder.
    """

    cls: str
    name: str
    expect: str  # "refuse" or "run"
    argv: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    files: dict[str, bytes | None] = field(default_factory=dict)
    fifo: str | None = None
    call: Callable[[], object] | None = None
    out: str | None = "run"  # the output folder argv writes (checked complete or absent)
    timeout_s: float = 120.0


# -- catalog ------------------------------------------------------------------

def _replay(*args: str, out: bool = True) -> tuple[str, ...]:
    return ("replay", *FAST, *args, *(("--out", "{dir}/run") if out else ()))  # the probe's flags win


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


def option_probes() -> list[Probe]:
    bad = [  # (flag, value, words the error must name)
        ("--kv-budget-gib", "-1", ("kv_budget_gib",)), ("--kv-budget-gib", "0", ("kv_budget_gib",)),
        ("--kv-budget-gib", "nan", ("kv_budget_gib",)), ("--kv-budget-gib", "inf", ("kv_budget_gib",)),
        ("--kv-budget-gib", "1e9", ("kv_budget_gib",)), ("--kv-budget-gib", "abc", ("kv-budget-gib",)),
        ("--page-size", "0", ("page_size",)), ("--page-size", "-16", ("page_size",)),
        ("--page-size", "3.5", ("page-size",)),
        ("--rate-scale", "0", ("rate_scale",)), ("--rate-scale", "nan", ("rate_scale",)),
        ("--rate-scale", "inf", ("rate_scale",)), ("--rate-scale", "-2", ("rate_scale",)),
        ("--rate-rps", "0", ("rate_rps",)), ("--rate-rps", "nan", ("rate_rps",)),
        ("--spread-s", "-3", ("spread_s",)), ("--spread-s", "inf", ("spread_s",)),
        ("--reserve-init", "1.5", ("reserve_init",)), ("--reserve-init", "-0.1", ("reserve_init",)),
        ("--reserve-min", "2", ("reserve_min",)), ("--reserve-decay", "-1", ("reserve_decay",)),
        ("--reserve-decay", "nan", ("reserve_decay",)), ("--reserve-decay", "inf", ("reserve_decay",)),
        ("--check-every", "-1", ("check_every",)), ("--max-requests", "0", ("max_requests",)),
        ("--max-requests", "-5", ("max_requests",)), ("--max-context-tokens", "0", ("max_context_tokens",)),
        ("--max-running", "0", ("max_running",)), ("--prefill-tokens-per-step", "0", ("prefill_tokens_per_step",)),
        ("--block-tokens", "0", ("block_tokens",)), ("--block-tokens", "-16", ("block_tokens",)),
        ("--trace-start-s", "nan", ("trace_start_s",)), ("--trace-end-s", "inf", ("trace_end_s",)),
        ("--seed", "-1", ("seed",)), ("--layout", "nope", ("layout", "nope")),
        ("--compaction", "later", ("compaction",)), ("--oversize", "drop", ("oversize",)),
        ("--hardware", "no_such_gpu", ("hardware", "no_such_gpu")),
        ("--model", "no-such-model", ("no-such-model",)),
        ("--trace", "no_such_trace", ("no_such_trace",)),
    ]
    probes = [Probe("options", f"{flag} {value}", "refuse", _replay(flag, value), words)
              for flag, value, words in bad]
    probes += [
        Probe("options", "reserve min above init", "refuse",
              _replay("--reserve-init", "0.2", "--reserve-min", "0.5"), ("reserve_min", "reserve_init")),
        Probe("options", "trace window start after end", "refuse",
              _replay("--trace-start-s", "100", "--trace-end-s", "50"), ("trace_start_s", "trace_end_s")),
        Probe("options", "static ratio with end_end", "refuse",
              _replay("--layout", "end_end", "--static-ratio", "0.5"), ("static_ratio",)),
        Probe("options", "block tokens on a trace without hashes", "refuse",
              _replay("--trace", "azure_conv", "--block-tokens", "16"), ("block_tokens",)),
        Probe("options", "block tokens the trace cannot honour", "refuse",
              _replay("--trace", "mooncake_conversation", "--block-tokens", "100"), ("block_tokens",)),
        Probe("options", "defaults run", "run", _replay()),
        Probe("options", "mooncake with its own block size", "run",
              _replay("--trace", "mooncake_conversation", "--block-tokens", "512")),
        Probe("options", "compare: a bad layout in the grid", "refuse",
              ("compare", "--layouts", "end_end", "nope", "--max-requests", "20", "--quiet",
               "--out", "{dir}/run"), ("nope",), out=None),
    ]
    return probes


def output_probes() -> list[Probe]:
    return [
        Probe("outputs", "--out is an existing file", "refuse", _replay(out=False) + ("--out", "{dir}/f"),
              ("f",), files={"f": b"keep me"}, out=None),
        Probe("outputs", "--out under a file", "refuse", _replay(out=False) + ("--out", "{dir}/f/run"),
              ("f",), files={"f": b"keep me"}, out=None),
        Probe("outputs", "--out holds a csv run, parquet asked", "run",
              _replay(), files={"run": None, "run/steps.csv": b"a\n1\n", "run/summary.json": b"{}"}),
        Probe("outputs", "compare --out is a file", "refuse",
              ("compare", "--max-requests", "20", "--quiet", "--out", "{dir}/f"), ("f",),
              files={"f": b"x"}, out=None),
    ]


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
         "torch_dtype": "bfloat16"}


def config_probes() -> list[Probe]:
    def with_(**changes) -> bytes:
        return _json({**LLAMA, **changes})

    bad = {
        "a JSON list": (b"[1, 2]", ()), "a JSON string": (b'"llama"', ()),
        "not JSON": (b"{model_type: llama", ()), "not UTF-8": (b'{"model_type": "\xff\xfe"}', ()),
        "empty file": (b"", ()),
        "zero layers": (with_(num_hidden_layers=0), ("num_hidden_layers",)),
        "negative heads": (with_(num_attention_heads=-4), ("num_attention_heads",)),
        "zero kv heads": (with_(num_key_value_heads=0), ("num_key_value_heads",)),
        "layers as a string": (with_(num_hidden_layers="32"), ("num_hidden_layers",)),
        "layers as a float": (with_(num_hidden_layers=32.5), ("num_hidden_layers",)),
        "layers as a bool": (with_(num_hidden_layers=True), ("num_hidden_layers",)),
        "hidden size zero": (with_(hidden_size=0), ("hidden_size",)),
        "layer_types too short": (with_(layer_types=["full_attention"] * 3), ("layer_types",)),
        "unknown layer type": (with_(layer_types=["warp_attention"] * 32), ("layer_types",)),
        "window zero": (with_(model_type="mistral", sliding_window=0), ("sliding_window",)),
        "qwen3-next interval zero": (_json({**LLAMA, "model_type": "qwen3_next",
                                            "full_attention_interval": 0}), ("full_attention_interval",)),
        "unknown model_type": (with_(model_type="warpnet", architectures=["WarpForCausalLM"]), ("warpnet",)),
    }
    probes = [Probe("configs", name, "refuse", _replay("--model", "{dir}/config.json"), words or ("config",),
                    files={"config.json": data}) for name, (data, words) in bad.items()]
    probes += [
        Probe("configs", "a folder without config.json", "refuse", _replay("--model", "{dir}/m"),
              ("config.json",), files={"m": None}),
        Probe("configs", "a missing file", "refuse", _replay("--model", "{dir}/none.json"), ("none.json",)),
        Probe("configs", "llama config.json runs", "run", _replay("--model", "{dir}/config.json"),
              files={"config.json": _json(LLAMA)}),
        Probe("configs", "a model folder runs", "run", _replay("--model", "{dir}/m"),
              files={"m": None, "m/config.json": _json(LLAMA)}),
    ]
    return probes


TRACE_CSV = b"arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n"


def trace_probes() -> list[Probe]:
    bad = {
        "a directory": ({"t": None}, "t", ("directory",)),
        "not UTF-8": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\n0,\xff\xfe,1\n"}, "t.csv", ("t.csv",)),
        "empty file": ({"t.csv": b""}, "t.csv", ("t.csv",)),
        "header only": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\n"}, "t.csv", ("t.csv",)),
        "a JSON list": ({"t.jsonl": b"[1, 2, 3]\n"}, "t.jsonl", ("t.jsonl",)),
        "a JSON string": ({"t.jsonl": b'"hello"\n'}, "t.jsonl", ("t.jsonl",)),
        "missing token column": ({"t.csv": b"arrival_s,prompt_tokens\n0,10\n"}, "t.csv", ("output",)),
        "tokens as strings": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\n0,ten,1\n"}, "t.csv",
                              ("prompt",)),
        "negative tokens": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\n0,-10,1\n"}, "t.csv",
                            ("prompt",)),
        "fractional tokens": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\n0,10.5,1\n"}, "t.csv",
                              ("prompt",)),
        "nan arrival": ({"t.csv": b"arrival_s,prompt_tokens,output_tokens\nnan,10,1\n"}, "t.csv",
                        ("arrival",)),
    }
    probes = []
    for name, (files, target, words) in bad.items():
        probes.append(Probe("traces", f"replay: {name}", "refuse", _replay("--trace", f"{{dir}}/{target}"),
                            words, files=files))
        probes.append(Probe("traces", f"describe: {name}", "refuse",
                            ("traces", "describe", f"{{dir}}/{target}"), words, files=files, out=None))
    probes += [
        Probe("traces", "replay: a FIFO", "refuse", _replay("--trace", "{dir}/fifo"), ("fifo",),
              fifo="fifo", timeout_s=30),
        Probe("traces", "describe: a FIFO", "refuse", ("traces", "describe", "{dir}/fifo"), ("fifo",),
              fifo="fifo", out=None, timeout_s=30),
        Probe("traces", "replay: a good csv runs", "run", _replay("--trace", "{dir}/t.csv"),
              files={"t.csv": TRACE_CSV}),
        Probe("traces", "describe: a good csv", "run", ("traces", "describe", "{dir}/t.csv"),
              files={"t.csv": TRACE_CSV}, out=None),
    ]
    return probes


def _oversize_trace(tokens: int) -> bytes:
    return f"arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n1.0,{tokens},10\n".encode()


def engine_probes() -> list[Probe]:
    probes = []
    for model in ("mistral-7b-v0.1", "ministral-8b-instruct-2410"):
        for layout in ("end_end", "oracle"):
            probes.append(Probe("engine", f"window-only {model} on {layout}, checked every step", "run",
                                ("replay", "--model", model, "--layout", layout, "--check-every", "1",
                                 "--max-requests", "150", "--no-figures", "--no-oracle", "--quiet",
                                 "--out", "{dir}/run"), timeout_s=300))
    for model in ("mistral-7b-v0.1", "gemma-3-12b", "llama-3.1-8b"):
        probes.append(Probe("engine", f"a 1e12-token request on {model}", "refuse",
                            _replay("--model", model, "--trace", "{dir}/t.csv"), ("1000000000010",),
                            files={"t.csv": _oversize_trace(10**12)}, timeout_s=60))
        probes.append(Probe("engine", f"a 1e12-token request on {model}, oversize=reject", "run",
                            _replay("--model", model, "--trace", "{dir}/t.csv", "--oversize", "reject"),
                            files={"t.csv": _oversize_trace(10**12)}, timeout_s=60))
    return probes


# -- library calls -------------------------------------------------------------

def _pool():
    from unikv import Band, Layout, UnifiedPool
    from unikv.backends import SimBackend

    layout = Layout(total_bytes=1 << 22, bands=[
        Band("mamba", entry_bytes=4096, grow="up", page_size=1, unit="request"),
        Band("swa", entry_bytes=256, grow="float", page_size=16, unit="token"),
        Band("full", entry_bytes=512, grow="down", page_size=16, unit="token"),
    ])
    pool = UnifiedPool(layout, backend=SimBackend(), compaction="lazy")
    return pool, pool.alloc(64)


def _snapshot(pool) -> str:
    return repr((pool.occupancy(), pool.stats(), pool.available_size(), pool.available_state("mamba")))


def _unchanged_after(action: Callable[[object, object], object]) -> Callable[[], object]:
    """A call on a fresh pool holding 64 tokens; raises AssertionError if
    the pool's state changed or it fails verify()."""
    def call():
        pool, ids = _pool()
        before = _snapshot(pool)
        try:
            action(pool, ids)
        finally:
            assert _snapshot(pool) == before, "pool state changed by a refused call"
            assert pool.verify() == [], pool.verify()
    return call


def api_probes() -> list[Probe]:
    import numpy as np

    def layout(grows):
        from unikv import Band, Layout

        return lambda: Layout(total_bytes=1 << 22, bands=[
            Band(f"b{i}", entry_bytes=512, grow=g, page_size=16 if u == "token" else 1, unit=u)
            for i, (g, u) in enumerate(grows)])

    calls = {
        "inflight forward without an event": (_unchanged_after(
            lambda p, ids: p.set_inflight_forward(None, ids)), ("event",)),
        "inflight forward with out-of-range ids": (_unchanged_after(
            lambda p, ids: p.set_inflight_forward(object(), np.array([10**9]))), ("write",)),
        # positions 0..7 then 9..16 given as positions 0..15: not one run of a request's tokens
        "release a non-contiguous run with start_pos": (_unchanged_after(
            lambda p, ids: p.release(np.concatenate([ids[:8], ids[9:17]]), band="swa", start_pos=0)),
            ("run",)),
        "free unallocated ids": (_unchanged_after(lambda p, ids: p.free(np.array([10**6]))), ("free",)),
        "free_state of a free slot": (_unchanged_after(
            lambda p, ids: p.free_state("mamba", np.array([5]))), ("mamba",)),
        "translate out-of-range ids": (_unchanged_after(
            lambda p, ids: p.translate(np.array([10**9]), band="full")), ("translate",)),
        "alloc of a non-multiple of page_size": (_unchanged_after(lambda p, ids: p.alloc(7)), ("page",)),
        "Layout up|up|down": (layout([("up", "request"), ("up", "token"), ("down", "token")]), ("chain",)),
        "Layout up|down|down": (layout([("up", "request"), ("down", "token"), ("down", "token")]),
                                ("chain",)),
    }
    probes = [Probe("api", name, "refuse", call=call, words=words, out=None) for name, (call, words) in calls.items()]
    # A page's tokens named twice in one free (the pool frees pages: a request's ids
    # repeat their pages by nature): the page is freed once and the pool stays healthy.
    probes.append(Probe("api", "free names a page's tokens twice in one call", "run",
                        call=_healthy_after(lambda p, ids: p.free(np.concatenate([ids[:16], ids[:16]]))),
                        out=None))
    return probes


def _healthy_after(action: Callable[[object, object], object]) -> Callable[[], object]:
    """A call on a fresh pool holding 64 tokens that must succeed (it frees
    the first page); the pool then passes verify() and, once the rest is
    freed, holds what a fresh pool holds."""
    def call():
        pool, ids = _pool()
        action(pool, ids)
        assert pool.verify() == [], pool.verify()
        pool.free(ids[16:])
        assert pool.verify() == [] and pool.available_size() == _fresh().available_size()
    return call


def _fresh():
    pool, ids = _pool()
    pool.free(ids)
    return pool


CLASSES: dict[str, Callable[[], list[Probe]]] = {
    "options": option_probes, "outputs": output_probes, "configs": config_probes,
    "traces": trace_probes, "engine": engine_probes, "api": api_probes,
}


# -- running ---------------------------------------------------------------------

def _prepare(probe: Probe, folder: Path) -> list[str]:
    for name, data in probe.files.items():
        path = folder / name
        if data is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if probe.fifo:
        os.mkfifo(folder / probe.fifo)
    return [a.replace("{dir}", str(folder)) for a in probe.argv]


def _child(probe: Probe, argv: list[str], report: Path) -> None:
    """In the forked child: run the probe, write what happened, exit."""
    out, err = io.StringIO(), io.StringIO()
    rc, raised = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if probe.call is not None:
                probe.call()
            else:
                from unikv.cli import main

                rc = main(argv) or 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001 -- the outcome is what we record
            import traceback

            raised = f"{type(exc).__name__}: {exc}"
            err.write(traceback.format_exc())
            rc = 1
    report.write_text(json.dumps({"rc": rc, "stdout": out.getvalue()[-4000:], "stderr": err.getvalue()[-4000:],
                                  "raised": raised}))


def run_probe(probe: Probe, root: Path) -> dict:
    folder = Path(tempfile.mkdtemp(dir=root))
    argv = _prepare(probe, folder)
    report = folder / ".report.json"
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            _child(probe, argv, report)
        finally:
            os._exit(0)
    deadline = t0 + probe.timeout_s
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return _row(probe, "hang", time.perf_counter() - t0, "", f"no answer in {probe.timeout_s:g} s")
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    if not report.exists():
        return _row(probe, "traceback", wall, "", "the child died without a report")
    rep = json.loads(report.read_text())
    outcome, detail = classify(probe, rep, folder)
    return _row(probe, outcome, wall, rep["stderr"].strip().splitlines()[-1:] and rep["stderr"].strip()
                .splitlines()[-1] or "", detail)


def classify(probe: Probe, rep: dict, folder: Path) -> tuple[str, str]:
    if probe.call is not None:
        return _classify_call(probe, rep)
    stderr = rep["stderr"]
    if "Traceback" in stderr:
        return "traceback", stderr.strip().splitlines()[-1]
    partial = _partial(folder / probe.out) if probe.out else ""
    if partial:
        return "partial output", partial
    if rep["rc"] == 0:
        return ("ok", "") if probe.expect == "run" else ("silent wrong result", "exit 0")
    lines = [line for line in stderr.splitlines() if ERROR_LINE.match(line)]
    missing = [w for w in probe.words if not lines or w.lower() not in lines[0].lower()]
    if rep["rc"] != 2 or len(lines) != 1 or missing:
        return "unclear error", f"rc {rep['rc']}; {len(lines)} error lines; not named: {missing}"
    return ("ok", "") if probe.expect == "refuse" else ("wrong refusal", lines[0])


def _classify_call(probe: Probe, rep: dict) -> tuple[str, str]:
    raised = rep["raised"]
    if raised is None:
        return ("ok", "") if probe.expect == "run" else ("silent wrong result", "no error raised")
    if raised.startswith("AssertionError"):
        return "silent wrong result", raised
    if not raised.startswith("ValueError"):
        return "traceback", raised
    missing = [w for w in probe.words if w.lower() not in raised.lower()]
    return ("unclear error", f"not named: {missing}: {raised}") if missing else ("ok", "")


def _partial(out: Path) -> str:
    if not out.exists():
        return ""
    names = {p.name for p in out.iterdir()}
    if not names:
        return ""
    missing = [n for n in RUN_FILES if n not in names]
    stale = sorted(n for n in names if n.endswith(".csv"))
    if missing:
        return f"missing {missing}"
    return f"stale tables of the other format: {stale}" if stale else ""


def _row(probe: Probe, outcome: str, wall: float, last_line: str, detail: str) -> dict:
    return {"class": probe.cls, "probe": probe.name, "expect": probe.expect, "outcome": outcome,
            "wall_s": round(wall, 2), "detail": detail[:300], "message": last_line[:300]}


def report_md(table: pd.DataFrame, command: str) -> str:
    counts = table.pivot_table(index="class", columns="outcome", values="probe", aggfunc="count",
                               fill_value=0)
    lines = ["# Input probes", "", f"`{command}`", "",
             f"{len(table)} probes, {int((table['outcome'] == 'ok').sum())} ok.", "",
             counts.to_markdown() if _has_tabulate() else counts.to_string(), ""]
    bad = table[table["outcome"] != "ok"]
    if len(bad):
        lines += ["## Not ok", ""]
        lines += [f"- **{r['class']} / {r['probe']}**: {r['outcome']}: {r['detail']} ({r['message']})"
                  for _, r in bad.iterrows()]
    return "\n".join(lines) + "\n"


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/probes"))
    parser.add_argument("--classes", nargs="+", choices=list(CLASSES), default=list(CLASSES))
    args = parser.parse_args(argv)
    import unikv.sim.run  # noqa: F401

    import unikv.cli  # noqa: F401 -- imported once here, so every forked child starts warm

    probes = [p for cls in args.classes for p in CLASSES[cls]()]
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for i, probe in enumerate(probes, 1):
            rows.append(run_probe(probe, Path(root)))
            print(f"[{i}/{len(probes)}] {probe.cls}: {probe.name}: {rows[-1]['outcome']}", file=sys.stderr)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "probes.csv", index=False)
    command = "python benchmarks/probe_inputs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "probes.md").write_text(report_md(table, command.strip()))
    print(report_md(table, command.strip()))
    return 0 if (table["outcome"] == "ok").all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
