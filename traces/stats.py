"""Summary statistics of a trace frame (what ``describe`` prints).

Percentiles are numpy's default (linear interpolation), the same convention
as ``/work/shared/traces/README.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from unikv.traces.schema import ARRIVAL, HASHES, OUTPUT, PROMPT

PERCENTILES = (50, 90, 99)


def length_stats(values: np.ndarray) -> dict[str, float]:
    """Mean, p50/p90/p99, min and max of lengths (tokens); NaN when empty."""
    if len(values) == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "min", "max")}
    v = np.asarray(values, dtype=np.float64)
    out = {"mean": float(v.mean())}
    out.update({f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES})
    out.update({"min": float(v.min()), "max": float(v.max())})
    return out


def prefix_hit_ratio(hashes: list[list[int]] | pd.Series) -> tuple[int, int, float]:
    """Block hit ratio of an infinite prefix cache with strict prefix matching.

    Requests are taken in order; a request hits its leading ids that some
    earlier request already held (stopping at the first unseen id).

    Returns:
        (total block references, unique ids, hits / references; NaN if none).
    """
    seen: set[int] = set()
    refs = hits = 0
    for ids in hashes:
        refs += len(ids)
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hits += k
        seen.update(ids)
    return refs, len(seen), (hits / refs if refs else float("nan"))


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Summarize a trace frame.

    Returns:
        A JSON-able dict: ``rows``, ``span_s`` (last minus first arrival),
        ``rate_rps`` (rows / span; NaN for a zero span), ``prompt_tokens``
        and ``output_tokens`` (see :func:`length_stats`), ``dropped`` and
        ``format`` from the metadata, and ``prefix`` (block size, blocks per
        request, references, unique ids, infinite-cache hit ratio) when the
        frame has ``prefix_hashes``.
    """
    t = df[ARRIVAL].to_numpy()
    span = float(t[-1] - t[0]) if len(t) else 0.0
    out: dict[str, Any] = {
        "rows": len(df),
        "format": df.attrs.get("format"),
        "dropped": dict(df.attrs.get("dropped", {})),
        "span_s": span,
        "rate_rps": len(t) / span if span > 0 else float("nan"),
        PROMPT: length_stats(df[PROMPT].to_numpy()),
        OUTPUT: length_stats(df[OUTPUT].to_numpy()),
    }
    if HASHES in df.columns:
        refs, unique, ratio = prefix_hit_ratio(df[HASHES])
        out["prefix"] = {
            "block_tokens": df.attrs.get("block_tokens"),
            "blocks_per_request": length_stats(np.array([len(h) for h in df[HASHES]])),
            "block_refs": refs,
            "unique_blocks": unique,
            "infinite_cache_hit_ratio": ratio,
        }
    return out


def _num(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _lengths_line(name: str, s: dict[str, float]) -> str:
    cells = "  ".join(f"{k} {_num(s[k])}" for k in ("mean", "p50", "p90", "p99", "max"))
    return f"{name:<16}{cells}"


def format_summary(summary: dict[str, Any], *, title: str = "") -> str:
    """Render :func:`summarize` output as aligned text lines."""
    dropped = summary["dropped"]
    lines = [f"trace:          {title}"] if title else []
    lines += [
        f"format:         {summary['format']}",
        f"requests:       {summary['rows']}",
        f"dropped:        {sum(dropped.values())}" + (f" {dropped}" if any(dropped.values()) else ""),
        f"time span:      {summary['span_s']:,.1f} s",
        "request rate:   " + (f"{summary['rate_rps']:.3f} req/s" if summary["span_s"] > 0 else "n/a (no time span)"),
        _lengths_line("prompt tokens:", summary[PROMPT]),
        _lengths_line("output tokens:", summary[OUTPUT]),
    ]
    p = summary.get("prefix")
    if p:
        lines += [
            f"prefix blocks:  {p['block_tokens']} tokens per block; {p['block_refs']:,} references, "
            f"{p['unique_blocks']:,} unique",
            _lengths_line("blocks/request:", p["blocks_per_request"]),
            f"prefix reuse:   {100 * p['infinite_cache_hit_ratio']:.1f} % of blocks hit an infinite prefix cache",
        ]
    return "\n".join(lines)
