"""A request as the simulated engine tracks it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Request:
    """One trace request and its progress.

    Token positions `[0, seq)` hold KV. Pages are virtual page ids, one per
    `page_size` positions; `shared_pages` leading pages belong to prefix-cache
    nodes (locked while the request runs), the rest to the request itself.
    """

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hashes: tuple = ()

    pages: list[int] = field(default_factory=list)
    seq: int = 0  # tokens with KV allocated
    prefill_target: int = 0  # tokens the (re)admission must prefill
    prefilled: int = 0  # of those, computed or hit in the prefix cache
    generated: int = 0  # output tokens produced
    shared_pages: int = 0
    nodes: list = field(default_factory=list)  # locked prefix-cache path
    swa_released: int = 0  # leading own pages released on the window band
    state: int | None = None  # state slot id
    hit_tokens: int = 0
    order: int = -1  # running order: set by the engine at each (re)admission

    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    retractions: int = 0
    rejected: bool = False

    @property
    def prefill_left(self) -> int:
        return self.prefill_target - self.prefilled

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV a (re)admission needs: the prompt plus every
        generated token but the newest (the next decode's input)."""
        return self.prompt_tokens + max(0, self.generated - 1)

    @property
    def decoding(self) -> bool:
        return self.prefill_left == 0

    def last_loc(self, page_size: int) -> int:
        """Virtual token id of position `seq - 1` (-1 when empty)."""
        if self.seq == 0:
            return -1
        return self.pages[(self.seq - 1) // page_size] * page_size + (self.seq - 1) % page_size

    def reset_progress(self) -> None:
        """Back to the queue after a retraction: generated tokens are kept,
        their KV is recomputed at re-admission."""
        self.pages = []
        self.seq = self.prefilled = self.prefill_target = 0
        self.shared_pages = self.swa_released = 0
        self.nodes = []
        self.state = None
