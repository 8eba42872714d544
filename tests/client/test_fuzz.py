"""Bad input, fuzzed (hypothesis): queue names, keys, kinds, headers, payloads and their sizes,
timeouts, leases, delays, priorities and counts, through the client and straight into the SQL
functions. Every call either does what a valid call does (and what went in comes back out) or
raises a typed lonnymq error (SQL: a SQLSTATE of class LQ, or 22003 for bigint overflow) and
changes nothing in the database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core_helpers import Sql
from lonnymq import Client, errors
from lonnymq.client.ops import MAX_MS, QUEUE_NAME_RE
from lonnymq.models import decode_payload

pytestmark = pytest.mark.slow

# 100 examples a test (150 until 2026-11-26: 7 s more of the suite's CPU for each run; each CI
# run draws new ones, and the explicit @example cases run every time).
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LIMIT = 1000  # max_payload_bytes of queue "q"

# Any str, including NUL, lone surrogates and other unstorable characters.
ANY_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=40),
    st.text(
        st.sampled_from(
            ["\x00", "\ud800", "\udfff", "\x01", "a", "'", '"', "\\", ";", "%", "é", "\U0001f600"]
        ),
        max_size=8,
    ),
)
NOT_TEXT = st.one_of(st.none(), st.integers(), st.binary(max_size=4), st.floats(), st.booleans())
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(-1e15, 1e15), ANY_TEXT)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(ANY_TEXT, inner, max_size=3)),
    max_leaves=12,
)
TIMES = st.one_of(
    st.none(),
    st.floats(),
    st.integers(),
    st.timedeltas(),
    st.booleans(),
    st.text(max_size=2),
    st.sampled_from([1e-9, 0.0005, 0.001, MAX_MS / 1000, MAX_MS / 1000 + 1, -0.0]),
)


def storable(s: str) -> bool:
    return "\x00" not in s and not any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def storable_json(v: Any) -> bool:
    """JSON that jsonb can store: serialisable, finite numbers, no NUL or lone surrogate."""
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return _storable_tree(v)


def _storable_tree(v: Any) -> bool:
    if isinstance(v, str):
        return storable(v)
    if isinstance(v, dict):
        return all(_storable_tree(k) and _storable_tree(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_storable_tree(x) for x in v)
    return True


def valid_seconds(v: Any, positive: bool, sql: bool = True) -> bool:
    """Seconds the client accepts; ``sql``: also a whole positive number of milliseconds where
    the database needs one (leases; a poll interval stays in Python)."""
    if isinstance(v, timedelta):
        v = v.total_seconds()
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return (
        math.isfinite(v)
        and (v > 0 if positive else v >= 0)
        and v * 1000 <= MAX_MS
        and (not sql or round(v * 1000) >= positive)
    )


@pytest.fixture
def db(client: Client, conn: psycopg.Connection, schema: str) -> Sql:
    """Queue "q" (payload limit 1000 bytes) with a leased message keyed "live" and a ready one;
    queue "r" with plenty of ready messages for receive()."""
    client.create_queue("q", max_payload_bytes=LIMIT)
    client.send("q", b"live", key="live")
    client.take("q")
    client.send("q", b"ready")
    client.create_queue("r")
    client.send_batch("r", [b"m"] * 500)
    return Sql(conn, schema)


def snapshot(db: Sql) -> tuple[Any, ...]:
    """Every message, archived message, queue setting and relation of the schema, each table as
    the md5 of its rows' text in one order (a row's text holds every column), read in one
    round trip: comparing the rows themselves in Python made this most of the fuzz tests' time
    (12 of test_queue_names' 14 s: two reads of 500-1,200 rows for each call)."""
    [row] = db.q(
        "SELECT (SELECT md5(coalesce(string_agg(m::text, E'\\n' ORDER BY queue_id, id), ''))"
        "          FROM {s}.message m) AS messages,"
        "       (SELECT md5(coalesce(string_agg(a::text, E'\\n' ORDER BY id), '')) FROM {s}.archive a)"
        "         AS archive,"
        "       (SELECT coalesce(string_agg((name, lease_ms, max_attempts, archive, max_payload_bytes)::text,"
        "                                   E'\\n' ORDER BY name), '') FROM {s}.queue) AS queues,"
        "       (SELECT coalesce(string_agg(relname, ' ' ORDER BY relname), '')"
        "          FROM pg_class WHERE relnamespace = %s::regnamespace) AS relations",
        (db.schema,),
    )
    return tuple(row.values())


def attempt(db: Sql, call: Callable[[], Any]) -> Any:
    """The call's result, or the typed error it raised (the database is then unchanged)."""
    before = snapshot(db)
    try:
        return call()
    except errors.LonnyMQError as e:
        assert snapshot(db) == before, "a refused call changed the database"
        return e
    except Exception as e:
        pytest.fail(f"untyped {type(e).__module__}.{type(e).__name__}: {e}")


def stored(db: Sql, msg_id: int) -> dict[str, Any]:
    [row] = db.q(
        "SELECT key, kind, headers, payload, content_type, priority FROM {s}.message WHERE id = %s", (msg_id,)
    )
    return row


# -- through the client ----------------------------------------------------------------------


@FUZZ
@given(name=st.one_of(ANY_TEXT, NOT_TEXT, st.from_regex(QUEUE_NAME_RE, fullmatch=True)))
@example(name="q';drop table x;--")
@example(name="q" * 64)
@example(name="q" * 63)
@example(name="Q")
def test_queue_names(client: Client, db: Sql, name: Any) -> None:
    if name in ("q", "r"):  # the fixture's queues: not bad input
        return
    valid = isinstance(name, str) and QUEUE_NAME_RE.match(name) is not None
    for call in (
        lambda: client.send(name, b"x"),
        lambda: client.take(name),
        lambda: client.peek(name),
        lambda: client.metrics(name),
        lambda: client.dead_letters(name),
        lambda: client.purge_queue(name),
    ):
        out = attempt(db, call)
        assert isinstance(out, errors.QueueNotFound if valid else errors.InvalidQueueName), out
    out = attempt(db, lambda: client.create_queue(name))
    if valid:
        assert out is True and name in {q.name for q in client.list_queues()}
        assert client.drop_queue(name)
    else:
        assert isinstance(out, errors.InvalidQueueName)


@FUZZ
@given(
    key=st.one_of(ANY_TEXT, NOT_TEXT, st.text(min_size=500, max_size=520)),
    kind=st.one_of(ANY_TEXT, st.none()),
    on_conflict=st.sampled_from(["ignore", "replace", "error", "upsert", ""]),
)
@example(key="live", kind=None, on_conflict="error")
@example(key="live", kind=None, on_conflict="replace")
def test_keys_and_kinds(client: Client, db: Sql, key: Any, kind: Any, on_conflict: str) -> None:
    valid = (
        (key is None or (isinstance(key, str) and 0 < len(key) <= 512 and storable(key)))
        and (kind is None or (0 < len(kind) <= 255 and storable(kind)))
        and on_conflict in ("ignore", "replace", "error")
    )
    live = key is not None and valid and bool(db.q("SELECT 1 FROM {s}.message WHERE key = %s", (key,)))
    out = attempt(db, lambda: client.send("q", b"k", key=key, kind=kind, on_conflict=on_conflict))  # type: ignore[arg-type]
    if not valid:
        assert isinstance(out, errors.InvalidArgument), out
    elif live and on_conflict == "error":
        assert isinstance(out, errors.DuplicateKey), out
    else:
        assert out.outcome == (
            # A replace of the leased "live" message is kept too, as its next version.
            "created" if not live else "ignored" if on_conflict != "replace" else "updated"
        )
        row = stored(db, out.id)
        assert row["key"] == key and (out.outcome == "ignored" or row["kind"] == kind)


@FUZZ
@given(
    headers=st.one_of(
        st.dictionaries(ANY_TEXT, JSON, max_size=4),
        JSON,
        st.dictionaries(st.integers(), JSON, max_size=2),
        st.just({"x": float("nan")}),
        st.just({"x": b"bytes"}),
        st.just({"x": {1, 2}}),
    )
)
def test_headers(client: Client, db: Sql, headers: Any) -> None:
    valid = headers is None or (
        isinstance(headers, dict) and all(isinstance(k, str) for k in headers) and storable_json(headers)
    )
    out = attempt(db, lambda: client.send("q", b"h", headers=headers))
    if not valid:
        assert isinstance(out, errors.InvalidArgument), out
    else:
        assert stored(db, out.id)["headers"] == (None if headers is None else json.loads(json.dumps(headers)))


@FUZZ
@given(
    sizes=st.lists(
        st.one_of(st.integers(0, 2 * LIMIT), st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1])),
        min_size=1,
        max_size=5,
    ),
    text=ANY_TEXT,
    value=JSON,
)
def test_payloads_and_sizes(client: Client, db: Sql, sizes: list[int], text: str, value: Any) -> None:
    out = attempt(db, lambda: client.send_batch("q", [bytes(n) for n in sizes]))
    if max(sizes) > LIMIT:  # all or nothing
        assert isinstance(out, errors.PayloadTooLarge), out
    else:
        assert [bytes(stored(db, r.id)["payload"]) for r in out] == [bytes(n) for n in sizes]

    # str: stored as UTF-8 (NUL is fine in a payload; a lone surrogate is not text). JSON values
    # come back equal (as JSON text they are ASCII, whatever their strings hold).
    def ok(p: Any) -> bool:
        return not isinstance(p, str) or not any(0xD800 <= ord(c) <= 0xDFFF for c in p)

    for payload in (text, value):
        out = attempt(db, lambda p=payload: client.send("q", p))  # type: ignore[misc]
        if isinstance(out, errors.PayloadTooLarge):
            assert len(json.dumps(payload).encode()) > LIMIT
        elif isinstance(out, Exception):
            assert isinstance(out, errors.InvalidArgument) and not ok(payload), out
        else:
            assert ok(payload)
            row = stored(db, out.id)
            # JSON values come back as JSON reads them (two surrogate code points are one pair).
            expected = payload if isinstance(payload, str) else json.loads(json.dumps(payload))
            assert decode_payload(bytes(row["payload"]), row["content_type"]) == expected


