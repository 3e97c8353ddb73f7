"""Run a study's missing runs on Ray, one task per run, and write the dataset.

Resume is by row files: a run whose `rows/<run_id>.json` exists is done and
skipped; every other run is a Ray task, and its row is written (by the
driver, atomically) the moment it finishes, so a crash or Ctrl-C loses
only the runs in flight. Ray runs locally on this machine's cores unless
an `address` names a cluster; an already-initialised Ray (a test's
cluster) is used as it is.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from unikv.sim.study.dataset import read_row, read_rows, write_dataset, write_row
from unikv.sim.study.execute import FAILED, INAPPLICABLE, execute, make_row
from unikv.sim.study.grid import RunSpec, expand
from unikv.sim.study.spec import Study

DATASET = "study.parquet"
ROWS = "rows"


@dataclass(frozen=True, kw_only=True)
class StudyOutcome:
    """What one `run_study` did.

    Attributes:
        total: runs in the study.
        skipped: runs whose row file already existed.
        executed: runs this call ran (rows written).
        failed, inapplicable: of all rows now present.
        remaining: runs still without a row (`max_runs` stopped short).
        dataset: the Parquet file.
    """

    total: int
    skipped: int
    executed: int
    failed: int
    inapplicable: int
    remaining: int
    dataset: Path


def _start_ray(address: str | None) -> bool:
    """Initialise Ray unless it is; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=address, num_cpus=None if address else os.cpu_count(), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    return True


def _write(rows_dir: Path, row: dict, on_row: Callable[[dict], None] | None) -> None:
    write_row(rows_dir, row)
    if on_row is not None:
        on_row(row)


def run_on_ray(todo: list[RunSpec], rows_dir: Path, on_row: Callable[[dict], None] | None,
               work: Callable[[RunSpec], dict] = execute) -> int:
    """Run `work(spec)` for each of `todo` as a Ray task, writing each row as
    it lands; returns rows written. A task whose worker dies is a `failed`
    row. On KeyboardInterrupt the tasks in flight are cancelled and it re-raises."""
    import ray

    task = ray.remote(num_cpus=1, max_retries=0)(work)
    specs = {task.remote(spec): spec for spec in todo}
    pending = list(specs)
    written = 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                row = ray.get(ready[0])
            except ray.exceptions.RayError as exc:  # the worker died (killed, out of memory): this run failed
                row = make_row(specs[ready[0]], FAILED, f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}",
                               {}, wall_s=0.0)
            _write(rows_dir, row, on_row)
            written += 1
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return written


def run_study(study: Study, out_dir: Path, *, address: str | None = None, max_runs: int | None = None,
              on_start: Callable[[int], None] | None = None, on_row: Callable[[dict], None] | None = None,
              study_file: Path | None = None) -> StudyOutcome:
    """Run every run of `study` without a row in `out_dir`, then write the dataset.

    Args:
        out_dir: the study's folder (docs/studies.md, "Output folder").
        address: a Ray cluster's address; None: a local Ray (or the one
            already initialised).
        max_runs: run at most this many of the missing runs.
        on_start: called with the number of runs about to run (the progress display).
        on_row: called with each row as it is written.
        study_file: copied to `out_dir/study.toml`.

    Raises:
        ValueError: a study the expansion refuses (`grid.expand`).
        KeyboardInterrupt: Ctrl-C; the rows written so far stay, the
            dataset is rewritten from them.
    """
    specs = expand(study)
    out_dir = Path(out_dir)
    rows_dir = out_dir / ROWS
    rows_dir.mkdir(parents=True, exist_ok=True)
    if study_file is not None:
        shutil.copyfile(study_file, out_dir / "study.toml")
    done = {p.stem for p in rows_dir.glob("*.json")}
    todo = [s for s in specs if s.run_id not in done]
    if max_runs is not None:
        todo = todo[:max_runs]
    if on_start is not None:
        on_start(len(todo))
    executed = 0
    started = False
    searched: set[str] = set()
    try:
        for spec in (s for s in todo if s.problem is not None):  # known before it starts: no task
            _write(rows_dir, execute(spec), on_row)
            executed += 1
        tasks = [s for s in todo if s.problem is None]
        if tasks:
            started = _start_ray(address)
            executed += run_on_ray(tasks, rows_dir, on_row)
        if study.search is not None:
            started = _start_ray(address) or started
            executed += search_rates(study, specs, rows_dir, on_row, searched, run_point=RayPoints(),
                                     parallel=True)
    finally:
        grid_ids = {s.run_id for s in specs}
        rows = read_rows(rows_dir, grid_ids)
        write_dataset(out_dir / DATASET, rows + read_rows(rows_dir, searched - grid_ids))
        if started:
            import ray
            ray.shutdown()
    statuses = [r["status"] for r in rows]
    return StudyOutcome(total=len(specs), skipped=len(done & {s.run_id for s in specs}), executed=executed,
                        failed=statuses.count(FAILED), inapplicable=statuses.count(INAPPLICABLE),
                        remaining=len(specs) - len(rows), dataset=out_dir / DATASET)


