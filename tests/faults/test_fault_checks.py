"""The checks of the fault tests (tests/fault_helpers.py) catch what they claim to: each
violation of a delivery guarantee, written into the bookkeeping tables by hand, fails them."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from fault_helpers import check_at_least_once, create_tables
from lonnymq import Client

KILLED = 999


@pytest.fixture
def tables(
    client: Client, schema: str, conn: psycopg.Connection
) -> Callable[[str, list[tuple[int, int, int]]], None]:
    client.create_queue("q")
    create_tables(conn, schema)

    def put(table: str, rows: list[tuple[int, int, int]]) -> None:
        for r in rows:
            conn.execute(
                sql.SQL("INSERT INTO {}.{} (id, token, pid) VALUES (%s, %s, %s)").format(
                    sql.Identifier(schema), sql.Identifier(table)
                ),
                r,
            )

    # Two messages: 1 processed once; 2 processed by a killed consumer, then again and acked.
    put("fault_result", [(1, 1, 10), (2, 1, KILLED), (2, 3, 11)])
    put("fault_ack", [(1, 1, 10), (2, 3, 11)])
    return put


def test_a_clean_run_passes(tables: Callable[..., None], schema: str, conn: psycopg.Connection) -> None:
    report = check_at_least_once(conn, schema, {1, 2}, {KILLED})
    assert (report.duplicated_messages, report.never_processed) == (1, 1)
    assert dict(report.extra_deliveries) == {"consumer killed": 1}


@pytest.mark.parametrize(
    ("table", "rows", "killed", "error"),
    [
        ("fault_ack", [(1, 1, 10)], {KILLED}, "acknowledged twice"),
        ("fault_result", [(1, 2, 12)], {KILLED}, "came back after its ack"),
        ("fault_result", [(1, 2, 12)], {KILLED, 12}, "came back after its ack"),
        (None, [], set(), "not explained by a lease in flight"),
        ("fault_result", [(3, 1, 10)], {KILLED}, "never acknowledged"),
    ],
    ids=["ack twice", "after ack", "after ack by killed", "unexplained duplicate", "processed not acked"],
)
def test_each_violation_fails(
    tables: Callable[..., None],
    schema: str,
    conn: psycopg.Connection,
    table: str | None,
    rows: list[tuple[int, int, int]],
    killed: set[int],
    error: str,
) -> None:
    if table:
        tables(table, rows)
    with pytest.raises(AssertionError, match=error):
        check_at_least_once(conn, schema, {1, 2}, killed)


def test_a_lost_message_fails(tables: Callable[..., None], schema: str, conn: psycopg.Connection) -> None:
    with pytest.raises(AssertionError, match="missing"):
        check_at_least_once(conn, schema, {1, 2, 3}, {KILLED})


def test_a_message_left_in_the_queue_fails(
    tables: Callable[..., None], client: Client, schema: str, conn: psycopg.Connection
) -> None:
    client.send("q", b"x")
    with pytest.raises(AssertionError, match="left in the queue"):
        check_at_least_once(conn, schema, {1, 2}, {KILLED})


def test_lost_leases_and_abandoned_deliveries_explain_duplicates(
    tables: Callable[..., None], schema: str, conn: psycopg.Connection
) -> None:
    tables("fault_result", [(1, 0, 20), (2, 2, 21)])
    tables("fault_lost", [(1, 0, 20)])
    tables("fault_abandoned", [(2, 2, 21)])
    report = check_at_least_once(conn, schema, {1, 2}, {KILLED})
    assert dict(report.extra_deliveries) == {
        "consumer killed": 1,
        "lease expired before the ack": 1,
        "database failed under the consumer": 1,
    }
