"""The `unikv` command line: thin wrappers over the packages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from unikv._version import installed_version
from unikv.demo import run_demo


def _traces(argv: Sequence[str]) -> int:
    from unikv.traces.cli import main as traces_main

    return traces_main(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["traces"]:
        return _traces(argv[1:])
    if argv[:1] == ["models"]:
        from unikv.sim.models_cmd import main as models_main

        return models_main(argv[1:])
    if argv[:1] in (["replay"], ["compare"]):
        from unikv.sim import cli as sim_cli

        return getattr(sim_cli, argv[0])(argv[1:])
    parser = argparse.ArgumentParser(prog="unikv", description=__doc__)
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.compaction, args.steps, args.seed)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
