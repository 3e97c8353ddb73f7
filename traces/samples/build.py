"""Regenerate the bundled samples and ``stats.json`` from the full traces.

Usage: ``python -m unikv.traces.samples.build SOURCE_DIR``, a folder holding
the full public trace files (named as in ``README.md`` beside this file) and
their ``manifest.json``. Each sample is the source's
first bytes: the header line (CSV) and the first N data lines, where N is
fixed, the number of rows arriving within the first T seconds, or every
line (the whole file, then gzip-compressed).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from unikv.traces.loaders import load
from unikv.traces.samples import DIR, STATS_FILE
from unikv.traces.stats import summarize


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cut:
    """How one sample is cut from its source file.

    Attributes:
        name: the sample's name (``traces.load_sample(name)``).
        source: file name in the source folder.
        file: the sample's file name in ``traces/samples/``.
        first_s: keep the rows arriving before this many seconds after the
            first row (None: use ``rows``).
        rows: keep this many data rows (when ``first_s`` is None; None with
            ``first_s`` None keeps the whole file).
        gzip: write the kept bytes gzip-compressed (level 9, no name or
            time stamp, so a rebuild gives the same bytes); the loaders
            detect gzip by its magic bytes.
    """

    name: str
    source: str
    file: str
    first_s: float | None = None
    rows: int | None = None
    gzip: bool = False


CUTS = (
    Cut(name="azure_conv", source="azure_llm_2023_conv.csv", file="azure_llm_2023_conv_first600s.csv", first_s=600),
    Cut(name="azure_code", source="azure_llm_2023_code.csv", file="azure_llm_2023_code_first600s.csv", first_s=600),
    Cut(name="mooncake_conversation", source="mooncake_fast25_conversation_trace.jsonl",
        file="mooncake_fast25_conversation_first300s.jsonl", first_s=300),
    Cut(name="mooncake_synthetic", source="mooncake_fast25_synthetic_trace.jsonl",
        file="mooncake_fast25_synthetic_first120s.jsonl", first_s=120),
    Cut(name="sharegpt_lengths", source="lengths_sharegpt_8k_llama2tok.csv",
        file="lengths_sharegpt_8k_llama2tok_first2000.csv", rows=2000),
    Cut(name="arxiv_lengths", source="lengths_arxiv_summarization_llama2tok.csv",
        file="lengths_arxiv_summarization_llama2tok_first2000.csv", rows=2000),
    # The four timestamped traces whole, for studies that replay a whole file
    Cut(name="azure_conv_whole", source="azure_llm_2023_conv.csv", file="azure_llm_2023_conv.csv.gz", gzip=True),
    Cut(name="azure_code_whole", source="azure_llm_2023_code.csv", file="azure_llm_2023_code.csv.gz", gzip=True),
    Cut(name="mooncake_conversation_whole", source="mooncake_fast25_conversation_trace.jsonl",
        file="mooncake_fast25_conversation_trace.jsonl.gz", gzip=True),
    Cut(name="mooncake_synthetic_whole", source="mooncake_fast25_synthetic_trace.jsonl",
        file="mooncake_fast25_synthetic_trace.jsonl.gz", gzip=True),
)


def _rows_to_keep(cut: Cut, src: Path) -> int | None:
    if cut.first_s is None:
        return cut.rows
    full = load(src)
    meta = full.attrs
    if meta["resorted"] or any(meta["dropped"].values()):
        raise SystemExit(f"{src}: not a clean time-sorted file; a prefix slice would not be a time window")
    return int((full["arrival_s"] < cut.first_s).sum())


def _slice_bytes(src: Path, data_rows: int | None) -> tuple[bytes, int]:
    """Return the header plus the first ``data_rows`` lines (all when None) and the row count."""
    lines = src.read_bytes().splitlines(keepends=True)
    header = 0 if lines[0].lstrip().startswith(b"{") else 1
    n = len(lines) - header if data_rows is None else data_rows
    return b"".join(lines[: header + n]), n


def _describe_cut(cut: Cut, data_rows: int, header: bool) -> str:
    lines = data_rows + int(header)
    head = "header + " if header else ""
    if cut.first_s is None and cut.rows is None:
        return f"first {lines} lines = the whole file ({head}{data_rows} data rows), gzip -9n"
    why = f"rows with arrival < {cut.first_s:g} s after the first row" if cut.first_s is not None else "fixed count"
    return f"first {lines} lines ({head}{data_rows} data rows; {why}) = `head -n {lines}`"


def _encode(cut: Cut, data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0) if cut.gzip else data


def build_one(cut: Cut, src_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write one sample file and return its ``stats.json`` entry."""
    src = src_dir / cut.source
    data, n = _slice_bytes(src, _rows_to_keep(cut, src))
    data = _encode(cut, data)
    (DIR / cut.file).write_bytes(data)
    df = load(DIR / cut.file)
    up = manifest[cut.source]
    summary = summarize(df)
    return {
        "file": cut.file,
        "format": summary["format"],
        "source": {
            "file": cut.source, "repo": up["source_repo"], "path": up["source_path"],
            "commit": up["source_commit"], "last_changed_in_commit": up["last_changed_in_commit"],
            "license": up["license"], "sha256": up["sha256"],
        },
        "cut": _describe_cut(cut, n, header=not cut.file.endswith(".jsonl")),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "stats": {k: v for k, v in summary.items() if k not in ("format", "dropped")},
    }


def main(argv: list[str] | None = None) -> int:
    """Rebuild every sample from the source folder ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m unikv.traces.samples.build SOURCE_DIR", file=sys.stderr)
        return 2
    src_dir = Path(argv[0])
    if not (src_dir / "manifest.json").is_file():
        print(f"error: {src_dir} holds no manifest.json (the full traces' folder)", file=sys.stderr)
        return 2
    manifest = {f["file"]: f for f in json.loads((src_dir / "manifest.json").read_text())["files"]}
    samples = {cut.name: build_one(cut, src_dir, manifest) for cut in CUTS}
    doc = {
        "description": "Bundled trace samples: byte prefixes of the public trace files. "
        "Rebuild with `python -m unikv.traces.samples.build SOURCE_DIR`. "
        "Stats computed by unikv.traces.stats.summarize.",
        "samples": samples,
    }
    STATS_FILE.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for name, entry in samples.items():
        print(f"{name}: {entry['file']} {entry['bytes']:,} bytes, {entry['stats']['rows']} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
