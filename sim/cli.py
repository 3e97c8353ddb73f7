"""`unikv replay` and `unikv compare`: thin wrappers over `sim.run`.

Every option is derived from `RunConfig` / `SchedulerConfig`, the one
source of defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd
from tqdm import tqdm
from unikv.sim.config import (
    COMPACTIONS,
    EXECUTORS,
    LAYOUTS,
    OVERSIZE,
    REAL_CLOCKS,
    RunConfig,
    SchedulerConfig,
)
from unikv.sim.engines import ENGINE_OF_LAYOUT, effective_engine
from unikv.sim.layouts import applicable_kinds
from unikv.sim.models import load_model

if typing.TYPE_CHECKING:
    from unikv.sim.run import RunResult


def _add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One `--flag` per RunConfig / SchedulerConfig field: its type from the
    annotation, its default and help from the field."""
    for cls in (RunConfig, SchedulerConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip or f.name == "scheduler":
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            flag = "--" + f.name.replace("_", "-")
            kind, optional = _base_type(hints[f.name])
            helptext = f"{f.metadata.get('help', f.name)} (default {default})"
            if kind is bool:
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                    help=f.metadata.get("help"))
                continue
            parser.add_argument(flag, type=_parse(kind, optional), default=default, choices=_CHOICES.get(f.name),
                                help=helptext)


_CHOICES = {"layout": LAYOUTS, "compaction": COMPACTIONS, "oversize": OVERSIZE, "executor": EXECUTORS,
            "real_clock": REAL_CLOCKS}


def _base_type(hint) -> tuple[type, bool]:
    """(int, False) for `int`, (int, True) for `Optional[int]`, and so on."""
    args = typing.get_args(hint)
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _parse(kind: type, optional: bool):
    """Parse a flag value of `kind`; "none" gives None for an optional field."""
    def parse(text: str):
        return None if optional and text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its errors
    return parse


def _config(args: argparse.Namespace, **override) -> RunConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
              if f.name != "scheduler" and hasattr(args, f.name)}
    sched = {f.name: getattr(args, f.name) for f in dataclasses.fields(SchedulerConfig)}
    values.update(override)
    return RunConfig(**values, scheduler=SchedulerConfig(**sched))


