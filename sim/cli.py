"""`unikv replay` and `unikv compare`: thin wrappers over `sim.run`.

Every option is derived from `RunConfig` / `SchedulerConfig`, the one
source of defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd
from tqdm import tqdm
from unikv.sim.config import COMPACTIONS, LAYOUTS, OVERSIZE, RunConfig, SchedulerConfig
from unikv.sim.engines import ENGINE_OF_LAYOUT, effective_engine
from unikv.sim.layouts import applicable_kinds
from unikv.sim.models import load_model


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


_CHOICES = {"layout": LAYOUTS, "compaction": COMPACTIONS, "oversize": OVERSIZE}


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
    `show` (no bar and no per-request callback); the bar closes on exit.
    """
    if not show:
        yield None
        return
    bar = tqdm(desc=label, unit="req", file=sys.stderr, mininterval=0.2, dynamic_ncols=True)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
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
    ("capacity efficiency vs oracle", lambda s: f"{s.get('capacity_efficiency', math.nan):.3f}"),
    ("simulated time / steps", lambda s: f"{s['sim_time_s']:.1f} s / {s['steps']}"),
]


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
    from unikv.sim.figures import run_figures
    from unikv.sim.run import run, write_run
    from unikv.sim.summary import capacity_efficiency

    parser = argparse.ArgumentParser(prog="unikv replay", description="replay a trace against one layout")
    _add_config_options(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/replay"), help="output folder")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--no-oracle", action="store_true", help="skip the oracle run (no capacity efficiency)")
    parser.add_argument("--no-figures", action="store_true")
    _add_quiet(parser, "summary")
    args = parser.parse_args(argv)
    show = show_progress(args.quiet)
    try:
        config = _config(args)
        with progress_bar(config.layout, show=show) as progress:
            result = run(config, progress=progress)
        if not args.no_oracle and config.layout != "oracle":
            with progress_bar("oracle", show=show) as progress:
                # the oracle under the same engine rules as the layout it scores
                engine = effective_engine(config.scheduler.engine, config.layout)
                oracle = run(config.with_(layout="oracle", engine=engine), progress=progress)
            result.summary.update(capacity_efficiency(result.summary, oracle.summary))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = write_run(result, args.out, args.format)
    figures = [] if args.no_figures else run_figures(out)
    if not args.quiet:
        print_summary(result.summary, result.identity, result.wall_s)
        for path in figures:
            print(f"  figure: {path}")
        print(f"  tables and summary: {out}")
    if result.violations:
        print(f"  INVARIANT VIOLATIONS: {result.violations[:5]}", file=sys.stderr)
        return 1
    return 0


