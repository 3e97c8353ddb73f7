"""The one shortfall path: the order of remedies, with scripted callables."""

from unikv.sim.request import Request
from unikv.sim.shortfall import cover, remedy


def scripted(answers):
    """An attempt that returns `answers` in turn and logs each try."""
    log = []
    it = iter(answers)

    def attempt():
        log.append("try")
        return next(it)

    return attempt, log


def test_evicts_every_cached_prefix_before_retracting():
    attempt, log = scripted([None, None, None, "ids"])
    cache = [1, 2]  # two evictable prefixes

    def evict():
        log.append("evict")
        return bool(cache and cache.pop())

    victims = [Request(7, 0.0, 1, 1)]

    def retract():
        log.append("retract")
        return victims.pop()

    assert cover(attempt, evict, retract) == "ids"
    assert log == ["try", "evict", "try", "evict", "try", "evict", "retract", "try"]


def test_without_a_victim_chooser_it_never_retracts():
    attempt, log = scripted([None, None])
    assert cover(attempt, lambda: bool(log.append("evict"))) is None
    assert log == ["try", "evict"]


def test_gives_up_once_the_served_request_is_the_victim():
    me, other = Request(0, 0.0, 1, 1), Request(1, 0.0, 1, 1)
    attempt, log = scripted([None, None, None])
    victims = [me, other]  # `other` (the newest) goes first
    assert cover(attempt, lambda: False, victims.pop, keep=me) is None
    assert log == ["try", "try"] and victims == []


def test_gives_up_when_nothing_runs_and_success_needs_no_remedy():
    attempt, log = scripted([None])
    assert cover(attempt, lambda: False, lambda: None) is None
    attempt, log = scripted([[]])
    assert cover(attempt, lambda: 1 / 0, lambda: 1 / 0) == []  # an empty answer is a success


def test_remedy_continues_a_try_the_caller_made_without_trying_again_first():
    """A hot path tries once itself; on a shortfall `remedy` must remedy
    before its first try (a second bare try would re-run the pool's ladder
    for nothing and change what the run counts), then follow `cover`'s
    order exactly."""
    def run(with_cover: bool) -> list[str]:
        attempt, log = scripted([None, None, "ids"] if with_cover else [None, "ids"])
        cache = [1]

        def evict():
            log.append("evict")
            return bool(cache and cache.pop())

        def retract():
            log.append("retract")
            return Request(7, 0.0, 1, 1)

        if with_cover:
            assert cover(attempt, evict, retract) == "ids"
        else:
            log.append("try")  # the caller's own first try, which fell short
            assert remedy(attempt, evict, retract) == "ids"
        return log

    assert run(with_cover=False) == run(with_cover=True) == ["try", "evict", "try", "evict", "retract", "try"]