@contextlib.contextmanager
def progress_bar(label: str, *, show: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A tqdm bar of finished requests on stderr while one replay runs.

    Yields `run`'s `progress` callback `(done, total)`, or None when not
    `show` (no bar and no per-request callback). While the bar is on, a
    warning is printed through `tqdm.write`, on its own line above the bar;
    the bar closes on exit (its last line ends with a newline), so an error
    printed after it starts on its own line too.
    """
    if not show:
        yield None
        return
    bar = tqdm(desc=label, unit="req", file=sys.stderr, mininterval=0.2, dynamic_ncols=True)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        tqdm.write(text.rstrip("\n"), file=sys.stderr)

    try:
        with warnings.catch_warnings():  # restores the previous showwarning on exit
            warnings.showwarning = show_warning
            yield update
    finally:
        bar.close()


def show_progress(quiet: bool) -> bool:
    """Draw progress bars: only on a terminal, and never with --quiet."""
    return not quiet and sys.stderr.isatty()


def _add_quiet(parser: argparse.ArgumentParser, prints: str) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help=f"no progress bars and no {prints} on stdout: only errors and invariant violations "
                             "(on stderr); the output files and the exit status are the same. Progress bars "
                             "are drawn only when stderr is a terminal")


SUMMARY_ROWS = [
    ("arrived / admitted / finished", lambda s: f"{s['arrived']} / {s['admitted']} / {s['finished']}"),
    ("admission rate", lambda s: f"{s['admission_rate']:.3f}"),
    ("retractions / rejected", lambda s: f"{s['retractions']} / {s['rejected']}"),
    ("mean running requests", lambda s: f"{s['mean_running']:.1f}"),
    ("throughput (output tok/s)", lambda s: f"{s['throughput_tok_s']:.0f}"),
    ("TTFT p50 / p90 (s)", lambda s: f"{s['ttft_p50_s']:.3f} / {s['ttft_p90_s']:.3f}"),
    ("TPOT mean (ms)", lambda s: f"{1e3 * s['tpot_mean_s']:.2f}"),
    ("prefix hit ratio", lambda s: f"{s['prefix_hit_ratio']:.3f}"),
    ("mean available tokens", lambda s: f"{s['mean_available_tokens']:.0f}"),
    ("hole ratio / unusable free ratio", lambda s: f"{s['mean_hole_ratio']:.4f} / {s['mean_unusable_free_ratio']:.4f}"),
    ("page moves / GiB moved", lambda s: f"{s['moves']} / {s['moved_bytes'] / 2**30:.2f}"),
    ("compaction time (s) / overhead", lambda s: f"{s['move_time_s']:.4f} / {100 * s['compaction_overhead']:.3f} %"),
    ("capacity efficiency vs oracle", lambda s: f"{s['capacity_efficiency']:.3f}"),
    ("simulated time / steps", lambda s: f"{s['sim_time_s']:.1f} s / {s['steps']}"),
    ("step-time model", lambda s: _step_time_model(s)),
]


def _step_time_model(summary: dict) -> str:
    """The step-time model a run used, with the steps a profile extrapolated."""
    name = summary["step_time_model"]
    if "step_time_extrapolated_steps" not in summary:
        return name
    return f"{name} ({summary['step_time_extrapolated_steps']} of {summary['steps']} steps beyond its grids)"


def print_summary(summary: dict, identity: dict, wall_s: float) -> None:
    print(f"\n{identity['model']} | layout {identity['layout']} {identity['bands']} | "
          f"{identity['compaction']} | {identity['kv_budget_bytes'] / 2**30:.1f} GiB | "
          f"page {identity['page_size']} | {identity['hardware']['name']} | {Path(identity['trace']).name}")
    for label, fmt in SUMMARY_ROWS:
        try:
            value = fmt(summary)
        except (KeyError, TypeError, ValueError):
            value = "n/a"
        print(f"  {label:34} {value}")
    print(f"  {'wall time':34} {wall_s:.1f} s")


def replay(argv: Sequence[str] | None = None) -> int:
    """`unikv replay ARGV`; returns the exit status (`unikv.cli` documents it)."""
    from unikv.cli import guarded

    return guarded(_replay, sys.argv[1:] if argv is None else argv)


def _replay(argv: Sequence[str]) -> int:
    from unikv.sim.figures import run_figures
    from unikv.sim.outdir import check_out_dir
    from unikv.sim.run import run, write_run
    from unikv.sim.summary import capacity_efficiency

    parser = argparse.ArgumentParser(prog="unikv replay", description="replay a trace against one layout")
    _add_config_options(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/replay"),
                        help="output folder, replaced whole when the run is written")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--no-oracle", action="store_true",
                        help="skip the oracle run (no capacity efficiency); a real replay on the measured "
                             "clock never runs it (the oracle runs on the cost model's clock)")
    parser.add_argument("--no-figures", action="store_true")
    _add_quiet(parser, "summary")
    args = parser.parse_args(argv)
    show = show_progress(args.quiet)
    config = _config(args)
    check_out_dir(args.out)  # before the replay: a bad place fails at once
    with progress_bar(config.layout, show=show) as progress:
        result = run(config, progress=progress)
    # a measured real replay runs on the GPU's clock and the oracle on the cost
    # model's: their mean running requests are not comparable, so no efficiency
    measured = config.executor == "real" and config.real_clock == "measured"
    if not args.no_oracle and config.layout != "oracle" and not measured:
        # the oracle ignores compaction and the static ratio, and runs under
        # the same engine rules as the layout it scores
        engine = effective_engine(config.scheduler.engine, config.layout)
        # the oracle scores memory only: the cost model runs it, also for a real
        # replay on the cost clock
        oracle_config = config.with_(layout="oracle", compaction="lazy", static_ratio=None, engine=engine,
                                     executor="cost", weights=None, device="cpu", dtype=None,
                                     real_clock="measured", decode_graphs=False,
                                     compile_decode=False, compile_prefill=False,
                                     prefill_graphs=False)
        with progress_bar("oracle", show=show) as progress:
            oracle = run(oracle_config, progress=progress)
        result.summary.update(capacity_efficiency(result.summary, oracle.summary))
    figures: list[Path] = []
    draw = None if args.no_figures else (lambda staged: figures.extend(p.name for p in run_figures(staged)))
    out = write_run(result, args.out, args.format, extra=draw)
    if not args.quiet:
        print_summary(result.summary, result.identity, result.wall_s)
        for name in figures:
            print(f"  figure: {out / name}")
        print(f"  tables and summary: {out}")
    if result.violations:
        print(f"  INVARIANT VIOLATIONS: {result.violations[:5]}", file=sys.stderr)
        return 1
    return 0


def grid(config: RunConfig, layouts: Sequence[str], compactions: Sequence[str],
         static_ratios: Sequence[float | None]) -> list[tuple[str, RunConfig]]:
    """(label, config) for every layout x compaction (x fixed ratio), under
    each engine's rules (`sim.engines`): with `scheduler.engine` unset, every
    engine-baseline layout in `layouts` brings its engine, and the other
    layouts run once under each (labels get "@engine" when there are several);
    with none, under unikv's rules.

    Raises:
        ValueError: a fixed ratio `RunConfig` refuses (not finite, <= 0).
    """
    engines = _grid_engines(config, layouts)
    out = []
    for engine in engines:
        cfg = config.with_(engine=engine)
        tag = f"@{engine}" if len(engines) > 1 else ""
        for layout in layouts:
            if ENGINE_OF_LAYOUT.get(layout, engine) != engine:
                continue  # another engine's baseline: it runs in that engine's group
            own = "" if layout in ENGINE_OF_LAYOUT else tag  # a baseline names its engine already
            out.extend((label + own, c) for label, c in _layout_runs(cfg, layout, compactions,
                                                                       static_ratios))
    return out


def _grid_engines(config: RunConfig, layouts: Sequence[str]) -> list:
    if config.scheduler.engine is not None:
        return [config.scheduler.engine]
    engines = list(dict.fromkeys(ENGINE_OF_LAYOUT[x] for x in layouts if x in ENGINE_OF_LAYOUT))
    return engines or [None]


def _layout_runs(config: RunConfig, layout: str, compactions: Sequence[str],
                 static_ratios: Sequence[float]) -> list[tuple[str, RunConfig]]:
    if layout == "fixed_ratio":
        return [("fixed_ratio" if r is None else f"fixed_ratio@{r:g}",
                 config.with_(layout="fixed_ratio", static_ratio=r, compaction="lazy"))
                for r in static_ratios or [None]]
    if layout in ("oracle", *ENGINE_OF_LAYOUT):
        return [(layout, config.with_(layout=layout, compaction="lazy"))]
    return [(f"{layout}/{c}", config.with_(layout=layout, compaction=c)) for c in compactions]


def default_layouts(model, static_ratios: Sequence[float]) -> list[str]:
    """The layouts `unikv compare` runs for `model` unless told: those that
    apply, the fixed_ratio split only when ratios are swept."""
    kinds = applicable_kinds(model)
    return [k for k in kinds if k != "fixed_ratio" or static_ratios]


def compare(argv: Sequence[str] | None = None) -> int:
    """`unikv compare ARGV`; returns the exit status: 0 every cell ran
    clean, 1 a cell reported invariant violations, 3 (else) a cell could
    not run (its row says why), 2 bad input (nothing run)."""
    from unikv.cli import guarded

    return guarded(_compare, sys.argv[1:] if argv is None else argv)


def _compare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unikv compare",
                                     description="replay one trace against a grid of layouts x compaction modes")
    # the grid sets layout, compaction and static ratio per cell (--static-ratios sweeps the last)
    _add_config_options(parser, skip=("layout", "compaction", "static_ratio"))
    parser.add_argument("--models", nargs="+", default=None,
                        help="several models on the same trace, one table (overrides --model); each runs the "
                             "layouts applicable to it, so a 2-kind and a 3-kind model show all four layouts")
    parser.add_argument("--layouts", nargs="+", default=None, choices=LAYOUTS,
                        help=f"default: those applicable of {LAYOUTS} (fixed_ratio only with --static-ratios)")
    parser.add_argument("--compactions", nargs="+", default=list(COMPACTIONS), choices=COMPACTIONS)
    parser.add_argument("--static-ratios", nargs="*", type=float, default=[],
                        help="fixed_ratio split ratios to sweep (adds the fixed_ratio layout at its "
                             "default ratio and these)")
    parser.add_argument("--out", type=Path, default=Path("runs/compare"),
                        help="output folder, replaced whole when the comparison is written")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    _add_quiet(parser, "comparison table")
    return parser


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """One run of a comparison: its model, label, config, and why it
    cannot run (None: it can)."""

    model: str
    label: str
    config: RunConfig
    skip_reason: str | None = None


def plan_grid(args: argparse.Namespace) -> tuple[list[Cell], pd.DataFrame, object]:
    """Every cell of the comparison, checked before the first one runs.

    Returns:
        (cells, the trace's requests, the hardware spec), loaded once.

    Raises:
        ValueError / OSError: bad input anywhere in the grid (an option,
            a model, a static ratio, the trace, the hardware, --out).
    """
    from unikv.sim.outdir import check_out_dir
    from unikv.sim.run import load_hardware, load_trace

    base = _config(args, layout="oracle")
    check_out_dir(args.out)
    models = {name: load_model(name) for name in (args.models or [base.model])}
    hw = load_hardware(base)  # --gpu NAME or --hardware NAME_OR_FILE
    df = load_trace(base)
    cells = []
    for name, model in models.items():
        layouts = list(args.layouts or default_layouts(model, args.static_ratios))
        if "oracle" not in layouts:
            layouts.append("oracle")
        for label, cfg in grid(base.with_(model=name), layouts, args.compactions,
                               [None] + list(args.static_ratios)):
            cells.append(Cell(model=name, label=label, config=cfg, skip_reason=cell_problem(cfg, df)))
    return cells, df, hw


def cell_problem(config: RunConfig, df: pd.DataFrame) -> str | None:
    """Why the cell `config` cannot run on the requests `df` (its layout
    does not apply to the model, the engine rules' running cap is 0, or,
    with oversize="error", it cannot hold the longest request), or None.

    Raises:
        ValueError: a budget this host cannot simulate (`check_host_memory`):
            bad input for the whole grid, not one cell.
    """
    from unikv.sim.layouts import RequestTooLargeError, check_fits
    from unikv.sim.run import check_host_memory, engine_model, layout_plan

    state, model = engine_model(config)  # as `sim.run` holds the run to them
    try:
        plan = layout_plan(config, model)
        plan.max_running(config.scheduler.max_running, state.state_slots_per_request)
    except ValueError as exc:
        return " ".join(str(exc).split())
    check_host_memory(plan, config.kv_budget_gib)
    try:
        if config.oversize == "error":
            longest = int((df["prompt_tokens"] + df["output_tokens"]).max())
            check_fits(plan, longest, prefill_chunk_tokens=config.scheduler.prefill_tokens_per_step,
                       compaction=config.compaction, state_slots_per_request=state.state_slots_per_request)
    except RequestTooLargeError as exc:
        return " ".join(f"cannot hold the trace's longest request: {exc}".split())
    return None


def _compare(argv: Sequence[str]) -> int:
    from unikv.sim.figures import comparison
    from unikv.sim.outdir import staged_dir
    from unikv.sim.run import run, write_run

    args = _compare_parser().parse_args(argv)
    show = show_progress(args.quiet)
    cells, df, hw = plan_grid(args)
    several = len({c.model for c in cells}) > 1
    results: dict[tuple[str, str], RunResult] = {}
    with staged_dir(args.out) as staged:
        for cell in cells:
            if cell.skip_reason is not None:
                continue
            label = f"{cell.model} {cell.label}" if several else cell.label
            with progress_bar(label, show=show) as progress:
                result = run(cell.config, progress=progress, trace_df=df, hw=hw)
            results[cell.model, cell.label] = result
            sub = staged / _safe_name(cell.model) if several else staged
            write_run(result, sub / cell.label.replace("/", "_").replace("@", "_"), args.format)
        table = pd.concat([comparison_table(cells, results, m) for m in dict.fromkeys(c.model for c in cells)],
                          ignore_index=True)
        _write_comparison(table, staged, f"{', '.join(dict.fromkeys(c.model for c in cells))} | "
                                         f"{Path(str(cells[0].config.trace)).name}", comparison)
    if not args.quiet:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(table.to_string(index=False))
        print(f"\nwritten: {args.out / 'comparison.csv'}, comparison.md, comparison.png")
    for cell in cells:
        if cell.skip_reason is not None:
            print(f"skipped {cell.model} {cell.label}: {cell.skip_reason}", file=sys.stderr)
    if (table["status"] == "violations").any():
        return 1
    return 3 if (table["status"] == "skipped").any() else 0


def _safe_name(model: str) -> str:
    """A folder name for `model` (a bundled name, or a config path)."""
    return model.strip("/").replace("/", "_").replace("\\", "_") or "model"


def _write_comparison(table: pd.DataFrame, out: Path, title: str, draw) -> None:
    table.to_csv(out / "comparison.csv", index=False)
    (out / "comparison.md").write_text(table.to_markdown(index=False, floatfmt=".4g")
                                       if _has_tabulate() else table.to_string(index=False))
    draw(table[table["status"] != "skipped"], out / "comparison.png", title)


COMPARE_COLUMNS = ["model", "label", "layout", "compaction", "engine", "status", "reason",
                   "capacity_efficiency", "throughput_efficiency", "mean_running", "throughput_tok_s",
                   "admission_rate", "ttft_p50_s", "ttft_p90_s", "tpot_mean_s", "retractions", "rejected",
                   "mean_available_tokens",
                   "mean_hole_ratio", "mean_unusable_free_ratio", "moves", "moved_bytes",
                   "compaction_overhead", "wall_s"]
"""Columns of comparison.csv. status: "ok", "violations" (the run broke an
invariant: see its summary.json) or "skipped" (reason: why it could not run)."""


def comparison_table(cells: Sequence[Cell], results: dict, model: str) -> pd.DataFrame:
    """One row per cell of `model`, in grid order; metrics of the cells
    that ran, capacity efficiency against that model's oracle run under the
    same engine rules."""
    from unikv.sim.summary import capacity_efficiency

    oracles = {res.config.scheduler.engine: res for (m, _), res in results.items()
               if m == model and res.config.layout == "oracle"}
    rows = []
    for cell in (c for c in cells if c.model == model):
        row = {"model": model, "label": cell.label, "layout": cell.config.layout,
               "compaction": cell.config.compaction, "engine": cell.config.scheduler.engine}
        res = results.get((model, cell.label))
        if res is None:
            rows.append({**row, "status": "skipped", "reason": cell.skip_reason})
            continue
        s = dict(res.summary)
        oracle = oracles.get(res.config.scheduler.engine)
        if oracle is not None:
            s.update(capacity_efficiency(s, oracle.summary))
        rows.append({**row, "status": "violations" if res.violations else "ok",
                     "reason": "; ".join(res.violations[:3]), "wall_s": res.wall_s,
                     **{k: s.get(k) for k in COMPARE_COLUMNS if k in s}})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
