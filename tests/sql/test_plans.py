"""Plan tests for the hot query: the candidate SELECTs of take() (and take_tx()), taken verbatim
from sql/take.sql, on a realistic queue of 600k messages must walk the dequeue index from
its head: an index scan, no sequential scan, no sort, a handful of buffers."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client, Envelope
from lonnymq.sql import function_text

pytestmark = pytest.mark.slow

PER_STATE = 200_000
LIMIT = 10
GEN = 1  # the current generation of a fresh schema (sql/generations.sql): the messages' own


def _locking_selects(function: str) -> list[str]:
    """Every row-locking sub-SELECT of ``function`` (its current definition), whitespace
    normalised."""
    body = function_text(function)
    found = re.findall(r"\(\s*(SELECT\s[^()]*?FOR UPDATE SKIP LOCKED)\s*\)", body)
    assert found, f"no candidate SELECT ... FOR UPDATE SKIP LOCKED found in {function}()"
    return [re.sub(r"\s+", " ", text) for text in found]


def candidate_queries(function: str) -> list[str]:
    """The row-locking candidate SELECTs of ``function`` (its current definition), with the
    queue id, the time, the limit and the generation as $1 to $4: the subqueries in parentheses
    (take reads each generation of the window with one of them)."""
    queries = []
    # take and take_tx use the window's query twice: in the one-message statement, which reads
    # the ordinary queues' partition (message_logged), and in the general one.
    for text in dict.fromkeys(_locking_selects(function)):
        text = re.sub(r"\s+INTO\s+\w+(?:,\s*\w+)*\s+", " ", text, count=1)
        text = re.sub(r"\b(?:q\.id|v_head\.qid)\b", "$1", text)  # v_head: take_tx's lean pop
        text = re.sub(r"\b(?:v_now|p_now|v_head\.now)\b", "$2", text)
        text = re.sub(r"\b(?:p_limit|v_want|v_more)\b", "$3", text)
        text = re.sub(r"\b(?:g\.gen|v_old)\b", "$4", text)  # v_old: a frozen generation
        text = re.sub(r"\b(?:q|v_head)\.max_attempts\b", "5", text)  # take_tx's lean path: deliverable?
        unknown = re.findall(r"\b(?:p|v)_\w+|\bq\.\w+", text)
        assert not unknown, f"{function}() candidate query uses {unknown}: teach this test about them"
        queries.append(text)
    return queries


def window_query(function: str) -> str:
    """The candidate query of the window that ``function`` runs on the loaded (ordinary) queue,
    which has no frozen generation: the one that reads the generation of the VALUES list
    (g.gen), not a frozen one (v_old), and in take() and take_tx() the one-message statement's,
    which reads the ordinary queues' partition."""
    queries = candidate_queries(function)
    windows = [
        q for q, raw in zip(queries, dict.fromkeys(_locking_selects(function)), strict=True) if "g.gen" in raw
    ]
    if len(windows) > 1:
        windows = [q for q in windows if ".message_logged " in q]
    [window] = windows
    return window


