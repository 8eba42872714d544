"""Shared parts of the fault tests: the bookkeeping tables written by tests/fault_consumer.py,
starting consumer processes, and the checks of the delivery guarantees from those tables.

The checks (docs/guarantees-testing.md):

* no loss: every message that was committed is acknowledged exactly once (fault_ack holds a row
  exactly when an ack committed) and the queue is empty;
* an acknowledged message never comes back: no delivery of it was processed after the
  acknowledged one (tokens count deliveries, so "after" is "larger token");
* duplicates only from leases in flight: every processed delivery other than the acknowledged
  one was held by a consumer that was killed, that saw the database fail under it
  (fault_abandoned), or whose ack found the lease already expired (fault_lost).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

CONSUMER = str(Path(__file__).with_name("fault_consumer.py"))

TABLES = """
CREATE TABLE {s}.fault_result (id bigint NOT NULL, token integer NOT NULL, key text, pid integer NOT NULL,
                               at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE {s}.fault_ack (id bigint NOT NULL, token integer NOT NULL, pid integer NOT NULL);
CREATE TABLE {s}.fault_lost (id bigint NOT NULL, token integer NOT NULL, pid integer NOT NULL);
CREATE TABLE {s}.fault_abandoned (id bigint NOT NULL, token integer NOT NULL, pid integer NOT NULL);
"""


def create_tables(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL(TABLES).format(s=sql.Identifier(schema)))  # type: ignore[arg-type]


class Consumer:
    """One tests/fault_consumer.py process."""

    def __init__(self, dsn: str, schema: str, *args: str) -> None:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in kill/finish)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen(
            [sys.executable, CONSUMER, "--dsn", dsn, "--schema", schema, *args],
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
        )
        self.pid = self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.err.close()

    def finish(self, timeout: float = 60) -> dict[str, Any]:
        """Wait for a clean exit (after SIGTERM or by itself); its stats."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.err.seek(0)
        err = self.err.read().decode(errors="replace")
        self.err.close()
        assert self.proc.returncode == 0, f"consumer {self.pid} exited {self.proc.returncode}:\n{err[-3000:]}"
        return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def queue_size(conn: psycopg.Connection[Any], schema: str, queue: str = "q") -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id WHERE q.name = %s"
        ).format(s=sql.Identifier(schema)),
        (queue,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_until_empty(conn: psycopg.Connection[Any], schema: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while queue_size(conn, schema) > 0:
        assert time.monotonic() < deadline, f"queue not drained within {timeout}s"
        time.sleep(0.2)


@dataclass
class Report:
    messages: int = 0
    processed: int = 0  # deliveries processed (rows of fault_result)
    duplicated_messages: int = 0  # messages processed more than once
    extra_deliveries: Counter[str] = field(default_factory=Counter)  # explanation -> count
    never_processed: int = 0  # deliveries taken but not processed (consumer died first)

    def __str__(self) -> str:
        return (
            f"{self.messages} messages, {self.processed} processed deliveries, "
            f"{self.duplicated_messages} messages processed twice or more "
            f"(extra deliveries by cause: {dict(self.extra_deliveries)}), "
            f"{self.never_processed} deliveries lost in flight before processing"
        )


def check_at_least_once(
    conn: psycopg.Connection[Any],
    schema: str,
    message_ids: set[int],
    killed_pids: set[int] = frozenset(),  # type: ignore[assignment]
) -> Report:
    """Assert the lease-mode guarantees for ``message_ids`` (every message committed to the
    queue) from the bookkeeping tables; returns the numbers."""
    s = sql.Identifier(schema)

    def rows(table: str, cols: str = "id, token, pid") -> list[tuple[Any, ...]]:
        return conn.execute(
            sql.SQL("SELECT " + cols + " FROM {}.{}").format(s, sql.Identifier(table))
        ).fetchall()  # type: ignore[operator]

    assert queue_size(conn, schema) == 0, "messages left in the queue"
    acks = rows("fault_ack")
    ack_count = Counter(i for i, _, _ in acks)
    assert set(ack_count) == message_ids, (
        f"acknowledged: {len(ack_count)}, committed: {len(message_ids)}; missing e.g. "
        f"{sorted(message_ids - set(ack_count))[:5]}, unknown e.g. {sorted(set(ack_count) - message_ids)[:5]}"
    )
    twice = [i for i, n in ack_count.items() if n > 1]
    assert twice == [], f"messages acknowledged twice (came back after an ack): {twice[:10]}"
    acked_token = {i: t for i, t, _ in acks}

    results = rows("fault_result")
    per_delivery = Counter((i, t) for i, t, _ in results)
    assert max(per_delivery.values()) == 1, "one delivery recorded twice (consumer bug)"
    lost = {(i, t) for i, t, _ in rows("fault_lost")}
    abandoned = {(i, t) for i, t, _ in rows("fault_abandoned")}
    by_id: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, t, pid in results:
        by_id[i].append((t, pid))

    report = Report(messages=len(message_ids), processed=len(results))
    unexplained = []
    for i, deliveries in by_id.items():
        assert i in acked_token, f"message {i} was processed but never acknowledged"
        tokens = [t for t, _ in deliveries]
        assert acked_token[i] in tokens, (
            f"message {i}: acknowledged delivery {acked_token[i]} was never processed"
        )
        later = [t for t in tokens if t > acked_token[i]]
        assert later == [], (
            f"message {i} came back after its ack (token {acked_token[i]}): deliveries {later}"
        )
        report.never_processed += acked_token[i] - len(tokens)
        if len(deliveries) > 1:
            report.duplicated_messages += 1
        for t, pid in deliveries:
            if t == acked_token[i]:
                continue
            if pid in killed_pids:
                report.extra_deliveries["consumer killed"] += 1
            elif (i, t) in abandoned:
                report.extra_deliveries["database failed under the consumer"] += 1
            elif (i, t) in lost:
                report.extra_deliveries["lease expired before the ack"] += 1
            else:
                unexplained.append((i, t, pid))
    assert unexplained == [], f"duplicates not explained by a lease in flight: {unexplained[:10]}"
    assert set(by_id) == message_ids
    return report
