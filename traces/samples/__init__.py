"""Small byte-exact slices of the real traces, shipped with the package.

Each sample is the header plus the first N data lines of an upstream file
(see ``README.md`` beside this file for provenance and the cut, and
``stats.json`` for recorded statistics). ``azure_conv`` is the simulator's
default trace.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
from unikv.traces.schema import TraceFormatError, meta_of, with_meta

DIR = Path(__file__).resolve().parent
STATS_FILE = DIR / "stats.json"
DEFAULT = "azure_conv"


@cache
def _index() -> dict[str, dict[str, Any]]:
    return json.loads(STATS_FILE.read_text(encoding="utf-8"))["samples"]


def names() -> list[str]:
    """Return the names of the bundled samples."""
    return list(_index())


def info(name: str) -> dict[str, Any]:
    """Return a sample's recorded provenance, cut and statistics (from ``stats.json``).

    Raises:
        TraceFormatError: for an unknown name (lists the known ones).
    """
    if name not in _index():
        raise TraceFormatError(f"unknown sample {name!r}; bundled samples: {names()}")
    return dict(_index()[name])


def path(name: str) -> Path:
    """Return the path of a bundled sample file.

    Raises:
        TraceFormatError: for an unknown name (lists the known ones).
    """
    return DIR / info(name)["file"]


def load_sample(name: str = DEFAULT, **opts: Any) -> pd.DataFrame:
    """Load a bundled sample with :func:`traces.load`.

    Args:
        name: a name from :func:`names` (default: ``azure_conv``).
        **opts: passed to :func:`traces.load` (``spread_s``, ``rate_rps``...).

    Returns:
        The trace frame; its ``history`` starts with the sample's cut.
    """
    from unikv.traces.loaders import load  # late: traces.loaders does not need samples

    entry = info(name)
    df = load(path(name), **opts)
    meta = meta_of(df)
    step = f"sample {name!r}: {entry['cut']} of {entry['source']['repo']}:{entry['source']['path']}"
    return with_meta(df, dataclasses.replace(meta, history=(step, *meta.history)))
