"""Derive the measured coefficients of a hardware data file from benchmark CSVs.

The cost model's coefficients are package data (`sim/data/hardware/*.json`,
docs/cost_model.md). Datasheet figures and assumptions are edited in that
file by hand, each with its `source`; the measured ones are derived here, so
the file can be regenerated from a new measurement:

    python benchmarks/derive_hardware.py --moves results/kernels/move_pages.csv \\
        --hardware sim/data/hardware/h200.json

`move_bytes_per_s` comes from the long-format CSV of `benchmarks/bench_kernels.py`:
the rows with bench `move_pages` and method `triton` (the project's own move
kernel; the fastest method by median when no triton row exists), at the
largest transfer measured (`page_bytes x pages`: the bulk regime compaction
flushes run in), every shape; the median of their `gbps` x 1e9 (bytes read +
written per second). The provenance written beside the value names the file,
its sha256, the rows (file line numbers), the machine and the dates.
`--check` only reports whether the file is up to date (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import statistics
import sys
from pathlib import Path

from unikv.sim.cost import HardwareSpec

ROOT = Path(__file__).resolve().parents[1]
BENCH_COMMAND = "PYTHONPATH=. python benchmarks/bench_kernels.py --out results/kernels/move_pages.csv"


def move_rows(path: Path) -> list[dict]:
    """The `move_pages` rows of a bench_kernels.py CSV, each with its file line number (`line`).

    Raises:
        ValueError: the file lacks a column the derivation needs (named).
    """
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"bench", "method", "page_bytes", "pages", "gbps", "ts", "gpu", "torch", "triton", "git_rev"}
        missing = sorted(need - set(reader.fieldnames or ()))
        if missing:
            raise ValueError(f"{path}: missing columns {missing}")
        rows = []
        for row in reader:
            if row["bench"] == "move_pages" and row["gbps"]:
                rows.append({**row, "line": reader.line_num, "bytes": int(row["page_bytes"]) * int(row["pages"]),
                             "bytes_per_s": float(row["gbps"]) * 1e9})
        return rows


def move_bandwidth(path: Path, method: str | None = None) -> tuple[float, dict]:
    """(move_bytes_per_s, its provenance) from a bench_kernels.py CSV.

    Args:
        path: the CSV (bench_kernels.py's long format).
        method: the method whose rows count; None: "triton" if measured,
            else the method with the highest median bandwidth.

    Raises:
        ValueError: no usable row, or no row of `method`.
    """
    rows = move_rows(path)
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    if not by_method:
        raise ValueError(f"{path}: no move_pages row with a gbps value")
    if method is None:
        method = "triton" if "triton" in by_method else max(
            by_method, key=lambda m: statistics.median(r["bytes_per_s"] for r in by_method[m]))
    if method not in by_method:
        raise ValueError(f"{path}: no move_pages row of method {method!r}; measured: {sorted(by_method)}")
    largest = max(r["bytes"] for r in by_method[method])
    chosen = [r for r in by_method[method] if r["bytes"] == largest]
    value = statistics.median(r["bytes_per_s"] for r in chosen)
    return value, _provenance(path, method, largest, chosen)


def _provenance(path: Path, method: str, largest: int, chosen: list[dict]) -> dict:
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    machines = sorted({f"{r['gpu']}, torch {r['torch']}, triton {r['triton']}" for r in chosen})
    return {
        "kind": "measured",
        "source": f"measured: median page-move bandwidth of method {method} at the largest transfer "
                  f"measured ({largest} bytes moved per call), bytes read + written per second",
        "benchmark": "benchmarks/bench_kernels.py (bench move_pages)",
        "command": BENCH_COMMAND,
        "machine": "; ".join(machines),
        "date": ", ".join(sorted({r["ts"][:10] for r in chosen})),
        "timestamps": sorted({r["ts"] for r in chosen}),
        "git_revisions": sorted({r["git_rev"] for r in chosen}),
        "file": str(shown),
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "rows": [r["line"] for r in chosen],
        "row_shapes": [r["shape"] for r in chosen],
        "row_gbps": [float(r["gbps"]) for r in chosen],
        "derivation": f"bench == move_pages, method == {method}, page_bytes x pages == {largest}; "
                      "median of gbps x 1e9 (benchmarks/derive_hardware.py)",
    }


def derive(hardware: dict, moves: Path, method: str | None = None) -> dict:
    """`hardware` (the file schema) with move_bytes_per_s derived from `moves`.

    Raises:
        ValueError: as `move_bandwidth`, or the result is no valid HardwareSpec.
    """
    value, provenance = move_bandwidth(moves, method)
    coefficients = dict(hardware["coefficients"])
    coefficients["move_bytes_per_s"] = {"value": value, "unit": "bytes/s (read + written)", **provenance}
    out = {**hardware, "coefficients": coefficients}
    HardwareSpec.from_dict(out)  # validate before anything is written
    return out


def render(hardware: dict) -> str:
    return json.dumps(hardware, indent=2) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--moves", type=Path, default=ROOT / "results" / "kernels" / "move_pages.csv",
                   help="bench_kernels.py CSV (default: results/kernels/move_pages.csv)")
    p.add_argument("--hardware", type=Path, default=ROOT / "sim" / "data" / "hardware" / "h200.json",
                   help="the hardware data file to update in place (default: the bundled H200)")
    p.add_argument("--method", default=None, help="move method whose rows count (default: triton)")
    p.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    args = p.parse_args(argv)
    try:
        text = render(derive(json.loads(args.hardware.read_text()), args.moves, args.method))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        same = args.hardware.read_text() == text
        print(f"{args.hardware}: {'up to date' if same else 'OUT OF DATE (run without --check)'}")
        return 0 if same else 1
    args.hardware.write_text(text)
    print(f"{args.hardware}: move_bytes_per_s = {json.loads(text)['coefficients']['move_bytes_per_s']['value']:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
