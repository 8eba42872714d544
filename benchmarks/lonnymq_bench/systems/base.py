"""What a benchmarked system provides: install/clear/preload in the parent, and workers (run in
forked processes) for each workload it takes part in."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..harness import Ctx

#: A worker factory: (dsn, ctx) -> the timed callable (runs in a forked child).
Factory = Callable[[str, Ctx], Callable[[], Any]]


@dataclass(frozen=True)
class Variant:
    """One way of doing a workload. ``kind``: for sends ``one``/``batch``, for drains ``one``
    (one message per take) / ``batch``. ``headline``: the variant the targets compare (the
    system's idiomatic at-least-once path); others are shown for context."""

    system: str
    name: str
    kind: str
    factory: Factory
    headline: bool = True
    note: str = ""


@dataclass(frozen=True)
class Flat:
    """Dequeue latency with many future-dated and leased rows. The system has two queues: the
    main one, where ``setup(dsn, future, leased)`` creates those rows through the system's own
    API, and an empty one (``FLAT_EMPTY``). ``ready(dsn, n)`` sends ``n`` ready messages to
    each. ``probe`` is a worker whose timed part takes ``ctx.extra['n']`` messages from each
    queue one at a time, alternating between the two every ``ctx.extra['chunk']`` takes (so both
    see the same machine), and returns {"empty": [seconds per call], "loaded": [...]}."""

    setup: Callable[[str, int, int], None]
    ready: Callable[[str, int], None]
    probe: Factory
    what: str


#: The name of the always-empty queue of the flat workload.
FLAT_EMPTY = "bench_empty"


class System:
    name = ""
    label = ""
    #: Modules that must be importable (checked before anything runs).
    requires: tuple[str, ...] = ()
    #: Tables to VACUUM between phases and to count dead tuples of ("schema.table").
    tables: tuple[str, ...] = ()

    def missing(self) -> str | None:
        for mod in self.requires:
            if importlib.util.find_spec(mod) is None:
                return f"{self.label} needs the Python package {mod!r} (pip install -r benchmarks/requirements.txt)"
        return None

    def install(self, dsn: str) -> dict[str, Any]:
        """Install into the empty database ``dsn``; returns version information."""
        raise NotImplementedError

    def clear(self, dsn: str) -> None:
        """Remove every message (no VACUUM: the harness does that)."""
        raise NotImplementedError

    def preload(self, dsn: str, n: int) -> None:
        """Enqueue ``n`` ready messages, in batches, through the system's own API."""
        raise NotImplementedError

    def remaining(self, dsn: str) -> int:
        raise NotImplementedError

    def sends(self) -> list[Variant]:
        return []

    def drains(self) -> list[Variant]:
        return []

    def pops(self) -> list[Variant]:
        """Take-and-delete one message per call (no lease; at-most-once), kind ``one``: the
        producers benchmark's pop workload (benchmarks/producers.py)."""
        return []

    def commits(self) -> list[Variant]:
        """The cheapest durable transaction, kind ``one``: what a one-message send cannot go
        below (the producers benchmark's commit floor)."""
        return []

    def pickups(self) -> list[Variant]:
        """Idle consumers for the pickup-latency workload: each worker's timed part waits for
        messages until its deadline and returns [(message id, time.time() when received)]."""
        return []

    def producer(self, dsn: str) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
        """(send one message in its own transaction -> its id, close) for the latency workload."""
        raise NotImplementedError

    def batch_sender(self, dsn: str) -> tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]:
        """(send a list of messages in one transaction, close) for the churn producer."""
        raise NotImplementedError

    def flat(self) -> Flat | None:
        return None

    def churn(self) -> Variant | None:
        """A consumer for the churn workload: takes and settles until ``ctx.stop`` is set and
        returns [(time.time() at the end of a take, messages, seconds the take took)]."""
        return None
