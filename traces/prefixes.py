"""Synthetic workloads whose requests share prompt prefixes, with consistent hashes.

Model: each request's prompt is a token stream cut into ``block_tokens``
blocks. A block's id is stable exactly when its content is:

- a full block inside a group's system prompt has the group's id;
- a full block inside a conversation's history (earlier turns' prompts and
  outputs, which a new turn extends) has the conversation's id;
- the last, partial block of a prompt is unique (a fresh id).

So two requests share their leading ids exactly as far as their token
content agrees at block granularity, which is what a prefix cache matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np
import pandas as pd
from unikv.traces.schema import (
    HASHES,
    PROMPT,
    TraceFormatError,
    TraceMeta,
    expected_blocks,
    hash_column,
    make_frame,
    meta_of,
    with_meta,
)
from unikv.traces.synthetic import LengthSampler, Seed, as_rng, gamma_arrivals


class BlockIds:
    """Hands out block ids: the same id for the same key, fresh ids otherwise."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._next = 0

    def stable(self, key: Hashable) -> int:
        """Return the id of ``key``, allocating it on first use."""
        if key not in self._ids:
            self._ids[key] = self.fresh()
        return self._ids[key]

    def fresh(self) -> int:
        """Return an id never returned before."""
        self._next += 1
        return self._next - 1