def grid(config: RunConfig, layouts: Sequence[str], compactions: Sequence[str],
         static_ratios: Sequence[float]) -> list[tuple[str, RunConfig]]:
    """(label, config) for every layout x compaction (x fixed ratio), under
    each engine's rules (`sim.engines`): with `scheduler.engine` unset, every
    engine-baseline layout in `layouts` brings its engine, and the other
    layouts run once under each (labels get "@engine" when there are several);
    with none, under unikv's rules."""
    engines = _grid_engines(config, layouts)
    out = []
    for engine in engines:
        cfg = config.with_(engine=engine)
        tag = f"@{engine}" if len(engines) > 1 else ""
        for layout in layouts:
            if ENGINE_OF_LAYOUT.get(layout, engine) != engine:
                continue  # another engine's baseline: it runs in that engine's group
            out.extend((label + tag, c) for label, c in _layout_runs(cfg, layout, compactions,
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
    from unikv.sim.figures import comparison
    from unikv.sim.run import run, write_run

    parser = argparse.ArgumentParser(prog="unikv compare",
                                     description="replay one trace against a grid of layouts x compaction modes")
    _add_config_options(parser, skip=("layout", "compaction"))
    parser.add_argument("--models", nargs="+", default=None,
                        help="several models on the same trace, one table (overrides --model); each runs the "
                             "layouts applicable to it, so a 2-kind and a 3-kind model show all four layouts")
    parser.add_argument("--layouts", nargs="+", default=None,
                        help=f"default: those applicable of {LAYOUTS} (fixed_ratio only with --static-ratios)")
    parser.add_argument("--compactions", nargs="+", default=list(COMPACTIONS), choices=COMPACTIONS)
    parser.add_argument("--static-ratios", nargs="*", type=float, default=[],
                        help="fixed_ratio split ratios to sweep (adds the fixed_ratio layout at its "
                             "default ratio and these)")
    parser.add_argument("--out", type=Path, default=Path("runs/compare"))
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    _add_quiet(parser, "comparison table")
    args = parser.parse_args(argv)
    show = show_progress(args.quiet)
    tables = []
    try:
        base = _config(args, layout="oracle")
        models = args.models or [base.model]
        for model in models:
            cfg = base.with_(model=model)
            layouts = list(args.layouts or default_layouts(load_model(model), args.static_ratios))
            bad = [x for x in layouts if x not in LAYOUTS]
            if bad:
                hint = " ('static' is now 'fixed_ratio')" if "static" in bad else ""
                raise ValueError(f"unknown layouts {bad}; valid layouts are {list(LAYOUTS)}{hint}")
            if "oracle" not in layouts:
                layouts.append("oracle")
            results = {}
            for label, c in grid(cfg, layouts, args.compactions, [None] + list(args.static_ratios)):
                with progress_bar(label if len(models) == 1 else f"{model} {label}", show=show) as progress:
                    results[label] = run(c, progress=progress)
                sub = args.out if len(models) == 1 else args.out / model
                write_run(results[label], sub / label.replace("/", "_").replace("@", "_"), args.format)
            tables.append((model, comparison_table(results), any(r.violations for r in results.values())))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = pd.concat([t.assign(model=m) for m, t, _ in tables], ignore_index=True)
    table = table[["model"] + [c for c in table.columns if c != "model"]]
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "comparison.csv", index=False)
    (args.out / "comparison.md").write_text(table.to_markdown(index=False, floatfmt=".4g")
                                            if _has_tabulate() else table.to_string(index=False))
    comparison(table, args.out / "comparison.png", f"{', '.join(m for m, _, _ in tables)} | "
                                                   f"{Path(str(base.trace)).name}")
    if not args.quiet:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(table.to_string(index=False))
        print(f"\nwritten: {args.out / 'comparison.csv'}, comparison.md, comparison.png")
    return 1 if any(bad for _, _, bad in tables) else 0


COMPARE_COLUMNS = ["label", "layout", "compaction", "engine", "capacity_efficiency", "throughput_efficiency",
                   "mean_running", "throughput_tok_s", "admission_rate", "ttft_p50_s", "ttft_p90_s",
                   "tpot_mean_s", "retractions", "rejected", "mean_available_tokens",
                   "mean_hole_ratio", "mean_unusable_free_ratio", "moves", "moved_bytes",
                   "compaction_overhead", "wall_s"]


def comparison_table(results: dict) -> pd.DataFrame:
    """One row per run; capacity efficiency against the oracle that ran
    under the same engine rules."""
    from unikv.sim.summary import capacity_efficiency

    oracles = {res.config.scheduler.engine: res for res in results.values()
               if res.config.layout == "oracle"}
    rows = []
    for label, res in results.items():
        s = dict(res.summary)
        oracle = oracles.get(res.config.scheduler.engine)
        if oracle is not None:
            s.update(capacity_efficiency(s, oracle.summary))
        rows.append({"label": label, "layout": res.config.layout, "compaction": res.config.compaction,
                     "engine": res.config.scheduler.engine,
                     "wall_s": res.wall_s, **{k: s.get(k) for k in COMPARE_COLUMNS if k in s}})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
