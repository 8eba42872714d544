"""Branch leaseidx: a short take(100) / take_tx(100) on a queue whose first 1,000 ready rows
another session holds (take_tx(1000) in an open transaction) and 50 more are free: the rows the
call fetched by index (pg_stat_xact_user_tables.idx_tup_fetch of message_logged), in schemas
"before" (migrated by main's tree) and "after" (this branch's) of one database.

    PYTHONPATH=src python docs/benchmarks-leaseidx-held.py postgresql://root@127.0.0.1:5432/leaseidx_x
"""

import sys

import psycopg
from psycopg import sql

dsn = sys.argv[1]
for schema in ("before", "after"):
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as a:
        a.execute(sql.SQL("SELECT {}.queue_create('held', p_if_not_exists => true)").format(s))
        a.execute(sql.SQL("SELECT {}.queue_purge('held')").format(s))
        a.execute(
            sql.SQL(
                "SELECT count(*) FROM {}.send_batch('held', array_fill('\\x00'::bytea, ARRAY[1050]))"
            ).format(s)
        )
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as taker:
        held = holder.execute(sql.SQL("SELECT count(*) FROM {}.take_tx('held', 1000)").format(s)).fetchone()
        rel = sql.Identifier(schema, "message_logged").as_string(taker)
        for fn in ("take", "take_tx"):
            got = taker.execute(
                sql.SQL("SELECT count(*) FROM {}.{}('held', 100)").format(s, sql.Identifier(fn))
            ).fetchone()
            fetched = taker.execute(
                "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = %s::regclass", (rel,)
            ).fetchone()
            taker.rollback()
            print(schema, fn, "held by the other session", held, "got", got, "index fetches", fetched)
        holder.rollback()
