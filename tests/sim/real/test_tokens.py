"""Prompt ids: shared prefix blocks get the same ids in every request, the
rest differ per request; generated tokens splice in after the prompt."""

import numpy as np
import pytest
from unikv.sim.real.tokens import TokenSource
from unikv.sim.request import Request


def test_a_shared_hash_gives_the_same_ids_and_other_positions_differ():
    src = TokenSource(vocab_size=1000, block_tokens=4)
    a = Request(0, 0.0, 10, 1, hashes=(7, 8, 9))
    b = Request(1, 0.0, 9, 1, hashes=(7, 8, 5))
    pa, pb = src.prompt(a), src.prompt(b)
    assert len(pa) == 10 and len(pb) == 9
    assert np.array_equal(pa[:8], pb[:8])  # blocks 7, 8 shared
    assert not np.array_equal(pa[8:9], pb[8:9])  # blocks 9 and 5 differ
    assert (pa >= 0).all() and (pa < 1000).all()
    # two requests without hashes: own ids, different per request
    c, d = Request(2, 0.0, 50, 1), Request(3, 0.0, 50, 1)
    assert (src.prompt(c) != src.prompt(d)).mean() > 0.9
    # a block position's id depends on its offset: no constant block
    assert len(set(pa[:4].tolist())) > 1


def test_ids_are_deterministic_and_the_seed_changes_them():
    r = Request(5, 0.0, 30, 1, hashes=("x", "y"))
    one, two = TokenSource(vocab_size=500, block_tokens=8), TokenSource(vocab_size=500, block_tokens=8)
    assert np.array_equal(one.prompt(r), two.prompt(r))
    other = TokenSource(vocab_size=500, block_tokens=8, seed=1)
    assert (one.prompt(r) != other.prompt(r)).mean() > 0.9


def test_without_a_block_size_hashes_are_ignored():
    src = TokenSource(vocab_size=1000, block_tokens=None)
    a, b = Request(0, 0.0, 8, 1, hashes=(1, 2)), Request(1, 0.0, 8, 1, hashes=(1, 2))
    assert (src.prompt(a) != src.prompt(b)).mean() > 0.5


def test_ids_splice_the_generated_tokens_after_the_prompt():
    src = TokenSource(vocab_size=100, block_tokens=None)
    r = Request(0, 0.0, 5, 4)
    prompt = src.prompt(r)
    assert src.ids(r, 3, 7, [11, 12]).tolist() == prompt[3:].tolist() + [11, 12]
    assert src.ids(r, 5, 7, [11, 12]).tolist() == [11, 12]
    assert src.ids(r, 0, 2, []).tolist() == prompt[:2].tolist()
    with pytest.raises(ValueError, match="outside its 5 prompt"):
        src.ids(r, 4, 8, [11, 12])


@pytest.mark.parametrize("field,value", [("vocab_size", 0), ("block_tokens", -1), ("vocab_size", True)])
def test_bad_arguments_are_refused_by_name(field, value):
    kwargs = {"vocab_size": 10, "block_tokens": 4, field: value}
    with pytest.raises(ValueError, match=field):
        TokenSource(**kwargs)