class _RatePoints:
    """A rate search's evaluator over one cell: a point's row from its row
    file when one exists (the grid's or an earlier search's), else the run,
    done by `run_point` and written. Thread-safe: the parallel search calls
    one per cell, each from its own thread, sharing `lock`."""

    def __init__(self, cell: RunSpec, rows_dir: Path, on_row, used: set[str],
                 run_point: Callable[[RunSpec], dict], lock: threading.Lock) -> None:
        self.cell, self.rows_dir, self.on_row, self.used = cell, rows_dir, on_row, used
        self.run_point, self.lock = run_point, lock
        self.executed = 0

    def __call__(self, rate_scale: float) -> dict:
        from unikv.sim.study.answers import MET
        from unikv.sim.study.grid import at_rate

        point = at_rate(self.cell, rate_scale)
        with self.lock:
            self.used.add(point.run_id)
        row = read_row(self.rows_dir, point.run_id)
        if row is None:
            row = self.run_point(point)
            with self.lock:
                _write(self.rows_dir, row, self.on_row)
            self.executed += 1
        return {**row, MET: bool(row.get(MET))}  # a failed run meets nothing


class RayPoints:
    """`run_point` for the parallel search: each point one Ray task, the
    calling thread blocked on it. A task whose worker dies is a `failed`
    row; after `cancel()` (Ctrl-C) a cancelled task raises instead, so no
    row is written for a run that did not finish."""

    def __init__(self, work: Callable[[RunSpec], dict] = execute) -> None:
        import ray

        self._task = ray.remote(num_cpus=1, max_retries=0)(work)
        self._lock = threading.Lock()
        self._in_flight: set = set()
        self._stopped = threading.Event()

    def __call__(self, spec: RunSpec) -> dict:
        import ray

        if self._stopped.is_set():
            raise KeyboardInterrupt
        ref = self._task.remote(spec)
        with self._lock:
            self._in_flight.add(ref)
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            if self._stopped.is_set():
                raise KeyboardInterrupt from exc
            return make_row(spec, FAILED, f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}",
                            {}, wall_s=0.0)
        finally:
            with self._lock:
                self._in_flight.discard(ref)

    def cancel(self) -> None:
        """Stop: cancel every task in flight; later calls raise KeyboardInterrupt."""
        import ray

        self._stopped.set()
        with self._lock:
            refs = list(self._in_flight)
        for ref in refs:
            ray.cancel(ref, force=True)


def _search_cells(specs: list[RunSpec]) -> dict[str, list[RunSpec]]:
    """The runnable grid runs by cell (`grid.rate_group`), in grid order."""
    from unikv.sim.study.grid import rate_group

    cells: dict[str, list[RunSpec]] = {}
    for spec in specs:
        if spec.config is not None and spec.problem is None:
            cells.setdefault(rate_group(spec), []).append(spec)
    return cells


def search_rates(study: Study, specs: list[RunSpec], rows_dir: Path, on_row, used: set[str], *,
                 run_point: Callable[[RunSpec], dict] = execute, parallel: bool = False) -> int:
    """Bisect each cell's rate scale for the highest one meeting the
    objectives (`study.search`, `answers.max_rate`), from the rows the grid
    left; every point run is a row like the grid's (content-addressed, so
    a rerun reuses it). Adds the run ids the searches read to `used`;
    returns the runs executed.

    Args:
        run_point: runs one point and returns its row (`execute`, or a
            `RayPoints`).
        parallel: run the cells' bisections together, one driver thread per
            cell, each waiting on its own next point; with `RayPoints` every
            unfinished cell has its next point in flight at once. Each cell's
            points (so its run ids and rows) are those of the serial search:
            a cell's bisection depends only on its own points.
    """
    cells = _search_cells(specs)
    done = {r["run_id"]: r for r in read_rows(rows_dir, [s.run_id for s in specs])}  # the grid's rows, read once
    lock = threading.Lock()
    searches = [_cell_search(study, members, done, rows_dir, on_row, used, run_point, lock)
                for members in cells.values()]
    if not parallel or len(searches) < 2:
        return sum(one() for one in searches)
    with ThreadPoolExecutor(max_workers=len(searches), thread_name_prefix="rate-search") as pool:
        futures = [pool.submit(one) for one in searches]
        try:
            return sum(f.result() for f in futures)
        except BaseException:
            for f in futures:
                f.cancel()
            if isinstance(run_point, RayPoints):
                run_point.cancel()
            raise


def _cell_search(study: Study, members: list[RunSpec], done: dict[str, dict], rows_dir: Path, on_row,
                 used: set[str], run_point: Callable[[RunSpec], dict], lock: threading.Lock) -> Callable[[], int]:
    """One cell's search as a call returning the runs it executed."""

    def one() -> int:
        import pandas as pd
        from unikv.sim.study import answers

        if any(done.get(m.run_id, {}).get("status") == INAPPLICABLE for m in members):
            return 0  # the layout does not apply to the model: no rate would
        finished = [done[m.run_id] for m in members if m.run_id in done and done[m.run_id].get("status") == "ok"]
        with lock:
            used.update(r["run_id"] for r in finished)
        points = _RatePoints(members[0], rows_dir, on_row, used, run_point, lock)
        search = study.search
        answers.max_rate(points, pd.DataFrame(finished) if finished else None, lo=search.rate_scale_lo,
                         hi=search.rate_scale_hi, rel_tol=search.rel_tol)
        return points.executed

    return one
