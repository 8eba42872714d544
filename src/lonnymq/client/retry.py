"""When the client repeats a call cut off by a lost connection (a PostgreSQL restart, a failover,
a dropped network link), and how long it waits between attempts.

A call is repeated only when repeating it cannot do harm:

* it never reached the server (no connection could be had, or the pool's check found the
  connection dead before the statement was sent): every call, sends included;
* it may have run, but running it twice is harmless (``Op.safe_to_retry``: take, peek, the
  metrics and the listings; a take that ran and whose answer was lost leaves its messages leased
  until their lease ends, then they are delivered again; a send or send_batch with an
  idempotency key, which the client gives each send it may repeat (``idempotent_sends``): a
  repeat of a call that committed creates nothing and returns the first call's result).

A call the server rolled back whole, because it deadlocked with another transaction or failed
to serialize with one (SQLSTATE 40P01, 40001), is repeated too, whatever it is: the client runs
each call as one statement in its own transaction, so nothing of it committed.

Any other call cut off midway (a send without a key, a settle, an admin call) raises
:class:`~lonnymq.errors.ConnectionLost` with ``may_have_committed=True``: a repeated send could
create a second message, and a repeated ack of a delivery the first attempt already acked
raises LeaseLost. Attempts stop at the policy's deadline (ConnectionLost again).

``asleep`` and ``sleep`` are the two waits the asyncio client and its generated sync twin use.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from time import monotonic

from .. import errors

#: The waits of the asyncio client and of its sync twin (``tools/async_to_sync.py`` maps the
#: first name to the second).
asleep = asyncio.sleep
sleep = time.sleep


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff with jitter under a deadline: the n-th wait is drawn uniformly from
    ``[d * (1 - jitter), d]`` with ``d = min(initial_delay * multiplier**(n-1), max_delay)``,
    and no attempt starts after ``deadline`` seconds (counted from the first attempt; the wait for
    a pooled connection is bounded by what is left of it)."""

    deadline: float = 30.0
    initial_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("deadline", "initial_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise errors.InvalidArgument(f"RetryPolicy.{name} must be positive seconds, got {value!r}")
        if not isinstance(self.multiplier, (int, float)) or not 1 <= self.multiplier < math.inf:
            raise errors.InvalidArgument(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")
        if not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter <= 1:
            raise errors.InvalidArgument(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter!r}")

    def start(self, started: float | None = None) -> Backoff:
        """The state of one call's attempts, its deadline counted from ``started`` (a
        ``time.monotonic()`` reading: when the call's first attempt began), default now."""
        return Backoff(self, started)


class Backoff:
    """The attempts of one call: how long is left, and the next (jittered) wait."""

    def __init__(self, policy: RetryPolicy, started: float | None = None) -> None:
        self.policy = policy
        self.give_up_at = (monotonic() if started is None else started) + policy.deadline
        self.delay = policy.initial_delay
        self.attempts = 1

    def remaining(self) -> float:
        return max(self.give_up_at - monotonic(), 0.0)

    def next_delay(self) -> float | None:
        """Seconds to wait before the next attempt, or None when the deadline has passed."""
        left = self.remaining()
        if left <= 0:
            return None
        p = self.policy
        wait = self.delay * random.uniform(1 - p.jitter, 1)
        self.delay = min(self.delay * p.multiplier, p.max_delay)
        self.attempts += 1
        return min(wait, left)


#: The client's default: retry what is safe for up to 30 s.
DEFAULT_RETRY = RetryPolicy()
