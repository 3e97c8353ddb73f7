"""The prefix cache's block size: validated, honoured by the trace's hashes, never mis-scaled."""

import pytest
from unikv.sim.config import RunConfig, SchedulerConfig
from unikv.sim.prefix_cache import cache_block_tokens
from unikv.sim.run import run

from unikv import traces

LENGTHS = traces.FixedLengths(prompt_tokens=100, output_tokens=4)


def _shared(block_tokens: int):
    """40 requests over 2 system prompts of 96 tokens: full blocks of the prompt are shared."""
    return traces.shared_prefix_trace(40, rate_rps=2.0, lengths=LENGTHS, n_groups=2, system_prompt_tokens=96,
                                      block_tokens=block_tokens, seed=3)


@pytest.mark.parametrize("value", [0, -1, -16, True, 1.5, "16"])
def test_scheduler_refuses_a_block_size_that_is_not_a_positive_integer(value):
    with pytest.raises(ValueError, match=r"scheduler\.block_tokens=.*positive integer"):
        SchedulerConfig(block_tokens=value)


def test_cache_block_tokens_defaults_to_the_trace_and_accepts_multiples():
    assert cache_block_tokens(None, 512, enabled=True) == 512
    assert cache_block_tokens(1024, 512, enabled=True) == 1024
    assert cache_block_tokens(None, None, enabled=True) is None
    assert cache_block_tokens(None, 512, enabled=False) is None


@pytest.mark.parametrize("requested, trace, enabled, words", [
    (16, 512, True, "cannot be honoured"),       # smaller: the hashes cannot split a block
    (768, 512, True, "multiple of it"),          # not a multiple
    (16, None, True, "no prefix hashes"),        # the option does not apply
    (512, 512, False, "prefix cache is off"),    # nor here
])
def test_cache_block_tokens_refuses_what_the_trace_cannot_honour(requested, trace, enabled, words):
    with pytest.raises(ValueError, match=words):
        cache_block_tokens(requested, trace, enabled=enabled)


def test_regrouped_hashes_share_exactly_what_a_native_larger_block_shares():
    # Synthetic ids follow content, so a trace generated with 32-token blocks
    # is what an engine with 32-token blocks sees; regrouping the 16-token
    # trace must give the same sharing, block for block.
    small, native = _shared(16), _shared(32)
    regrouped = traces.regroup_blocks(small, block_tokens=32)
    assert regrouped.attrs["block_tokens"] == 32 and traces.validate(regrouped) == []
    assert [len(h) for h in regrouped["prefix_hashes"]] == [len(h) for h in native["prefix_hashes"]]
    rows = range(len(native))
    for j in range(3):
        for a in rows:
            for b in rows:
                same_native = native["prefix_hashes"][a][j] == native["prefix_hashes"][b][j]
                same_regrouped = regrouped["prefix_hashes"][a][j] == regrouped["prefix_hashes"][b][j]
                assert same_native == same_regrouped, (j, a, b)


def test_regroup_chains_the_prefix():
    # Same second pair of ids after different first pairs: different blocks.
    meta = traces.TraceMeta(source="t", format="f", block_tokens=2)
    df = traces.make_frame([0.0, 1.0], [8, 8], [1, 1], [[1, 2, 5, 6], [3, 4, 5, 6]], meta=meta)
    out = traces.regroup_blocks(df, block_tokens=4)["prefix_hashes"]
    assert out[0][1] != out[1][1]
    with pytest.raises(traces.TraceFormatError, match="multiple of the trace's 2-token"):
        traces.regroup_blocks(df, block_tokens=3)


def _replay(df, **changes):
    cfg = RunConfig(trace="synthetic", model="llama-3.1-8b", kv_budget_gib=4.0, layout="oracle",
                    trace_end_s=None, check_every=5).with_(**changes)
    return run(cfg, trace_df=df)


def test_a_larger_block_counts_the_hits_a_native_larger_block_gets():
    # Before: hits were matched 16-token hashes x 32 tokens, twice the truth.
    native = _replay(_shared(32))
    regrouped = _replay(_shared(16), block_tokens=32)
    assert native.violations == [] and regrouped.violations == []
    assert native.summary["prefix_hit_ratio"] > 0
    assert regrouped.requests["hit_tokens"].tolist() == native.requests["hit_tokens"].tolist()
    own = _replay(_shared(16), block_tokens=16)
    assert own.requests["hit_tokens"].tolist() == _replay(_shared(16)).requests["hit_tokens"].tolist()


def test_a_replay_refuses_block_sizes_the_trace_cannot_honour():
    with pytest.raises(ValueError, match="block_tokens=8 cannot be honoured"):
        _replay(_shared(16), block_tokens=8)
    no_hashes = _shared(16).drop(columns=["prefix_hashes"])
    with pytest.raises(ValueError, match="no prefix hashes"):
        _replay(no_hashes, block_tokens=16)