@FUZZ
@given(
    lease=TIMES,
    delay=TIMES,
    priority=st.one_of(st.integers(-300, 300), st.floats(), st.booleans()),
    n=st.one_of(
        st.integers(-5, 100_005), st.sampled_from([0, 1, 100_000, 100_001]), st.floats(), st.booleans()
    ),
)
def test_times_priorities_and_counts(
    client: Client, db: Sql, lease: Any, delay: Any, priority: Any, n: Any
) -> None:
    out = attempt(db, lambda: client.send("q", b"t", delay=delay, priority=priority))
    ok_send = (
        (delay is None or valid_seconds(delay, False))
        and isinstance(priority, int)
        and not isinstance(priority, bool)
        and -100 <= priority <= 100
    )
    assert isinstance(out, errors.InvalidArgument) != ok_send, (out, delay, priority)
    out = attempt(db, lambda: client.take("q", n, lease=lease))
    ok_n = isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 100_000
    assert isinstance(out, errors.InvalidArgument) != (
        ok_n and (lease is None or valid_seconds(lease, True))
    ), (out, n, lease)
    if not isinstance(out, Exception) and out:
        ext = attempt(db, lambda: client.extend(out, lease=lease))
        assert not isinstance(ext, Exception) and set(ext) == {m.id for m in out}
        back = attempt(db, lambda: client.defer(out, delay=delay))
        assert isinstance(back, errors.InvalidArgument) != (delay is None or valid_seconds(delay, False)), (
            back
        )
        if isinstance(back, Exception):
            client.release(out)
    # "r" never runs dry, so a valid timeout returns at once with a message.
    out = attempt(db, lambda: client.receive("r", timeout=delay, poll=lease if lease is not None else 1))
    ok_receive = (delay is None or valid_seconds(delay, False)) and (
        lease is None or valid_seconds(lease, True, sql=False)
    )
    assert isinstance(out, errors.InvalidArgument) != ok_receive, (out, delay, lease)
    if ok_receive:
        assert len(out) == 1


