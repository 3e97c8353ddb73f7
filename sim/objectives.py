"""Latency objectives and a run's service against them (METRICS.md,
"Service against objectives").

An `Objectives` names percentile targets (e.g. TTFT p90 <= 2 s, TPOT p90
<= 50 ms) and per-request targets (a request meets its objectives when it
finished, was not rejected, and its TTFT and TPOT are within them).
`evaluate` turns a run's request table (`sim.recorder.REQUEST_COLUMNS`)
into objective attainment, goodput, the named percentiles and whether every
percentile target holds.

Definitions, so that numbers can be checked by hand:

* Every request of the table counts. A rejected or unfinished request
  misses: its TTFT and TPOT count as +inf, in the percentiles too.
* TPOT is defined for requests of more than one output token only (the
  recorder leaves it empty otherwise): its percentiles are taken over those
  requests, and a finished one-token request meets any TPOT target.
* Percentiles are nearest-rank: the p-th percentile of N values is the
  ceil(p/100 x N)-th smallest (1-based), so "TTFT p90 <= 2 s" holds exactly
  when at least ceil(0.9 N) requests have a TTFT of at most 2 s. (The run
  summary's `ttft_p90_s` interpolates over the requests that have a TTFT;
  the `objective_*` columns here differ from it on purpose.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

METRICS = ("ttft", "tpot")
"""The latencies an objective may target: time to first token, time per output token."""

_NAME = re.compile(r"^(ttft|tpot)_p(\d+(?:\.\d+)?)_s$")
_NEEDED = ("ttft_s", "tpot_s", "finished_s", "rejected", "output_tokens")


def _check_seconds(field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{field}={value!r} must be a positive finite number of seconds")


@dataclass(frozen=True, kw_only=True)
class PercentileTarget:
    """One percentile target: the `percentile`-th percentile of `metric`
    must be at most `max_s` seconds.

    Raises:
        ValueError: an unknown metric, a percentile outside (0, 100], or a
            target that is not a positive finite number of seconds.
    """

    metric: str
    percentile: float
    max_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric={self.metric!r} must be one of {', '.join(METRICS)}")
        p = self.percentile
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 100):
            raise ValueError(f"{self.metric} percentile={p!r} must be a number in (0, 100]")
        _check_seconds(f"{self.name}", self.max_s)

    @property
    def name(self) -> str:
        """The target's name, e.g. "ttft_p90_s" (percentile 99.9: "ttft_p99.9_s")."""
        return f"{self.metric}_p{self.percentile:g}_s"


@dataclass(frozen=True, kw_only=True)
class Objectives:
    """Latency objectives of a study.

    Args:
        percentile_targets: the targets the maximum rate must keep (all of
            them), at most one per (metric, percentile).
        request_ttft_s: a request's TTFT target (seconds); None: the tightest
            TTFT percentile target, or no TTFT target when there is none.
        request_tpot_s: the same for TPOT.

    Raises:
        ValueError: no target at all, a duplicated percentile target, or a
            per-request target that is not a positive finite number.
    """

    percentile_targets: tuple[PercentileTarget, ...] = ()
    request_ttft_s: float | None = None
    request_tpot_s: float | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.percentile_targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"percentile_targets={names!r}: {', '.join(dup)} given more than once")
        for metric in METRICS:
            value = getattr(self, f"request_{metric}_s")
            if value is not None:
                _check_seconds(f"request_{metric}_s", value)
        if not self.percentile_targets and self.request_ttft_s is None and self.request_tpot_s is None:
            raise ValueError("objectives: give at least one target (e.g. ttft_p90_s = 2.0)")

    @classmethod
    def from_mapping(cls, values: Mapping[str, float]) -> Objectives:
        """Objectives from names such as a study file writes them:
        "ttft_p90_s" / "tpot_p99_s" (percentile targets) and "ttft_s" /
        "tpot_s" (per-request targets), values in seconds.

        Raises:
            ValueError: an unknown name (the message lists the accepted forms)
                or a bad value (as the constructor).
        """
        targets, request = [], {}
        for key, value in values.items():
            m = _NAME.match(key)
            if m:
                targets.append(PercentileTarget(metric=m[1], percentile=float(m[2]), max_s=value))
            elif key in ("ttft_s", "tpot_s"):
                request[f"request_{key}"] = value
            else:
                raise ValueError(f"objectives.{key}={value!r}: unknown objective; expected ttft_pNN_s, "
                                 "tpot_pNN_s (a percentile target) or ttft_s, tpot_s (per request)")
        return cls(percentile_targets=tuple(targets), **request)

    def request_target_s(self, metric: str) -> float | None:
        """The per-request target of `metric`, explicit or the tightest percentile one."""
        explicit = getattr(self, f"request_{metric}_s")
        if explicit is not None:
            return explicit
        own = [t.max_s for t in self.percentile_targets if t.metric == metric]
        return min(own) if own else None

    def as_dict(self) -> dict[str, float]:
        """The `from_mapping` form (per-request targets as resolved)."""
        out = {t.name: t.max_s for t in self.percentile_targets}
        for metric in METRICS:
            target = self.request_target_s(metric)
            if target is not None:
                out[f"{metric}_s"] = target
        return out


