"""Figures of the analysis tables (they read tables, never run anything)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from unikv.sim.analyses.views import CASE_KEYS

LABEL_COLORS = {"static (default)": "#bbbbbb", "static (best of sweep)": "#666666",
                "end_end/lazy": "#1f77b4", "end_end/eager": "#aec7e8",
                "end_float_end/lazy": "#2ca02c", "end_float_end/eager": "#98df8a"}


def _figure(*args, **kwargs):
    import matplotlib.pyplot as plt
    import unikv.sim.figures  # noqa: F401  (selects the file-only backend)

    return plt.subplots(*args, **kwargs)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _case_label(row) -> str:
    return f"{row['trace']} | {row['model']} | {row['kv_budget_gib']:g} GiB"


def plot_layouts(table: pd.DataFrame, path: Path, metric: str = "capacity_efficiency") -> Path:
    """Grouped bars per case (a `headline` table): `metric` of each layout."""
    labels = [x for x in LABEL_COLORS if x in set(table["label"])]
    cases = table[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    fig, ax = _figure(figsize=(max(8, 0.75 * len(cases)), 6.5))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        rows = cases.merge(table[table["label"] == label], on=CASE_KEYS, how="left")
        ax.bar(np.arange(len(cases)) + i * width, rows[metric].fillna(0), width,
               color=LABEL_COLORS[label], label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="oracle")
    ax.set_xticks(np.arange(len(cases)) + width * (len(labels) - 1) / 2,
                  [_case_label(r) for _, r in cases.iterrows()], fontsize=6, rotation=90)
    ax.set_ylabel(metric.replace("_", " ") + " (vs oracle)")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    return _save(fig, path)


def plot_sweep(sweep: pd.DataFrame, table: pd.DataFrame, path: Path) -> Path:
    """Capacity efficiency of the static split vs its ratio, one panel per
    case; the default ratio as an open marker, the unified layout as a line."""
    sweep = sweep[sweep["role"] == "static_sweep"].pipe(lambda d: sweep.merge(
        d[CASE_KEYS].drop_duplicates(), on=CASE_KEYS))  # cases with a ratio to sweep
    cases = sweep[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    if cases.empty:
        fig, ax = _figure(figsize=(4, 2))
        ax.text(0.5, 0.5, "no static ratio to sweep", ha="center")
        return _save(fig, path)
    cols = min(4, len(cases))
    rows_n = -(-len(cases) // cols)
    fig, axes = _figure(rows_n, cols, figsize=(3.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax, (_, case) in zip(axes.flat, cases.iterrows()):
        mine = sweep.merge(case.to_frame().T, on=CASE_KEYS)
        x = mine["static_swa_full_tokens"].fillna(mine["static_mamba_full_memory"])
        ok = mine["error"].isna()
        sw = (mine["role"] == "static_sweep") & ok
        order = x[sw].sort_values().index
        ax.plot(x[order], mine.loc[order, "capacity_efficiency"], "o-", ms=3, color="#666666")
        dflt = (mine["role"] == "static_default") & ok
        ax.plot(x[dflt], mine.loc[dflt, "capacity_efficiency"], "o", mfc="none", color="red",
                label="default ratio")
        uni = table.merge(case.to_frame().T, on=CASE_KEYS)
        for _, u in uni[uni["label"].str.endswith("/lazy")].iterrows():
            ax.axhline(u["capacity_efficiency"], color=LABEL_COLORS.get(u["label"], "C0"), lw=1,
                       label=u["label"])
        ax.set_title(f"{case['trace']} | {case['model']}", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("static ratio (swa/full tokens, or mamba/full bytes)", fontsize=8)
    fig.supylabel("capacity efficiency vs oracle", fontsize=8)
    return _save(fig, path)


def plot_eager_lazy(table: pd.DataFrame, path: Path) -> Path:
    """Bytes moved and compaction overhead per case, eager vs lazy."""
    cases = table[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    fig, (a1, a2) = _figure(1, 2, figsize=(max(10, 1.2 * len(cases)), 6.5))
    x = np.arange(len(cases))
    for i, mode in enumerate(("eager", "lazy")):
        rows = cases.merge(table[table["compaction"] == mode], on=CASE_KEYS, how="left")
        color = "#aec7e8" if mode == "eager" else "#1f77b4"
        a1.bar(x + 0.4 * i, rows["moved_gib"], 0.4, color=color, label=mode)
        a2.bar(x + 0.4 * i, 100 * rows["compaction_overhead_all"], 0.4, color=color, label=mode)
    names = [_case_label(r) for _, r in cases.iterrows()]
    for ax, label in ((a1, "GiB moved"), (a2, "move time / busy time (%)")):
        ax.set_xticks(x + 0.2, names, fontsize=6, rotation=90)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    a1.set_yscale("symlog", linthresh=0.01)
    return _save(fig, path)


def plot_capacity_compared(results: dict, path: Path, title: str = "") -> Path:
    """Available tokens and running requests over time, one line per layout
    (a `capacity_study` result); admission stalls of each run as ticks."""
    fig, (a1, a2) = _figure(2, 1, figsize=(10, 5.5), sharex=True)
    for label, res in results.items():
        s = res.steps.iloc[:: max(1, len(res.steps) // 3000)]
        a1.plot(s["t_s"], s["available_tokens"], lw=0.8, label=label)
        a2.plot(s["t_s"], s["running"], lw=0.8, label=label)
    a1.set_ylabel("available tokens")
    a1.set_yscale("symlog")
    a2.set_ylabel("running requests")
    a2.set_xlabel("simulated time (s)")
    a1.set_title(title, fontsize=9)
    a1.legend(fontsize=7)
    return _save(fig, path)
