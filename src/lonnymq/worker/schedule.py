"""Schedule expressions of periodic messages, evaluated in UTC on epoch milliseconds.

Accepted forms:

* five-field cron, ``minute hour day-of-month month day-of-week``: ``*``, ``5``, ``1-5``,
  ``*/15``, ``10-40/10``, lists ``1,15,30``, month and weekday names (``jan``, ``mon-fri``),
  weekday 0 or 7 for Sunday. As in Vixie cron, when both day fields are restricted a day matches
  if either does; a field written ``*...`` counts as unrestricted;
* macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``),
  ``@hourly``;
* ``@every <duration>`` with units d, h, m, s, e.g. ``@every 30s``, ``@every 1h30m``: ticks are
  the multiples of the period since the Unix epoch, so every worker computes the same ticks.

A tick is a point in time (epoch ms); the scheduler sends one message per tick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
#: How far ahead next_after() looks before deciding a cron expression never matches
#: (covers Feb 29, which can be 8 years away across a non-leap century).
_HORIZON_YEARS = 9


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
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_any: bool
    weekdays_any: bool

    def _day_matches(self, d: datetime) -> bool:
        dom = d.day in self.days
        dow = d.isoweekday() % 7 in self.weekdays
        if self.days_any or self.weekdays_any:
            return dom and dow  # the unrestricted one matches every day
        return dom or dow

    def next_after(self, t_ms: int) -> int | None:
        d = datetime.fromtimestamp(t_ms // 60_000 * 60, UTC) + timedelta(minutes=1)
        horizon = d.year + _HORIZON_YEARS
        while d.year <= horizon:
            if d.month not in self.months:
                d = datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=UTC)
            elif not self._day_matches(d):
                d = (d + timedelta(days=1)).replace(hour=0, minute=0)
            elif d.hour not in self.hours:
                d = (d + timedelta(hours=1)).replace(minute=0)
            elif d.minute not in self.minutes:
                d += timedelta(minutes=1)
            else:
                return int(d.timestamp()) * 1000
        return None


def _field(text: str, lo: int, hi: int, names: list[str] | None, what: str) -> frozenset[int]:
    def value(token: str) -> int:
        if names is not None and token.lower() in names:
            return names.index(token.lower()) + lo
        if not token.isdigit():
            raise InvalidArgument(f"bad {what} value {token!r}")
        n = int(token)
        if not lo <= n <= hi:
            raise InvalidArgument(f"{what} {n} is outside {lo}-{hi}")
        return n

    out: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise InvalidArgument(f"bad {what} step in {part!r}")
            step = int(step_text)
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = value(a), value(b)
            if start > end:
                raise InvalidArgument(f"{what} range {base!r} goes backwards")
        else:
            start = value(base)
            end = hi if step_text else start
        out.update(range(start, end + 1, step))
    return frozenset(out)


def _duration_ms(text: str) -> int:
    text = text.strip().lower()
    if text.isdigit():
        return int(text) * 1000
    match = _DURATION_RE.match(text)
    if not text or not match:
        raise InvalidArgument(f"bad duration {text!r}: use e.g. 30s, 5m, 1h30m, 1d")
    d, h, m, s = (int(g or 0) for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60_000 + s * 1000


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule expression (see the module doc); raises InvalidArgument if it is bad or
    can never fire."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a schedule must be a string, got {text!r}")
    spec = " ".join(text.split())
    if spec.lower().startswith("@every"):
        period = _duration_ms(spec[len("@every") :])
        if period < 1000:
            raise InvalidArgument(f"{text!r}: the period must be at least 1 second")
        return EverySchedule(spec, period)
    expr = _MACROS.get(spec.lower(), spec)
    fields = expr.split(" ")
    if len(fields) != 5:
        raise InvalidArgument(
            f"bad schedule {text!r}: expected 5 cron fields (minute hour day month weekday),"
            " a macro like @hourly, or @every <duration>"
        )
    try:
        minutes = _field(fields[0], 0, 59, None, "minute")
        hours = _field(fields[1], 0, 23, None, "hour")
        days = _field(fields[2], 1, 31, None, "day")
        months = _field(fields[3], 1, 12, _MONTHS, "month")
        weekdays = frozenset(d % 7 for d in _field(fields[4], 0, 7, _DAYS, "weekday"))
    except InvalidArgument as e:
        raise InvalidArgument(f"bad schedule {text!r}: {e}") from None
    sched = CronSchedule(
        spec,
        minutes,
        hours,
        days,
        months,
        weekdays,
        days_any=fields[2].startswith("*"),
        weekdays_any=fields[4].startswith("*"),
    )
    if sched.next_after(0) is None:
        raise InvalidArgument(f"schedule {text!r} never fires")
    return sched