@pytest.fixture(scope="module")
def loaded(dsn: str) -> Iterator[tuple[str, int, int]]:
    """A schema with queue "q" holding 200k future, 200k leased and 200k ready messages (and a
    small second queue), analysed. Yields (schema, queue id, now)."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("other")
        c.create_queue("q")
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        qid = conn.execute(sql.SQL("SELECT id FROM {}.queue WHERE name = 'q'").format(s)).fetchone()[0]
        other = conn.execute(sql.SQL("SELECT id FROM {}.queue WHERE name = 'other'").format(s)).fetchone()[0]
        now = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchone()[0]
        started = time.perf_counter()
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, attempts,
                                           deliveries, leased, payload)
                   SELECT %(q)s, %(gen)s,
                          CASE i %% 3 WHEN 0 THEN %(now)s + 3600000 + i   -- future
                                     WHEN 1 THEN %(now)s + 30000 + i     -- leased
                                     ELSE %(now)s - 3 * %(n)s + i END,   -- ready
                          %(now)s - 3 * %(n)s + i, %(now)s - 3 * %(n)s + i,
                          (i %% 3 = 1)::int, (i %% 3 = 1)::int, i %% 3 = 1, '\\x7b7d'
                     FROM generate_series(1, 3 * %(n)s) i"""
            ).format(s),
            {"q": qid, "now": now, "n": PER_STATE, "gen": GEN},
        )
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, payload)
                   SELECT %s, %s, %s - i, %s - i, %s - i, '\\x00' FROM generate_series(1, 1000) i"""
            ).format(s),
            (other, GEN, now, now, now),
        )
        conn.execute(sql.SQL("ANALYZE {}.message").format(s))
        print(f"\nplan tests: loaded {3 * PER_STATE + 1000} messages in {time.perf_counter() - started:.1f}s")
    yield schema, qid, now
    drop_schema(dsn, schema)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _dequeue_index(conn: psycopg.Connection, schema: str, qid: int) -> str:
    [(name,)] = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s"
        " AND indexdef LIKE '%%(gen, queue_id, dequeue_at, id)%%'",
        (schema, "message_logged" if qid > 0 else "message_unlogged"),
    ).fetchall()
    return str(name)


def _explain(
    conn: psycopg.Connection,
    schema: str,
    query: str,
    mode: str,
    args: tuple[int, int, int],
    analyze: bool = False,
) -> dict[str, Any]:
    conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Literal(mode)))
    conn.execute("DEALLOCATE ALL")
    conn.execute(
        sql.SQL("PREPARE candidates(integer, bigint, integer, bigint) AS {}").format(
            sql.SQL(query.replace("{schema}", sql.Identifier(schema).as_string(conn)))  # type: ignore[arg-type]
        )
    )
    options = "FORMAT JSON, ANALYZE, BUFFERS" if analyze else "FORMAT JSON"
    # EXPLAIN takes no bind parameters: the arguments go in as literals (the prepared plan is
    # still generic or custom as plan_cache_mode says).
    [(out,)] = conn.execute(
        sql.SQL("EXPLAIN ({}) EXECUTE candidates({})").format(
            sql.SQL(options), sql.SQL(", ").join(sql.Literal(a) for a in args)
        )  # type: ignore[arg-type]
    ).fetchall()
    return out[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
# _lock_ready: the candidates of take() and take_tx(); take: its one-message lean path;
# take_tx: its lean path (pop).
@pytest.mark.parametrize("function", ["_lock_ready", "take", "take_tx"])
def test_candidate_query_walks_the_dequeue_index(
    dsn: str, loaded: tuple[str, int, int], function: str, mode: str
) -> None:
    schema, qid, now = loaded
    with psycopg.connect(dsn) as conn:
        index = _dequeue_index(conn, schema, qid)
        for query in candidate_queries(function):
            plan = _explain(conn, schema, query, mode, (qid, now, LIMIT, GEN))["Plan"]
            nodes = list(_nodes(plan))
            types = [n["Node Type"] for n in nodes]
            assert not {"Seq Scan", "Sort", "Incremental Sort", "Bitmap Heap Scan"} & set(types), types
            scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
            assert index in [n.get("Index Name") for n in scans], (index, types)
            assert types[0] == "Limit" and "LockRows" in types, types
        conn.rollback()


@pytest.mark.parametrize(("function", "rows"), [("_lock_ready", LIMIT), ("take", LIMIT)])
def test_candidate_query_reads_a_handful_of_buffers(
    dsn: str, loaded: tuple[str, int, int], function: str, rows: int
) -> None:
    schema, qid, now = loaded
    with psycopg.connect(dsn) as conn:
        query = window_query(function)
        for mode in ("force_custom_plan", "force_generic_plan"):
            result = _explain(conn, schema, query, mode, (qid, now, LIMIT, GEN), analyze=True)
            plan = result["Plan"]
            buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            print(
                f"\n{function} {mode}: {plan['Actual Rows']} rows, {buffers} buffers,"
                f" {result['Execution Time']:.2f} ms"
            )
            assert plan["Actual Rows"] == rows
            assert buffers <= 50, buffers
            conn.rollback()  # the EXPLAIN ANALYZE really locked the rows


@pytest.mark.parametrize(("function", "limit"), [("_lock_ready", LIMIT), ("take", 1), ("take", LIMIT)])
def test_the_extracted_query_is_the_one_take_runs(
    dsn: str, loaded: tuple[str, int, int], function: str, limit: int
) -> None:
    """Guard against the regex drifting: the extracted SELECT picks exactly what take() leases
    (take(1) and take(n) of a queue without frozen generations through their lean statements,
    which share the window's query; _lock_ready's is the general path's)."""
    schema, qid, now = loaded
    query = window_query(function)
    with psycopg.connect(dsn) as conn:
        text = query.replace("{schema}", sql.Identifier(schema).as_string(conn))
        text = text.replace("$1", "%(q)s").replace("$2", "%(now)s").replace("$3", "%(limit)s")
        text = text.replace("$4", "%(gen)s")
        params = {"q": qid, "now": now, "limit": limit, "gen": GEN}
        picked = [r[0] for r in conn.execute(text, params).fetchall()]
        conn.rollback()
        taken = [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT id FROM {}.take('q', %s, p_now => %s)").format(sql.Identifier(schema)),
                (limit, now),
            ).fetchall()
        ]
        conn.rollback()
    assert picked == taken and len(taken) == limit


