"""Per-request rows of virtual page ids, kept on the device across steps.

A serving engine's block table (vLLM's `block_table`, SGLang's
`req_to_token`) is a device tensor that grows by the pages each step adds;
it is never rebuilt. `PageRows` is that tensor over the pool's VIRTUAL page
ids: row r holds one request's pages in position order. The forward turns a
batch's rows into physical pages on the device, one gather per band from
the pool's device page table (`KVViews.translate_pages`), so a compaction,
a lazy flush or a float relocation changes only `v2p`, never a row
(DESIGN.md: the engine never notices moves).

Row 0 is never handed out and stays zero: virtual page 0 maps to the sink,
so row 0 is the padding row of a batch, and the cells past a request's last
page read the sink. A closed row is zeroed before it is handed out again.

Writes are queued on the host and reach the device in `flush()`: one upload
and one scatter for the cells, one fill for the rows closed since the last
flush. Nothing reads the device.
"""

from __future__ import annotations

import numpy as np
import torch


class PageRows:
    """A `[rows + 1, width]` int64 device table of virtual page ids.

    Args:
        device: where the table lives (the model's device).
        rows: rows to start with (grows by doubling).
        width: pages per row to start with (grows by doubling).
    Raises:
        ValueError: rows or width below 1.
    """

    def __init__(self, device: str | torch.device = "cpu", *, rows: int = 64, width: int = 64) -> None:
        for name, value in (("rows", rows), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PageRows: {name}={value!r} must be an integer >= 1")
        self.device = torch.device(device)
        self.table = torch.zeros((rows + 1, width), dtype=torch.int64, device=self.device)
        self._free = list(range(rows, 0, -1))  # pop() hands out the lowest row first
        self._open: set[int] = set()
        self._cells: list[tuple[int, int, np.ndarray]] = []  # (row, first column, pages)
        self._closed: list[int] = []

    @property
    def width(self) -> int:
        return int(self.table.shape[1])

    def open(self) -> int:
        """A free row (all zero once flushed); grows the table when none is free."""
        if not self._free:
            self._grow(rows=2 * (self.table.shape[0] - 1))
        row = self._free.pop()
        self._open.add(row)
        return row

    def close(self, row: int) -> None:
        """Give `row` back; the next flush zeroes it.

        Raises:
            ValueError: a row that is not open.
        """
        if row not in self._open:
            raise ValueError(f"PageRows.close: row={row!r} is not an open row")
        self._open.discard(row)
        self._cells = [c for c in self._cells if c[0] != row]
        self._closed.append(row)
        self._free.append(row)

    def write(self, row: int, first: int, pages) -> None:
        """Queue `pages` (virtual page ids) at columns `[first, first + len)` of `row`.

        Raises:
            ValueError: a row that is not open, or a negative column.
        """
        if row not in self._open:
            raise ValueError(f"PageRows.write: row={row!r} is not an open row")
        if first < 0:
            raise ValueError(f"PageRows.write: first={first!r} must be >= 0")
        values = np.asarray(pages, dtype=np.int64).reshape(-1)
        if values.size:
            self._cells.append((row, first, values))

    def flush(self) -> None:
        """Ship the queued writes: zero the closed rows, then scatter the cells
        (one upload of every cell's row, column and value, one `index_put_`)."""
        if self._closed:
            idx = torch.as_tensor(self._closed, dtype=torch.int64).to(self.device, non_blocking=True)
            self.table.index_fill_(0, idx, 0)
            self._closed = []
        if not self._cells:
            return
        need = max(first + len(values) for _, first, values in self._cells)
        if need > self.width:
            self._grow(width=max(need, 2 * self.width))
        rows = np.concatenate([np.full(len(v), r, dtype=np.int64) for r, _, v in self._cells])
        cols = np.concatenate([np.arange(f, f + len(v), dtype=np.int64) for _, f, v in self._cells])
        vals = np.concatenate([v for _, _, v in self._cells])
        self._cells = []
        host = torch.from_numpy(np.stack([rows, cols, vals]))
        dev = host.to(self.device, non_blocking=True) if self.device.type == "cuda" else host
        self.table.index_put_((dev[0], dev[1]), dev[2])

    def gather(self, rows, width: int) -> torch.Tensor:
        """`[B, width]` virtual pages of `rows` (0 = the padding row), flushed first.

        Args:
            rows: `[B]` row ids (host ints or an int64 array / tensor).
            width: columns to take (pages past a row's end read 0).
        Raises:
            ValueError: a width below 1.
        """
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"PageRows.gather: width={width!r} must be an integer >= 1")
        self.flush()
        if width > self.width:
            self._grow(width=width)
        idx = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.asarray(rows, dtype=np.int64))
        idx = idx.to(self.device, non_blocking=True)
        return self.table[:, :width].index_select(0, idx)

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        """A larger table holding the current one (a device copy; ids unchanged)."""
        old_rows, old_width = self.table.shape[0] - 1, self.width
        new_rows, new_width = rows or old_rows, width or old_width
        table = torch.zeros((new_rows + 1, new_width), dtype=torch.int64, device=self.device)
        table[: old_rows + 1, :old_width] = self.table
        self.table = table
        self._free = list(range(new_rows, old_rows, -1)) + self._free
