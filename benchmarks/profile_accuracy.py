"""How well a step-time profile predicts grid points it was not fitted on (issue 17 item 2).

Given pairs of profile files, the one the cost model interpolates (FIT) and
one measured at other grid points (HELDOUT, same model and GPU, same
format), predicts every held-out point's step time (non-forward + forward)
from FIT exactly as a replay would (`sim.profile.StepProfile.forward_s`)
and prints, per model and grid, the median and p90 absolute relative error
as a markdown table. Points outside FIT's grids are counted apart
("extrapolated"): the error columns cover them too.

    python benchmarks/profile_accuracy.py FIT.json HELDOUT.json [FIT2.json HELDOUT2.json ...] [--out table.md]

Target (issue 17): median <= 5 %, p90 <= 15 % per model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from unikv.sim.profile import GRIDS, StepProfile


def point_errors(fit: StepProfile, held: StepProfile, grid: str) -> list[tuple[float, bool]]:
    """(absolute relative error of the step time, extrapolated) per point of `held`'s `grid`."""
    table = getattr(held, grid)
    out = []
    for i, row in enumerate(table.rows):
        for j, col in enumerate(table.cols):
            if (i, j) in table.filled:  # not measured (the GPU could not hold it): nothing to check against
                continue
            measured = held.non_forward_s + table.forward_s[i][j]
            if grid == "prefill":
                fwd, outside = fit.forward_s(chunk_tokens=row, cached_tokens=col, batch=0, context_tokens=0)
            elif grid == "decode":
                fwd, outside = fit.forward_s(chunk_tokens=0, cached_tokens=0, batch=int(row), context_tokens=col)
            else:  # mixed: chunk tokens x batch, the chunk over no cache, decoders at the reference context
                fwd, outside = fit.forward_s(chunk_tokens=row, cached_tokens=0, batch=int(col),
                                             context_tokens=held.mixed_context_tokens)
            out.append((abs(fit.non_forward_s + fwd - measured) / measured, outside))
    return out


def p90(values: list[float]) -> float:
    """The 90th percentile (linear interpolation between order statistics)."""
    ordered = sorted(values)
    k = 0.9 * (len(ordered) - 1)
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def accuracy_rows(fit: StepProfile, held: StepProfile) -> list[dict]:
    """One row per grid and one over all of them, for one model."""
    if (fit.model, fit.gpu) != (held.model, held.gpu):
        raise ValueError(f"held-out profile of {held.model!r} on {held.gpu!r} does not match the fitted "
                         f"{fit.model!r} on {fit.gpu!r}")
    if fit.step_forwards != held.step_forwards:  # measured as another executor runs its steps
        raise ValueError(f"held-out profile with step_forwards={held.step_forwards!r} does not match the "
                         f"fitted one's {fit.step_forwards!r}")
    rows, every = [], []
    for grid in GRIDS:
        errors = point_errors(fit, held, grid)
        every += errors
        rows.append(_row(fit, grid, errors))
    rows.append(_row(fit, "all", every))
    return rows


def _row(fit: StepProfile, grid: str, errors: list[tuple[float, bool]]) -> dict:
    values = [e for e, _ in errors]
    return {"model": fit.model, "gpu": fit.gpu, "grid": grid, "points": len(values),
            "extrapolated": sum(o for _, o in errors),
            "median": statistics.median(values), "p90": p90(values)}


def markdown(rows: list[dict]) -> str:
    """The table: median and p90 absolute relative error of the step time, in percent."""
    lines = ["| model | gpu | grid | points | extrapolated | median abs. error | p90 abs. error |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['gpu']} | {r['grid']} | {r['points']} | {r['extrapolated']} | "
                     f"{100 * r['median']:.2f} % | {100 * r['p90']:.2f} % |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="FIT HELDOUT pairs of profile files")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    if len(args.files) % 2:
        print("error: files must come in FIT HELDOUT pairs; got an odd number", file=sys.stderr)
        return 2
    rows = []
    try:
        for fit, held in zip(args.files[::2], args.files[1::2]):
            rows += accuracy_rows(StepProfile.load(fit), StepProfile.load(held))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = markdown(rows)
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
