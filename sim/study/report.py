"""`unikv study report STUDY.toml`: the planner's answers as markdown and
figures, from the study's dataset alone (docs/studies.md, "Report").

Nothing is replayed here: the maximum rate of each (trace, model, GPU,
budget, layout) is read from the rates the dataset holds
(`answers.known_threshold`), the smallest budget from the budgets it holds,
and the capacity figure from a per-step table the study kept
(`steps/<run_id>.parquet` beside the dataset), if any.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pandas as pd
from unikv.sim.study import answers as ans
from unikv.sim.study import study_figures as figs

if sys.version_info >= (3, 11):
    import tomllib
else:  # the study extra installs tomli there (as sim.study.spec reads it)
    import tomli as tomllib

DATASET = "study.parquet"
STEPS = "steps"
REPORT = "report.md"
ANSWERS = "answers.parquet"
FIGURES = "figures"
DEFAULT_ROOT = Path("runs/studies")  # beside `unikv replay`'s runs/replay

GROUP = ("trace", "trace_start_s", "trace_end_s", "max_requests", "max_context_tokens", "rate_rps",
         "spread_s", "model", "kv_cache_dtype", "gpu", "kv_budget_gib", "budget_rule", "seed", "oversize")
"""What one figure / answer holds fixed (with every `sched_*` column but
`sched_engine`): the same trace, model, GPU, budget and scheduler for every
layout. The engine whose state rules a unified layout ran under stays a
series of the group (`end_end/lazy@sglang`), so that its gain is over the
best deployable baseline of either engine."""
ENGINE = "sched_engine"
RATE_AXES = (("offered_rate_rps", "request rate (req/s, offered)"),
             ("target_rate_rps", "request rate (req/s, as asked)"),
             ("rate_scale", "rate scale (x the trace's arrivals)"))


def read_dataset(study_dir: Path) -> pd.DataFrame:
    """The study's rows (`study_dir/study.parquet`).

    Raises:
        FileNotFoundError: no dataset there (the message names the path).
    """
    path = Path(study_dir) / DATASET
    if not path.exists():
        raise FileNotFoundError(f"no study dataset at {path}; run `unikv study run` first "
                                "or give the folder it wrote (--out)")
    return pd.read_parquet(path)


def served(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of finished runs, with their objective columns.

    Raises:
        ValueError: the dataset has no objective columns or misses a column
            the report needs.
    """
    need = ("label", "layout", "rate_scale", "objectives_met", "goodput_rps", "objective_attainment")
    missing = [c for c in need if c not in df.columns]
    if missing:
        hint = " (give the study an [objectives] table)" if "objectives_met" in missing else ""
        raise ValueError(f"dataset lacks column(s) {', '.join(missing)}{hint}")
    ok = df["status"] == "ok" if "status" in df.columns else pd.Series(True, index=df.index)
    return df[ok & df["objectives_met"].notna()].copy()


def group_keys(df: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    keys = [c for c in GROUP if c in df.columns] + sorted(c for c in df.columns
                                                         if c.startswith("sched_") and c != ENGINE)
    return [k for k in keys if k not in drop]


def groups(df: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[tuple[dict, pd.DataFrame]]:
    keys = group_keys(df, drop)
    if not keys:
        return [({}, df)]
    return [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), part)
            for k, part in df.groupby(keys, dropna=False, sort=True)]


def rate_axis(rows: pd.DataFrame) -> tuple[str, str]:
    """The rate column figures use (and its axis label): the offered rate
    when every row has one, else the asked rate, else the rate scale."""
    for col, label in RATE_AXES:
        if col in rows.columns and rows[col].notna().all():
            return col, label
    return RATE_AXES[-1]


def title(key: dict) -> str:
    """"trace [window] | model | GPU | budget" for a group key."""
    trace = Path(str(key.get("trace", "?"))).name
    start, end = key.get("trace_start_s"), key.get("trace_end_s")
    if _given(end) or (_given(start) and start):
        trace += f" [{_fmt(start or 0)}-{_fmt(end) if _given(end) else 'end'} s]"
    budget = key.get("kv_budget_gib")
    rule = key.get("budget_rule")
    kv = f"{_fmt(budget)} GiB KV" + (f" ({rule})" if _given(rule) and rule != "explicit" else "")
    return f"{trace} | {key.get('model', '?')} | {key.get('gpu', '?')} | {kv}"


