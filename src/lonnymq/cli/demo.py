"""``lonnymq demo``: a short end-to-end tour of the queue's semantics on a real server.

Runs in its own schema (``lonnymq_demo`` by default, recreated each run and dropped at the end
unless ``--keep``) and checks every claim it prints, so a broken guarantee fails the demo rather
than printing a wrong story. It needs a server like every command: ``lonnymq server start``
gives a local one.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from .. import errors
from ..client import Client
from ..models import Envelope
from . import _util, common

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def console() -> Console:
    """rich's console, made when the demo runs: importing rich took every ``lonnymq`` command
    about a tenth of its start-up (docs/testing.md)."""
    from rich.console import Console

    return Console()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="a short end-to-end tour (FIFO, scheduling, priority, leases, retries, de-dup, DLQ)"
    )
    common(p)
    p.add_argument("--keep", action="store_true", help="keep the demo's schema (default: dropped at the end)")
    p.set_defaults(func=run, default_schema="lonnymq_demo")


def _check(ok: bool, claim: str) -> None:
    if not ok:
        raise SystemExit(f"demo: expected {claim}")
    console().print(f"  [green]✓[/green] {claim}")


def _step(title: str) -> None:
    console().rule(f"[bold]{title}")


def run(args: argparse.Namespace) -> int:
    dsn = _util.resolve(args)
    schema = _util.schema(args)
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
    with _util.connect_to(dsn, args) as conn:
        conn.execute(drop)
    try:
        with Client(dsn, schema=schema) as c:
            console().print(f"[bold]LonnyMQ demo[/bold] on {_util.where(dsn)}, schema {schema!r}")
            console().print(f"  migrations applied: {c.migrate()}")
            c.create_queue("demo.dead")
            c.create_queue("demo", lease=1, max_attempts=3, dead_letter_queue="demo.dead", priority_step=1)
            tour(c, dsn)
            from rich.table import Table

            table = Table(title="queue metrics at the end")
            for col in ("queue", "ready", "scheduled", "leased", "dead"):
                table.add_column(col)
            for q in ("demo", "demo.dead"):
                m = c.metrics(q)
                table.add_row(m.queue, str(m.ready), str(m.scheduled), str(m.leased), str(m.dead))
            console().print(table)
    finally:
        if not args.keep:
            with _util.connect_to(dsn, args) as conn:
                conn.execute(drop)
    console().print(
        "[bold green]demo finished: every claim above was checked against the database[/bold green]"
    )
    console().print(
        f"  schema {schema!r} " + ("kept (--keep)" if args.keep else "dropped: the demo left nothing behind")
    )
    return 0


def tour(c: Client, dsn: str) -> None:
    _step("1. FIFO: a batch of 5 in one round trip, taken one by one")
    sent = c.send_batch("demo", [{"n": i} for i in range(5)])
    got = [c.take("demo")[0] for _ in range(5)]
    console().print(f"  sent ids {[r.id for r in sent]} → taken {[m.id for m in got]}")
    _check([m.id for m in got] == [r.id for r in sent], "messages come out in the order they went in")
    c.ack(got)

    _step("2. Scheduling: a message for 1.5 s from now")
    c.send("demo", "later", delay=1.5)
    _check(c.take("demo") == [], "nothing is deliverable yet")
    t0 = time.monotonic()
    [m] = c.receive("demo", timeout=5, poll=30)
    waited = time.monotonic() - t0
    console().print(f"  receive() woke after {waited:.2f}s (it polls only every 30 s: the due time woke it)")
    _check(1.0 <= waited < 4 and m.payload == "later", "the scheduled message arrives when due")
    c.ack(m)

    _step("3. Priority: dequeue_at moved into the past by priority x priority_step")
    c.send_batch("demo", ["normal-1", "normal-2", Envelope("urgent", priority=10), "normal-3"])
    order = [m.payload for m in c.take("demo", 4)]
    console().print(f"  taken in order {order}")
    _check(order[0] == "urgent", "priority 10 overtakes messages sent up to 10 s before it")

    _step("4. Lease expiry: a consumer 'crashes' holding a message")
    # The 4 messages above are leased for 1 s and never acked: they come back by themselves.
    time.sleep(1.2)
    again = c.take("demo", 4)
    _check(sorted(m.payload for m in again) == sorted(order), "expired leases are redelivered")
    _check(all(m.attempt == 2 for m in again), "each redelivery counts as attempt 2")
    stale = next(m for m in again if m.payload == "urgent")
    c.ack([m for m in again if m is not stale])
    time.sleep(1.2)
    [retaken] = c.take("demo")
    try:
        c.ack(stale)
        _check(False, "a stale ack to be rejected")
    except errors.LeaseLost:
        _check(
            True,
            f"the old holder's ack (token {stale.token}) is rejected: the message is now token {retaken.token}",
        )
    c.ack(retaken)

    _step("5. Retry with backoff, then the dead-letter queue")
    c.send("demo", {"job": "always fails"})
    outcomes = []
    for attempt in range(1, 4):
        [m] = c.receive("demo", timeout=5, poll=30)
        result = c.nack(m, delay=0.2 * attempt, error=f"boom on attempt {attempt}")
        outcomes.append(result[m.id])
    console().print(f"  nack outcomes: {outcomes}")
    _check(outcomes == ["retry", "retry", "dead"], "retried with backoff, dead after max_attempts=3")
    [dead] = c.take("demo.dead")
    console().print(f"  dead-letter headers: {dead.headers}")
    _check(dead.last_error == "boom on attempt 3", "the dead letter carries the last error")
    c.ack(dead)

    _step("6. De-duplication keys")
    a = c.send("demo", {"invoice": 42, "v": 1}, key="invoice-42")
    b = c.send("demo", {"invoice": 42, "v": 2}, key="invoice-42")
    r = c.send("demo", {"invoice": 42, "v": 3}, key="invoice-42", on_conflict="replace")
    console().print(f"  outcomes: {a.outcome}, {b.outcome}, {r.outcome} (same id {a.id})")
    _check(
        (a.outcome, b.outcome, r.outcome) == ("created", "ignored", "updated") and a.id == b.id == r.id,
        "one live message per key: second send ignored, third replaced it",
    )
    try:
        c.send("demo", {}, key="invoice-42", on_conflict="error")
        _check(False, "DuplicateKey")
    except errors.DuplicateKey:
        _check(True, "on_conflict='error' raises DuplicateKey")
    [m] = c.take("demo")
    _check(m.payload == {"invoice": 42, "v": 3}, "the replaced payload is what gets delivered")
    c.ack(m)

    _step("7. Exactly-once with your own transaction")
    c.send("demo", "transfer")
    with psycopg.connect(dsn) as tx:
        [m] = c.take_tx("demo", conn=tx)
        tx.rollback()
    _check([x.payload for x in c.peek("demo")] == ["transfer"], "rolled back: the message is back")
    with psycopg.connect(dsn) as tx:
        [m] = c.take_tx("demo", conn=tx)
        tx.commit()
    _check(c.peek("demo") == [], "committed: the message is gone, with your writes")
