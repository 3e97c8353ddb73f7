"""The paged alloc surface: argument checks and page arithmetic.

Serving engines hand a batch as per-request `prefix_lens` (tokens already
held), `seq_lens` (tokens wanted) and `last_loc` (id of the last prefix
token). New tokens first fill the free slots of the last page, then take
`ceil(seq / ps) - ceil(prefix / ps)` new pages per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unikv.ids import as_ids, few


@dataclass(frozen=True)
class PagedRequest:
    prefix: torch.Tensor
    seq: torch.Tensor
    last_loc: torch.Tensor
    new_pages: int
    total_tokens: int


def _host(values, what: str) -> list[int]:
    """Lengths and locations as host ints (they are scheduler metadata: pass
    CPU tensors or lists; a device tensor costs a device-to-host read)."""
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise ValueError(f"{what}: dtype {values.dtype} is not an integer dtype")
        if values.dim() > 1:
            raise ValueError(f"{what}: shape {tuple(values.shape)} is not 1-D")
        return values.reshape(-1).tolist()
    return as_ids(values, what, "cpu").tolist()


def _device(values, host: list[int], device) -> torch.Tensor:
    """`values` as an int64 tensor on `device`, reusing it when it already is."""
    if isinstance(values, torch.Tensor) and values.dtype == torch.int64 and values.device == device:
        return values.reshape(-1)
    return torch.tensor(host, dtype=torch.int64, device=device)


def extend_request(pool, prefix_lens, seq_lens, last_loc, extend_num_tokens=None) -> PagedRequest:
    """Checked arguments of `alloc_extend`. Raises ValueError naming the
    argument (shapes, negative or shrinking lengths, a wrong token total, a
    `last_loc` that is not a live id at the prefix's last position)."""
    prefix = _host(prefix_lens, "alloc_extend: prefix_lens")
    seq = _host(seq_lens, "alloc_extend: seq_lens")
    last = _host(last_loc, "alloc_extend: last_loc")
    if not (len(prefix) == len(seq) == len(last)):
        raise ValueError(f"alloc_extend: prefix_lens, seq_lens, last_loc have lengths "
                         f"{len(prefix)}, {len(seq)}, {len(last)}; expected equal")
    negative = [p for p in prefix if p < 0]
    if negative:
        raise ValueError(f"alloc_extend: prefix_lens {few(negative)} are negative")
    shrinking = [s for s, p in zip(seq, prefix) if s < p]
    if shrinking:
        raise ValueError(f"alloc_extend: seq_lens {few(shrinking)} are below prefix_lens")
    total = sum(seq) - sum(prefix)
    if extend_num_tokens is not None and int(extend_num_tokens) != total:
        raise ValueError(f"alloc_extend: extend_num_tokens={extend_num_tokens} but "
                         f"sum(seq_lens - prefix_lens)={total}")
    _check_last_loc(pool, prefix, last, "alloc_extend")
    ps = pool.page_size
    pages = sum(-(-s // ps) + (p // -ps) for s, p in zip(seq, prefix))
    dev = pool.backend.device
    return PagedRequest(_device(prefix_lens, prefix, dev), _device(seq_lens, seq, dev),
                        _device(last_loc, last, dev), pages, total)


def decode_request(pool, seq_lens, last_loc) -> PagedRequest:
    """Checked arguments of `alloc_decode` (seq_lens >= 1, include the new token)."""
    seq = _host(seq_lens, "alloc_decode: seq_lens")
    last = _host(last_loc, "alloc_decode: last_loc")
    if len(seq) != len(last):
        raise ValueError(f"alloc_decode: seq_lens and last_loc have lengths "
                         f"{len(seq)}, {len(last)}; expected equal")
    short = [s for s in seq if s < 1]
    if short:
        raise ValueError(f"alloc_decode: seq_lens {few(short)} must be >= 1")
    prefix = [s - 1 for s in seq]
    _check_last_loc(pool, prefix, last, "alloc_decode")
    ps = pool.page_size
    pages = sum(1 for p in prefix if p % ps == 0)
    dev = pool.backend.device
    seq_t = _device(seq_lens, seq, dev)
    return PagedRequest(seq_t - 1, seq_t, _device(last_loc, last, dev), pages, len(seq))


def _check_last_loc(pool, prefix: list[int], last: list[int], op: str) -> None:
    """Where a prefix ends inside a page, its `last_loc` must be a live id
    at the prefix's last position of that page."""
    ps = pool.page_size
    tails = [(p, l) for p, l in zip(prefix, last) if p % ps]
    if not tails:
        return
    high = pool.vids.size * ps
    outside = [l for _, l in tails if not 0 <= l < high]
    if outside:
        raise ValueError(f"{op}: last_loc ids {few(outside)} are outside [0, {high})")
    wrong = [l for p, l in tails if l % ps != (p - 1) % ps]
    if wrong:
        raise ValueError(f"{op}: last_loc {few(wrong)} do not sit at the prefix's last "
                         f"position within their page (page_size={ps})")
    pages = torch.tensor([l // ps for _, l in tails], dtype=torch.int64, device=pool.vids.binds.device)
    live = pool.vids.binds[pages].tolist()
    dead = [l for (_, l), b in zip(tails, live) if b <= 0]
    if dead:
        raise ValueError(f"{op}: last_loc {few(dead)} are not on allocated pages")


def page_representatives(ids: torch.Tensor, start_pos: int, page_size: int) -> torch.Tensor:
    """One id per page of a contiguous run starting at position `start_pos`:
    the first id, then one every `page_size` from the next page boundary."""
    if page_size == 1 or ids.numel() == 0:
        return ids
    offset = start_pos % page_size
    if offset == 0:
        return ids[::page_size]
    return torch.cat([ids[:1], ids[page_size - offset::page_size]])