def label_answers(rows: pd.DataFrame) -> pd.DataFrame:
    """Per label of one group: the maximum rate the rows give, as a rate
    scale and in requests per second (rate scale x the trace's offered
    rate per unit scale, when the dataset has the offered rate)."""
    out = []
    for label, part in rows.groupby("label", sort=True):
        t = ans.known_threshold(part, column="rate_scale")
        per_scale = _rps_per_scale(part)
        engine = part[ENGINE].iloc[0] if ENGINE in part.columns else None
        out.append({"label": label, "layout": part["layout"].iloc[0], "engine": engine,
                    "outcome": t.outcome.value,
                    "value": t.value, "miss": t.miss, "gap": t.rel_tol, "runs": len(part),
                    "value_rps": _times(t.value, per_scale), "miss_rps": _times(t.miss, per_scale),
                    "inversions": t.inversions, "threshold": t})
    return pd.DataFrame(out)


def gain_notes(answers: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """`answers.unified_gain` over the labels (the best of every deployable
    baseline), its `same_rules_gain` over the baseline of the engine whose
    rules the unified run followed, and a short note per unified label."""
    layout = dict(zip(answers["label"], answers["layout"]))
    maxima = dict(zip(answers["label"], answers["threshold"]))
    baselines = [lb for lb, lo in layout.items() if lo in ans.DEPLOYABLE_BASELINES]
    gains = ans.unified_gain(maxima, unified=[lb for lb, lo in layout.items() if lo in ans.UNIFIED_LAYOUTS],
                             baselines=baselines)
    engine = dict(zip(answers["label"], answers["engine"]))
    same = []
    for g in gains.itertuples():
        own = [b for b in baselines if layout[b] == engine.get(g.layout)]
        one = ans.unified_gain(maxima, unified=[g.layout], baselines=own) if own else None
        same.append(one["gain"].iloc[0] if one is not None and len(one) else math.nan)
    gains = gains.assign(same_rules_gain=same)
    notes = {}
    outcome = dict(zip(answers["label"], answers["outcome"]))
    for g in gains.itertuples():
        if outcome[g.layout] == outcome[g.baseline] == ans.Outcome.NONE.value:
            notes[g.layout] = f"n/a: neither it nor {g.baseline} met the objectives at any rate run"
            continue
        exact = "" if math.isnan(g.gain) else f"x{g.gain:.2f} "
        note = f"{exact}[{_fmt(g.gain_low)}, {_fmt(g.gain_high)}] vs {g.baseline}"
        if not math.isnan(g.same_rules_gain) and engine.get(g.layout) != g.baseline:
            note += f"; x{g.same_rules_gain:.2f} vs {engine[g.layout]}"
        notes[g.layout] = note
    return gains, notes


def budget_answers(rows: pd.DataFrame) -> pd.DataFrame:
    """The smallest budget the rows show sustaining each rate run at two
    budgets or more, per label (`answers.known_threshold` on the budget)."""
    out = []
    for key, part in groups(rows, drop=("kv_budget_gib", "budget_rule")):
        for (label, _scale), cell in part.groupby(["label", "rate_scale"], sort=True):
            if cell["kv_budget_gib"].nunique() < 2:
                continue
            t = ans.known_threshold(cell, column="kv_budget_gib", side=ans.Side.ABOVE)
            x, _ = rate_axis(cell)
            out.append({"group": title({**key, "kv_budget_gib": None}).rsplit(" | ", 1)[0],
                        "label": label, "rate": _fmt(cell[x].median()), "outcome": t.outcome.value,
                        "min_budget_gib": t.value, "largest_missing_gib": t.miss,
                        "budgets": cell["kv_budget_gib"].nunique()})
    return pd.DataFrame(out)


def _given(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _fmt(v) -> str:
    if not _given(v):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:.3g}" if isinstance(v, (int, float)) else str(v)


def _rps_per_scale(rows: pd.DataFrame) -> float | None:
    if "offered_rate_rps" not in rows.columns or rows["offered_rate_rps"].isna().any():
        return None
    return float((rows["offered_rate_rps"] / rows["rate_scale"]).median())


def _times(v, factor: float | None):
    return None if v is None or factor is None else v * factor


def md_table(df: pd.DataFrame) -> str:
    """A markdown table of `df` (cells through `_fmt`)."""
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |"
            for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _goodput_table(rows: pd.DataFrame, x: str) -> pd.DataFrame:
    """Rate x label: "goodput (attainment %)", a * where every percentile target holds."""
    cells = rows.assign(cell=[f"{g:.3g} ({100 * a:.0f}%){'*' if m else ''}" for g, a, m in
                              zip(rows["goodput_rps"], rows["objective_attainment"], rows["objectives_met"])])
    table = cells.pivot_table(index=x, columns="label", values="cell", aggfunc="first").reset_index()
    table.columns.name = None
    return table


def _answers_table(answers: pd.DataFrame, notes: dict[str, str]) -> pd.DataFrame:
    shown = answers[["label", "outcome", "value", "miss", "value_rps", "miss_rps", "runs"]].copy()
    shown.columns = ["label", "outcome", "max scale", "first miss scale", "max rate (req/s)",
                     "first miss (req/s)", "runs"]
    shown["monotone"] = ["yes" if not inv else f"no: {inv}" for inv in answers["inversions"]]
    shown["gain vs best baseline"] = [notes.get(lb, "") for lb in answers["label"]]
    return shown


def group_section(key: dict, rows: pd.DataFrame, fig_dir: Path, slug: str) -> tuple[list[str], pd.DataFrame]:
    """One group's markdown (answers, gains, goodput, figures) and its answers."""
    name = title(key)
    x, x_label = rate_axis(rows)
    answers = label_answers(rows)
    gains, notes = gain_notes(answers)
    y_label = "max rate (req/s)" if answers["value_rps"].notna().any() else "max rate scale"
    bars = answers.assign(value=answers["value_rps"], miss=answers["miss_rps"]) \
        if y_label.endswith("(req/s)") else answers
    paths = [
        figs.latency_vs_rate(rows, x=x, x_label=x_label, title=name, path=fig_dir / f"{slug}_latency.png"),
        figs.attainment_vs_rate(rows, x=x, x_label=x_label, title=name,
                                path=fig_dir / f"{slug}_attainment.png"),
        figs.max_rate_bars(bars, notes, y_label=y_label, title=name, path=fig_dir / f"{slug}_max_rate.png"),
    ]
    lines = [f"## {name}", "", "### Maximum rate within objectives", "", md_table(_answers_table(answers, notes)),
             ""]
    if any(not note.startswith("n/a") for note in notes.values()):
        lines += ["Unified gain (maximum rate over the best deployable baseline's; the range "
                  "follows from each rate's bracket): " +
                  "; ".join(f"{lb} {note}" for lb, note in notes.items()) + ".", ""]
    lines += ["### Goodput at each rate", "",
              "Goodput in requests/s within the objectives (attainment in brackets; * where every "
              "percentile target holds).", "", md_table(_goodput_table(rows, x)), ""]
    lines += [f"![{p.stem}]({FIGURES}/{p.name})" for p in paths] + [""]
    gain_cols = gains.rename(columns={"layout": "label"})[
        ["label", "baseline", "gain", "gain_low", "gain_high", "same_rules_gain"]] if not gains.empty else None
    if gain_cols is not None:
        answers = answers.merge(gain_cols, on="label", how="left")
    return lines, answers.assign(**key)


TARGET = re.compile(r"^target_((ttft|tpot)_(p\d+(\.\d+)?_)?s)$")
"""A target column (`target_ttft_p90_s`, `target_tpot_s`); not `target_rate_rps`."""


def _objective_lines(df: pd.DataFrame) -> list[str]:
    targets = {m[1]: df[c].dropna().iloc[0] for c in df.columns
               if (m := TARGET.match(c)) and df[c].notna().any()}
    shown = ", ".join(f"{k} <= {_fmt(v)}" for k, v in sorted(targets.items())) or "(not recorded)"
    return [f"Objectives: {shown}. A request meets them when it finished, was not rejected and is "
            "within every per-request target; the maximum rate is the highest rate run at which every "
            "percentile target holds, below the lowest rate run that missed (nearest-rank percentiles "
            "over every request, a missed request counting as +inf: `unikv.sim.objectives`). Read from "
            "the runs present (nothing is replayed); monotone attainment is assumed, and every pair of "
            "rates contradicting it is listed.", ""]


def capacity_section(df: pd.DataFrame, answers: pd.DataFrame, study_dir: Path, fig_dir: Path,
                     run_id: str | None) -> list[str]:
    """Capacity over time of `run_id`, or of the first unified run at its
    maximum rate whose per-step table was kept."""
    steps_dir = Path(study_dir) / STEPS
    wanted = [run_id] if run_id else _capacity_candidates(df, answers)
    lines = ["## Capacity over time", ""]
    for rid in wanted:
        path = steps_dir / f"{rid}.parquet"
        if path.exists() and "run_id" in df.columns and (df["run_id"] == rid).any():
            row = df[df["run_id"] == rid].iloc[0]
            name = f"{row['label']} at scale {_fmt(row['rate_scale'])} | " + title(row.to_dict())
            fig = figs.capacity_over_time(pd.read_parquet(path), title=name, path=fig_dir / f"capacity_{rid}.png")
            return lines + [f"Run `{rid}` ({name}).", "", f"![capacity]({FIGURES}/{fig.name})", ""]
    which = f"run {run_id!r}" if run_id else "any run"
    return lines + [f"No per-step table kept for {which} (`{STEPS}/<run_id>.parquet` beside the dataset).", ""]


def _capacity_candidates(df: pd.DataFrame, answers: pd.DataFrame) -> list[str]:
    if "run_id" not in df.columns or answers.empty:
        return []
    out = []
    for a in answers[answers["layout"].isin(ans.UNIFIED_LAYOUTS)].itertuples():
        if a.value is not None:
            hit = df[(df["label"] == a.label) & ((df["rate_scale"] - a.value).abs() <= 1e-9 * a.value)]
            out += list(hit["run_id"])
    return out + list(df["run_id"])


def _unfinished_lines(df: pd.DataFrame) -> list[str]:
    if "status" not in df.columns or (df["status"] == "ok").all():
        return []
    bad = df[df["status"] != "ok"]
    cols = [c for c in ("run_id", "status", "label", "model", "kv_budget_gib", "rate_scale", "reason")
            if c in bad.columns]
    return ["## Runs that did not finish", "", f"{len(bad)} run(s), left out of every answer above.", "",
            md_table(bad[cols]), ""]


def write_report(df: pd.DataFrame, out_dir: Path, *, study_dir: Path | None = None,
                 run_id: str | None = None, name: str | None = None) -> Path:
    """Write `out_dir/report.md` and `out_dir/figures/*.png` from the rows `df`.

    Args:
        study_dir: where per-step tables are looked for (default `out_dir`).
        run_id: the run whose capacity over time is drawn (default: see
            `capacity_section`).

    Also writes `out_dir/answers.parquet` (`answers_frame`).

    Returns:
        The report's path.

    Raises:
        ValueError: no finished run with objective columns.
    """
    out_dir = Path(out_dir)
    rows = served(df)
    if rows.empty:
        raise ValueError("the dataset holds no finished run with objective columns; nothing to report")
    fig_dir = out_dir / FIGURES
    fig_dir.mkdir(parents=True, exist_ok=True)
    counts = df["status"].value_counts().to_dict() if "status" in df.columns else {"ok": len(df)}
    lines = [f"# Study report: {name or (df['study'].iloc[0] if 'study' in df.columns else 'study')}", "",
             f"{len(df)} runs ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); "
             f"schema version {_fmt(df['schema_version'].iloc[0]) if 'schema_version' in df.columns else '-'}.",
             "", *_objective_lines(df)]
    all_answers = []
    for i, (key, part) in enumerate(groups(rows)):
        section, answers = group_section(key, part, fig_dir, f"g{i:02d}")
        lines += section
        all_answers.append(answers)
    budgets = budget_answers(rows)
    if not budgets.empty:
        lines += ["## Smallest KV budget sustaining a rate", "", md_table(budgets), ""]
    every = pd.concat(all_answers, ignore_index=True)
    lines += capacity_section(df, every, study_dir or out_dir, fig_dir, run_id)
    lines += _unfinished_lines(df)
    answers_frame(every).to_parquet(out_dir / ANSWERS, index=False)
    path = out_dir / REPORT
    path.write_text("\n".join(lines))
    return path


def answers_frame(answers: pd.DataFrame) -> pd.DataFrame:
    """The answers as a table (`answers.parquet`): one row per group key
    and label, the maximum rate as a scale (`max_rate_scale`, `miss_scale`)
    and in req/s, the gap left, whether the rows were monotone, the gain."""
    out = answers.drop(columns=["threshold"]).rename(columns={
        "value": "max_rate_scale", "miss": "miss_scale", "value_rps": "max_rate_rps",
        "miss_rps": "miss_rps", "gap": "rel_gap"})
    out["monotone"] = [not inv for inv in out["inversions"]]
    out["inversions"] = [repr(list(inv)) if inv else None for inv in out["inversions"]]
    return out


def study_dir_of(study_path: Path) -> Path:
    """The folder `unikv study run` writes by default: runs/studies/<study.name>.

    Raises:
        ValueError: the file is no TOML or has no `[study] name`.
        OSError: the file cannot be read.
    """
    try:
        data = tomllib.loads(Path(study_path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{study_path}: not a TOML study file: {exc}") from None
    name = data.get("study", {}).get("name") if isinstance(data.get("study"), dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"study.name={name!r} in {study_path}: expected the study's name (it names its folder)")
    return DEFAULT_ROOT / name


def main(study_path: Path, out_dir: Path | None = None, *, run_id: str | None = None) -> Path:
    """`unikv study report STUDY.toml [--out DIR]`: the report of the study
    whose `study run` wrote `out_dir` (default: runs/studies/<name>),
    written into that folder (report.md, figures/).

    Raises:
        FileNotFoundError: no dataset; ValueError: see `write_report`.
    """
    study_dir = Path(out_dir) if out_dir is not None else study_dir_of(study_path)
    return write_report(read_dataset(study_dir), study_dir, study_dir=study_dir, run_id=run_id)
