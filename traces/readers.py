"""Low-level readers: open plain or gzip files, peek at them, read raw rows.

Rows are read with the standard ``csv`` and ``json`` modules, not pandas, so
every error can name the file's line number. Values stay raw (strings for
CSV, JSON values for JSONL); :mod:`traces.loaders` converts them.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import stat
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from unikv.traces.schema import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peek:
    """What the start of a file looks like.

    Attributes:
        container: ``"csv"``, ``"jsonl"``, ``"parquet"`` or ``"empty"``.
        fields: the CSV header fields, or the keys of the first JSON record.
        first: the first data record (CSV: field name -> raw string; JSONL:
            the parsed object), or None when the file has no data row.
        gzip: True when the file is gzip-compressed.
    """

    container: str
    fields: tuple[str, ...] = ()
    first: dict[str, Any] | None = None
    gzip: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class RawTable:
    """Raw rows of one file, column-wise.

    Attributes:
        columns: column name -> one raw value per data row (None where an
            optional JSON key is absent).
        lines: the 1-based line number of each data row in the file.
    """

    columns: dict[str, list[Any]]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.lines)


def check_file(path: Path) -> None:
    """Refuse a path that is not a readable regular file, without opening it
    (a FIFO would block the reader; a directory is not a trace).

    Raises:
        FileNotFoundError: when nothing exists at ``path``.
        TraceFormatError: for a directory, FIFO, socket or device, naming it.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"trace file not found: {path}") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read the trace file: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        raise TraceFormatError(f"{path}: is {_kind(mode)}, not a trace file (expected a CSV, JSON Lines or "
                               "Parquet file)")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def magic(path: Path, n: int = 4) -> bytes:
    """Return the first ``n`` bytes of a file (raw, not decompressed).

    Raises:
        TraceFormatError: when the file cannot be opened or read.
    """
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read the trace file: {exc.strerror or exc}") from exc


def open_text(path: Path) -> TextIO:
    """Open a file as UTF-8 text, decompressing when it starts with the gzip magic.

    A UTF-8 byte-order mark is skipped. The caller closes the handle.
    """
    if magic(path, 2) == GZIP_MAGIC:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _guarded(path: Path, lines: Iterator[str]) -> Iterator[str]:
    """Re-raise decoding, decompression and I/O errors as TraceFormatError naming the file."""
    try:
        yield from lines
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start:exc.start + 1].hex()
        raise TraceFormatError(f"{path}: not UTF-8 text (byte 0x{bad} cannot be decoded); a trace is CSV or "
                               "JSON Lines in UTF-8, plain or gzip, or Parquet") from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{path}: corrupt or truncated gzip data: {exc}") from exc
    except OSError as exc:
        raise TraceFormatError(f"{path}: I/O error while reading: {exc.strerror or exc}") from exc


def peek(path: Path) -> Peek:
    """Look at a file's first lines to tell its container and fields.

    Raises:
        TraceFormatError: when the file is neither CSV, JSON Lines nor Parquet.
    """
    head = magic(path)
    if head == PARQUET_MAGIC:
        return Peek(container="parquet")
    is_gz = head[:2] == GZIP_MAGIC
    with open_text(path) as f:
        lines = [ln for ln in _take_nonblank(_guarded(path, f), 2)]
    if not lines:
        return Peek(container="empty", gzip=is_gz)
    _refuse_json_document(path, lines[0])
    if lines[0].lstrip().startswith("{"):
        first = _parse_json(path, lines[0], _first_line_no(path))
        return Peek(container="jsonl", fields=tuple(first), first=first, gzip=is_gz)
    header = _header(next(csv.reader([lines[0]])))
    first_row = dict(zip(header, next(csv.reader([lines[1]])), strict=False)) if len(lines) > 1 else None
    return Peek(container="csv", fields=header, first=first_row, gzip=is_gz)


def _refuse_json_document(path: Path, first: str) -> None:
    """A file that starts with a JSON list or string holds no rows: say so
    (it would otherwise be read as a CSV header and called an unknown format)."""
    text = first.strip()
    kind = "list" if text.startswith("[") else None
    if text.startswith('"'):
        try:
            kind = "string" if isinstance(json.loads(text), str) else None
        except json.JSONDecodeError:  # a quoted CSV header: "a","b"
            kind = None
    if kind:
        raise TraceFormatError(f"{path}: starts with a JSON {kind} where rows were expected: JSON Lines (one "
                               "object per line) or CSV with a header line")


def _take_nonblank(lines: Iterator[str], n: int) -> Iterator[str]:
    taken = 0
    for ln in lines:
        if ln.strip():
            yield ln
            taken += 1
            if taken == n:
                return


def _first_line_no(path: Path) -> int:
    with open_text(path) as f:
        for no, ln in enumerate(_guarded(path, f), start=1):
            if ln.strip():
                return no
    return 1


def _header(row: Sequence[str]) -> tuple[str, ...]:
    return tuple(name.strip() for name in row)


def missing_columns_error(
    path: Path, missing: Sequence[str], found: Sequence[str], expected: Sequence[str]
) -> TraceFormatError:
    """Build the error for absent columns, naming found and expected ones."""
    return TraceFormatError(
        f"{path}: missing column(s) {list(missing)}; found {list(found)}; expected {list(expected)}"
    )