@pytest.mark.parametrize("function", ["take", "take_tx"])
def test_every_row_lock_of_take_and_take_tx_is_plan_tested(function: str) -> None:
    """The plan tests above cover take() and take_tx() only while each row-locking SELECT on
    their plain path is either _lock_ready()'s or one candidate_queries() extracts."""
    body = function_text(function)
    assert "{schema}._lock_ready(q, v_want, v_now)" in body
    # (The channels' row locks are _take_channels'.)
    assert body.count("FOR UPDATE SKIP LOCKED") == len(_locking_selects(function))
    # The frozen generations', the window's, and the window's in the ordinary queues' partition
    # (the lean statements of one message and of a batch share it).
    assert len(candidate_queries(function)) == 3


# Settling by (id, token) ----------------------------------------------------------------------
#
# ack, nack, extend, give_up and the ack riding on take find their rows by primary key. The
# partial index of leased rows (message_leased_idx, WHERE leased) also answers "leased rows of
# this queue", and right after a burst of takes the statistics still say there are none: a
# statement that says a bare "m.leased" then hash-joins against every leased row of the queue
# (measured: 46 ms for an ack of 100 with 150k leased, against 0.25 ms by primary key).

LEASED = 20_000
SETTLE = 10


def _analyze_once(dsn: str, schema: str, table: str) -> None:
    """ANALYZE ``table`` now, and keep autovacuum from analysing it again while the test runs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = sql.Identifier(schema, table)
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(t))
        conn.execute(sql.SQL("ANALYZE {}").format(t))


def _reads_of_call(
    dsn: str, schema: str, call: str, table: str, params: dict[str, Any]
) -> tuple[list[Any], int, int]:
    """Run ``call`` (``{s}`` is the schema) in a transaction rolled back afterwards: its rows,
    and the rows it read from ``table`` by sequential scans and fetched through indexes. The
    rotator's lock is held meanwhile: a take may rotate the generations (generations.sql), and
    the rows a rotation moves are not the call's reads."""
    with psycopg.connect(dsn) as rotator, psycopg.connect(dsn) as conn:
        rotator.execute("SELECT pg_advisory_xact_lock(hashtext(%s || '/rotate'), 0)", (schema,))
        rows = conn.execute(sql.SQL(call).format(s=sql.Identifier(schema)), params).fetchall()
        # This transaction's own counters (not yet flushed anywhere).
        [(seq_read, idx_fetch)] = conn.execute(
            "SELECT coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
            " WHERE relid = %s::regclass",
            (sql.Identifier(schema, table).as_string(conn),),
        ).fetchall()
        conn.rollback()
    return rows, seq_read, idx_fetch


