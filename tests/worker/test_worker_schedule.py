"""Schedule expressions of periodic messages (pure Python, no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lonnymq.errors import InvalidArgument
from lonnymq.worker import App, parse_schedule


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


# -- time zones and daylight-saving changes ---------------------------------------------------

NY = ZoneInfo("America/New_York")  # 2024: springs forward Mar 10 02:00, falls back Nov 3 02:00


def local(*args: int, fold: int = 0) -> int:
    return int(datetime(*args, tzinfo=NY, fold=fold).timestamp() * 1000)  # type: ignore[misc]


def iso(ticks: list[int]) -> list[str]:
    return [datetime.fromtimestamp(t / 1000, NY).isoformat() for t in ticks]


def test_spring_forward_a_skipped_time_runs_once_right_after_the_jump() -> None:
    s = parse_schedule("30 2 * * *", timezone="America/New_York")
    assert s.text == "CRON_TZ=America/New_York 30 2 * * *"
    # 02:30 does not exist on Mar 10: the job runs at 03:00 that day, and once.
    assert iso(s.ticks(local(2024, 3, 9), local(2024, 3, 12))) == [
        "2024-03-09T02:30:00-05:00",
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]
    assert s.next_after(local(2024, 3, 10, 1, 59)) == local(2024, 3, 10, 3, 0)


def test_fall_back_a_repeated_time_runs_once() -> None:
    s = parse_schedule("CRON_TZ=America/New_York 30 1 * * *")
    ticks = s.ticks(local(2024, 11, 2), local(2024, 11, 5))
    # 01:30 happens twice on Nov 3 (EDT, then EST): one tick, the first.
    assert iso(ticks) == [
        "2024-11-02T01:30:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-04T01:30:00-05:00",
    ]
    assert s.next_after(ticks[1]) == ticks[2]
    # A scheduler looking from inside the repeated hour (01:10 EST, after the EDT 01:30 was
    # sent) must not send it again.
    assert s.next_after(local(2024, 11, 3, 1, 10, fold=1)) == ticks[2]


def test_wildcard_jobs_follow_real_time_across_the_changes() -> None:
    s = parse_schedule("*/30 * * * *", timezone="America/New_York")
    for start in (datetime(2024, 11, 3, 4, tzinfo=UTC), datetime(2024, 3, 10, 5, tzinfo=UTC)):
        t0 = int(start.timestamp() * 1000)
        ticks = s.ticks(t0, t0 + 4 * 3_600_000)
        assert [b - a for a, b in zip([t0, *ticks], ticks, strict=False)] == [1_800_000] * 8


def test_a_zone_moves_the_ticks_to_its_local_time() -> None:
    tokyo = parse_schedule("@daily", timezone="Asia/Tokyo")
    assert tokyo.next_after(ms(2024, 1, 1, 12)) == ms(2024, 1, 1, 15)  # midnight in Tokyo
    assert parse_schedule("0 0 * * *", timezone="UTC").text == "0 0 * * *"
    p = App().periodic("report", "30 2 * * *", queue="q", timezone="Europe/Paris")
    assert p.schedule.text == "CRON_TZ=Europe/Paris 30 2 * * *"
    assert parse_schedule(p.schedule.text) == p.schedule  # what the scheduler reads back


@pytest.mark.parametrize(
    ("expr", "timezone"),
    [
        ("0 0 * * *", "Mars/Olympus_Mons"),
        ("0 0 * * *", "../etc/passwd"),
        ("CRON_TZ=Nowhere/Land 0 0 * * *", None),
        ("@every 1h", "Europe/Paris"),
        ("CRON_TZ=Europe/Paris 0 0 * * *", "Asia/Tokyo"),
        ("CRON_TZ=Europe/Paris", None),
    ],
)
def test_bad_time_zones_are_rejected(expr: str, timezone: str | None) -> None:
    with pytest.raises(InvalidArgument):
        parse_schedule(expr, timezone)
