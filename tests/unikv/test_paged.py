"""unikv.paged: the host twins of the paged kernels' torch references."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unikv import paged
from unikv.kernels import reference


def random_batch(rng, bs: int, ps: int):
    """prefix / seq lengths, last_loc ids on distinct live pages, fresh pages."""
    prefix = rng.integers(0, 5 * ps, bs)
    seq = prefix + rng.integers(0, 4 * ps, bs)
    tail_pages = rng.permutation(np.arange(1, 10 * bs + 2))[:bs]
    last = tail_pages * ps + (prefix - 1) % ps
    new = int((-(-seq // ps) - -(-prefix // ps)).sum())
    fresh = rng.permutation(np.arange(10 * bs + 2, 30 * bs + 2 + new))[:new]
    return prefix.astype(np.int64), seq.astype(np.int64), last.astype(np.int64), fresh.astype(np.int64)


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("bs", [1, 7, 64])
def test_extend_ids_match_the_reference(ps, bs):
    rng = np.random.default_rng(ps * 100 + bs)
    for _ in range(300 if bs == 1 else 5):  # one request has its own path
        prefix, seq, last, fresh = random_batch(rng, bs, ps)
        req = paged.PagedRequest(prefix, seq, last, len(fresh), int((seq - prefix).sum()))
        got = paged.extend_ids(req, fresh, ps)
        want = reference.paged_extend(*(torch.from_numpy(a) for a in (prefix, seq, last, fresh)), ps)
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_decode_ids_match_the_reference(ps):
    rng = np.random.default_rng(ps)
    seq = rng.integers(1, 10 * ps, 50).astype(np.int64)
    prefix = seq - 1
    last = (np.arange(1, 51) * ps + (prefix - 1) % ps).astype(np.int64)
    opens = prefix % ps == 0
    fresh = np.arange(100, 100 + int(opens.sum()), dtype=np.int64)
    req = paged.PagedRequest(prefix, seq, last, len(fresh), len(seq), opens)
    want = reference.paged_decode(torch.from_numpy(seq), torch.from_numpy(last), torch.from_numpy(fresh), ps)
    assert paged.decode_ids(req, fresh, ps).tolist() == want.tolist()


@pytest.mark.parametrize("ps,mult", [(1, 1), (16, 1), (16, 6), (5, 3)])
def test_translate_matches_the_reference(ps, mult):
    rng = np.random.default_rng(ps + mult)
    v2p = rng.integers(-1, 500, 300).astype(np.int64)
    v2p[0] = 0
    ids = rng.integers(0, 300 * ps, 1000).astype(np.int64)
    want = reference.translate(torch.from_numpy(ids), torch.from_numpy(v2p), ps, mult)
    got = paged.translate(ids, v2p, ps, mult)
    assert got.tolist() == want.tolist() and got.min() >= 0


@pytest.mark.parametrize("ps", [1, 2, 3, 16, 48, 64])
def test_page_and_slot_of_equal_division_on_every_page_size(ps):
    """`page_of` / `slot_of` shift and mask for a power-of-two page size,
    divide otherwise: both paths equal `//` and `%`."""
    ids = np.random.default_rng(ps).integers(0, 1 << 40, 2000).astype(np.int64)
    assert (paged.page_of(ids, ps) == ids // ps).all()
    assert (paged.slot_of(ids, ps) == ids % ps).all()


def test_page_representatives_of_a_mid_page_run():
    ids = np.arange(99, 136)  # positions 3.. of a run on page size 16 (99 = 6 * 16 + 3)
    reps = paged.page_representatives(ids, 3, 16)
    assert (reps // 16).tolist() == sorted(set((ids // 16).tolist()))


def test_a_run_across_pages_may_jump_between_pages_at_their_boundaries():
    ids = np.concatenate([np.arange(5 * 16 + 14, 6 * 16), np.arange(2 * 16, 2 * 16 + 5)])
    assert paged.page_representatives(ids, 14, 16).tolist() == [94, 32]


def _is_run(ids: list[int], start_pos: int, ps: int) -> bool:
    """The run contract spelled out: each id at its position's slot, +1
    inside a page."""
    return all(x % ps == (start_pos + i) % ps and (i == 0 or (start_pos + i) % ps == 0 or x == ids[i - 1] + 1)
               for i, x in enumerate(ids))


@settings(max_examples=300)
@given(ps=st.sampled_from([2, 3, 4, 16]), start_pos=st.integers(0, 40), n=st.integers(1, 60),
       data=st.data())
def test_check_run_accepts_exactly_the_runs_and_their_strides_cover_every_page(ps, start_pos, n, data):
    positions = range(start_pos, start_pos + n)
    page_of_pos = {p // ps: data.draw(st.integers(1, 50)) for p in positions}
    ids = [page_of_pos[p // ps] * ps + p % ps for p in positions]
    if data.draw(st.booleans(), label="perturb"):
        i = data.draw(st.integers(0, n - 1), label="at")
        ids[i] = data.draw(st.integers(0, 50 * ps), label="to")
    arr = np.array(ids, dtype=np.int64)
    if _is_run(ids, start_pos, ps):
        reps = paged.page_representatives(arr, start_pos, ps)
        assert sorted(set((reps // ps).tolist())) == sorted({x // ps for x in ids})
    else:
        with pytest.raises(ValueError, match="not one contiguous run"):
            paged.page_representatives(arr, start_pos, ps)


@pytest.mark.parametrize("ids, start_pos, where", [
    (np.arange(15, 33), 0, "id 15 at index 0"),  # a stride from slot 15 skips page 2 (id 32)
    (np.array([32, 49]), 0, "id 49 at index 1"),  # position 1 on another page than position 0
    (np.array([32, 33, 35]), 0, "id 35 at index 2"),  # a gap inside the page
])
def test_page_representatives_refuse_ids_that_are_not_the_run_claimed(ids, start_pos, where):
    with pytest.raises(ValueError, match=f"not one contiguous run from start_pos={start_pos}: {where}"):
        paged.page_representatives(ids, start_pos, 16)


def _outcome(fn):
    try:
        return fn()
    except ValueError as exc:
        return f"ValueError: {exc}"


@pytest.mark.parametrize("ps", [1, 3, 4])
def test_small_batch_paths_accept_and_reject_like_the_vector_paths(ps, monkeypatch):
    """The Python-int paths for small batches (decode and extend checks, the
    pages of release / free) give the vector paths' answers, and leave bad
    input to them (same ValueError)."""
    import random

    from factories import full_swa, pool

    rng = random.Random(ps)
    p = pool(full_swa(page_size=ps), "lazy")
    live = p.alloc(5 * ps).numpy()
    p.free(live[:2 * ps])  # some dead pages to point at
    high = p.vids.size * ps
    for _ in range(400):
        bs = rng.randrange(0, 5)
        seq = np.array([rng.randrange(-1, 6 * ps) for _ in range(bs)], dtype=np.int64)
        last = np.array([rng.choice([rng.randrange(-2, high + 2), int(rng.choice(live))])
                         for _ in range(bs)], dtype=np.int64)
        ids = np.array([rng.choice([rng.randrange(-1, high + 1), int(rng.choice(live))])
                        for _ in range(bs)], dtype=np.int64)
        prefix = np.array([rng.randrange(-1, 6 * ps) for _ in range(bs)], dtype=np.int64)
        grown = prefix + np.array([rng.randrange(-1, 3 * ps) for _ in range(bs)], dtype=np.int64)
        total = int((grown - prefix).sum()) + rng.choice([0, 0, 0, 1])
        given = rng.choice([None, total])

        def run():  # each lambda below is called at once, inside the loop
            binds = p.vids.binds
            decode = _outcome(lambda: paged.decode_request(ps, binds, seq, last))  # noqa: B023
            pages = _outcome(lambda: paged.live_pages(ids, "release", ps, binds, allow_sink=True).tolist())  # noqa: B023
            extend = _outcome(lambda: paged.extend_request(ps, binds, prefix, grown, last, given))  # noqa: B023
            if not isinstance(decode, str):
                decode = (decode.new_pages, decode.total_tokens, decode.opens.tolist(),
                          decode.prefix.tolist())
            if not isinstance(extend, str):
                extend = (extend.new_pages, extend.total_tokens, extend.prefix.tolist(),
                          extend.seq.tolist(), extend.last_loc.tolist())
            return decode, pages, extend

        fast = run()
        with monkeypatch.context() as m:
            m.setattr(paged, "SMALL_BATCH", -1)
            assert run() == fast, (seq, last, ids, prefix, grown, given)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_decode_ids_when_every_request_opens_a_page(ps):
    seq = (np.arange(1, 9, dtype=np.int64) * ps) + 1  # position seq - 1 starts a page
    last = (np.arange(1, 9) * ps + ps - 1).astype(np.int64)
    fresh = np.arange(100, 108, dtype=np.int64)
    req = paged.PagedRequest(seq - 1, seq, last, 8, 8, np.ones(8, dtype=bool))
    want = reference.paged_decode(torch.from_numpy(seq), torch.from_numpy(last), torch.from_numpy(fresh), ps)
    assert paged.decode_ids(req, fresh, ps).tolist() == want.tolist() == (fresh * ps).tolist()


@pytest.mark.parametrize("ps", [1, 4])
def test_small_alloc_decode_matches_the_vector_path(ps, monkeypatch):
    """`alloc_decode` of a few requests (opening a page or not) returns the
    ids and leaves the pool the vector path would."""
    import random

    from factories import full_swa, pool, same, snapshot

    rng = random.Random(ps)
    pools = [pool(full_swa(page_size=ps, total=100_000), "lazy") for _ in range(2)]
    tokens = []
    for n in (2 * ps - 1, 2 * ps, ps + 1):
        outs = [q.alloc_extend([0], [n], [-1], n).tolist() for q in pools]
        assert outs[0] == outs[1]
        tokens.append(outs[0])
    for _ in range(3 * ps + 2):
        pick = sorted(rng.sample(range(3), rng.randrange(1, 4)))
        seq = np.array([len(tokens[i]) + 1 for i in pick], dtype=np.int64)
        last = np.array([tokens[i][-1] for i in pick], dtype=np.int64)
        outs = []
        for k, q in enumerate(pools):
            with monkeypatch.context() as m:
                if k:  # the vector path
                    m.setattr(paged, "SMALL_BATCH", -1)
                outs.append(q.alloc_decode(seq, last).tolist())
        assert outs[0] == outs[1]
        assert same(snapshot(pools[0]), snapshot(pools[1]))
        for i, t in zip(pick, outs[0]):
            tokens[i].append(t)