@pytest.fixture
def stale(dsn: str) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """A queue with LEASED messages leased since its last ANALYZE (which saw none), and SETTLE
    more deliveries to settle. Yields (schema, [(id, token)])."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("q", lease=3600)
        for _ in range(0, LEASED + SETTLE, 5000):
            c.send_batch("q", [b"x"] * 5000)
        _analyze_once(dsn, schema, "message_logged")
        c.take("q", LEASED)
        mine = [(m.id, m.token) for m in c.take("q", SETTLE)]
    yield schema, mine
    drop_schema(dsn, schema)


_SETTLE_CALLS = {
    "ack": "SELECT * FROM {s}.ack('q', %(ids)s, %(tokens)s)",
    # ack's one-statement path (one delivery of a plain queue)
    "ack one": "SELECT * FROM {s}.ack('q', (%(ids)s::bigint[])[1:1], (%(tokens)s::int[])[1:1])",
    "take(ack=)": "SELECT * FROM {s}.take('q', 1, NULL, %(ids)s, %(tokens)s)",
    "take(n, ack=)": "SELECT * FROM {s}.take('q', 5, NULL, %(ids)s, %(tokens)s)",
    "nack": "SELECT * FROM {s}.nack('q', %(ids)s, %(tokens)s)",
    "extend": "SELECT * FROM {s}.extend('q', %(ids)s, %(tokens)s)",
    "give_up": "SELECT * FROM {s}.give_up('q', %(ids)s, %(tokens)s)",
}


@pytest.mark.parametrize("call", list(_SETTLE_CALLS))
def test_settling_reads_only_its_rows_with_stale_statistics(
    dsn: str, stale: tuple[str, list[tuple[int, int]]], call: str
) -> None:
    schema, mine = stale
    params = {"ids": [i for i, _ in mine], "tokens": [t for _, t in mine]}
    settled, seq_read, idx_fetch = _reads_of_call(dsn, schema, _SETTLE_CALLS[call], "message_logged", params)
    assert len(settled) >= (1 if call == "ack one" else SETTLE) or call.startswith("take"), settled
    assert seq_read == 0 and idx_fetch < 10 * SETTLE, (call, seq_read, idx_fetch)


def test_a_session_that_began_on_an_empty_queue_keeps_reading_by_index(dsn: str) -> None:
    """A session keeps the generic plans it made at its first calls. A consumer that started
    before the producers made them on an empty table, which statistics never taken make look
    free to scan: every later take and ack scanned the whole message table (held-snapshot run:
    a take went from 8 ms to 4 s). With its first calls on an empty queue analysed empty, then
    20,000 messages the statistics have not seen, its calls read no row by a sequential scan."""
    schema = fresh_schema_name()
    try:
        with Client(dsn, schema=schema, pool_size=1) as c:
            c.migrate()
            c.create_queue("q")
        with psycopg.connect(dsn, autocommit=True) as admin:
            table = sql.Identifier(schema, "message_logged")
            admin.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(table))
            admin.execute(sql.SQL("ANALYZE {}").format(table))  # empty: as migrate leaves it
            with psycopg.connect(dsn) as conn:
                s = sql.Identifier(schema)
                take = sql.SQL("SELECT id, token FROM {}.take('q', %s, NULL, %s, %s)").format(s)
                ack = sql.SQL("SELECT * FROM {}.ack('q', %s, %s)").format(s)
                for _ in range(6):  # plans made, and kept, on the empty queue
                    for n in (1, 10):
                        assert conn.execute(take, (n, None, None)).fetchall() == []
                    conn.execute(ack, ([1], [1])).fetchall()
                    conn.commit()
                admin.execute(
                    sql.SQL(
                        "INSERT INTO {s}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, payload)"
                        " SELECT q.id, g.last_value, {s}.now_ms() - i, {s}.now_ms() - i, {s}.now_ms() - i, '\\x00'"
                        " FROM {s}.queue q, {s}.message_gen_seq g, generate_series(1, 20000) i"
                    ).format(s=s)
                )
                got = conn.execute(take, (1, None, None)).fetchall()
                got += conn.execute(take, (10, [got[0][0]], [got[0][1]])).fetchall()
                conn.execute(ack, ([r[0] for r in got[1:]], [r[1] for r in got[1:]])).fetchall()
                [(scans, read)] = conn.execute(
                    "SELECT coalesce(seq_scan, 0), coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables"
                    " WHERE relid = %s::regclass",
                    (sql.Identifier(schema, "message_logged").as_string(conn),),
                ).fetchall()
                conn.rollback()
        assert len(got) == 11
        assert (scans, read) == (0, 0)
    finally:
        drop_schema(dsn, schema)


# Channel bookkeeping ---------------------------------------------------------------------------
#
# Every call that changes a channel's messages updates its channel row. When that update was a
# join with the channel table, statistics taken while the queues had few channels made it scan
# every channel of the queue: at 20,000 channels, 88,000 channel index entries per take, and
# take+ack at 100,000 channels ran at 0.04x its speed at 10 channels (benchmarks/scale.py).

CHANNELS = 5_000
CHANNEL_SETTLE = 5


@pytest.fixture
def stale_channels(dsn: str) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """Queue "q" with CHANNELS channels created after the channel table's last ANALYZE (which
    saw another queue's 1,000), CHANNEL_SETTLE of its messages leased. Yields (schema,
    [(id, token)])."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("a")
        c.send_batch("a", [Envelope(b"x", channel=f"a{i}") for i in range(1000)])
        _analyze_once(dsn, schema, "channel")
        c.create_queue("q", lease=3600)
        c.send_batch("q", [Envelope(b"x", channel=f"c{i}") for i in range(CHANNELS)])
        mine = [(m.id, m.token) for m in c.take("q", CHANNEL_SETTLE)]
    yield schema, mine
    drop_schema(dsn, schema)


