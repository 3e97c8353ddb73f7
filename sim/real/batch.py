"""A planned step (`StepPlan`) as one forward's inputs over the pool.

The scheduler plans a step and allocates its memory; this module reads the
plan and the pool and builds what the model and the attention function need:

- `input_ids` / `position_ids`: packed `[1, T]` (every request's new tokens
  concatenated in batch order: prefill chunks, then decoders) for a step
  with any prefill, padded `[B, 1]` for a decode-only step;
- `cu_q` `[B+1]` (prefix sums of the query counts) and `seq_lens` `[B]` (KV
  length after this step's writes), as the paged-attention op reads them;
- per token band, `block_tables[band]` `[B, W]` (request b's j-th virtual
  page translated to its physical page on the band; released and unbound
  pages read 0, the sink) and `write_slots[band]` `[T]` (the physical slot
  each new token's K/V goes to: `pool.translate(virtual token ids, band)`);
  both are computed on the device when first read, from `page_rows` (the
  requests' VIRTUAL pages, `[B, W]`) and `write_vids` (`[T]` virtual token
  ids) by one gather from the pool's device page table per band, so a
  decode graph can take the virtual rows and translate inside the capture;
- `sample_rows`: the rows of the `T` tokens whose logits give a new token
  (a decoder's one token; the last token of a prefill that completes a
  first admission's prompt), and `samplers`, their requests.

A request readmitted after a retraction recomputes its prompt and all but
its newest generated token; that prefill samples nothing (its next token is
already known: the newest generated one, the next decode's input).

The virtual rows are not rebuilt per step: `BlockRows` keeps one device row
per request (`unikv.tensors.PageRows`) and writes only the pages the step
added (and the window pages the memory layer gave back, which read 0); a
finished or retracted request's row is closed when a later step finds it
so. `block_tables()` (host translate of every page, one upload) is the
readable version the tests hold the device path equal to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from unikv.sim.real.tokens import TokenSource
from unikv.sim.request import Request
from unikv.sim.scheduler import StepPlan

from unikv.kernels.translate.reference import translate, translate_pages


@dataclass(frozen=True, kw_only=True)
class StepBatch:
    """One forward's inputs (torch tensors on the model's device).

    Attributes:
        layout: "packed" (`[1, T]` inputs) or "padded" (`[B, 1]`, decode only).
        input_ids, position_ids: int64, shaped by `layout`.
        cu_q: `[B+1]` int32; seq_lens: `[B]` int32.
        block_tables: token band -> `[B, W]` int32 physical pages.
        write_slots: token band -> `[T]` int64 physical slots.
        sample_rows: `[S]` int64 rows of the step's tokens whose logits are sampled.
        samplers: the S requests those rows give a token to, in row order.
        requests: the batch (prefills, then decoders).
        page_rows: `[B, W]` int64 virtual pages of each request (0 past its
            last page), or None (a batch built from physical tables only).
        write_vids: `[T]` int64 virtual token ids written, or None.
        page_tables: token band -> the pool's device `v2p` (int64), with
            `page_rows` and `write_vids`; the tables were committed when the
            batch was built.
    """

    layout: str
    input_ids: Any
    position_ids: Any
    cu_q: Any
    seq_lens: Any
    block_tables: Mapping[str, Any]
    write_slots: Mapping[str, Any]
    sample_rows: Any
    samplers: tuple[Request, ...]
    requests: tuple[Request, ...]
    page_rows: Any = None
    write_vids: Any = None
    page_tables: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.position_ids.numel())


def _spans(plan: StepPlan) -> list[tuple[Request, int, int, bool]]:
    """(request, first position, last position + 1, samples) in batch order."""
    out = []
    for r, chunk in plan.prefill:
        first_done = r.prefilled + chunk == r.prefill_target and r.generated == 0
        out.append((r, r.seq - chunk, r.seq, first_done))
    out.extend((r, r.seq - 1, r.seq, True) for r in plan.decode)
    return out


def _vids(r: Request, start: int, stop: int, ps: int) -> np.ndarray:
    """Virtual token ids of positions `[start, stop)` of `r` (only the pages
    the span covers are read: a long request holds thousands)."""
    pos = np.arange(start, stop, dtype=np.int64)
    first = start // ps
    pages = np.asarray(r.pages[first:(stop - 1) // ps + 1], dtype=np.int64)
    return pages[pos // ps - first] * ps + pos % ps


def _decode_columns(decode: Sequence[Request], tokens: TokenSource, generated: Mapping[int, Sequence[int]],
                    ps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Input id, position and virtual id of each decoder (one token each, at
    `seq - 1`), in Python per request (numpy per request costs more than
    the arithmetic); the input id is the newest generated token, else the
    token source's."""
    ids, pos, vids = [], [], []
    for r in decode:
        a = r.seq - 1
        gen = generated.get(r.rid, ())
        k = a - r.prompt_tokens
        ids.append(gen[k] if 0 <= k < len(gen) else int(tokens.ids(r, a, a + 1, gen)[0]))
        pos.append(a)
        vids.append(r.pages[a // ps] * ps + a % ps)
    return (np.array(ids, dtype=np.int64), np.array(pos, dtype=np.int64), np.array(vids, dtype=np.int64))


def _tensor(x, device):
    """A translate answer as a torch tensor on `device`: a host numpy array
    is wrapped (no copy) and uploaded once, a device tensor (a CUDA pool's
    answer) stays where it is: no round trip through the host."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return t.to(device=device, dtype=torch.int64)


def block_tables(pool, requests: Sequence[Request], bands: Sequence[str], device: Any = "cpu") -> dict:
    """Per band, `[B, W]` int32 physical pages (torch, on `device`) of each
    request's virtual pages (W: the most pages a request holds; padding and
    released pages 0)."""
    import torch

    ps = pool.page_size
    counts = [len(r.pages) for r in requests]
    width = max(max(counts, default=0), 1)
    flat = np.array([p for r in requests for p in r.pages], dtype=np.int64) * ps
    # row-major flat index of each page's cell in the [B, W] table
    cells = np.concatenate([np.arange(c) + b * width for b, c in enumerate(counts)]) if flat.size \
        else np.empty(0, np.int64)
    where = torch.from_numpy(cells).to(device)
    out = {}
    for band in bands:
        table = torch.zeros(len(requests) * width, dtype=torch.int32, device=device)
        if flat.size:
            table[where] = (_tensor(pool.translate(flat, band), device) // ps).to(torch.int32)
        out[band] = table.reshape(len(requests), width)
    return out


class _Held:
    """What `BlockRows` wrote for one request: its row, the page list it
    copied (identity: a retraction gives the request a new list), the pages
    written and the window pages known released."""

    __slots__ = ("request", "row", "pages", "written", "released")

    def __init__(self, request: Request, row: int) -> None:
        self.request, self.row, self.pages, self.written, self.released = request, row, request.pages, 0, 0


class BlockRows:
    """The requests' virtual page rows on the device, kept across steps.

    Per step `rows_of(requests)` writes only what changed since the request
    was last seen: the pages it added, and the window pages the memory
    layer took back (`sim.memory.GONE`, 0: they must read the sink, since
    the pool may hand the id to another request). A request whose page list
    is a new object (readmitted after a retraction) gets a fresh row; rows
    of requests that finished or were retracted are closed at the next step.

    Args:
        pool: the run's pool (its device page tables; its page size).
        bands: the token bands the batch translates on.
        device: the model's device.
    """

    def __init__(self, pool, bands: Sequence[str], device: Any = "cpu") -> None:
        import torch

        from unikv.tensors import PageRows

        self.bands = tuple(bands)
        self.rows = PageRows(device)
        self._held: dict[int, _Held] = {}
        # the pool's device v2p per band: the same memory for the pool's life
        self.tables = {b: torch.as_tensor(pool.page_table(b)) for b in self.bands}

    def rows_of(self, requests: Sequence[Request]) -> np.ndarray:
        """`[B]` int64 row of each request, its row brought up to date (queued;
        `PageRows.gather` ships it)."""
        out = np.empty(len(requests), dtype=np.int64)
        seen = set()
        for i, r in enumerate(requests):
            held = self._held.get(r.rid)
            if held is None or held.pages is not r.pages or len(r.pages) < held.written:
                if held is not None:
                    self.rows.close(held.row)
                held = self._held[r.rid] = _Held(r, self.rows.open())
            self._sync(held, r)
            out[i] = held.row
            seen.add(r.rid)
        if len(self._held) > len(seen):
            self._close_gone(seen)
        return out

    def _sync(self, held: _Held, r: Request) -> None:
        pages = r.pages
        if r.swa_released > held.released:  # released window pages: 0 where the pool took the id back
            lo = min(held.released, held.written)
            gone = pages[lo:min(r.swa_released, held.written)]
            if 0 in gone:
                self.rows.write(held.row, lo, gone)
            held.released = r.swa_released
        if len(pages) > held.written:
            self.rows.write(held.row, held.written, pages[held.written:])
            held.written = len(pages)

    def _close_gone(self, seen: set) -> None:
        """Close the rows of requests outside this batch that finished or
        were retracted (their page list replaced)."""
        for rid in [rid for rid in self._held if rid not in seen]:
            held = self._held[rid]
            if held.request.finished_s is not None or held.request.pages is not held.pages:
                self.rows.close(held.row)
                del self._held[rid]

    def open_rows(self) -> int:
        """Rows held (requests seen and not yet known finished)."""
        return len(self._held)


class _Translated(Mapping):
    """band -> physical tensor, computed on the device on first read."""

    def __init__(self, bands: Sequence[str], make) -> None:
        self._bands, self._make, self._done = tuple(bands), make, {}

    def __getitem__(self, band: str):
        if band not in self._bands:
            raise KeyError(band)
        if band not in self._done:
            self._done[band] = self._make(band)
        return self._done[band]

    def __iter__(self) -> Iterator[str]:
        return iter(self._bands)

    def __len__(self) -> int:
        return len(self._bands)


def build_batch(plan: StepPlan, pool, tokens: TokenSource, generated: Mapping[int, Sequence[int]],
                bands: Sequence[str], device: Any = "cpu", block_rows: BlockRows | None = None,
                readable: bool = False) -> StepBatch:
    """The forward's inputs for `plan` (its memory already allocated).

    Args:
        pool: the run's pool (translates virtual ids; its page size).
        tokens: the prompt ids.
        generated: request id -> the tokens the model generated so far.
        bands: the token bands the model's layers store on.
        device: where the tensors go (the model's device).
        block_rows: the run's `BlockRows`, kept across its steps so a step
            ships only the pages it added (default: a fresh one, every page
            written: correct, and as slow as a rebuild).
        readable: build the physical tables on the host instead
            (`block_tables`, `pool.translate`): the reference the device
            path is held equal to; no `page_rows`.
    Raises:
        ValueError: an empty plan.
    """
    import torch

    spans = _spans(plan)
    if not spans:
        raise ValueError(f"build_batch: step {plan.index} plans no request")
    ps = pool.page_size
    pre = spans[:len(plan.prefill)]  # then the decoders, one token each
    ids = [tokens.ids(r, a, b, generated.get(r.rid, ())) for r, a, b, _ in pre]
    pos = [np.arange(a, b, dtype=np.int64) for _, a, b, _ in pre]
    vid = [_vids(r, a, b, ps) for r, a, b, _ in pre]
    if plan.decode:
        for out, column in zip((ids, pos, vid), _decode_columns(plan.decode, tokens, generated, ps)):
            out.append(column)
    vids = np.concatenate(vid)
    q_lens = np.array([b - a for _, a, b, _ in spans], dtype=np.int64)
    rows = np.cumsum(q_lens) - 1
    samples = [i for i, s in enumerate(spans) if s[3]]
    layout = "packed" if plan.prefill else "padded"
    shape = (1, -1) if layout == "packed" else (-1, 1)
    batch = [r for r, *_ in spans]

    def dev(a, dtype):
        return torch.as_tensor(np.ascontiguousarray(a), device=device).to(dtype)

    common = dict(
        layout=layout,
        input_ids=dev(np.concatenate(ids), torch.int64).reshape(shape),
        position_ids=dev(np.concatenate(pos), torch.int64).reshape(shape),
        cu_q=dev(np.concatenate([[0], np.cumsum(q_lens)]), torch.int32),
        seq_lens=dev(np.array([b for _, _, b, _ in spans]), torch.int32),
        sample_rows=dev(rows[samples], torch.int64),
        samplers=tuple(batch[i] for i in samples), requests=tuple(batch))
    if readable:
        writes = {band: _tensor(pool.translate(vids, band), device) for band in bands}
        return StepBatch(block_tables=block_tables(pool, batch, bands, device), write_slots=writes, **common)
    held = block_rows if block_rows is not None else BlockRows(pool, bands, device)
    width = max(max(len(r.pages) for r in batch), 1)
    page_rows = held.rows.gather(held.rows_of(batch), width)
    pool.commit()  # the device tables as the step's allocator work left them
    return StepBatch(**device_tables(page_rows, dev(vids, torch.int64), held.tables, ps), **common)


def device_tables(page_rows, write_vids, tables: Mapping[str, Any], page_size: int) -> dict:
    """`StepBatch`'s table fields from virtual rows and ids: `block_tables`
    and `write_slots` gathered on the device from `tables` (band -> device
    `v2p`, committed) when first read.

    Args:
        page_rows: `[B, W]` int64 virtual pages (0 past a request's pages).
        write_vids: `[T]` int64 virtual token ids written.
    """
    import torch

    return dict(
        block_tables=_Translated(tables, lambda b: translate_pages(page_rows, tables[b]).to(torch.int32)),
        write_slots=_Translated(tables, lambda b: translate(write_vids, tables[b], page_size)),
        page_rows=page_rows, write_vids=write_vids, page_tables=tables)