def prompt_hashes(
    ids: BlockIds, *, prompt_tokens: int, block_tokens: int, group: Hashable, system_tokens: int, conversation: Hashable
) -> list[int]:
    """Block ids of one prompt that starts with a group's system prompt.

    Args:
        ids: the id allocator shared by the whole trace.
        prompt_tokens: the prompt's length in tokens (system prompt included).
        block_tokens: tokens per block.
        group: key of the system-prompt group.
        system_tokens: length of the group's system prompt in tokens.
        conversation: key of the conversation whose history the prompt extends.

    Returns:
        ``ceil(prompt_tokens / block_tokens)`` ids.
    """
    out = []
    for j in range(expected_blocks(prompt_tokens, block_tokens)):
        end = (j + 1) * block_tokens
        if end <= system_tokens:
            out.append(ids.stable(("group", group, j)))
        elif end <= prompt_tokens:
            out.append(ids.stable(("conversation", conversation, j)))
        else:
            out.append(ids.fresh())
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConversationSpec:
    """Shape of a multi-turn, system-prompt-sharing workload.

    Attributes:
        turns_mean: mean turns per conversation (geometric, >= 1; 1 = single turn).
        think_time_s: mean seconds between a turn's arrival and the next
            turn's (exponential; open loop: it does not wait for the answer).
        n_groups: number of system-prompt groups (conversations pick one uniformly).
        system_prompt_tokens: tokens of each group's shared system prompt.
        block_tokens: tokens per prefix-hash block.
        max_context_tokens: end a conversation before a turn whose prompt +
            output would exceed this (None: no limit).
    """

    turns_mean: float = 1.0
    think_time_s: float = 30.0
    n_groups: int = 1
    system_prompt_tokens: int = 0
    block_tokens: int = 16
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        checks = {
            "turns_mean": self.turns_mean >= 1, "think_time_s": self.think_time_s >= 0,
            "n_groups": self.n_groups >= 1, "system_prompt_tokens": self.system_prompt_tokens >= 0,
            "block_tokens": self.block_tokens >= 1,
            "max_context_tokens": self.max_context_tokens is None or self.max_context_tokens >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                raise TraceFormatError(f"ConversationSpec.{name}={getattr(self, name)!r} is out of range")


def conversation_trace(
    n_conversations: int, *, rate_rps: float, lengths: LengthSampler, spec: ConversationSpec,
    cv: float = 1.0, seed: Seed = 0,
) -> pd.DataFrame:
    """Multi-turn conversations over shared system prompts, with ``prefix_hashes``.

    Conversations start as a gamma process (``rate_rps``, ``cv``). Turn k's
    prompt is the system prompt, every earlier turn's user message and
    output, then a new user message; ``lengths`` draws each turn's
    (user message tokens, output tokens).

    Returns:
        A schema frame sorted by arrival, with extra columns
        ``conversation_id``, ``turn`` (from 0) and ``prefix_group``;
        ``attrs['block_tokens'] = spec.block_tokens``.
    """
    rng = as_rng(seed)
    starts = gamma_arrivals(n_conversations, rate_rps=rate_rps, cv=cv, rng=rng)
    turns = rng.geometric(1.0 / spec.turns_mean, size=n_conversations)
    groups = rng.integers(0, spec.n_groups, size=n_conversations)
    rows: list[tuple] = []
    for c in range(n_conversations):
        rows += _turns(c, int(groups[c]), float(starts[c]), int(turns[c]), spec, lengths, rng)
    rows.sort(key=lambda r: r[0])  # stable: keeps conversation order at equal times
    return _frame(rows, spec, n_conversations, rate_rps, cv, seed)


def _turns(
    c: int, group: int, start_s: float, n_turns: int, spec: ConversationSpec, lengths: LengthSampler,
    rng: np.random.Generator,
) -> list[tuple]:
    user, output = lengths.sample(n_turns, rng)
    gaps = rng.exponential(spec.think_time_s, size=n_turns) if spec.think_time_s > 0 else np.zeros(n_turns)
    out, context, t = [], spec.system_prompt_tokens, start_s
    for k in range(n_turns):
        prompt = context + int(user[k])
        if spec.max_context_tokens is not None and prompt + int(output[k]) > spec.max_context_tokens:
            break
        out.append((t, prompt, int(output[k]), c, k, group))
        context = prompt + int(output[k])
        t += float(gaps[k])
    return out


def _frame(rows: list[tuple], spec: ConversationSpec, n: int, rate_rps: float, cv: float, seed: Seed) -> pd.DataFrame:
    ids = BlockIds()
    # Ids are allocated in arrival order, so earlier requests get smaller ids.
    hashes = [
        prompt_hashes(ids, prompt_tokens=p, block_tokens=spec.block_tokens, group=g,
                      system_tokens=spec.system_prompt_tokens, conversation=c)
        for (_, p, _, c, _, g) in rows
    ]
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 6
    label = seed if isinstance(seed, int) else "generator"
    meta = TraceMeta(
        source="synthetic:conversations", format="synthetic", block_tokens=spec.block_tokens, rows_read=len(rows),
        history=(f"conversation_trace(n_conversations={n}, rate_rps={rate_rps}, cv={cv}, seed={label}, {spec})",),
    )
    extra = {"conversation_id": np.asarray(cols[3], np.int64), "turn": np.asarray(cols[4], np.int64),
             "prefix_group": np.asarray(cols[5], np.int64)}
    return make_frame(cols[0], cols[1], cols[2], hashes, meta=meta, extra=extra)


def shared_prefix_trace(
    n_requests: int, *, rate_rps: float, lengths: LengthSampler, n_groups: int, system_prompt_tokens: int,
    block_tokens: int = 16, cv: float = 1.0, seed: Seed = 0,
) -> pd.DataFrame:
    """Single-turn requests, each prefixed by one of ``n_groups`` shared system prompts.

    A request's prompt is ``system_prompt_tokens`` plus a user message drawn
    from ``lengths``; the system prompt's full blocks share their ids within
    the group. See :func:`conversation_trace` for the columns.
    """
    spec = ConversationSpec(
        turns_mean=1.0, n_groups=n_groups, system_prompt_tokens=system_prompt_tokens, block_tokens=block_tokens
    )
    return conversation_trace(n_requests, rate_rps=rate_rps, lengths=lengths, spec=spec, cv=cv, seed=seed)


def with_unique_hashes(df: pd.DataFrame, *, block_tokens: int) -> pd.DataFrame:
    """Give every request its own block ids (no sharing at all).

    Useful to run a prefix-cache-aware simulator on a trace without hashes.

    Raises:
        TraceFormatError: when ``block_tokens < 1``.
    """
    if block_tokens < 1:
        raise TraceFormatError(f"with_unique_hashes(block_tokens={block_tokens}): expected >= 1")
    ids = BlockIds()
    hashes = [[ids.fresh() for _ in range(expected_blocks(p, block_tokens))] for p in df[PROMPT]]
    out = df.copy()
    out[HASHES] = hash_column(hashes, out.index)
    meta = meta_of(df).with_step(f"with_unique_hashes(block_tokens={block_tokens})", block_tokens=block_tokens)
    return with_meta(out, meta)


def regroup_blocks(df: pd.DataFrame, *, block_tokens: int) -> pd.DataFrame:
    """Re-cut ``prefix_hashes`` into blocks ``k`` times the trace's (``block_tokens = k * B``).

    Block j of the new size covers the trace's blocks ``[j*k, (j+1)*k)``; its
    id is fresh for each distinct (previous new id, those ``k`` ids), so it
    names the whole prefix up to the block's end, as an engine's chained
    block hash of the larger block does: two requests share new block j
    exactly when they share the trace's first ``(j+1)*k`` blocks (or, for a
    last partial block, all of their ids). Ids are handed out in row order.

    Args:
        df: a trace frame with ``prefix_hashes`` and ``attrs['block_tokens'] = B``.
        block_tokens: the new block size in tokens, a positive multiple of B.

    Returns:
        A new frame (the input untouched) with ``ceil(prompt / block_tokens)``
        ids per row and ``attrs['block_tokens'] = block_tokens``.

    Raises:
        TraceFormatError: without hashes, or when ``block_tokens`` is not a
            positive multiple of B (a smaller or unaligned block would need
            token content the trace's hashes do not hold).
    """
    if HASHES not in df.columns:
        raise TraceFormatError(f"regroup_blocks(block_tokens={block_tokens}): the trace has no prefix_hashes")
    base = int(df.attrs["block_tokens"])
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1 \
            or block_tokens % base:
        raise TraceFormatError(
            f"regroup_blocks(block_tokens={block_tokens!r}): expected a positive multiple of the trace's "
            f"{base}-token blocks")
    k = block_tokens // base
    chained: dict[tuple, int] = {}
    hashes = [_regroup_row(list(h), k, chained) for h in df[HASHES]]
    out = df.copy()
    out[HASHES] = hash_column(hashes, out.index)
    meta = meta_of(df).with_step(f"regroup_blocks(block_tokens={block_tokens})", block_tokens=block_tokens)
    return with_meta(out, meta)


def _regroup_row(ids: list[int], k: int, chained: dict[tuple, int]) -> list[int]:
    out, prev = [], -1
    for j in range(0, len(ids), k):
        key = (prev, *ids[j: j + k])
        prev = chained.setdefault(key, len(chained))
        out.append(prev)
    return out