# -- straight into the SQL functions -----------------------------------------------------------


BIGINT = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**62, 2**63 - 1, -(2**63)]))
INT = st.integers(-(2**31), 2**31 - 1)
SQL_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=70)


def sql_attempt(db: Sql, func: str, **args: Any) -> Any:
    before = snapshot(db)
    try:
        with db.conn.transaction():
            return db.call(func, **args)
    except psycopg.Error as e:
        assert e.sqlstate is not None and (e.sqlstate.startswith("LQ") or e.sqlstate == "22003"), (
            f"{func}: untyped SQLSTATE {e.sqlstate}: {e}"
        )
        assert snapshot(db) == before
        return e


@FUZZ
@given(name=SQL_TEXT, lease=BIGINT, attempts=INT, payload_limit=INT, retention=BIGINT, step=BIGINT)
def test_sql_queue_settings(
    db: Sql, name: str, lease: int, attempts: int, payload_limit: int, retention: int, step: int
) -> None:
    out = sql_attempt(
        db,
        "queue_create",
        p_name=name,
        p_lease_ms=lease,
        p_max_attempts=attempts,
        p_max_payload_bytes=payload_limit,
        p_retention_ms=retention,
        p_priority_step_ms=step,
    )
    if not isinstance(out, Exception):
        assert QUEUE_NAME_RE.match(name) and name not in ("q", "r")
        db.call("queue_drop", p_name=name)


