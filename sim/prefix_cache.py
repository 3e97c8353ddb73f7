"""A radix tree of prompt blocks (block hashes) holding reusable KV pages.

Each node is one block of `block_tokens` prompt tokens, keyed by its hash
under its parent (hashes are chained prefixes, as in the Mooncake traces).
A node owns the virtual pages of its block; running requests lock the path
they reuse; unlocked leaves are evicted least recently used first. The tree
knows nothing about the pool: the caller frees an evicted node's pages, and
gives each node the bytes freeing it returns (`nbytes`), so that the tree can
keep `evictable_bytes`: the bytes of all unlocked nodes. Locks run from the
root, so an unlocked node's whole subtree is unlocked: repeated leaf eviction
can free every unlocked node.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable


def cache_block_tokens(requested: int | None, trace_block: int | None, *, enabled: bool) -> int | None:
    """The prefix cache's block size for a trace, or None for no cache.

    A trace's hash j covers its tokens `[j*B, (j+1)*B)`, B = `trace_block`;
    hits are counted in whole blocks, so the cache must use B or a multiple
    of it (the hashes are then regrouped, `traces.prefixes.regroup_blocks`):
    any other size would scale every hit by the wrong block.

    Args:
        requested: `SchedulerConfig.block_tokens` (None: the trace's B).
        trace_block: B in tokens, or None when the trace has no prefix hashes.
        enabled: `SchedulerConfig.prefix_cache`.

    Raises:
        ValueError: a requested size that does not apply (no cache, no
            hashes) or that the trace's hashes cannot honour.
    """
    if requested is not None and not enabled:
        raise ValueError(f"block_tokens={requested} does not apply: the prefix cache is off (--no-prefix-cache)")
    if requested is not None and trace_block is None:
        raise ValueError(f"block_tokens={requested} does not apply: the trace has no prefix hashes")
    if not enabled or trace_block is None:
        return None
    if requested is None:
        return trace_block
    if requested < trace_block or requested % trace_block:
        raise ValueError(
            f"block_tokens={requested} cannot be honoured by the trace's prefix hashes, one per "
            f"{trace_block} tokens: expected {trace_block} or a multiple of it (hashes regrouped)")
    return requested


def cover_blocks(hashes, trace_block: int, block: int, chained: dict) -> list[int]:
    """Keys of whole `block`-token blocks from one request's trace hashes
    (one per `trace_block` tokens), for a block that is not a multiple of
    the trace's (vLLM's block size under its mamba align rules, e.g. 544
    tokens over 512-token hashes).

    Block j covers tokens `[j*block, (j+1)*block)`; two requests can be
    known to share it only when they share every trace block up to the one
    holding its last token, `ceil((j+1)*block / trace_block)` of them. Its
    key is a fresh id for (block j-1's key, the trace ids it adds), handed
    out through `chained` (shared by all requests of a trace), so it names
    the whole prefix up to the block's end. A block whose last token lies
    past the trace's hashes gets no key. Conservative: a prefix shared only
    part way into a trace block counts up to that block's start.

    Raises:
        ValueError: a block size or trace block that is not a positive integer.
    """
    for name, value in (("block", block), ("trace_block", trace_block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (tokens)")
    out: list[int] = []
    prev, used = -1, 0
    while True:
        need = -(-(len(out) + 1) * block // trace_block)  # trace blocks through this block's last token
        if need > len(hashes):
            return out
        prev = chained.setdefault((prev, *hashes[used:need]), len(chained))
        out.append(prev)
        used = need


class Node:
    __slots__ = ("key", "parent", "children", "pages", "locks", "last_access", "state", "depth", "alive",
                 "nbytes")

    def __init__(self, key, parent: Node | None, pages: list[int], depth: int, nbytes: int = 0) -> None:
        self.key = key
        self.parent = parent
        self.children: dict = {}
        self.pages = pages
        self.locks = 0
        self.last_access = 0.0
        self.state: int | None = None  # state snapshot slot at this boundary
        self.depth = depth  # blocks from the root, this one included
        self.alive = True
        self.nbytes = nbytes  # bytes freeing this node's pages returns to the pool

    def __repr__(self) -> str:
        return f"Node(key={self.key}, depth={self.depth}, locks={self.locks})"


class PrefixCache:
    """LRU radix cache over block hashes."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.root = Node(None, None, [], 0)
        self._heap: list = []
        self._tick = itertools.count()
        self.nodes = 0
        self.pages = 0  # virtual token pages held by nodes
        self.states = 0  # state snapshots held
        self.evicted_nodes = 0
        self.evictable_bytes = 0  # nbytes of the unlocked nodes (see `evictable_bytes_slow`)

    def match(self, hashes: Iterable) -> list[Node]:
        """The longest path of cached nodes along `hashes`."""
        path, node = [], self.root
        for h in hashes:
            node = node.children.get(h)
            if node is None:
                break
            path.append(node)
        return path

    def lock(self, path: list[Node], now: float) -> None:
        for node in path:
            if not node.locks:
                self.evictable_bytes -= node.nbytes
            node.locks += 1
            node.last_access = now

    def unlock(self, path: list[Node], now: float) -> None:
        for node in path:
            node.locks -= 1
            node.last_access = now
            if not node.locks:
                self.evictable_bytes += node.nbytes
            self._maybe_evictable(node)

    def insert(self, parent: Node, key, pages: list[int], now: float, nbytes: int = 0) -> Node:
        """A new child block under `parent` (which must not have `key`);
        `nbytes`: the bytes evicting it returns to the pool."""
        node = Node(key, parent, pages, parent.depth + 1, nbytes)
        node.last_access = now
        parent.children[key] = node
        self.nodes += 1
        self.pages += len(pages)
        self.evictable_bytes += nbytes
        self._maybe_evictable(node)
        return node

    def set_state(self, node: Node, slot: int) -> None:
        node.state = slot
        self.states += 1

    def _maybe_evictable(self, node: Node) -> None:
        if node.alive and node.locks == 0 and not node.children and node is not self.root:
            heapq.heappush(self._heap, (node.last_access, next(self._tick), node))

    def evict_one(self) -> Node | None:
        """Remove and return the least recently used unlocked leaf."""
        while self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not node.alive or node.locks or node.children or stamp != node.last_access:
                continue
            del node.parent.children[node.key]
            node.alive = False
            self.nodes -= 1
            self.pages -= len(node.pages)
            self.states -= node.state is not None
            self.evictable_bytes -= node.nbytes
            self.evicted_nodes += 1
            self._maybe_evictable(node.parent)
            return node
        return None

    def evictable(self) -> bool:
        """Whether some node could be evicted now."""
        while self._heap:
            stamp, _, node = self._heap[0]
            if node.alive and not node.locks and not node.children and stamp == node.last_access:
                return True
            heapq.heappop(self._heap)
        return False

    def evictable_bytes_slow(self) -> int:
        """`evictable_bytes` recomputed from the tree (for checks)."""
        return sum(node.nbytes for node in self.walk() if not node.locks)

    def walk(self):
        """Every cached node (depth first)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
