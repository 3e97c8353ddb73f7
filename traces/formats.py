"""The table of known trace formats and their detection from a file's start.

A :class:`Format` is data: which source columns hold arrival, prompt and
output, how the arrival is encoded, and the block size of prefix hashes.
Detection matches the header (CSV) or the first record's keys (JSONL)
against the table, most specific format first.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from unikv.traces.readers import Peek
from unikv.traces.schema import ARRIVAL, HASHES, OUTPUT, PROMPT, TraceFormatError

# How the arrival column is encoded -> units per second (None: absolute datetime text).
TIME_UNITS: dict[str, int | None] = {"datetime": None, "s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

_TZ_SUFFIX = re.compile(r"(Z|[+-]\d\d:?\d\d)$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format:
    """One trace format.

    Attributes:
        name: the format's name, as passed to ``traces.load(format=...)``.
        container: ``"csv"`` or ``"jsonl"``.
        prompt: source column of prompt tokens.
        output: source column of output tokens.
        arrival: source column of arrival times, or None (no timestamps).
        time_unit: a key of :data:`TIME_UNITS` for the arrival column.
        hashes: source column of prefix-block ids, or None.
        block_tokens: tokens per hash block, when the format fixes it.
        failed_if_zero_output: rows with 0 output tokens are failed requests.
        rezero: measure arrivals from the earliest row read (raw sources);
            False keeps the file's times (normalized files).
        ordered: the source publishes its rows in arrival order (or has no
            arrivals), so the file's first rows are the trace's first
            requests and a reader may stop early (:func:`traces.load_head`).
        description: one line for error messages and docs.
    """

    name: str
    container: str
    prompt: str
    output: str
    arrival: str | None = None
    time_unit: str = "s"
    hashes: str | None = None
    block_tokens: int | None = None
    failed_if_zero_output: bool = False
    rezero: bool = True
    ordered: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        if self.container not in ("csv", "jsonl"):
            raise TraceFormatError(f"Format.container={self.container!r}: expected 'csv' or 'jsonl'")
        if self.time_unit not in TIME_UNITS:
            raise TraceFormatError(f"Format.time_unit={self.time_unit!r}: expected one of {list(TIME_UNITS)}")

    @property
    def required(self) -> tuple[str, ...]:
        """Source columns that must be present (hashes are optional in JSONL)."""
        cols = (self.arrival, self.prompt, self.output)
        if self.container == "csv" and self.hashes:
            cols += (self.hashes,)
        return tuple(c for c in cols if c)


# Every named format's source is published in arrival order (the generic ones promise nothing).
_AZURE = dict(container="csv", arrival="TIMESTAMP", time_unit="datetime", prompt="ContextTokens",
              output="GeneratedTokens", ordered=True)
_MOONCAKE = dict(container="jsonl", arrival="timestamp", time_unit="ms", prompt="input_length",
                 output="output_length", ordered=True)

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(name="azure_2023", **_AZURE,
               description="Azure LLM inference 2023 CSV: TIMESTAMP,ContextTokens,GeneratedTokens"),
        Format(name="azure_2024", **_AZURE,
               description="Azure LLM inference 2024 CSV: same columns, timestamps with a UTC offset"),
        Format(name="mooncake", **_MOONCAKE, hashes="hash_ids", block_tokens=512,
               description="Mooncake FAST'25 JSONL: timestamp (ms),input_length,output_length,hash_ids"),
        Format(name="burstgpt", container="csv", arrival="Timestamp", prompt="Request tokens",
               output="Response tokens", failed_if_zero_output=True, ordered=True,
               description="BurstGPT CSV: Timestamp (s),Model,Request tokens,Response tokens,..."),
        Format(name="vidur", container="csv", arrival="arrived_at", prompt="num_prefill_tokens",
               output="num_decode_tokens", ordered=True,
               description="Vidur processed trace CSV: arrived_at (s),num_prefill_tokens,num_decode_tokens"),
        Format(name="lengths", container="csv", prompt="num_prefill_tokens", output="num_decode_tokens", ordered=True,
               description="length-only CSV (no timestamps): num_prefill_tokens,num_decode_tokens,..."),
        Format(name="unikv_csv", container="csv", arrival=ARRIVAL, prompt=PROMPT, output=OUTPUT,
               rezero=False, ordered=True,  # traces.save writes schema frames: sorted
               description="normalized CSV: arrival_s,prompt_tokens,output_tokens[,prefix_hashes]"),
        Format(name="unikv_jsonl", container="jsonl", arrival=ARRIVAL, prompt=PROMPT, output=OUTPUT,
               hashes=HASHES, rezero=False, ordered=True, description="normalized JSONL with the schema's field names"),
    )
}
GENERIC = ("csv", "jsonl")  # need an explicit column mapping
OTHER = ("parquet",)  # normalized frames written by `convert`


def known_formats() -> list[str]:
    """Return every format name ``traces.load`` accepts."""
    return [*FORMATS, *GENERIC, *OTHER]


def _unknown(path: object, peek: Peek) -> TraceFormatError:
    listing = "; ".join(f"{f.name} ({f.description})" for f in FORMATS.values())
    return TraceFormatError(
        f"{path}: unknown trace format ({peek.container} with fields {list(peek.fields)}). "
        f"Known formats: {listing}; generic 'csv'/'jsonl' with columns={{...}}; 'parquet'."
    )


def detect(path: object, peek: Peek) -> Format:
    """Pick the format whose columns the file has, most specific first.

    Raises:
        TraceFormatError: when no known format matches; lists the known ones.
    """
    fields = set(peek.fields)
    for fmt in FORMATS.values():
        if fmt.container != peek.container or not set(fmt.required) <= fields:
            continue
        if fmt.name.startswith("azure_"):
            return FORMATS[_azure_variant(peek)]
        if fmt.name == "unikv_csv" and HASHES in fields:
            return dataclasses.replace(fmt, hashes=HASHES)
        return fmt
    raise _unknown(path, peek)


def _azure_variant(peek: Peek) -> str:
    """2024 timestamps carry a UTC offset ('+00:00'); 2023 ones are naive."""
    stamp = str((peek.first or {}).get("TIMESTAMP", "")).strip()
    return "azure_2024" if _TZ_SUFFIX.search(stamp) else "azure_2023"


def by_name(name: str, peek: Peek, path: object) -> Format:
    """Return the named format, checked against the file's container.

    Raises:
        TraceFormatError: for an unknown name or a container mismatch.
    """
    if name not in FORMATS:
        raise TraceFormatError(f"format={name!r} is unknown; known formats: {known_formats()}")
    fmt = FORMATS[name]
    if peek.container not in (fmt.container, "empty"):
        raise TraceFormatError(
            f"{path}: format={name!r} expects {fmt.container}, but the file is {peek.container}"
        )
    if fmt.name == "unikv_csv" and HASHES in peek.fields:
        fmt = dataclasses.replace(fmt, hashes=HASHES)
    return fmt


def generic(
    container: str, columns: Mapping[str, str], *, time_unit: str, block_tokens: int | None
) -> Format:
    """Build a format from an explicit column mapping.

    Args:
        container: ``"csv"`` or ``"jsonl"``.
        columns: schema column -> source column. ``prompt_tokens`` and
            ``output_tokens`` are required; ``arrival_s`` and
            ``prefix_hashes`` are optional.
        time_unit: encoding of the arrival column (a key of :data:`TIME_UNITS`).
        block_tokens: tokens per hash block (required with ``prefix_hashes``).

    Raises:
        TraceFormatError: for unknown keys, missing required keys, or hashes
            without a block size.
    """
    allowed = {ARRIVAL, PROMPT, OUTPUT, HASHES}
    unknown = sorted(set(columns) - allowed)
    if unknown:
        raise TraceFormatError(f"columns has unknown key(s) {unknown}; expected keys among {sorted(allowed)}")
    absent = [k for k in (PROMPT, OUTPUT) if k not in columns]
    if absent:
        raise TraceFormatError(f"columns lacks {absent}; it maps schema names to the file's column names")
    if HASHES in columns and block_tokens is None:
        raise TraceFormatError("columns maps prefix_hashes but block_tokens is None; pass block_tokens=...")
    return Format(
        name=container, container=container, arrival=columns.get(ARRIVAL), time_unit=time_unit,
        prompt=columns[PROMPT], output=columns[OUTPUT], hashes=columns.get(HASHES),
        block_tokens=block_tokens, description=f"generic {container} with columns={dict(columns)}",
    )
