"""Schedule expressions of periodic messages (pure Python, no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lonnymq.errors import InvalidArgument
from lonnymq.worker import parse_schedule


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("* * * * *", ms(2024, 1, 1, 0, 0), ms(2024, 1, 1, 0, 1)),
        ("* * * * *", ms(2024, 1, 1, 0, 0) + 59_999, ms(2024, 1, 1, 0, 1)),
        ("*/15 * * * *", ms(2024, 1, 1, 0, 16), ms(2024, 1, 1, 0, 30)),
        ("5 4 * * *", ms(2024, 1, 1, 4, 5), ms(2024, 1, 2, 4, 5)),
        ("0 0 1 1 *", ms(2024, 6, 1), ms(2025, 1, 1)),
        ("0 12 * * mon-fri", ms(2024, 3, 8, 12, 0), ms(2024, 3, 11, 12, 0)),  # Fri -> Mon
        ("0 0 * * 7", ms(2024, 3, 8), ms(2024, 3, 10)),  # 7 is Sunday
        ("0 0 * * 5-5", ms(2000, 1, 1), ms(2000, 1, 7)),  # a one-day range is that day
        ("0 0 29 feb *", ms(2024, 3, 1), ms(2028, 2, 29)),
        ("0 0 13 * fri", ms(2024, 1, 1), ms(2024, 1, 5)),  # both day fields: either matches
        ("0 0 */10 * *", ms(2024, 1, 1), ms(2024, 1, 11)),
        ("10-40/10 1 * * *", ms(2024, 1, 1, 1, 20), ms(2024, 1, 1, 1, 30)),
        ("0 0 1 jan,jul *", ms(2024, 2, 1), ms(2024, 7, 1)),
        ("@hourly", ms(2024, 1, 1, 0, 30), ms(2024, 1, 1, 1, 0)),
        ("@daily", ms(2024, 12, 31, 1), ms(2025, 1, 1)),
        ("@weekly", ms(2024, 3, 8), ms(2024, 3, 10)),
        ("@every 30s", 45_000, 60_000),
        ("@every 1h30m", 0, 5_400_000),
        ("@every 10", 1, 10_000),
    ],
)
def test_next_after(expr: str, after: int, expected: int) -> None:
    assert parse_schedule(expr).next_after(after) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "5-1 * * * *",
        "a * * * *",
        "0 0 30 feb *",
        "@every 0s",
        "@every 500ms",
        "@every",
        "@sometimes",
        "* * * foo *",
    ],
)
def test_bad_schedules_are_rejected(expr: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_schedule(expr)


def test_ticks_in_a_window() -> None:
    s = parse_schedule("*/20 * * * *")
    start = ms(2024, 1, 1)
    assert s.ticks(start, start + 3_600_000) == [start + k * 1_200_000 for k in (1, 2, 3)]
    assert s.ticks(start, start + 3_600_000, limit=2) == [start + 2_400_000, start + 3_600_000]
    every = parse_schedule("@every 1s")
    assert every.ticks(999, 4000) == [1000, 2000, 3000, 4000]
    assert every.ticks(0, 10**12, limit=3) == [10**12 - 2000, 10**12 - 1000, 10**12]


def _range(lo: int, hi: int) -> st.SearchStrategy[str]:
    # Proper ranges only: croniter mishandles "a-a" (it reads "5-5" as every day).
    return (
        st.tuples(st.integers(lo, hi), st.integers(lo, hi))
        .filter(lambda t: t[0] != t[1])
        .map(lambda t: f"{min(t)}-{max(t)}")
    )


_FIELD = {
    "minute": st.one_of(
        st.just("*"), st.integers(0, 59).map(str), st.integers(1, 30).map(lambda s: f"*/{s}"), _range(0, 59)
    ),
    "hour": st.one_of(
        st.just("*"),
        st.integers(0, 23).map(str),
        st.integers(1, 12).map(lambda s: f"*/{s}"),
        st.lists(st.integers(0, 23), min_size=1, max_size=3, unique=True).map(
            lambda v: ",".join(map(str, sorted(v)))
        ),
    ),
    "day": st.one_of(st.just("*"), st.integers(1, 28).map(str), _range(1, 28)),
    "month": st.one_of(st.just("*"), st.integers(1, 12).map(str)),
    "weekday": st.one_of(st.just("*"), st.integers(0, 6).map(str), _range(0, 6)),
}


@settings(max_examples=150, deadline=None)
@given(
    fields=st.tuples(*(_FIELD[k] for k in ("minute", "hour", "day", "month", "weekday"))),
    start=st.integers(ms(2000, 1, 1), ms(2040, 1, 1)),
)
def test_agrees_with_croniter(fields: tuple[str, ...], start: int) -> None:
    croniter = pytest.importorskip("croniter").croniter
    expr = " ".join(fields)
    ours = parse_schedule(expr)
    base = datetime.fromtimestamp(start / 1000, UTC)
    it = croniter(expr, base)
    t = start
    for _ in range(3):
        expected = int(it.get_next(datetime).timestamp() * 1000)
        got = ours.next_after(t)
        assert got == expected, (expr, base)
        t = expected