@FUZZ
@given(
    delays=st.lists(st.one_of(st.none(), BIGINT), min_size=1, max_size=3),
    ats=st.one_of(st.none(), BIGINT),
    priorities=st.lists(st.integers(-(2**15), 2**15 - 1), min_size=1, max_size=3),
    now=st.one_of(st.none(), BIGINT),
    limit=INT,
    lease=st.one_of(st.none(), BIGINT),
)
def test_sql_times_and_limits(
    db: Sql,
    delays: list[int | None],
    ats: int | None,
    priorities: list[int],
    now: int | None,
    limit: int,
    lease: int | None,
) -> None:
    n = min(len(delays), len(priorities))
    out = sql_attempt(
        db,
        "send_batch",
        p_queue="q",
        p_payloads=[b"s"] * n,
        p_delays_ms=delays[:n],
        p_at_ms=[ats] * n,
        p_priorities=priorities[:n],
        p_now=now,
    )
    if not isinstance(out, Exception):
        assert all(-100 <= p <= 100 for p in priorities[:n])
    out = sql_attempt(db, "take", p_queue="r", p_limit=limit, p_lease_ms=lease, p_now=now)
    if not isinstance(out, Exception):
        assert 1 <= limit <= 100_000 and (lease is None or lease > 0)
        if out:
            sql_attempt(
                db,
                "extend",
                p_queue="r",
                p_ids=[r["id"] for r in out],
                p_tokens=[r["token"] for r in out],
                p_lease_ms=lease,
                p_now=now,
            )
            sql_attempt(
                db,
                "nack",
                p_queue="r",
                p_ids=[r["id"] for r in out],
                p_tokens=[r["token"] for r in out],
                p_delays_ms=[lease] * len(out),
                p_now=now,
            )
