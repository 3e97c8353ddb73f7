"""The scheduling policy: which requests run in a step, and how much.

Plain code over a `Memory`, with no clock of its own and no SimPy: a driver
(`sim.engine`) hands it arrivals, asks it to `plan` a step (this allocates
the step's memory), has an executor run or cost the step, and then tells it
the step is `complete`. The policy: admit waiting requests FCFS while their
first chunk and state slot fit and the decode reserve holds; give every
decoding request one token and every prefilling one its next chunk first;
on a shortfall evict cached prefixes, then retract the newest running
request (`sim.shortfall.cover`).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

import numpy as np
from unikv.sim.memory import Memory, int64_ids
from unikv.sim.request import Request
from unikv.sim.shortfall import cover, remedy
from unikv.sim.vllm_rules import aligned_chunk


@dataclass(slots=True)
class StepPlan:
    """One engine step as the scheduler planned it; its memory is allocated.

    Attributes:
        index: the step's number (0 first).
        prefill: (request, chunk tokens) in batch order: continued prefills,
            then admissions.
        decode: the requests decoding one token each, in running order.
        prefill_tokens: the chunks summed.
        written: the virtual token ids the forward writes (the decoders'
            new positions, then the pages of every prefill chunk, one id per
            page): Python ints (or an int array), or None: derived from
            `write_pages` when asked (`write_ids`).
        whole_batch: the batch is every running request.
        write_pages: the virtual page of each written id, as Python ints
            (what the pool's hazards need: `Memory.begin_forward`), or None
            (the pool then derives them from `write_ids`).
        page_size: tokens per page, for `write_ids` when `written` is None.
    """

    index: int
    prefill: list[tuple[Request, int]]
    decode: list[Request]
    prefill_tokens: int
    written: list[int] | np.ndarray | None
    whole_batch: bool
    write_pages: list[int] | None = None
    page_size: int = 0

    @property
    def write_ids(self) -> np.ndarray:
        """The written ids as a 1-D int64 array, built when asked: the
        simulated engine hands the pool pages, so only an executor that
        runs the forward reads the ids. Without `written`, each decoder's
        id is its newest position (`seq - 1`) on its page and each chunk
        page's id its first slot: ask before the step completes (the
        decoders' positions move on at the next plan).

        Raises:
            ValueError: neither `written` nor `write_pages` (with a
                positive `page_size`) is given.
        """
        if self.written is not None:
            return int64_ids(self.written)
        pages, ps = self.write_pages, self.page_size
        if pages is None or ps <= 0:
            raise ValueError(f"StepPlan {self.index}: write_ids needs written, or write_pages and a positive "
                             f"page_size (got page_size={ps})")
        n = len(self.decode)
        ids = [p * ps + (r.seq - 1) % ps for r, p in zip(self.decode, pages)]
        ids += [p * ps for p in pages[n:]]
        return int64_ids(ids)

    def batch(self) -> list[Request]:
        """The requests the forward computes: prefills, then decoders."""
        return [r for r, _ in self.prefill] + self.decode if self.prefill else self.decode


class Scheduler:
    """Admission, chunked prefill, decode and retraction over one `Memory`.

    Args:
        memory: the request-level memory layer.
        max_running: the most requests running at once.
        prefill_tokens_per_step: the prefill chunk budget of one step.
        max_tokens: the longest request (prompt + output) the layout can
            ever hold; longer ones are rejected on arrival.
        reserve: (initial, minimum, decay per step) of the decode reserve
            ratio: admission keeps room for that share of the tokens running
            requests have yet to produce; a retraction resets it to the
            initial value (SGLang's new_token_ratio).
    """

    def __init__(self, memory: Memory, *, max_running: int, prefill_tokens_per_step: int,
                 max_tokens: int, reserve: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        self.mem = memory
        self.ps = memory.ps
        self.max_running = max_running
        self.prefill_budget = prefill_tokens_per_step
        self.max_tokens = max_tokens
        self.reserve = reserve
        self.reserve_ratio = reserve[0]
        self.waiting: deque[Request] = deque()
        # Running requests in admission order, and the same split by phase
        # (each in running order): those decoding and those still prefilling.
        self.running: list[Request] = []
        self.decoding: list[Request] = []
        self.prefilling: list[Request] = []
        self.steps = 0
        self.counts = dict(admitted=0, finished=0, retracted=0, rejected=0)
        self._admissions = 0
        self._left = 0  # tokens the running requests have yet to produce, kept as they change

    def arrive(self, req: Request) -> bool:
        """Queue an arrival; False (and `req.rejected`) when it can never fit."""
        if req.prompt_tokens + req.output_tokens > self.max_tokens:
            req.rejected = True
            self.counts["rejected"] += 1
            return False
        self.waiting.append(req)
        return True

    # -- planning a step --

    def plan(self, now: float) -> StepPlan:
        """Allocate the next step: running requests first (their decode
        token, then their next prefill chunk), then admissions into what is
        left of the chunk budget. `now`: the clock, in seconds."""
        retracted = self.counts["retracted"]
        pages = self._decode(now)
        prefill = self._continue_prefills(now)
        prefill_tokens = sum([c for _, c in prefill]) if prefill else 0
        admitted = self._admit(self.prefill_budget - prefill_tokens, now)
        if admitted:
            prefill += admitted
            prefill_tokens += sum([c for _, c in admitted])
        # A retraction takes its victim out of `decoding`, which is then the
        # decode batch; decoders may have left since their pages were read.
        decode = list(self.decoding)
        ps = self.ps
        if self.counts["retracted"] != retracted:
            pages = [r.pages[(r.seq - 1) // ps] for r in decode]  # each one's newest position
        for r, chunk in prefill:  # every page a chunk writes
            pages += r.pages[(r.seq - chunk) // ps: (r.seq - 1) // ps + 1]
        return StepPlan(self.steps, prefill, decode, prefill_tokens, None,
                        len(prefill) == len(self.prefilling), pages, ps)

    def _decode(self, now: float) -> list[int]:
        """One token for every decoding request: the page each writes
        (`Memory.decode`)."""
        if not self.decoding:
            return []
        mem = self.mem
        out = mem.decode(self.decoding)
        if out is None:  # short: the one shortfall path takes over from this first try
            out = remedy(lambda: mem.decode(self.decoding) if self.decoding else [], mem.evict_some,
                         lambda: self._retract_newest(now))
        return out if out is not None else []

    def _continue_prefills(self, now: float) -> list[tuple[Request, int]]:
        if not self.prefilling:
            return []
        out, budget, mem = [], self.prefill_budget, self.mem
        for r in list(self.prefilling):
            chunk = min(r.prefill_target - r.prefilled, budget)
            if chunk <= 0:
                break
            if r not in self.running:  # retracted while making room for an earlier one
                continue
            chunk = self._aligned(r, chunk)
            if not chunk:  # vLLM align: no whole block fits the budget left; a later request may
                continue
            if cover(lambda r=r, c=chunk: mem.extend(r, c) or None, mem.evict_some,
                     lambda: self._retract_newest(now), keep=r):
                out.append((r, chunk))
                budget -= chunk
        return out

    # -- admission --

    def _admit(self, budget: int, now: float) -> list[tuple[Request, int]]:
        out: list[tuple[Request, int]] = []
        if not self.waiting:
            return out
        mem = self.mem
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            r = self.waiting[0]
            left = self._left  # the running requests' tokens to produce (see _reserve_holds)
            context = r.context_tokens
            if mem.cache is None and not self._room_for(
                    r.output_tokens - r.generated + context, 0, 0, min(context, budget), left):
                # Without a cache there is no hit: the reserve is asked with
                # the numbers take_hit would set, and a refusal leaves the
                # request untouched (take_hit then _undo_admission would).
                break
            mem.take_hit(r, now)
            chunk = self._aligned(r, min(r.prefill_left, budget))
            if not chunk or not self._take(r, chunk, left):
                mem.retract(r, now)
                r.retractions -= 1  # an admission that did not happen is no retraction
                break
            self.waiting.popleft()
            self._start(r)
            if r.admitted_s is None:
                r.admitted_s = now
                self.counts["admitted"] += 1
            out.append((r, chunk))
            budget -= chunk
        return out

    def _aligned(self, r: Request, chunk: int) -> int:
        """`chunk` as vLLM's align rules cut it (`vllm_rules.aligned_chunk`;
        unchanged without them)."""
        align = self.mem.align
        return chunk if align is None else aligned_chunk(r.prefilled, chunk, r.prefill_target, align)

    def _take(self, r: Request, chunk: int, left: int) -> bool:
        """Ask, then act: the reserve is checked before the state slot and
        the chunk are allocated (an allocation undone costs as much as one
        kept, and its holes cost flushes). A state slot only takes room from
        the tokens: check again once it is held. No retraction: running
        requests are never pushed back for an admission."""
        mem = self.mem
        if not self._reserve_holds(r, chunk, left):
            return False
        if mem.state_band is not None and not (
                cover(lambda: mem.take_state(r) or None, mem.evict_some)
                and self._reserve_holds(r, chunk, left)):
            return False
        return bool(cover(lambda: mem.extend(r, chunk) or None, mem.evict_some))

    def _reserve_holds(self, new: Request, chunk: int, running_left: int) -> bool:
        """SGLang's admission guard: once `new`'s first `chunk` is allocated,
        room must remain for `reserve_ratio` of the tokens the running
        requests (`running_left`) and `new` have yet to produce. Room is the
        free pool room plus what evicting unlocked cached blocks would free
        (SGLang counts evictable cached tokens as available), less the
        chunk's new pages."""
        return self._room_for(tokens_left(new), new.seq, len(new.pages), chunk, running_left)

    def _room_for(self, new_left: int, seq: int, held_pages: int, chunk: int,
                  running_left: int) -> bool:
        """`_reserve_holds` of a request with `new_left` tokens yet to
        produce, `seq` positions on `held_pages` pages, taking `chunk` more."""
        if self.reserve_ratio <= 0 or not self.running:
            return True
        need = self.reserve_ratio * (running_left + new_left)
        ps = self.ps
        chunk_slots = (-(-(seq + chunk) // ps) - held_pages) * ps
        other = self.mem.evictable_tokens() - chunk_slots
        # The live-count bound settles most refusals without the capacity search.
        if self.mem.room_tokens_bound() + other < need:
            return False
        # ... and the flushed view most admissions, without the float's slide search.
        if self.mem.room_tokens_floor() + other >= need:
            return True
        return self.mem.room_tokens() + other >= need

    # -- the running set --

    def _start(self, r: Request) -> None:
        """`r` joins the running requests, prefilling."""
        r.order = self._admissions
        self._admissions += 1
        self.running.append(r)
        self.prefilling.append(r)
        self._left += tokens_left(r)

    def _stop(self, r: Request) -> None:
        """`r` leaves the running requests."""
        self.running.remove(r)
        (self.decoding if r in self.decoding else self.prefilling).remove(r)
        self._left -= tokens_left(r)

    def _retract_newest(self, now: float) -> Request | None:
        """The victim choice: retract the newest running request (None when
        none runs); it goes back to the head of the queue."""
        if not self.running:
            return None
        r = self.running[-1]
        self._stop(r)
        self.mem.retract(r, now)
        self.waiting.appendleft(r)
        self.counts["retracted"] += 1
        self.reserve_ratio = self.reserve[0]
        return r

    # -- completing a step --

    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """The step's forward is done at `now`: advance its requests, finish
        those done (returned, in running order), ratchet the window."""
        finished = self._advance(plan, now)
        for r in finished:
            self._stop(r)
            self.mem.finish(r, now)
            r.finished_s = now
            self.counts["finished"] += 1
        # Ratchet the requests whose positions moved (see Memory.ratchet);
        # those that finished or were retracted since hold no pages.
        mem = self.mem
        moved = [r for r in mem.window_due if r.pages] if mem.window_due else []
        mem.window_due = []
        if plan.prefill:
            moved += [r for r, _ in plan.prefill if r.pages]
        if moved:
            mem.ratchet(moved)
        self.steps += 1
        self.reserve_ratio = max(self.reserve[1], self.reserve_ratio - self.reserve[2])
        return finished

    def _advance(self, plan: StepPlan, now: float) -> list[Request]:
        """Count the step's tokens; returns the requests it finished."""
        finished = []
        for r in plan.decode:
            g = r.generated + 1
            r.generated = g
            if g >= r.output_tokens:
                finished.append(r)
        self._left -= len(plan.decode)
        for r, chunk in plan.prefill:
            r.prefilled += chunk
            self._left -= chunk
            if r.prefilled == r.prefill_target:  # decoding from the next step on
                self.mem.prefill_done(r)
                if r.generated == 0:
                    r.generated = 1
                    self._left -= 1
                    r.first_token_s = now
                self.prefilling.remove(r)
                bisect.insort(self.decoding, r, key=_order)
                if r.generated >= r.output_tokens:
                    finished.append(r)
        if plan.prefill and len(finished) > 1:
            finished.sort(key=_order)  # running order
        return finished

    def check(self) -> list[str]:
        """The memory layer's checks over the running requests, and the
        kept count of tokens left against a recount ([] when healthy)."""
        problems = self.mem.verify(self.running)
        left = sum([tokens_left(r) for r in self.running])
        if left != self._left:
            problems.append(f"tokens left to produce {self._left} != {left} recounted")
        return problems


def _order(r: Request) -> int:
    return r.order


def tokens_left(r: Request) -> int:
    """Tokens a request has yet to produce: its output left and its prefill left."""
    return r.output_tokens - r.generated + r.prefill_target - r.prefilled
