"""`unikv study run STUDY.toml [--address ADDR] [--out DIR] [--max-runs N]`
and `unikv study report STUDY.toml [--out DIR] [--run-id ID]` (sim/study/report.py).

Exit status (`unikv.cli.guarded`): 0 every run is done and none failed;
3 some run failed or was inapplicable (its row says why) or `--max-runs`
left runs to do; 2 bad input (nothing run); 130 interrupted (the rows
written so far stay: run it again to resume).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_INCOMPLETE = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unikv study", description="run a study: a grid of replays "
                                     "on Ray, resumable, into one Parquet dataset (docs/studies.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the study's missing runs, then write its dataset")
    run.add_argument("study", type=Path, help="the study file (TOML)")
    run.add_argument("--address", default=None, help="Ray cluster address (default: a local Ray on this "
                     "machine's cores)")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: runs/studies/<name>)")
    run.add_argument("--max-runs", type=int, default=None, help="run at most N of the missing runs")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    rep = sub.add_parser("report", help="the study's answers as markdown and figures, from its dataset alone")
    rep.add_argument("study", type=Path, help="the study file (TOML)")
    rep.add_argument("--out", type=Path, default=None, help="the study's folder (default: runs/studies/<name>)")
    rep.add_argument("--run-id", default=None, help="the run whose capacity over time is drawn")
    return parser


class Progress:
    """One progress display for the whole study: tqdm on a terminal, quiet otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.show = not quiet and sys.stderr.isatty()
        self.bar = None

    def start(self, todo: int) -> None:
        if self.show and todo:
            from tqdm import tqdm

            self.bar = tqdm(total=todo, unit="run", file=sys.stderr)

    def row(self, row: dict) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(row["status"], refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run(args: argparse.Namespace) -> int:
    from unikv.sim.study.runner import run_study
    from unikv.sim.study.spec import load_study

    if args.max_runs is not None and args.max_runs < 1:
        raise ValueError(f"--max-runs={args.max_runs!r} must be a positive integer")
    study = load_study(args.study)
    out = args.out or Path("runs") / "studies" / study.study.name
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out={str(out)!r} is a file; expected a folder")
    progress = Progress(args.quiet)
    try:
        outcome = run_study(study, out, address=args.address, max_runs=args.max_runs, on_start=progress.start,
                            on_row=progress.row, study_file=args.study)
    finally:
        progress.close()
    print(f"{outcome.total} runs: {outcome.executed} run now, {outcome.skipped} already done, "
          f"{outcome.failed} failed, {outcome.inapplicable} inapplicable, {outcome.remaining} left; "
          f"dataset: {outcome.dataset}")
    return EXIT_INCOMPLETE if outcome.failed or outcome.inapplicable or outcome.remaining else 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.command == "report":
        from unikv.sim.study.report import main as report

        print(f"report: {report(args.study, args.out, run_id=args.run_id)}")
        return 0
    return _run(args)


def study(argv: Sequence[str] | None = None) -> int:
    """`unikv study ARGV` under the CLI's error policy; returns the exit status."""
    from unikv.cli import guarded

    return guarded(main, sys.argv[1:] if argv is None else argv)
