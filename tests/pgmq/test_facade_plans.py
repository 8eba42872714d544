"""The facade's message-path wrappers are inlined (issue 13 item 5, docs/pgmq.md "Speed"): a
query through ``pgmq.send``, ``send_batch``, ``read`` or ``pop``, as pgmq's clients write it,
is planned as the call of LonnyMQ's own function it wraps, with no function of the facade left
to run; and the same functions still write when PostgreSQL does not inline them (a call in a
select list, PL/pgSQL's PERFORM), with their own snapshots."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from lonnymq import Client

Conn = psycopg.Connection[dict[str, Any]]

# pgmq's Python client's statements (pgmq/_sql.py), their arguments and the LonnyMQ function
# each must become. Every overload of send and send_batch is here: each is inlined on its own.
T = "'2030-01-01'"
CALLS = [
    # The plain send: LonnyMQ's send_plain (a scalar: called in the plan's Result node).
    ("send(queue_name=>%s::text, msg=>%s::jsonb)", "'q', '{}'", "send_plain"),
    ("send(queue_name=>%s::text, msg=>%s::jsonb, delay=>%s::integer)", "'q', '{}', 5", "send"),
    ("send(queue_name=>%s::text, msg=>%s::jsonb, delay=>%s::timestamptz)", f"'q', '{{}}', {T}", "send"),
    ("send(queue_name=>%s::text, msg=>%s::jsonb, headers=>%s::jsonb)", "'q', '{}', '{}'", "send"),
    (
        "send(queue_name=>%s::text, msg=>%s::jsonb, headers=>%s::jsonb, delay=>%s::integer)",
        "'q', '{}', '{}', 5",
        "send",
    ),
    (
        "send(queue_name=>%s::text, msg=>%s::jsonb, headers=>%s::jsonb, delay=>%s::timestamptz)",
        f"'q', '{{}}', '{{}}', {T}",
        "send",
    ),
    ("send_batch(queue_name=>%s::text, msgs=>%s::jsonb[])", "'q', '{\"{}\"}'", "send_batch"),
    (
        "send_batch(queue_name=>%s::text, msgs=>%s::jsonb[], delay=>%s::integer)",
        "'q', '{\"{}\"}', 5",
        "send_batch",
    ),
    (
        "send_batch(queue_name=>%s::text, msgs=>%s::jsonb[], delay=>%s::timestamptz)",
        f"'q', '{{\"{{}}\"}}', {T}",
        "send_batch",
    ),
    (
        "send_batch(queue_name=>%s::text, msgs=>%s::jsonb[], headers=>%s::jsonb[])",
        "'q', '{\"{}\"}', '{\"{}\"}'",
        "send_batch",
    ),
    (
        "send_batch(queue_name=>%s::text, msgs=>%s::jsonb[], headers=>%s::jsonb[], delay=>%s::integer)",
        "'q', '{\"{}\"}', '{\"{}\"}', 5",
        "send_batch",
    ),
    (
        "send_batch(queue_name=>%s::text, msgs=>%s::jsonb[], headers=>%s::jsonb[], delay=>%s::timestamptz)",
        f"'q', '{{\"{{}}\"}}', '{{\"{{}}\"}}', {T}",
        "send_batch",
    ),
    ("read(queue_name=>%s::text, vt=>%s::integer, qty=>%s::integer)", "'q', 30, 1", "take"),
    ("pop(queue_name=>%s::text, qty=>%s::integer)", "'q', 1", "take_tx"),
    ("pop(queue_name=>%s::text)", "'q'", "take_tx"),
]


def _functions(plan: dict[str, Any]) -> Iterator[str]:
    """The schema-qualified functions the plan's function scans call, and those its result nodes
    call in their output (a scalar function in a select list; EXPLAIN VERBOSE's text)."""
    if plan.get("Node Type") == "Function Scan":
        yield f"{plan['Schema']}.{plan['Function Name']}"
    if plan.get("Node Type") == "Result":
        for out in plan.get("Output", []):
            yield from re.findall(r"\b(\w+\.\w+)\(", out)
    for child in plan.get("Plans", []):
        yield from _functions(child)


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_message_path_is_planned_as_the_lonnymq_call(pg: Conn, plan_cache_mode: str) -> None:
    """Each statement's plan, custom (the values known) and generic (a prepared statement's,
    as a driver reuses it), scans LonnyMQ's function and no function of the pgmq schema."""
    pg.execute("SELECT pgmq.create('q')")
    pg.execute("SELECT set_config('plan_cache_mode', %s, false)", (plan_cache_mode,))
    for i, (call, args, core) in enumerate(CALLS):
        n = call.count("%s")
        query = "SELECT * FROM pgmq." + call.replace("%s", "${}").format(*range(1, n + 1))
        pg.execute(f"PREPARE s{i} AS {query}")  # type: ignore[arg-type]
        row = pg.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE s{i}({args})").fetchone()  # type: ignore[arg-type]
        assert row is not None
        functions = set(_functions(row["QUERY PLAN"][0]["Plan"]))
        assert f"lonnymq.{core}" in functions, (query, functions)
        assert not [f for f in functions if f.startswith("pgmq.")], (query, functions)
        # And the statement runs (a pop or read of an empty queue returns no row).
        pg.execute(f"EXECUTE s{i}({args})")  # type: ignore[arg-type]


def test_a_read_with_a_conditional_keeps_both_branches_and_runs_one(pg: Conn) -> None:
    """read's conditional picks take or _read_where: with a constant the other branch is gone
    from the plan; as a parameter of a generic plan both stay, each behind a one-time filter,
    and only the one that applies runs (the message a conditional excludes stays unread)."""
    pg.execute("SELECT pgmq.create('q')")
    pg.execute("SELECT pgmq.send_batch('q', ARRAY['{\"k\": 1}', '{\"k\": 2}']::jsonb[])")
    pg.execute("SET plan_cache_mode = force_generic_plan")
    pg.execute(
        "PREPARE r(text, integer, integer, jsonb) AS"
        " SELECT msg_id, message FROM pgmq.read(queue_name=>$1, vt=>$2, qty=>$3, conditional=>$4)"
    )
    row = pg.execute("EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE r('q', 30, 5, '{\"k\": 2}')").fetchone()
    assert row is not None
    assert set(_functions(row["QUERY PLAN"][0]["Plan"])) == {"lonnymq.take", "pgmq._read_where"}
    got = pg.execute("EXECUTE r('q', 30, 5, '{\"k\": 2}')").fetchall()
    assert [r["message"] for r in got] == [{"k": 2}]
    got = pg.execute("EXECUTE r('q', 30, 5, '{}')").fetchall()
    assert [r["message"] for r in got] == [{"k": 1}]
    assert pg.execute("EXECUTE r('q', 30, 5, NULL)").fetchall() == []
    row = pg.execute("EXPLAIN (VERBOSE, FORMAT JSON) SELECT * FROM pgmq.read('q', 30, 5)").fetchone()
    assert row is not None
    assert set(_functions(row["QUERY PLAN"][0]["Plan"])) == {"lonnymq.take"}


def test_calls_that_are_not_inlined_still_write(pg: Conn, lq: Client) -> None:
    """In a select list (no inlining) and through PL/pgSQL (send_topic's PERFORM of send, a
    DO block), the wrappers send, read and pop as they do in FROM; in one transaction, each
    call sees what the ones before it wrote (the LonnyMQ functions take their own snapshots)."""
    pg.execute("SELECT pgmq.create('q')")
    pg.execute("SELECT pgmq.bind_topic('t.*', 'q')")
    with pg.transaction():
        first = pg.execute("SELECT pgmq.send('q', '{\"n\": 1}') AS id").fetchone()
        batch = [
            r["id"] for r in pg.execute("SELECT pgmq.send_batch('q', ARRAY['{\"n\": 2}']::jsonb[]) AS id")
        ]
        assert pg.execute("SELECT pgmq.send_topic('t.x', '{\"n\": 3}') AS n").fetchone() == {"n": 1}
        pg.execute("DO $$ BEGIN PERFORM pgmq.send('q', '{\"n\": 4}'::jsonb, 0); END $$")
        read = pg.execute("SELECT (pgmq.read('q', 30, 1)).*").fetchall()
        popped = pg.execute("SELECT (pgmq.pop('q', 5)).*").fetchall()
    assert first is not None
    assert [r["msg_id"] for r in read] == [first["id"]]
    assert [r["message"] for r in popped] == [{"n": 2}, {"n": 3}, {"n": 4}]
    assert popped[0]["msg_id"] == batch[0]
    assert lq.metrics("q").total_sent == 4


def _outputs(plan: dict[str, Any]) -> Iterator[str]:
    """Every output expression of the plan's nodes (EXPLAIN VERBOSE)."""
    yield from plan.get("Output", [])
    for child in plan.get("Plans", []):
        yield from _outputs(child)


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_read_and_pop_convert_times_without_numeric(pg: Conn, plan_cache_mode: str) -> None:
    """The times of read's and pop's rows (pgmq._ts, epoch ms to timestamptz) are computed in
    float8, not numeric (a numeric division and a text round trip to float8 per value:
    benchmarks/server_instructions.py, pgmq_pop); and they are the instants LonnyMQ stored."""
    pg.execute("SELECT pgmq.create('q')")
    pg.execute("SELECT set_config('plan_cache_mode', %s, false)", (plan_cache_mode,))
    for name, call, args in [
        ("r", "read(queue_name=>$1::text, vt=>$2::integer, qty=>$3::integer)", "'q', 30, 1"),
        ("p", "pop(queue_name=>$1::text, qty=>$2::integer)", "'q', 1"),
    ]:
        pg.execute(
            f"PREPARE {name} AS SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers"  # type: ignore[arg-type]
            f" FROM pgmq.{call}"
        )
        row = pg.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE {name}({args})").fetchone()  # type: ignore[arg-type]
        assert row is not None
        outputs = list(_outputs(row["QUERY PLAN"][0]["Plan"]))
        assert any("to_timestamp" in o for o in outputs), outputs
        assert not [o for o in outputs if "numeric" in o], outputs
    pg.execute("SELECT pgmq.send_batch('q', ARRAY['{\"a\": 1}', '{\"a\": 2}']::jsonb[])")
    stored = {
        r["id"]: r["enqueued_at"] for r in pg.execute("SELECT m.id, m.enqueued_at FROM lonnymq.message m")
    }
    got = [pg.execute("EXECUTE r('q', 30, 1)").fetchone(), pg.execute("EXECUTE p('q', 1)").fetchone()]
    assert sorted(r["msg_id"] for r in got if r is not None) == sorted(stored)
    for r in got:
        assert r is not None
        ms = pg.execute(
            "SELECT (extract(epoch FROM %s::timestamptz) * 1000)::bigint AS ms", (r["enqueued_at"],)
        )
        assert ms.fetchone() == {"ms": stored[r["msg_id"]]}


def test_ts_is_the_instant_of_its_milliseconds(pg: Conn) -> None:
    """pgmq._ts(ms) is what the numeric form to_timestamp(ms / 1000.0) gave, everywhere: before
    the epoch, around now, far ahead, at values whose quotient by 1000 is not exact in binary;
    and, around the epoch and now, the exact instant ms milliseconds after the epoch (far from
    2000, to_timestamp's float8 seconds times 10^6 may miss it by a microsecond or more, in
    either form)."""
    row = pg.execute(
        "SELECT count(*) AS n,"
        " count(*) FILTER (WHERE pgmq._ts(x.ms) IS DISTINCT FROM pg_catalog.to_timestamp(x.ms / 1000.0))"
        "   AS not_numeric,"
        " count(*) FILTER (WHERE abs(x.ms) < 2000000000000 AND pgmq._ts(x.ms)"
        "   IS DISTINCT FROM timestamptz 'epoch' + (x.ms / 1000) * interval '1 second'"
        "                    + (x.ms % 1000) * interval '1 millisecond') AS not_exact,"
        " count(*) FILTER (WHERE pgmq._ts(NULL) IS NOT NULL) AS not_null"
        " FROM (SELECT g AS ms FROM generate_series(-5000, 5000) g"
        "       UNION ALL SELECT 1700000000000 + g * 7 FROM generate_series(0, 20000) g"
        "       UNION ALL SELECT -62135596800000 + g * 997 FROM generate_series(0, 2000) g"
        "       UNION ALL SELECT 9007199254740 - g * 1013 FROM generate_series(0, 2000) g"
        "       UNION ALL SELECT 253402300799999 - g * 1009 FROM generate_series(0, 2000) g) x"
    ).fetchone()
    assert row == {"n": 36005, "not_numeric": 0, "not_exact": 0, "not_null": 0}
