"""What the conformance machine's rule mixins use of `ConformanceMachine`:
the attributes its setup sets and the helpers both mixins call (type
declarations only; nothing here runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool
    from unikv.testing.forward import Forward
    from unikv.testing.model import ChainModel


class MachineHost:
    """The surface `MemoryRules` and `EngineRules` share, for the type checker."""

    if TYPE_CHECKING:
        pool: UnifiedPool
        model: ChainModel
        ps: int
        token_bands: list[str]
        state_bands: list[str]
        inflight: Forward | None

        def _op(self) -> None: ...
        def _write(self, band: str, ids: list[int]) -> None: ...
        def _new_tokens(self, out: Any, fresh: list[list[int]], rids: list[int],
                        tokens: list[list[int]]) -> None: ...
        def _reqs(self, extendable: bool = False, live: bool = False) -> list[int]: ...
        def _room(self) -> list[int]: ...
        def _shortfall(self, room_before: list[int], what: str) -> None: ...