def nearest_rank(values, percentile: float) -> float:
    """The `percentile`-th nearest-rank percentile of `values` (floats, a
    sequence or an array): the ceil(p/100 x N)-th smallest; NaN when empty."""
    if len(values) == 0:
        return math.nan
    rank = max(1, math.ceil(percentile / 100 * len(values)))
    return float(np.sort(values)[rank - 1])


def latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per metric, the values the percentiles are taken over: TTFT of every
    request, TPOT of every request with more than one output token; +inf
    for a rejected or unfinished request.

    Raises:
        ValueError: a column `evaluate` needs is missing.
    """
    missing = [c for c in _NEEDED if c not in requests.columns]
    if missing:
        raise ValueError(f"requests table lacks column(s) {', '.join(missing)}; expected "
                         "the recorder's request table (sim.recorder.REQUEST_COLUMNS)")
    served = requests["finished_s"].notna().to_numpy() & ~requests["rejected"].astype(bool).to_numpy()
    out = {}
    for metric in METRICS:
        values = requests[f"{metric}_s"].to_numpy(dtype=float, na_value=math.nan)
        values = np.where(served, values, math.inf)
        if metric == "tpot":
            values = values[requests["output_tokens"].to_numpy() > 1]
        out[metric] = values
    return out


def _met(requests: pd.DataFrame, objectives: Objectives) -> np.ndarray:
    """Per request: finished, not rejected, and within every per-request target."""
    ok = requests["finished_s"].notna().to_numpy() & ~requests["rejected"].astype(bool).to_numpy()
    for metric in METRICS:
        target = objectives.request_target_s(metric)
        if target is None:
            continue
        values = requests[f"{metric}_s"].to_numpy(dtype=float, na_value=math.nan)
        within = values <= target
        if metric == "tpot":  # one output token: no TPOT, nothing to miss
            within |= requests["output_tokens"].to_numpy() <= 1
        ok &= within
    return ok


def evaluate(requests: pd.DataFrame, objectives: Objectives, duration_s: float) -> dict:
    """A run's service against `objectives`.

    Args:
        requests: the run's request table (one row per trace request).
        objectives: the targets.
        duration_s: the seconds goodput is per; the study passes the run's
            simulated time (`sim_time_s`, the denominator of throughput).

    Returns:
        `objective_attainment` (share of the requests that met every
        per-request target), `met_requests`, `goodput_rps` (met requests /
        `duration_s`), one `objective_<target name>` per percentile target
        (seconds, +inf when the rank falls on a missed request, NaN when no
        request has the metric), and `objectives_met` (every percentile
        target holds; a target over no request holds vacuously).

    Raises:
        ValueError: an empty table, a missing column, or a negative
            `duration_s` (0 only when no request met its targets).
    """
    if len(requests) == 0:
        raise ValueError("requests table has no row; expected one row per trace request")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s >= 0:
        raise ValueError(f"duration_s={duration_s!r} must be a non-negative number of seconds")
    values = latencies(requests)
    met = int(_met(requests, objectives).sum())
    if met and duration_s == 0:
        raise ValueError(f"duration_s=0 but {met} request(s) met their targets; expected the run's seconds")
    out: dict = {"objective_attainment": met / len(requests), "met_requests": met,
                 "goodput_rps": met / duration_s if met else 0.0}
    holds = True
    for target in objectives.percentile_targets:
        value = nearest_rank(values[target.metric], target.percentile)
        out[f"objective_{target.name}"] = value
        holds &= math.isnan(value) or value <= target.max_s
    out["objectives_met"] = bool(holds)
    return out
