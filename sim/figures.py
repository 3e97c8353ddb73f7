"""Figures drawn from saved result files (never inside a simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

GIB = float(1 << 30)


def read_steps(run_dir: Path) -> pd.DataFrame:
    run_dir = Path(run_dir)
    for name in ("steps.parquet", "steps.csv"):
        path = run_dir / name
        if path.exists():
            return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    raise FileNotFoundError(f"no steps table in {run_dir}")


def _bands(steps: pd.DataFrame) -> list[str]:
    return [c[: -len("_live_bytes")] for c in steps.columns if c.endswith("_live_bytes") and c != "live_bytes"]


def _thin(steps: pd.DataFrame, points: int = 4000) -> pd.DataFrame:
    step = max(1, len(steps) // points)
    return steps.iloc[::step]


def capacity_over_time(steps: pd.DataFrame, title: str, path: Path) -> Path:
    """Stacked live / hole / pending bytes per band, the gap, and the free
    rest; admission stalls (requests waiting) shaded."""
    s = _thin(steps)
    t = s["t_s"]
    layers, labels = [], []
    for b in _bands(s):
        for kind in ("live", "hole", "pending"):
            col = f"{b}_{kind}_bytes"
            if s[col].any():
                layers.append(s[col] / GIB)
                labels.append(f"{b} {kind}")
    layers.append(s["gap_bytes"] / GIB)
    labels.append("gap")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.stackplot(t, *layers, labels=labels, alpha=0.85)
    # An admission stall: requests wait and none was admitted since the last row.
    stalled = (s["waiting"] > 0) & (s["admitted"].diff().fillna(1) == 0)
    if stalled.any():
        ax.fill_between(t, 0, 1, where=stalled, transform=ax.get_xaxis_transform(),
                        color="grey", alpha=0.12, label="admission stalled")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    return _save(fig, path)


def frontiers_over_time(steps: pd.DataFrame, title: str, path: Path) -> Path:
    """Each band's low and high byte over time."""
    s = _thin(steps)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for b in _bands(s):
        lo, hi = s[f"{b}_low_byte"] / GIB, s[f"{b}_high_byte"] / GIB
        line, = ax.plot(s["t_s"], lo, lw=0.8, label=f"{b} low")
        ax.plot(s["t_s"], hi, lw=0.8, ls="--", color=line.get_color(), label=f"{b} high")
        ax.fill_between(s["t_s"], lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("byte offset (GiB)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    return _save(fig, path)


def compaction_cost(steps: pd.DataFrame, title: str, path: Path) -> Path:
    """Cumulative page moves and bytes moved, and per-step overhead."""
    s = steps
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    a1.plot(s["t_s"], s["moved_bytes"].cumsum() / GIB, lw=1)
    a1.set_ylabel("GiB moved (cumulative)")
    a1.set_title(title)
    thin = _thin(s)
    a2.plot(thin["t_s"], 100 * thin["compaction_overhead"], lw=0.6)
    a2.set_ylabel("compaction / step time (%)")
    a2.set_xlabel("simulated time (s)")
    return _save(fig, path)


def run_figures(run_dir: Path) -> list[Path]:
    """The three figures of one run, written beside its tables."""
    run_dir = Path(run_dir)
    steps = read_steps(run_dir)
    ident = json.loads((run_dir / "summary.json").read_text())["identity"]
    name = f"{ident['model']} | {ident['layout']} ({ident['compaction']}) | {Path(ident['trace']).name}"
    return [
        capacity_over_time(steps, f"capacity over time: {name}", run_dir / "capacity_over_time.png"),
        frontiers_over_time(steps, f"band frontiers: {name}", run_dir / "frontiers.png"),
        compaction_cost(steps, f"compaction cost: {name}", run_dir / "compaction_cost.png"),
    ]


def comparison(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Bars per (layout, compaction): capacity efficiency, throughput, TTFT."""
    several = "model" in table and table["model"].nunique() > 1
    labels = [(f"{r.model}\n" if several else "") + f"{r.layout}\n{r.compaction}" for r in table.itertuples()]
    metrics = [("capacity_efficiency", "capacity vs oracle"), ("throughput_tok_s", "output tok/s"),
               ("ttft_p90_s", "TTFT p90 (s)"), ("retractions", "retractions")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 4))
    for ax, (col, label) in zip(axes, metrics):
        ax.bar(range(len(table)), table[col].fillna(0))
        ax.set_xticks(range(len(table)), labels, fontsize=7)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
