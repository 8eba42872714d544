"""Shapes of ack's memory (the ``settled`` table) in their steady state: what a row's insert
costs in instructions, and what a lookup by id and the time prune read.

``benchmarks/server_instructions.py`` counts a drain on fresh tables with autovacuum off: every
insert lands in the table's last, unsummarized BRIN range, which costs a BRIN index little. A
live ``settled`` is different: ``maintain()`` deletes rows older than an hour, (auto)vacuum
summarizes the BRIN ranges and frees that space, and new rows then land in summarized ranges,
whose summary each insert must widen. This harness builds that state per shape and counts it.

A throwaway cluster (server_instructions' ``Cluster``: Debian's PostgreSQL binaries, a temporary
directory, a free port) gets one UNLOGGED table per shape, filled minute by minute for
``--minutes``: ``--rows`` rows a minute from two queues interleaved (a live one acking new ids,
and a backlog acking ids sent long before, so ids are not in time order across the table),
the rows older than an hour deleted each minute, and a VACUUM every 5 minutes. Then, per shape:

* ``lookup_blocks``: buffers an ``enable_seqscan = off`` lookup by (queue_id, id) reads
  (EXPLAIN ANALYZE BUFFERS): of a recent id (``recent``), of an id acked ~50 minutes ago
  (``old``) and of an id never settled (``missing``);
* ``prune_blocks``: buffers ``SELECT ctid ... WHERE settled_at < <the next minute's cut>
  LIMIT 10000`` (maintain()'s prune) reads, as the planner picks it;
* ``insert``: instructions per row of a 100-row INSERT (callgrind in a single-user backend,
  ``--toggle-collect=ExecuteQuery``, ``--calls`` calls minus a quarter of them; 1,000: 75,000
  rows, the table's size matters while it grows), after half the
  window was deleted and vacuumed: every row lands in freed, summarized space;
* ``insert_fresh``: the same into an empty table of the shape (``f_<shape>``), as
  server_instructions.py's drains insert: the table and its indexes grow (a hash index splits
  its buckets as it grows), no BRIN range is summarized. A difference of two runs on a table
  whose state changes between them: it varies with ``--calls`` and, for the minmax-multi
  shapes, came out below a bare row's cost (not a per-row cost there).

With ``--per-call`` instead, the shape not built: one row per settling call (``lo``, ``hi``,
the call's ids and tokens as arrays) with a GiST index on ``int8range(lo, hi, '[]')``, filled
the same way (a call settles 100 consecutive ids of one queue); a lookup asks for the ranges
holding the id and then the id in the array; ``insert`` is a call of 100 settles per message,
``insert_one`` a row of one settle (a drain at batch 1; 100 such rows a statement, as the
shapes above are counted), both into the steady table's freed space.

    python benchmarks/settled_shapes.py [--shapes pk,hash,...] [--minutes 150] [--rows 5000] \\
        [--per-call] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from server_instructions import Cluster

WINDOW = 60  # minutes of memory (maintain() keeps an hour)
VACUUM_EVERY = 5  # minutes
#: shape: its indexes ({t}: the table), as DDL
SHAPES: dict[str, list[str]] = {
    "pk_brin": [
        "ALTER TABLE {t} ADD PRIMARY KEY (queue_id, id)",
        "CREATE INDEX ON {t} USING brin (settled_at)",
    ],
    "hash_brin": ["CREATE INDEX ON {t} USING hash (id)", "CREATE INDEX ON {t} USING brin (settled_at)"],
    "brin_at_id": ["CREATE INDEX ON {t} USING brin (settled_at, id)"],
    "brin_at_id_multi": ["CREATE INDEX ON {t} USING brin (settled_at, id int8_minmax_multi_ops)"],
    "brin_at_id_multi16": [
        "CREATE INDEX ON {t} USING brin (settled_at, id int8_minmax_multi_ops) WITH (pages_per_range = 16)"
    ],
    "btree_id_brin": ["CREATE INDEX ON {t} (id)", "CREATE INDEX ON {t} USING brin (settled_at)"],
    "pk": ["ALTER TABLE {t} ADD PRIMARY KEY (queue_id, id)"],
    "hash": ["CREATE INDEX ON {t} USING hash (id)"],
    "brin": ["CREATE INDEX ON {t} USING brin (settled_at)"],
    "none": [],
}
_FILL = """INSERT INTO {t} SELECT CASE WHEN g %% 2 = 0 THEN 1 ELSE 2 END,
                  CASE WHEN g %% 2 = 0 THEN %(live)s + g ELSE %(backlog)s + g END, 1, 'acked',
                  %(minute)s * 60000 + g
             FROM generate_series(1, %(rows)s) g"""
_LOOKUP = "SELECT 1 FROM {t} WHERE queue_id = 1 AND id = %s"
_PRUNE = "SELECT ctid FROM {t} WHERE settled_at < %s LIMIT 10000"


def _blocks(conn: psycopg.Connection[Any], query: sql.Composed, param: int) -> int:
    [(out,)] = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, FORMAT JSON) ") + query, (param,)
    ).fetchall()
    plan = out[0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


def fill(conn: psycopg.Connection[Any], shape: str, minutes: int, rows: int) -> dict[str, Any]:
    """Table ``s_<shape>`` in its steady state; its lookups' and prune's reads. Leaves the
    sequences the counted INSERTs draw their ids and times from."""
    t = sql.Identifier(f"s_{shape}")
    conn.execute(
        sql.SQL(
            "CREATE UNLOGGED TABLE {} (queue_id integer NOT NULL, id bigint NOT NULL, token integer NOT NULL,"
            " outcome text NOT NULL, settled_at bigint NOT NULL)"
        ).format(t)
    )
    for ddl in SHAPES[shape]:
        conn.execute(sql.SQL(ddl).format(t=t))  # type: ignore[arg-type]
    live = 10_000_000
    for minute in range(minutes):
        params = {"live": live, "backlog": live // 10 + minute * rows, "minute": minute, "rows": rows}
        conn.execute(sql.SQL(_FILL).format(t=t), params)
        live += rows * 3
        conn.execute(sql.SQL("DELETE FROM {} WHERE settled_at < %s").format(t), ((minute - WINDOW) * 60000,))
        if minute % VACUUM_EVERY == 0:
            conn.execute(sql.SQL("VACUUM {}").format(t))
    conn.execute(sql.SQL("ANALYZE {}").format(t))
    [(count, pages)] = conn.execute(
        sql.SQL("SELECT count(*), pg_relation_size({}) / 8192 FROM {}").format(sql.Literal(f"s_{shape}"), t)
    ).fetchall()
    [(old,)] = conn.execute(
        sql.SQL("SELECT min(id) + 1000 FROM {} WHERE queue_id = 1").format(t)  # ~50 minutes ago
    ).fetchall()
    prune = _blocks(conn, sql.SQL(_PRUNE).format(t=t), (minutes - WINDOW + 1) * 60000)
    conn.execute("SET enable_seqscan = off")
    lookup = {
        "recent": _blocks(conn, sql.SQL(_LOOKUP).format(t=t), live - rows * 3 - 100),
        "old": _blocks(conn, sql.SQL(_LOOKUP).format(t=t), old),
        "missing": _blocks(conn, sql.SQL(_LOOKUP).format(t=t), live + 10**9),
    }
    conn.execute("RESET enable_seqscan")
    # Half the window forgotten and vacuumed: the counted inserts land in freed space.
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE settled_at < %s").format(t), ((minutes - WINDOW // 2) * 60000,)
    )
    conn.execute(sql.SQL("VACUUM {}").format(t))
    _sequences(conn, f"s_{shape}", live, live // 10 + minutes * rows, minutes * 60000)
    f = sql.Identifier(f"f_{shape}")
    conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(f, t))
    for ddl in SHAPES[shape]:
        conn.execute(sql.SQL(ddl).format(t=f))  # type: ignore[arg-type]
    _sequences(conn, f"f_{shape}", 10_000_000, 1_000_000, 1)
    return {"rows": count, "pages": pages, "lookup_blocks": lookup, "prune_blocks": prune}


def _sequences(conn: psycopg.Connection[Any], table: str, ids: int, backlog: int, at: int) -> None:
    """The sequences the counted INSERTs into ``table`` draw ids and times from."""
    for seq, start in (("ids", ids), ("bids", backlog), ("ts", at)):
        conn.execute(sql.SQL("CREATE SEQUENCE {} START {}").format(sql.Identifier(f"{table}_{seq}"), start))


def insert_cost(cluster: Cluster, t: str, calls: int) -> float:
    """Instructions per row of a 100-row INSERT into table ``t`` (the server stopped)."""
    stmt = (
        f"INSERT INTO {t} SELECT CASE WHEN g % 2 = 0 THEN 1 ELSE 2 END,"
        f" CASE WHEN g % 2 = 0 THEN nextval('{t}_ids') ELSE nextval('{t}_bids') END, 1, 'acked',"
        f" nextval('{t}_ts') FROM generate_series(1, 100) g"
    )

    def script(n: int) -> str:
        return f"PREPARE w AS {stmt}\n" + "EXECUTE w\n" * (5 + n)

    small = cluster.single(script(calls // 4))
    big = cluster.single(script(calls))
    return (big - small) / ((calls - calls // 4) * 100)


_CALL_FILL = """INSERT INTO s_call SELECT g %% 2, b.lo, b.lo + 99, ARRAY(SELECT generate_series(b.lo, b.lo + 99)),
                       array_fill(1, ARRAY[100]), 'acked', %(minute)s * 60000 + g
                  FROM generate_series(1, %(calls)s) g,
                       LATERAL (SELECT CASE WHEN g %% 2 = 1 THEN %(live)s ELSE %(backlog)s END + g * 100 AS lo) b"""
_CALL_LOOKUP = "SELECT 1 FROM s_call WHERE queue_id = 1 AND int8range(lo, hi, '[]') @> %(id)s::bigint AND %(id)s = ANY (ids)"


def fill_per_call(conn: psycopg.Connection[Any], minutes: int, rows: int) -> dict[str, Any]:
    """Table ``s_call`` (one row per settling call of 100) in its steady state; its lookups'
    reads. Leaves the sequences the counted INSERTs draw from."""
    conn.execute(
        "CREATE UNLOGGED TABLE s_call (queue_id integer NOT NULL, lo bigint NOT NULL, hi bigint NOT NULL,"
        " ids bigint[] NOT NULL, tokens integer[] NOT NULL, outcome text NOT NULL, settled_at bigint NOT NULL)"
    )
    conn.execute("CREATE INDEX ON s_call USING gist (int8range(lo, hi, '[]'))")
    live = 10_000_000
    calls = rows // 100
    for minute in range(minutes):
        params = {"live": live, "backlog": live // 10 + minute * rows, "minute": minute, "calls": calls}
        conn.execute(_CALL_FILL, params)
        live += rows * 3
        conn.execute("DELETE FROM s_call WHERE settled_at < %s", ((minute - WINDOW) * 60000,))
        if minute % VACUUM_EVERY == 0:
            conn.execute("VACUUM s_call")
    conn.execute("ANALYZE s_call")
    [(count, pages)] = conn.execute(
        "SELECT count(*), pg_relation_size('s_call') / 8192 FROM s_call"
    ).fetchall()
    [(old,)] = conn.execute("SELECT min(lo) + 1050 FROM s_call WHERE queue_id = 1").fetchall()
    conn.execute("SET enable_seqscan = off")
    lookup = {}
    for name, value in (("recent", live - rows * 3 - 50), ("old", old), ("missing", live + 10**9)):
        [(out,)] = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, FORMAT JSON) " + _CALL_LOOKUP, {"id": value}
        ).fetchall()
        plan = out[0]["Plan"]
        lookup[name] = int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
    conn.execute("RESET enable_seqscan")
    conn.execute("DELETE FROM s_call WHERE settled_at < %s", ((minutes - WINDOW // 2) * 60000,))
    conn.execute("VACUUM s_call")
    conn.execute(f"CREATE SEQUENCE s_call_ids START {live} INCREMENT 100")
    conn.execute(f"CREATE SEQUENCE s_call_ts START {minutes * 60000}")
    conn.execute(f"CREATE SEQUENCE s_call_ids1 START {live * 2}")
    return {"rows": count, "pages": pages, "lookup_blocks": lookup}


def insert_cost_per_call(cluster: Cluster, batch: int, calls: int) -> float:
    """Instructions per settle of INSERTs into ``s_call`` (the server stopped): with ``batch``
    100, one row holding 100 settles a statement; with 1, 100 rows of one settle each a
    statement (as the per-row shapes are counted: the statement's own cost spread)."""
    if batch == 100:
        stmt = (
            "INSERT INTO s_call SELECT 1, x.lo, x.lo + 99, ARRAY(SELECT generate_series(x.lo, x.lo + 99)),"
            " array_fill(1, ARRAY[100]), 'acked', nextval('s_call_ts') FROM (SELECT nextval('s_call_ids') AS lo) x"
        )
        settles = 1 * 100
    else:
        stmt = (
            "INSERT INTO s_call SELECT 1, x.v, x.v, ARRAY[x.v], ARRAY[1], 'acked', nextval('s_call_ts')"
            " FROM (SELECT nextval('s_call_ids1') AS v FROM generate_series(1, 100)) x"
        )
        settles = 100

    def script(n: int) -> str:
        return f"PREPARE w AS {stmt}\n" + "EXECUTE w\n" * (5 + n)

    small = cluster.single(script(calls // 4))
    big = cluster.single(script(calls))
    return (big - small) / ((calls - calls // 4) * settles)


def per_call(args: argparse.Namespace) -> None:
    """--per-call: the one-row-per-call shape, printed and written to --json."""
    cluster = Cluster(args.bin)
    try:
        dsn = cluster.start_bench()
        with psycopg.connect(dsn, autocommit=True) as conn:
            result = fill_per_call(conn, args.minutes, args.rows)
        cluster.pg_ctl("stop")
        result["insert"] = round(insert_cost_per_call(cluster, 100, args.calls))
        result["insert_one"] = round(insert_cost_per_call(cluster, 1, args.calls))
    finally:
        cluster.remove()
    print(
        f"per call (GiST on int8range)  insert {result['insert'] / 1000:.1f}k a settle at 100 a call,"
        f" {result['insert_one'] / 1000:.1f}k at 1   lookup blocks {result['lookup_blocks']}"
        f"   ({result['rows']} rows, {result['pages']} pages)"
    )
    if args.json:
        config = {
            "minutes": args.minutes,
            "rows_a_minute": args.rows,
            "window": WINDOW,
            "per_call": 100,
            "calls": args.calls,
        }
        args.json.write_text(json.dumps({"config": config, "per_call_gist": result}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--minutes", type=int, default=150)
    ap.add_argument("--rows", type=int, default=5000, help="rows settled a minute")
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--calls", type=int, default=1000, help="counted INSERTs (100 rows each), at most 1,200")
    ap.add_argument("--per-call", action="store_true", help="the one-row-per-call shape instead")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not 4 <= args.calls <= 1200:  # the counted rows must fit in the freed half of the window
        raise SystemExit("--calls must be between 4 and 1200")
    if args.per_call:
        per_call(args)
        return
    shapes = args.shapes.split(",")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")
    cluster = Cluster(args.bin)
    results: dict[str, dict[str, Any]] = {}
    try:
        dsn = cluster.start_bench()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for shape in shapes:
                results[shape] = fill(conn, shape, args.minutes, args.rows)
        cluster.pg_ctl("stop")
        for shape in shapes:
            results[shape]["insert"] = round(insert_cost(cluster, f"s_{shape}", args.calls))
            results[shape]["insert_fresh"] = round(insert_cost(cluster, f"f_{shape}", args.calls))
            r = results[shape]
            print(
                f"{shape:20} insert {r['insert'] / 1000:6.1f}k (fresh table {r['insert_fresh'] / 1000:6.1f}k)"
                f" instructions/row   lookup blocks"
                f" {r['lookup_blocks']}   prune blocks {r['prune_blocks']}   ({r['rows']} rows, {r['pages']} pages)",
                flush=True,
            )
    finally:
        cluster.remove()
    if args.json:
        config = {
            "minutes": args.minutes,
            "rows_a_minute": args.rows,
            "window": WINDOW,
            "vacuum_every": VACUUM_EVERY,
            "calls": args.calls,
        }
        args.json.write_text(json.dumps({"config": config, "shapes": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
