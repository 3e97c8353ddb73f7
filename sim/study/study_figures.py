"""The study report's figures, drawn from the dataset's rows alone
(docs/studies.md, "Report"); never inside a run.

Every figure holds one group of rows sharing trace, model, GPU and budget
(the caller passes the title naming them) and draws one series per cell
label (`end_end/lazy`, `sglang`, ...), against the request rate the rows
carry (`rate_rps_column`: the offered rate when the dataset has it).
Capacity over time reuses `unikv.sim.figures.capacity_over_time`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from unikv.sim import figures as run_figures  # noqa: E402

LATENCIES = (("ttft_p50_s", "TTFT p50", "-"), ("ttft_p90_s", "TTFT p90", "--"),
             ("tpot_p50_s", "TPOT p50", "-"), ("tpot_mean_s", "TPOT mean", "-"),
             ("tpot_p90_s", "TPOT p90", "--"))
"""Latency columns drawn, when present (the run summary has no TPOT p50:
its mean stands in, labelled as such)."""


def _series(rows: pd.DataFrame, x: str):
    for label, part in rows.groupby("label", sort=True):
        yield str(label), part.sort_values(x, kind="stable")


def _targets(rows: pd.DataFrame, metric: str) -> dict[str, float]:
    """The study's targets on `metric` ("ttft" / "tpot"), from the target_* columns."""
    out = {}
    for col in rows.columns:
        if col.startswith(f"target_{metric}_") and rows[col].notna().any():
            out[col[len("target_"):]] = float(rows[col].dropna().iloc[0])
    return out


def latency_vs_rate(rows: pd.DataFrame, *, x: str, x_label: str, title: str, path: Path) -> Path:
    """TTFT (p50, p90) and TPOT (p50 or mean, p90) against the rate, one
    colour per label; the study's targets as grey lines."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        cols = [c for c in LATENCIES if c[0].startswith(metric) and c[0] in rows.columns]
        if metric == "tpot" and any(c[0] == "tpot_p50_s" for c in cols):
            cols = [c for c in cols if c[0] != "tpot_mean_s"]
        handles = []
        for i, (label, part) in enumerate(_series(rows, x)):
            for j, (col, _, style) in enumerate(cols):
                line, = ax.plot(part[x], part[col], style, marker="o", ms=3, color=f"C{i}")
                if j == 0:
                    handles.append(Line2D([], [], color=line.get_color(), label=label))
        # one entry per layout (colour) and one per statistic (line style)
        handles += [Line2D([], [], color="black", ls=style, label=name) for _, name, style in cols]
        for name, value in _targets(rows, metric).items():
            ax.axhline(value, color="grey", lw=0.8, ls=":")
            ax.annotate(f"target {name}", (1, value), xycoords=("axes fraction", "data"), fontsize=7,
                        ha="right", va="bottom", color="grey")
        _rate_axis(ax, rows[x], x_label)
        ax.set_ylabel(f"{metric.upper()} (s)")
        ax.set_yscale("log")
        ax.legend(handles=handles, fontsize=6, ncol=2)
    fig.suptitle(f"latency against request rate: {title}", fontsize=10, wrap=True)
    return _save(fig, path)


def attainment_vs_rate(rows: pd.DataFrame, *, x: str, x_label: str, title: str, path: Path) -> Path:
    """Objective attainment (share of requests within every target) and
    goodput against the rate; a filled marker where every percentile
    target holds, a hollow one where one misses."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (label, part) in enumerate(_series(rows, x)):
        met = part["objectives_met"].astype(bool)
        for ax, col in ((a1, "objective_attainment"), (a2, "goodput_rps")):
            ax.plot(part[x], part[col], "-", color=f"C{i}", label=label)
            ax.plot(part.loc[met, x], part.loc[met, col], "o", color=f"C{i}", ms=5)
            ax.plot(part.loc[~met, x], part.loc[~met, col], "o", mfc="none", color=f"C{i}", ms=5)
    a1.set_ylabel("objective attainment (share of requests)")
    a1.set_ylim(-0.02, 1.02)
    a2.set_ylabel("goodput (requests/s within objectives)")
    for ax in (a1, a2):
        _rate_axis(ax, rows[x], x_label)
        ax.legend(fontsize=7)
    fig.suptitle(f"objective attainment against request rate (filled: every target holds): {title}",
                 fontsize=10, wrap=True)
    return _save(fig, path)


def max_rate_bars(answers: pd.DataFrame, gains: Mapping[str, str], *, y_label: str, title: str,
                  path: Path) -> Path:
    """One bar per label: the maximum rate within objectives (`value`);
    a whisker up to the first rate that missed (`miss`); a note where the
    top rate run still met them, or where even the lowest missed; the
    unified layouts' gain over the best deployable baseline under their names."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.7 * len(answers) + 1), 4.6))
    ticks = []
    for i, r in enumerate(answers.itertuples()):
        value = 0.0 if r.value is None or math.isnan(r.value) else r.value
        ax.bar(i, value, color=f"C{i}")
        if r.outcome == "found":
            ax.errorbar(i, value, yerr=[[0], [r.miss - value]], color="black", capsize=3, lw=0.8)
        note = {"all": "still met at\nthe top rate run", "none": "none met"}.get(r.outcome)
        if note:
            ax.annotate(note, (i, value), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 4), textcoords="offset points")
        gain = gains.get(r.label)
        ticks.append(f"{r.label}\n" + gain.replace("; ", "\n") if gain else str(r.label))
    ax.set_xticks(range(len(answers)), ticks, fontsize=7)
    ax.set_ylabel(y_label)
    ax.margins(y=0.15)
    ax.set_title(f"maximum rate within objectives (whisker: first rate run that missed; "
                 f"under a unified layout: its gain)\n{title}", fontsize=9, wrap=True)
    return _save(fig, path)


def _rate_axis(ax, rates: pd.Series, label: str) -> None:
    """Label the rate axis; logarithmic when the rates span more than 20x."""
    ax.set_xlabel(label)
    low, high = rates.min(), rates.max()
    if low > 0 and high / low > 20:
        ax.set_xscale("log")


def capacity_over_time(steps: pd.DataFrame, *, title: str, path: Path) -> Path:
    """One run's capacity over time (`unikv.sim.figures.capacity_over_time`)."""
    return run_figures.capacity_over_time(steps, f"capacity over time: {title}", path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
