"""Command line: ``python -m unikv.traces describe FILE`` and ``convert FILE OUT``.

Thin layer over :func:`traces.load`, :func:`traces.stats.summarize` and
:func:`traces.writers.save`. Bad input prints one ``error: ...`` line on
stderr and returns 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from unikv.traces.loaders import load
from unikv.traces.schema import TraceFormatError
from unikv.traces.stats import format_summary, summarize
from unikv.traces.writers import save


def _columns(text: str) -> dict[str, str]:
    """Parse ``arrival_s=t,prompt_tokens=in,output_tokens=out``."""
    pairs = [p for p in text.split(",") if p.strip()]
    if not all("=" in p for p in pairs):
        raise argparse.ArgumentTypeError(f"--columns {text!r}: expected NAME=SOURCE pairs joined by commas")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traces", description="Inspect and convert LLM request traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    describe = sub.add_parser("describe", help="print count, time span, rate and length percentiles")
    describe.add_argument("file")
    describe.add_argument("--json", action="store_true", help="print the summary as JSON")
    convert = sub.add_parser("convert", help="write the normalized form (.parquet, .csv or .jsonl)")
    convert.add_argument("file")
    convert.add_argument("out")
    for p in (describe, convert):
        p.add_argument("--format", help="format name (default: detect from the file)")
        p.add_argument("--columns", type=_columns, help="generic csv/jsonl: arrival_s=COL,prompt_tokens=COL,...")
        p.add_argument("--time-unit", default="s", help="generic formats: s, ms, us, ns or datetime")
        p.add_argument("--block-tokens", type=int, help="tokens per prefix-hash block")
        p.add_argument("--rate-rps", type=float, help="length-only files: Poisson arrivals at this rate")
        p.add_argument("--spread-s", type=float, help="spread equal timestamps over this many seconds")
        p.add_argument("--seed", type=int, default=0)
    return parser


def _load(args: argparse.Namespace):
    return load(
        args.file, format=args.format, columns=args.columns, time_unit=args.time_unit,
        block_tokens=args.block_tokens, rate_rps=args.rate_rps, spread_s=args.spread_s, seed=args.seed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: arguments without the program name (None: ``sys.argv[1:]``).

    Returns:
        0 on success, 2 on bad input (message on stderr).
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error: argparse already printed
        return int(exc.code or 0)
    try:
        df = _load(args)
        if df.empty:  # nothing to describe or convert: say so, as `unikv replay` does
            raise TraceFormatError(f"trace {args.file!r} holds no request (no data row, or every row "
                                   "was dropped)")
        if args.command == "describe":
            summary = summarize(df)
            print(json.dumps(summary, indent=1) if args.json else format_summary(summary, title=args.file))
        else:
            written = save(df, args.out)
            print(f"wrote {len(df)} requests to {', '.join(map(str, written))}")
    except (TraceFormatError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
