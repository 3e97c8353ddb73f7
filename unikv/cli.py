"""The `unikv` command line: thin wrappers over the packages.

Exit status of every subcommand (`guarded`, the one place the policy lives):
0 success; 1 the run finished but reported invariant violations; 2 bad
input: one line "error: ..." on stderr naming the file or option, the
value and what was expected, no traceback; 3 (`compare`) some cells could
not run (the table says why); 70 an internal error: the traceback and a
line asking to report it as a bug; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from unikv._version import installed_version
from unikv.demo import run_demo

EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE of sysexits.h
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
BAD_INPUT = (ValueError, OSError, MemoryError)
"""What bad input raises: the packages' convention is a ValueError naming
the field (UnicodeDecodeError and TraceFormatError are ValueErrors); an
OSError names the file (permission, is-a-directory, no space); a MemoryError
is an input too big for this host."""
TRACEBACK_ENV = "UNIKV_TRACEBACK"
"""Set to 1 to see the traceback of a bad-input error as well."""


def guarded(command: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Run one subcommand under the CLI's error policy (module docstring).

    Args:
        command: the subcommand, `argv -> exit status`.
        argv: its arguments.

    Returns:
        The command's exit status, or the policy's for an exception.
    """
    try:
        return command(argv)
    except KeyboardInterrupt:
        # replay and compare leave their outputs as they were (sim/outdir.py)
        print("\nerror: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BAD_INPUT as exc:
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:
        traceback.print_exc()
        print(f"unikv {installed_version()}: internal error (a bug, not your input): please report it "
              "with the command line and the traceback above", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line (an OSError with its file name)."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, MemoryError):
        text = f"out of host memory ({exc or 'no detail'}); ask for a smaller budget or trace"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _traces(argv: Sequence[str]) -> int:
    from unikv.traces.cli import main as traces_main

    return traces_main(list(argv))


def _models(argv: Sequence[str]) -> int:
    from unikv.sim.models_cmd import main as models_main

    return models_main(list(argv))


def _demo(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="unikv", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"unikv {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="drive a 3-band pool and print its occupancy")
    demo.add_argument("--compaction", choices=["lazy", "eager"], default="lazy")
    demo.add_argument("--steps", type=int, default=200, help="decode steps to run")
    demo.add_argument("--seed", type=int, default=0)
    sub.add_parser("replay", help="replay a trace against one layout (unikv replay -h)")
    sub.add_parser("compare", help="replay a trace against a grid of layouts (unikv compare -h)")
    sub.add_parser("traces", help="describe / convert request traces (unikv traces -h)")
    sub.add_parser("models", help="list / describe models: bytes per token and request (unikv models -h)")
    sub.add_parser("study", help="run a study grid on Ray into one Parquet dataset (unikv study -h)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.compaction, args.steps, args.seed)
    return EXIT_BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["traces"]:
        return guarded(_traces, argv[1:])
    if argv[:1] == ["models"]:
        return guarded(_models, argv[1:])
    if argv[:1] == ["study"]:
        from unikv.sim.study_cmd import study

        return study(argv[1:])  # guarded there
    if argv[:1] in (["replay"], ["compare"]):
        from unikv.sim import cli as sim_cli

        return getattr(sim_cli, argv[0])(argv[1:])  # guarded there, for direct callers too
    return guarded(_demo, argv)


if __name__ == "__main__":
    raise SystemExit(main())
