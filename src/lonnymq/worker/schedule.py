"""Schedule expressions of periodic messages, evaluated on epoch milliseconds.

Accepted forms:

* five-field cron, ``minute hour day-of-month month day-of-week`` (parsed and evaluated by
  ``cronsim``): ``*``, ``5``, ``1-5``, ``*/15``, ``10-40/10``, lists ``1,15,30``, month and
  weekday names (``jan``, ``mon-fri``), weekday 0 or 7 for Sunday, ``L`` (last day of the
  month), ``5#2`` (second Friday). As in Debian cron, when both day fields are restricted a day
  matches if either does; a field written ``*...`` counts as unrestricted;
* macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``),
  ``@hourly``;
* ``@every <duration>`` with units d, h, m, s, e.g. ``@every 30s``, ``@every 1h30m``: ticks are
  the multiples of the period since the Unix epoch, so every worker computes the same ticks.

Cron expressions and macros run in UTC unless prefixed with ``CRON_TZ=<IANA zone>`` (the
convention of cronie and Go's robfig/cron), e.g. ``CRON_TZ=Europe/Paris 30 2 * * *``, which is
what ``App.periodic(..., timezone="Europe/Paris")`` stores. Across daylight-saving changes they
behave like Debian cron: a job at a fixed time that the clock skips (02:30 on a spring-forward
night) runs once, right after the jump (03:00); one in the hour that happens twice (01:30 on a
fall-back night) runs once, the first time. Jobs with ``*`` in the minute or hour field run at
every real instant that matches.

A tick is a point in time (epoch ms); the scheduler sends one message per tick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..errors import InvalidArgument

__all__ = ["CronSchedule", "EverySchedule", "Schedule", "parse_schedule"]

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_FIELDS = "minute 0-59, hour 0-23, day 1-31, month 1-12 or jan-dec, weekday 0-7 or sun-sat"
_TZ_RE = re.compile(r"^(?:CRON_)?TZ=(\S+) ")
#: Far beyond any tick: the end of an open window.
_MAX_MS = 2**53


class Schedule:
    """A set of ticks; ``next_after(t)`` is the first tick strictly after ``t`` (epoch ms)."""

    text: str

    def next_after(self, t_ms: int) -> int | None:
        raise NotImplementedError

    def ticks(self, after_ms: int, until_ms: int, limit: int = 1000) -> list[int]:
        """The ticks in ``(after_ms, until_ms]``, oldest first, at most ``limit`` (the newest)."""
        out: list[int] = []
        t = self.next_after(after_ms)
        while t is not None and t <= until_ms:
            out.append(t)
            t = self.next_after(t)
        return out[-limit:]


@dataclass(frozen=True)
class EverySchedule(Schedule):
    text: str
    period_ms: int

    def next_after(self, t_ms: int) -> int:
        return (t_ms // self.period_ms + 1) * self.period_ms

    def ticks(self, after_ms: int, until_ms: int, limit: int = 1000) -> list[int]:
        first = self.next_after(max(after_ms, until_ms - limit * self.period_ms))
        return list(range(first, until_ms + 1, self.period_ms))


@dataclass(frozen=True)
class CronSchedule(Schedule):
    """A cron expression, evaluated by ``cronsim`` in ``timezone`` (None: UTC)."""

    text: str
    expr: str
    timezone: str | None = None

    @property
    def zone(self) -> tzinfo:
        return UTC if self.timezone is None else ZoneInfo(self.timezone)

    def _iter(self, t_ms: int) -> CronSim:
        return CronSim(self.expr, datetime.fromtimestamp(t_ms // 1000, self.zone))

    def next_after(self, t_ms: int) -> int | None:
        return next(iter(self.ticks(t_ms, _MAX_MS, limit=1, first=True)), None)

    def ticks(self, after_ms: int, until_ms: int, limit: int = 1000, *, first: bool = False) -> list[int]:
        out: list[int] = []
        for d in self._iter(after_ms):  # ends when cronsim finds no match within 50 years
            t = int(d.timestamp()) * 1000
            if t > until_ms:
                break
            # In local time cronsim gives the first of a repeated hour's instants even when
            # ``after_ms`` is in the second one: a tick at or before it was already due.
            if t <= after_ms:
                continue
            out.append(t)
            if first:
                break
        return out[-limit:]


def _duration_ms(text: str) -> int:
    text = text.strip().lower()
    if text.isdigit():
        return int(text) * 1000
    match = _DURATION_RE.match(text)
    if not text or not match:
        raise InvalidArgument(f"bad duration {text!r}: use e.g. 30s, 5m, 1h30m, 1d")
    d, h, m, s = (int(g or 0) for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60_000 + s * 1000


def parse_schedule(text: str, timezone: str | None = None) -> Schedule:
    """Parse a schedule expression (see the module doc), optionally prefixed with
    ``CRON_TZ=<zone> `` or given ``timezone`` (an IANA name such as ``Europe/Paris``); raises
    InvalidArgument if it is bad or can never fire."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a schedule must be a string, got {text!r}")
    spec = " ".join(text.split())
    match = _TZ_RE.match(spec)
    if match:
        if timezone is not None and timezone != match.group(1):
            raise InvalidArgument(f"{text!r} names its time zone; timezone={timezone!r} contradicts it")
        timezone, spec = match.group(1), spec[match.end() :]
    if timezone is not None:
        _zone(timezone)
    if spec.lower().startswith("@every"):
        if timezone is not None:
            raise InvalidArgument(f"{text!r}: @every counts from the Unix epoch, a time zone does not apply")
        period = _duration_ms(spec[len("@every") :])
        if period < 1000:
            raise InvalidArgument(f"{text!r}: the period must be at least 1 second")
        return EverySchedule(spec, period)
    expr = _MACROS.get(spec.lower(), spec)
    if len(expr.split(" ")) != 5 or not expr.strip():
        raise InvalidArgument(
            f"bad schedule {text!r}: expected 5 cron fields (minute hour day month weekday),"
            " a macro like @hourly, or @every <duration>"
        )
    canonical = spec if timezone is None or timezone == "UTC" else f"CRON_TZ={timezone} {spec}"
    sched = CronSchedule(canonical, expr, None if timezone == "UTC" else timezone)
    try:
        first = sched._iter(0)
        next(first)
    except CronSimError as e:
        raise InvalidArgument(f"bad schedule {text!r}: {e} ({_FIELDS})") from None
    except StopIteration:
        raise InvalidArgument(f"schedule {text!r} never fires") from None
    return sched


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {name!r}: use an IANA name such as Europe/Paris") from None