_CHANNEL_CALLS = {
    **_SETTLE_CALLS,
    "take(n)": "SELECT * FROM {s}.take('q', 5)",
    "take_tx(n)": "SELECT * FROM {s}.take_tx('q', 5)",
    "send_batch": "SELECT * FROM {s}.send_batch('q', ARRAY['\\x00', '\\x01']::bytea[],"
    " p_channels => ARRAY['t1', 't2'])",
}


@pytest.mark.parametrize("call", list(_CHANNEL_CALLS))
def test_channel_bookkeeping_reads_only_its_channels_with_stale_statistics(
    dsn: str, stale_channels: tuple[str, list[tuple[int, int]]], call: str
) -> None:
    schema, mine = stale_channels
    params = {"ids": [i for i, _ in mine], "tokens": [t for _, t in mine]}
    done, seq_read, idx_fetch = _reads_of_call(dsn, schema, _CHANNEL_CALLS[call], "channel", params)
    assert done, call
    assert seq_read == 0 and idx_fetch <= 8 * CHANNEL_SETTLE, (call, seq_read, idx_fetch)


# Under a held snapshot ----------------------------------------------------------------------
#
# While a snapshot is held, every message processed leaves dead versions that neither vacuum nor
# index scans can clear; ANALYZE then counts only the live rows (a handful), and a join of the
# given ids with the message table was planned to read every entry the queue left in the primary
# key: 4,000 for a take(10) or an ack of 5 after 2,000 messages, 12,000 for a nack of 5. Take,
# take_tx and the settles now reach each row by its key and change it by ctid (settle.sql).

