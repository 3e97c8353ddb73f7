"""The paged alloc surface: argument checks and page arithmetic, on the host.

Functions here get what they check against as data: the page size and the
token id space's bind counts (`binds`: `IdSpace.binds`, one count per
virtual page, so `len(binds)` is the id space's size; a page is allocated
while its count is > 0). Serving engines hand a batch as per-request `prefix_lens` (tokens already
held), `seq_lens` (tokens wanted) and `last_loc` (id of the last prefix
token). New tokens first fill the free slots of the last page, then take
`ceil(seq / ps) - ceil(prefix / ps)` new pages per request. The arithmetic
here is the host twin of `unikv.kernels.reference.paged_extend` /
`paged_decode` (tests hold them equal).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from unikv.ids import as_ids, check_range, few


class PagedRequest(NamedTuple):
    """A checked paged alloc: per-request lengths and tail ids, and the
    fresh pages and tokens the batch takes in all."""

    prefix: np.ndarray
    seq: np.ndarray
    last_loc: np.ndarray
    new_pages: int
    total_tokens: int
    opens: np.ndarray | None = None  # decode: the requests that open a page


def page_of(ids: np.ndarray, page_size: int) -> np.ndarray:
    """`ids // page_size`, as a shift when the page size is a power of two
    (integer division is several times slower per element)."""
    if page_size & (page_size - 1) == 0:
        return ids >> (page_size.bit_length() - 1)
    return ids // page_size


def slot_of(ids: np.ndarray, page_size: int) -> np.ndarray:
    """`ids % page_size` (a mask for a power-of-two page size)."""
    if page_size & (page_size - 1) == 0:
        return ids & (page_size - 1)
    return ids % page_size


# Batches up to this size are checked on Python ints: a numpy call costs
# about a microsecond whatever its length, a Python step a few tens of ns.
SMALL_BATCH = 16


def extend_request(page_size: int, binds: np.ndarray, prefix_lens, seq_lens, last_loc,
                   extend_num_tokens=None) -> PagedRequest:
    """Checked arguments of `alloc_extend` (`page_size` in tokens, `binds`
    as above). Raises ValueError naming the argument (shapes, negative or
    shrinking lengths, a wrong token total, a `last_loc` that is not a live
    id at the prefix's last position)."""
    prefix = as_ids(prefix_lens, "alloc_extend: prefix_lens")
    seq = as_ids(seq_lens, "alloc_extend: seq_lens")
    last = as_ids(last_loc, "alloc_extend: last_loc")
    if len(prefix) <= SMALL_BATCH and len(prefix) == len(seq) == len(last):
        req = _small_extend_request(page_size, binds, prefix, seq, last, extend_num_tokens)
        if req is not None:
            return req
    if not (len(prefix) == len(seq) == len(last)):
        raise ValueError(f"alloc_extend: prefix_lens, seq_lens, last_loc have lengths "
                         f"{len(prefix)}, {len(seq)}, {len(last)}; expected equal")
    if len(prefix) and prefix.min() < 0:
        raise ValueError(f"alloc_extend: prefix_lens {few(prefix[prefix < 0])} are negative")
    if (seq < prefix).any():
        raise ValueError(f"alloc_extend: seq_lens {few(seq[seq < prefix])} are below prefix_lens")
    total = int(seq.sum() - prefix.sum())
    if extend_num_tokens is not None and int(extend_num_tokens) != total:
        raise ValueError(f"alloc_extend: extend_num_tokens={extend_num_tokens} but "
                         f"sum(seq_lens - prefix_lens)={total}")
    _check_last_loc(page_size, binds, prefix, last, "alloc_extend")
    ps = page_size
    pages = int((-(-seq // ps) - -(-prefix // ps)).sum())
    return PagedRequest(prefix, seq, last, pages, total)


def _small_extend_request(ps: int, binds: np.ndarray, prefix: np.ndarray, seq: np.ndarray,
                          last: np.ndarray, extend_num_tokens) -> PagedRequest | None:
    """`extend_request` of a small batch, checked on Python ints; None when
    any check fails (the vector path then names the offenders)."""
    high = len(binds) * ps
    total = pages = 0
    for p, s, t in zip(prefix.tolist(), seq.tolist(), last.tolist()):
        if p < 0 or s < p:
            return None
        slot = p % ps
        if slot and not _last_loc_ok(t, slot, ps, high, binds):
            return None
        total += s - p
        pages += -(-s // ps) - -(-p // ps)
    if extend_num_tokens is not None and int(extend_num_tokens) != total:
        return None
    return PagedRequest(prefix, seq, last, pages, total)


def decode_request(page_size: int, binds: np.ndarray, seq_lens, last_loc) -> PagedRequest:
    """Checked arguments of `alloc_decode` (seq_lens >= 1, include the new
    token; `page_size` in tokens, `binds` as above)."""
    seq = as_ids(seq_lens, "alloc_decode: seq_lens")
    last = as_ids(last_loc, "alloc_decode: last_loc")
    if len(seq) <= SMALL_BATCH and len(seq) == len(last):
        req = _small_decode_request(page_size, binds, seq, last)
        if req is not None:
            return req
    if len(seq) != len(last):
        raise ValueError(f"alloc_decode: seq_lens and last_loc have lengths "
                         f"{len(seq)}, {len(last)}; expected equal")
    if len(seq) and seq.min() < 1:
        raise ValueError(f"alloc_decode: seq_lens {few(seq[seq < 1])} must be >= 1")
    prefix = seq - 1
    opens = slot_of(prefix, page_size) == 0
    pages = int(np.count_nonzero(opens))
    if pages < len(seq):
        _check_last_loc(page_size, binds, prefix, last, "alloc_decode", ~opens, len(seq) - pages)
    return PagedRequest(prefix, seq, last, pages, len(seq), opens)


def _small_decode_request(ps: int, binds: np.ndarray, seq: np.ndarray,
                          last: np.ndarray) -> PagedRequest | None:
    """`decode_request` of a small batch, checked on Python ints; None when
    any check fails (the vector path then names the offenders)."""
    opens = small_decode_opens(ps, binds, seq, last)
    if opens is None:
        return None
    return PagedRequest(seq - 1, seq, last, opens.count(True), len(opens), np.array(opens, dtype=bool))


def small_decode_opens(ps: int, binds: np.ndarray, seq: np.ndarray,
                       last: np.ndarray) -> list[bool] | None:
    """Which requests of a small, checked decode batch open a page (on
    Python ints; `ps` the page size, `binds` as above); None when any
    check fails."""
    high = len(binds) * ps
    opens = []
    for s, t in zip(seq.tolist(), last.tolist()):
        if s < 1:
            return None
        slot = (s - 1) % ps
        if slot and not _last_loc_ok(t, slot, ps, high, binds):
            return None
        opens.append(not slot)
    return opens


def _last_loc_ok(t: int, slot: int, ps: int, high: int, binds: np.ndarray) -> bool:
    """Whether id `t` is on an allocated page, in `[0, high)`, at the slot
    before `slot` (a prefix ending at `slot` of its last page): one
    request's `_check_last_loc`, on Python ints."""
    return 0 <= t < high and (t + 1) % ps == slot and bool(binds[t // ps])


def _check_last_loc(ps: int, binds: np.ndarray, prefix: np.ndarray, last: np.ndarray, op: str,
                    tail: np.ndarray | None = None, n_tail: int | None = None) -> None:
    """Where a prefix ends inside a page (`tail`, and how many: `n_tail`;
    computed when not given), its `last_loc` must be a live id at the
    prefix's last position of that page."""
    if tail is None:
        tail = slot_of(prefix, ps) != 0
        n_tail = int(np.count_nonzero(tail))
    elif n_tail is None:
        n_tail = int(np.count_nonzero(tail))
    if n_tail == 0:
        return
    if n_tail < len(prefix):
        prefix, last = prefix[tail], last[tail]
    high = len(binds) * ps
    if last.min() >= 0 and last.max() < high:  # noqa: SIM102 (the comment belongs to the inner test)
        # last sits at position prefix - 1 of its page <=> (last + 1) % ps == prefix % ps
        if (slot_of(last + 1, ps) == slot_of(prefix, ps)).all() and binds[page_of(last, ps)].all():
            return  # the common case in a few vector passes; below, name the offenders
    inside = (last >= 0) & (last < high)
    if not inside.all():
        raise ValueError(f"{op}: last_loc ids {few(last[~inside])} are outside [0, {high})")
    placed = slot_of(last + 1, ps) == slot_of(prefix, ps)
    if not placed.all():
        raise ValueError(f"{op}: last_loc {few(last[~placed])} do not sit at the prefix's last "
                         f"position within their page (page_size={ps})")
    dead = last[binds[page_of(last, ps)] <= 0]
    raise ValueError(f"{op}: last_loc {few(dead)} are not on allocated pages")


def live_pages(ids, op: str, page_size: int, binds: np.ndarray, allow_sink: bool = False,
               bound_v2p: np.ndarray | None = None) -> np.ndarray:
    """The distinct virtual pages of token `ids`, ascending, all allocated
    (`binds` as above); of those, the ones a band binds when its v2p table
    is given (`bound_v2p`). `allow_sink`: page 0 (the sink) is dropped
    instead of refused. Raises ValueError naming `op` for ids outside the
    id space or on pages not allocated (never, or already freed)."""
    t = as_ids(ids, f"{op}: ids")
    if len(t) <= SMALL_BATCH:
        pages = _few_live_pages(t, page_size, binds, allow_sink, bound_v2p)
        if pages is not None:
            return pages
    check_range(t, 0, len(binds) * page_size, f"{op}: token ids")
    pages = distinct(page_of(t, page_size), len(binds))
    if allow_sink and len(pages) and pages[0] == 0:
        pages = pages[1:]
    dead = pages[binds[pages] <= 0]
    if len(dead):
        raise ValueError(f"{op}: virtual pages {few(dead)} are not allocated "
                         "(never allocated, or already freed)")
    if bound_v2p is not None:
        pages = pages[bound_v2p[pages] >= 0]
    return pages


def _few_live_pages(t: np.ndarray, ps: int, binds: np.ndarray, allow_sink: bool,
                    bound_v2p: np.ndarray | None) -> np.ndarray | None:
    """`live_pages` of a few ids, on Python ints; None when a check fails
    (the vector path then names the offenders)."""
    high = len(binds) * ps
    pages = set()
    for x in t.tolist():
        if not 0 <= x < high:
            return None
        pages.add(x // ps)
    if allow_sink:
        pages.discard(0)
    for v in pages:
        if binds[v] <= 0:
            return None
    if bound_v2p is not None:
        return np.array(sorted([v for v in pages if bound_v2p[v] >= 0]), dtype=np.int64)
    return np.array(sorted(pages), dtype=np.int64)


def distinct(pages: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of `pages` (all in `[0, size)`), ascending: a
    sort for few, a presence mask over the id space for many (a whole
    request's token ids: linear instead of n log n)."""
    if len(pages) <= 1:
        return pages
    if len(pages) >= 2048 and 4 * len(pages) >= size // 16:
        seen = np.zeros(size, dtype=bool)
        seen[pages] = True
        return np.flatnonzero(seen)
    out = np.sort(pages)  # then drop repeats: several times faster than np.unique
    new = out[1:] != out[:-1]
    if new.all():
        return out
    return out[np.concatenate(([True], new))]


def extend_ids(req: PagedRequest, new_pages: np.ndarray, page_size: int) -> np.ndarray:
    """Virtual token ids of positions `[prefix, seq)` of every request,
    request-major: the tail page's free slots after `last_loc`, then the
    fresh pages `new_pages` in batch order."""
    ps = page_size
    prefix, seq, last = req.prefix, req.seq, req.last_loc
    if len(prefix) == 1:
        return _extend_ids_one(int(prefix[0]), int(seq[0]), int(last[0]), new_pages, ps)
    ext = seq - prefix
    req_of = np.repeat(np.arange(len(ext)), ext)
    pos = np.arange(req.total_tokens) - (np.cumsum(ext) - ext)[req_of] + prefix[req_of]
    old_pages = -(-prefix // ps)
    counts = -(-seq // ps) - old_pages
    in_tail = pos < (old_pages * ps)[req_of]
    out = (last[req_of] + (pos - prefix[req_of] + 1)) if in_tail.any() else np.empty_like(pos)
    if len(new_pages):
        k = (np.cumsum(counts) - counts - old_pages)[req_of] + pos // ps
        fresh = ~in_tail
        out[fresh] = new_pages[k[fresh]] * ps + pos[fresh] % ps
    return out


def _extend_ids_one(prefix: int, seq: int, last: int, new_pages: np.ndarray, ps: int) -> np.ndarray:
    """`extend_ids` of one request: the tail page's slots after `last`,
    then every slot of the fresh pages, up to position `seq`."""
    tail = min(seq, -(-prefix // ps) * ps) - prefix  # free slots left on the tail page
    fresh = (new_pages[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)[: seq - prefix - tail]
    if tail <= 0:
        return fresh
    return np.concatenate([np.arange(last + 1, last + 1 + tail, dtype=np.int64), fresh])


def decode_ids(req: PagedRequest, new_pages: np.ndarray, page_size: int) -> np.ndarray:
    """One token per request at position `seq - 1`: `last_loc + 1` inside
    the tail page, else the next fresh page's first slot."""
    return decode_ids_of(req.last_loc, req.opens, new_pages, page_size)


def decode_ids_of(last_loc: np.ndarray, opens, new_pages: np.ndarray, page_size: int) -> np.ndarray:
    """`decode_ids` from each request's `last_loc` and whether it opens a
    page (`opens`: a bool array or list, one per request)."""
    if len(new_pages) == len(last_loc):  # every request opens a page
        return new_pages * page_size
    out = last_loc + 1
    if len(new_pages):
        out[opens] = new_pages * page_size
    return out


def page_representatives(ids: np.ndarray, start_pos: int, page_size: int) -> np.ndarray:
    """One id per page of a contiguous run starting at position `start_pos`:
    the first id, then one every `page_size` from the next page boundary.

    Raises:
        ValueError: `ids` are not such a run (`check_run`).
    """
    if page_size == 1 or len(ids) == 0:
        return ids  # every id is its own page's representative
    check_run(ids, start_pos, page_size)
    offset = start_pos % page_size
    if offset == 0:
        return ids[::page_size]
    return np.concatenate([ids[:1], ids[page_size - offset::page_size]])


def check_ids(ids: np.ndarray, high: int, what: str) -> None:
    """Every id (int64) in `[0, high)`, else ValueError naming `what` and a
    few offenders (`ids.check_range`): a few ids on Python ints, more in one
    reduction (as uint64 a negative id is above every `high`)."""
    if len(ids) <= SMALL_BATCH:
        values = ids.tolist()
        if not values or (min(values) >= 0 and max(values) < high):
            return
    elif int(np.maximum.reduce(ids.view(np.uint64))) < high:  # the ufunc: no wrapper
        return
    check_range(ids, 0, high, what)


def check_run(ids: np.ndarray, start_pos: int, page_size: int) -> None:
    """`ids` are the virtual ids of positions `start_pos, start_pos + 1, ...`
    of one request: the first at its position's slot, consecutive inside a
    page, and a jump only to a page's first slot at a page boundary. Three
    vector passes over `ids` (a diff, a compare, a nonzero).

    Raises:
        ValueError: naming the first id off the run (a stride over it would
            skip pages: only some of them would be released).
    """
    offset = start_pos % page_size
    if len(ids) <= SMALL_BATCH:
        bad = _first_off_run(ids.tolist(), offset, page_size)
    else:
        bad = _first_off_run_vector(ids, offset, page_size)
    if bad is None:
        return
    raise ValueError(f"release: ids are not one contiguous run from start_pos={start_pos}: id "
                     f"{int(ids[bad])} at index {bad} is not position {start_pos + bad}'s slot "
                     f"(page_size={page_size}); pass start_pos=None for other ids")


def _first_off_run(ids: list[int], offset: int, ps: int) -> int | None:
    """`check_run` of a few ids on Python ints: the index of the first id
    off the run, or None."""
    prev = 0
    for i, x in enumerate(ids):
        slot = (offset + i) % ps
        if x % ps != slot or (i and slot and x != prev + 1):
            return i
        prev = x
    return None


def _first_off_run_vector(ids: np.ndarray, offset: int, ps: int) -> int | None:
    """`_first_off_run` in vector passes: a jump (a step other than +1) may
    only land on a page's first slot at a position's page boundary."""
    if int(ids[0]) % ps != offset:
        return 0
    jumps = np.flatnonzero(np.diff(ids) != 1) + 1
    if len(jumps) == 0:
        return None
    off = ((jumps + offset) % ps != 0) | (slot_of(ids[jumps], ps) != 0)
    return int(jumps[np.argmax(off)]) if off.any() else None


def translate(ids: np.ndarray, v2p: np.ndarray, page_size: int, multiplier: int = 1) -> np.ndarray:
    """Host twin of `unikv.kernels.reference.translate`: virtual ids ->
    physical slot ids (or kernel-facing ids); tombstones -> 0, the sink."""
    pages = page_of(ids, page_size)
    phys = v2p[pages]
    out = phys * (page_size * multiplier) + (ids - pages * page_size)
    out[phys < 0] = 0
    return out
