"""The one shortfall path: the order of remedies, with scripted callables."""

from unikv.sim.request import Request
from unikv.sim.shortfall import cover


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