HELD = 2_000
HELD_SETTLE = 5


@pytest.fixture(params=["never analysed", "analysed under the snapshot"])
def held(dsn: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """HELD messages sent, taken and acked (a rotation every 100) while another session holds a
    snapshot, then HELD_SETTLE leased and 1,000 ready; the snapshot is still held while the test
    runs. Yields (schema, [(id, token)])."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("q", lease=3600)
        with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as holder:
            table = sql.Identifier(schema, "message_logged")
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(table))
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            rotate = sql.SQL("SELECT {}.rotate(p_force => true)").format(sql.Identifier(schema))
            for _ in range(HELD // 100):
                c.send_batch("q", [b"x"] * 100)
                c.ack(c.take("q", 100))
                conn.execute(rotate)
            if request.param != "never analysed":
                conn.execute(sql.SQL("ANALYZE {}").format(table))
            # A backlog: read in index order, a take stops after its first rows; a plan that
            # reads more than the head of the window shows in the count.
            c.send_batch("q", [b"y"] * (HELD_SETTLE + 1000))
            mine = [(m.id, m.token) for m in c.take("q", HELD_SETTLE)]
            yield schema, mine
            holder.rollback()
    drop_schema(dsn, schema)


_HELD_CALLS = {
    **_SETTLE_CALLS,
    "take(10)": "SELECT * FROM {s}.take('q', 10)",
    "take_tx(5)": "SELECT * FROM {s}.take_tx('q', 5)",
}


def _index_entries(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """Index entries this transaction read, by index of ``table``."""
    rows = conn.execute(
        "SELECT i.indexrelid::regclass::text, pg_stat_get_xact_tuples_returned(i.indexrelid)"
        " FROM pg_index i WHERE i.indrelid = %s::regclass",
        (table,),
    ).fetchall()
    return {name.rsplit(".", 1)[-1].strip('"'): int(n) for name, n in rows}


@pytest.mark.parametrize("call", list(_HELD_CALLS))
def test_calls_read_only_their_rows_under_a_held_snapshot(
    dsn: str, held: tuple[str, list[tuple[int, int]]], call: str
) -> None:
    schema, mine = held
    params = {"ids": [i for i, _ in mine], "tokens": [t for _, t in mine]}
    with psycopg.connect(dsn) as conn:
        done = conn.execute(sql.SQL(_HELD_CALLS[call]).format(s=sql.Identifier(schema)), params).fetchall()
        entries = _index_entries(conn, sql.Identifier(schema, "message_logged").as_string(conn))
        conn.rollback()
    assert done, call
    pkey = entries.pop("message_logged_pkey")
    # About two per row (the probe, the change by ctid); the dequeue index reads the window's
    # two generations (100 messages each, test_generations.py has the bound without ANALYZE).
    assert pkey <= 8 * max(HELD_SETTLE, 10), (call, pkey, entries)
    assert sum(entries.values()) <= 400, (call, pkey, entries)


# Ack's memory -------------------------------------------------------------------------------
#
# settled holds a row per settled delivery for an hour (maintain() prunes it), written by every
# ack, nack and dead-letter, read only when a settle finds no leased row: a repeat (idempotent
# answer) or a stale token (nothing done). Since migration 0021 its only index is a hash index
# on id (a cheaper insert than the primary key on (queue_id, id) and the BRIN index on
# settled_at it replaced): those reads must find their rows through it, never by a scan of an
# hour's rows.

MEMORY = 300_000  # rows of other deliveries in settled: an hour at ~80 acks a second
REPEATS = 5


@pytest.fixture(scope="module")
def remembered(dsn: str) -> Iterator[tuple[str, list[tuple[int, int]], list[tuple[int, int]]]]:
    """Queue "q" with REPEATS deliveries acked and REPEATS dead-lettered (give_up), amid MEMORY
    rows of two queues' other settles over the last hour, analysed. Yields (schema, acked
    [(id, token)], dead [(id, token)])."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("other")
        c.create_queue("q", lease=3600)
        c.send_batch("q", [b"x"] * (2 * REPEATS))
        taken = c.take("q", 2 * REPEATS)
        c.ack(taken[:REPEATS])
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        conn.execute(
            sql.SQL("SELECT * FROM {}.give_up('q', %s, %s)").format(s),
            ([m.id for m in taken[REPEATS:]], [m.token for m in taken[REPEATS:]]),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.settled (queue_id, id, token, outcome, settled_at)"
                " SELECT CASE WHEN i %% 2 = 0 THEN q.id ELSE o.id END, 1000000000 + i, 1, 'acked',"
                "        {s}.now_ms() - 3600000 + i::bigint * 3600000 / %s"
                "   FROM {s}.queue q, {s}.queue o, generate_series(1, %s) i"
                "  WHERE q.name = 'q' AND o.name = 'other'"
            ).format(s=s),
            (MEMORY, MEMORY),
        )
        _analyze_once(dsn, schema, "settled")
    yield (
        schema,
        [(m.id, m.token) for m in taken[:REPEATS]],
        [(m.id, m.token) for m in taken[REPEATS:]],
    )
    drop_schema(dsn, schema)


