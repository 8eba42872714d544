"""The API floors of the producers benchmark (benchmarks/lonnymq_bench/systems/api_floor.py) do
what they stand for: the send floor's function writes a message LonnyMQ delivers and counts it
as sent, the pop floors' functions delete the queue's first ready messages in LonnyMQ's order and
return take_tx's row, and an unknown queue is an error, not a silent no-op."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import errors, sql

from lonnymq import Client
from lonnymq.client.ops import encode_payload

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from lonnymq_bench.systems.api_floor import POP_CALL, SEND_CALL  # noqa: E402 - needs the path above


def test_api_send_floor_writes_a_message_lonnymq_delivers(
    client: Client, schema: str, floor: tuple[psycopg.Connection[tuple[object, ...]], sql.Identifier]
) -> None:
    c, f = floor
    client.create_queue("q")
    body, ctype = encode_payload({"order": 7})
    row = c.execute(sql.SQL(SEND_CALL).format(f=f), ("q", body, ctype)).fetchone()
    assert row is not None and isinstance(row[0], int)
    got = client.take_tx("q")
    assert [(m.id, m.payload) for m in got] == [(row[0], {"order": 7})]
    sent = c.execute(sql.SQL("SELECT sum(sent) FROM {}.queue_stat").format(sql.Identifier(schema))).fetchone()
    assert sent == (1,)


def test_api_pop_floors_take_the_first_ready_messages_in_order(
    client: Client, floor: tuple[psycopg.Connection[tuple[object, ...]], sql.Identifier]
) -> None:
    c, f = floor
    client.create_queue("q")
    ids = [client.send("q", {"n": n}).id for n in range(3)]
    popped = []
    for fn in ("pop", "pop2"):
        row = c.execute(sql.SQL(POP_CALL).format(f=f, fn=sql.Identifier(fn)), ("q",)).fetchone()
        assert row is not None
        # take_tx's row: id, attempt, token, lease_until (NULL: a pop holds no lease), ...
        assert row[1:4] == (1, 1, None)
        popped.append(row[0])
    assert popped == ids[:2]
    assert [m.id for m in client.take_tx("q")] == ids[2:]
    assert c.execute(sql.SQL(POP_CALL).format(f=f, fn=sql.Identifier("pop")), ("q",)).fetchone() is None


def test_api_floors_refuse_an_unknown_queue(
    client: Client, floor: tuple[psycopg.Connection[tuple[object, ...]], sql.Identifier]
) -> None:
    c, f = floor
    client.create_queue("q")
    with pytest.raises(errors.NoDataFound):
        c.execute(sql.SQL(SEND_CALL).format(f=f), ("nope", b"{}", None))
    for fn in ("pop", "pop2"):
        with pytest.raises(errors.NoDataFound):
            c.execute(sql.SQL(POP_CALL).format(f=f, fn=sql.Identifier(fn)), ("nope",))