CHUNK_ROWS = 16_384  # rows parsed at a time: bounds the raw text held while reading


def read_csv(path: Path, wanted: Sequence[str], *, max_rows: int | None = None) -> RawTable:
    """Read the ``wanted`` columns of a CSV file with a header line.

    Args:
        path: the file (plain or gzip).
        wanted: column names to keep, all required.
        max_rows: stop after this many data rows (None: read all).

    Returns:
        The raw string values of each wanted column, with line numbers.

    Raises:
        TraceFormatError: on a missing column, a row with the wrong number of
            fields, or unreadable bytes; the message names the line.
    """
    return concat_tables(csv_chunks(path, wanted, max_rows=max_rows), wanted)


def csv_chunks(
    path: Path, wanted: Sequence[str], *, max_rows: int | None = None, chunk_rows: int | None = None
) -> Iterator[RawTable]:
    """:func:`read_csv` in tables of at most ``chunk_rows`` rows (None: :data:`CHUNK_ROWS`),
    read as they are consumed."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    with open_text(path) as f:
        reader = csv.reader(_guarded(path, f))
        header = _read_header(path, reader)
        missing = [c for c in wanted if c not in header]
        if missing:
            raise missing_columns_error(path, missing, header, wanted)
        pos = [header.index(c) for c in wanted]
        cols, lines = _new_columns(wanted), []
        for seen, row in enumerate(_csv_rows(path, reader, len(header))):
            if max_rows is not None and seen >= max_rows:
                break
            for c, p in zip(wanted, pos, strict=True):
                cols[c].append(row[p])
            lines.append(reader.line_num)
            if len(lines) == chunk_rows:
                yield RawTable(columns=cols, lines=lines)
                cols, lines = _new_columns(wanted), []
        yield RawTable(columns=cols, lines=lines)


def _new_columns(keys: Sequence[str]) -> dict[str, list[Any]]:
    return {k: [] for k in keys}


def concat_tables(tables: Iterable[RawTable], keys: Sequence[str]) -> RawTable:
    """Join raw tables column-wise (for readers that want every row at once)."""
    cols: dict[str, list[Any]] = {k: [] for k in keys}
    lines: list[int] = []
    for t in tables:
        for k in keys:
            cols[k].extend(t.columns[k])
        lines.extend(t.lines)
    return RawTable(columns=cols, lines=lines)


def _read_header(path: Path, reader: Any) -> tuple[str, ...]:
    try:
        for row in reader:
            if row and any(cell.strip() for cell in row):
                return _header(row)
    except csv.Error as exc:
        raise TraceFormatError(f"{path} line {reader.line_num}: bad CSV header: {exc}") from exc
    raise TraceFormatError(f"{path}: empty file, expected a CSV header line")


def _csv_rows(path: Path, reader: Any, width: int) -> Iterator[list[str]]:
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceFormatError(f"{path} line {reader.line_num}: malformed CSV row: {exc}") from exc
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            raise TraceFormatError(
                f"{path} line {reader.line_num}: expected {width} fields as in the header, found {len(row)}"
            )
        yield row


def read_jsonl(
    path: Path, wanted: Sequence[str], *, optional: Sequence[str] = (), max_rows: int | None = None
) -> RawTable:
    """Read fields of a JSON Lines file (one JSON object per line).

    Args:
        path: the file (plain or gzip).
        wanted: keys every record must have.
        optional: keys read when present (None where absent).
        max_rows: stop after this many records (None: read all).

    Raises:
        TraceFormatError: on invalid JSON, a non-object line or a missing key;
            the message names the line.
    """
    return concat_tables(jsonl_chunks(path, wanted, optional=optional, max_rows=max_rows), [*wanted, *optional])


def jsonl_chunks(
    path: Path, wanted: Sequence[str], *, optional: Sequence[str] = (), max_rows: int | None = None,
    chunk_rows: int | None = None,
) -> Iterator[RawTable]:
    """:func:`read_jsonl` in tables of at most ``chunk_rows`` rows (None: :data:`CHUNK_ROWS`),
    read as they are consumed."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    keys = [*wanted, *optional]
    cols, lines, seen = _new_columns(keys), [], 0
    with open_text(path) as f:
        for no, text in enumerate(_guarded(path, f), start=1):
            if max_rows is not None and seen >= max_rows:
                break
            if not text.strip():
                continue
            rec = _parse_json(path, text, no)
            absent = [k for k in wanted if k not in rec]
            if absent:
                raise TraceFormatError(
                    f"{path} line {no}: missing key(s) {absent}; found {sorted(rec)}; expected {list(wanted)}"
                )
            for k in keys:
                cols[k].append(rec.get(k))
            lines.append(no)
            seen += 1
            if len(lines) == chunk_rows:
                yield RawTable(columns=cols, lines=lines)
                cols, lines = _new_columns(keys), []
    yield RawTable(columns=cols, lines=lines)


def _parse_json(path: Path, text: str, line_no: int) -> dict[str, Any]:
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path} line {line_no}: not valid JSON: {exc.msg}") from exc
    if not isinstance(rec, dict):
        raise TraceFormatError(f"{path} line {line_no}: expected a JSON object, got {type(rec).__name__}")
    return rec
