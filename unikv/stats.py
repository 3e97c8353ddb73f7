"""Cumulative counters, kept apart from the allocator state they observe."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class BandCounters:
    """Counters of one band (cumulative; `clear()` keeps them)."""

    allocated_pages: int = 0
    freed_pages: int = 0
    moves: int = 0  # pages copied: compaction, flush, float relocation
    moved_bytes: int = 0
    flushes: int = 0
    urgent_flushes: int = 0
    absorbed_pages: int = 0  # frontier retreats past free pages (no copy)
    relocations: int = 0  # float make_room / compact_holes calls that moved pages
    pending_peak: int = 0


@dataclass
class Stats:
    """Pool-wide counters: one `BandCounters` per band plus ladder counts."""

    bands: dict[str, BandCounters] = field(default_factory=dict)
    ladder_runs: int = 0
    ladder_failures: int = 0
    settles: int = 0  # waits on the in-flight forward

    @classmethod
    def for_bands(cls, names) -> Stats:
        return cls(bands={n: BandCounters() for n in names})

    def as_dict(self) -> dict:
        """Totals over bands under plain keys, per band under `bands`."""
        per_band = {n: asdict(c) for n, c in self.bands.items()}
        totals = {k: sum(c[k] for c in per_band.values()) for k in asdict(BandCounters())}
        totals["pending_peak"] = max((c["pending_peak"] for c in per_band.values()), default=0)
        return {
            **totals,
            "ladder_runs": self.ladder_runs,
            "ladder_failures": self.ladder_failures,
            "settles": self.settles,
            "bands": per_band,
        }
