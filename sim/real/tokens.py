"""Deterministic prompt token ids for trace requests, which carry only lengths.

A trace gives each request a prompt length and, for prefix-cached traces,
one hash per prompt block. The real executor needs token ids: a prompt block
with a hash gets ids derived from the hash alone, so every request sharing
that block (and, through the prefix cache's trie, the whole path before it)
feeds the model the same tokens, and the KV a prefix-cache hit reads is the
KV those tokens produce. Every other prompt position gets ids derived from
(request id, position). Generated tokens are the model's own (the executor
keeps them); `TokenSource.ids` splices them after the prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from unikv.sim.request import Request

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
# Domain tags keep hash-derived and (rid, position)-derived streams apart.
_HASHED, _OWN = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise over uint64 (wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _hash_key(h: object) -> int:
    """A trace's block hash as a 64-bit key: ints as they are (mod 2**64),
    anything else by a stable digest of its text (never Python's `hash`,
    which is salted per process)."""
    if isinstance(h, (int, np.integer)) and not isinstance(h, bool):
        return int(h) & 0xFFFFFFFFFFFFFFFF
    digest = hashlib.blake2b(repr(h).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class TokenSource:
    """Prompt ids of trace requests, and prompt + generated ids by position.

    Args:
        vocab_size: ids are drawn from `[0, vocab_size)`.
        block_tokens: tokens per prefix hash (the prefix cache's block); None:
            hashes are ignored (no block is shared).
        seed: changes every id (a different synthetic corpus).
    Raises:
        ValueError: a vocab_size or block_tokens that is not a positive integer.
    """

    def __init__(self, *, vocab_size: int, block_tokens: int | None, seed: int = 0) -> None:
        for name, value in (("vocab_size", vocab_size), ("block_tokens", block_tokens)):
            if value is None and name == "block_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TokenSource: {name}={value!r} must be a positive integer")
        self.vocab = vocab_size
        self.block = block_tokens
        self.seed = np.uint64(seed & 0xFFFFFFFFFFFFFFFF)

    def prompt(self, req: Request) -> np.ndarray:
        """The request's `prompt_tokens` ids, int64."""
        pos = np.arange(req.prompt_tokens, dtype=np.uint64)
        with np.errstate(over="ignore"):
            own = _mix(_mix(np.uint64(req.rid) ^ self.seed ^ _OWN) + pos)
            if self.block is not None and req.hashes:
                hashed = min(len(req.hashes) * self.block, req.prompt_tokens)
                keys = np.array([_hash_key(h) for h in req.hashes], dtype=np.uint64)
                block = (pos[:hashed] // np.uint64(self.block)).astype(np.int64)
                offset = pos[:hashed] % np.uint64(self.block)
                own[:hashed] = _mix(_mix(keys[block] ^ self.seed ^ _HASHED) + offset)
        return (own % np.uint64(self.vocab)).astype(np.int64)

    def ids(self, req: Request, start: int, stop: int, generated: Sequence[int]) -> np.ndarray:
        """Ids at positions `[start, stop)` of the request's sequence: its
        prompt, then `generated` (the model's tokens so far).

        Raises:
            ValueError: positions past the prompt and the generated tokens.
        """
        p = req.prompt_tokens
        if not 0 <= start <= stop <= p + len(generated):
            raise ValueError(f"TokenSource.ids: positions [{start}, {stop}) of request {req.rid} are "
                             f"outside its {p} prompt + {len(generated)} generated tokens")
        head = self.prompt(req)[start:min(stop, p)] if start < p else np.empty(0, np.int64)
        tail = np.asarray(generated[max(start, p) - p: stop - p], dtype=np.int64) if stop > p \
            else np.empty(0, np.int64)
        return np.concatenate([head, tail])
