"""Tests for traces.prefixes: shared system prompts and multi-turn conversations."""

from __future__ import annotations

import pytest
from unikv.traces import (
    BlockIds,
    ConversationSpec,
    FixedLengths,
    TraceFormatError,
    conversation_trace,
    shared_prefix_trace,
    validate,
    with_unique_hashes,
)
from unikv.traces.prefixes import prompt_hashes
from unikv.traces.stats import prefix_hit_ratio


def test_prompt_hashes_stable_shared_and_partial_blocks():
    ids = BlockIds()
    a = prompt_hashes(ids, prompt_tokens=40, block_tokens=8, group=0, system_tokens=20, conversation="a")
    b = prompt_hashes(ids, prompt_tokens=40, block_tokens=8, group=0, system_tokens=20, conversation="b")
    assert len(a) == 5 and a[:2] == b[:2]  # two full system blocks shared (20 // 8)
    assert not set(a[2:]) & set(b[2:])
    c = prompt_hashes(ids, prompt_tokens=41, block_tokens=8, group=0, system_tokens=20, conversation="a")
    assert c[:5] == a[:5] and len(c) == 6  # same conversation extends: its full blocks reused
    d = prompt_hashes(ids, prompt_tokens=36, block_tokens=8, group=0, system_tokens=20, conversation="a")
    assert d[:4] == a[:4] and d[4] not in a  # the last partial block is fresh


def test_shared_prefix_trace_groups_share_only_system_blocks():
    df = shared_prefix_trace(
        200, rate_rps=10, lengths=FixedLengths(prompt_tokens=30, output_tokens=4), n_groups=3,
        system_prompt_tokens=64, block_tokens=16, seed=1,
    )
    assert validate(df) == [] and (df["prompt_tokens"] == 94).all()
    firsts = df.groupby("prefix_group")["prefix_hashes"].apply(lambda s: {tuple(h[:4]) for h in s})
    assert all(len(v) == 1 for v in firsts) and len({next(iter(v)) for v in firsts}) == 3
    tails = [x for h in df["prefix_hashes"] for x in h[4:]]
    assert len(tails) == len(set(tails))  # user parts never shared
    refs, _, ratio = prefix_hit_ratio(df["prefix_hashes"])
    assert ratio == pytest.approx((200 - 3) * 4 / refs)


def test_multi_turn_context_grows_and_reuses_history():
    spec = ConversationSpec(turns_mean=4, think_time_s=5.0, system_prompt_tokens=0, block_tokens=16)
    lengths = FixedLengths(prompt_tokens=50, output_tokens=20)
    df = conversation_trace(30, rate_rps=0.5, lengths=lengths, spec=spec, seed=3)
    assert validate(df) == [] and df["turn"].max() >= 2
    for _, conv in df.groupby("conversation_id"):
        conv = conv.sort_values("turn")
        assert conv["prompt_tokens"].tolist() == [50 + 70 * k for k in range(len(conv))]
        hashes = conv["prefix_hashes"].tolist()
        for prev, cur, p_prev in zip(hashes, hashes[1:], conv["prompt_tokens"], strict=False):
            full = p_prev // 16
            assert cur[:full] == prev[:full]


def test_conversation_trace_is_reproducible_and_respects_context_limit():
    spec = ConversationSpec(turns_mean=10, think_time_s=1.0, block_tokens=8, max_context_tokens=300)
    kw = dict(rate_rps=1.0, lengths=FixedLengths(prompt_tokens=40, output_tokens=20), spec=spec, seed=5)
    a, b = conversation_trace(20, **kw), conversation_trace(20, **kw)
    assert a.equals(b) and ((a["prompt_tokens"] + a["output_tokens"]) <= 300).all()
    assert a.attrs["block_tokens"] == 8


def test_spec_validation():
    with pytest.raises(TraceFormatError, match="turns_mean"):
        ConversationSpec(turns_mean=0.5)
    with pytest.raises(TraceFormatError, match="block_tokens"):
        ConversationSpec(block_tokens=0)


def test_with_unique_hashes():
    df = shared_prefix_trace(
        5, rate_rps=1, lengths=FixedLengths(prompt_tokens=33, output_tokens=1), n_groups=1, system_prompt_tokens=0
    ).drop(columns=["prefix_hashes"])
    out = with_unique_hashes(df, block_tokens=16)
    assert validate(out) == [] and out.attrs["block_tokens"] == 16
    assert prefix_hit_ratio(out["prefix_hashes"])[2] == 0.0
