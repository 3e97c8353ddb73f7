"""Tables of runs: a `Job` per run, spread over worker processes (results do not depend on it)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import pandas as pd
from unikv.sim.analyses.ratios import _ratio_columns
from unikv.sim.analyses.rows import result_row
from unikv.sim.analyses.slices import Case, run_case


@dataclass(frozen=True)
class Job:
    """One run of a table: its case, its RunConfig changes, its extra row labels."""

    case: Case
    changes: tuple
    labels: tuple = ()


def _run_job(job: Job) -> dict:
    changes = dict(job.changes)
    ratio = changes.get("static_ratio")
    shown = {k: v for k, v in changes.items() if k != "static_ratio"}
    labels = {**job.case.labels(), "rate_scale": job.case.trace.rate_scale, **shown,
              **_ratio_columns(ratio), **dict(job.labels)}
    if ratio is not None:
        changes["static_ratio"] = ratio.as_static_ratio()
    try:
        result = run_case(job.case, **changes)
    except ValueError as exc:  # e.g. a static region too small for the trace's longest request
        return {**labels, "error": str(exc)}
    return {**labels, "error": None, **result_row(result)}


def run_jobs(jobs: Sequence[Job], n_jobs: int = 1, progress=None) -> pd.DataFrame:
    """Run `jobs`, in `n_jobs` worker processes when > 1; one row each, in order.

    progress: called with each finished row (a dict), or None.
    """
    report = progress or (lambda row: None)
    if n_jobs <= 1 or len(jobs) <= 1:
        rows = []
        for job in jobs:
            rows.append(_run_job(job))
            report(rows[-1])
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(n_jobs, len(jobs)), mp_context=ctx) as ex:
            futures = [ex.submit(_run_job, j) for j in jobs]
            for f in as_completed(futures):
                report(f.result())
            rows = [f.result() for f in futures]
    return pd.DataFrame(rows)