_MEMORY_CALLS = {
    # call: (statement, which deliveries, token offset (1: a stale token), rows expected)
    "ack repeated": ("SELECT * FROM {s}.ack('q', %(ids)s, %(tokens)s)", "acked", 0, REPEATS),
    "ack one repeated": (
        "SELECT * FROM {s}.ack('q', (%(ids)s::bigint[])[1:1], (%(tokens)s::int[])[1:1])",
        "acked",
        0,
        1,
    ),
    "take(ack=) repeated": (
        "SELECT * FROM {s}.take('q', 1, NULL, (%(ids)s::bigint[])[1:1], (%(tokens)s::int[])[1:1])",
        "acked",
        0,
        0,
    ),
    "ack stale": ("SELECT * FROM {s}.ack('q', %(ids)s, %(tokens)s)", "acked", 1, 0),
    "nack of the dead-lettered": ("SELECT * FROM {s}.nack('q', %(ids)s, %(tokens)s)", "dead", 0, REPEATS),
    "nack stale": ("SELECT * FROM {s}.nack('q', %(ids)s, %(tokens)s)", "dead", 1, 0),
    "give_up repeated": ("SELECT * FROM {s}.give_up('q', %(ids)s, %(tokens)s)", "dead", 0, REPEATS),
}


@pytest.mark.parametrize("call", list(_MEMORY_CALLS))
def test_repeats_and_stale_settles_find_acks_memory_by_id(
    dsn: str, remembered: tuple[str, list[tuple[int, int]], list[tuple[int, int]]], call: str
) -> None:
    schema, acked, dead = remembered
    statement, which, offset, expected = _MEMORY_CALLS[call]
    mine = acked if which == "acked" else dead
    params = {"ids": [i for i, _ in mine], "tokens": [t + offset for _, t in mine]}
    with psycopg.connect(dsn) as conn:
        done = conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)), params).fetchall()
        table = sql.Identifier(schema, "settled").as_string(conn)
        entries = _index_entries(conn, table)
        [(seq_read,)] = conn.execute(
            "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
            (table,),
        ).fetchall()
        conn.rollback()
    assert len(done) == expected, (call, done)
    by_id = entries.pop("settled_id_idx")
    assert seq_read == 0, (call, seq_read, entries)
    # One entry per id asked (a hash index returns the entries of the id's bucket that match);
    # none for take's one-delivery drain, which answers no repeat (take discards ack()'s answer).
    least = 0 if call.startswith("take") else 1
    assert least <= by_id <= 2 * len(mine), (call, by_id, entries)
    assert not entries, (call, entries)  # no other index on settled
