"""Where the server's work of a drain goes, from the bare lease floor to LonnyMQ's
``take(q, n, ack=previous)``: each piece LonnyMQ's guarantees add, counted in instructions per
message, alone on the bare floor and one after the other (issue 12; docs/benchmarks.md, "The
drain's floors").

Every step is one statement counted as ``server_instructions.py`` counts a workload (a throwaway
cluster, a single-user backend under callgrind, the statement ``PREPARE``d and ``EXECUTE``d
``--calls`` and ``--calls / 4`` times over a backlog, only the EXECUTEs counted, the difference
over the difference of the calls; a fixed clock; the previous call's ids and tokens acknowledged
through ``set_config``, as ``server_instructions.py``'s drains keep them). Every step's planner
runs with ``enable_seqscan = off``, as ``take()`` does (its SET clause): a floor's plan is the
least one, not a hash join over a scan of the table that statistics of a small backlog can pick
(``server_instructions.py``'s bare lease floor did below 30,000 rows, see the doc).

The plain steps run on tables of their own (schema ``abl``), each built with the pieces its step
has, filled with rows like the ones ``send_batch`` writes (LonnyMQ's payload, the queue's id, the
current generation); ack's memory and the counter rows go to tables shaped as LonnyMQ's
``settled`` and ``queue_stat``. The last steps run on LonnyMQ's own tables (the tree's schema
``tree_x``): the lease floor on them (``leasestorefloor``, lonnymq_bench/systems/lease_store_floor.py),
the same through a secure function (``apileasefloor``, api_floor.py), variants of that function
(take's SET clauses; LonnyMQ's nested ``_ack`` instead of the floor's ack) and ``take()`` itself.

    python benchmarks/drain_floors.py --tree src [--batch 100] [--calls 200] [--steps a,b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import server_instructions as si
from lonnymq_bench.systems.api_floor import FLOOR_SCHEMA, ddl
from lonnymq_bench.systems.lease_store_floor import CTES, LEASE

NOW = si.NOW
SCHEMA = "tree_x"
#: The queue's lease (ms): the default of a new queue, as take() uses it.
LEASE_MS = 30000


@dataclass(frozen=True)
class Piece:
    """The pieces of a plain step (each a guarantee's cost or a choice, see the doc)."""

    payload: bool = False  # LonnyMQ's payload (bytea, 42 bytes) instead of the floor's '{"i": 1}'
    row: bool = False  # LonnyMQ's row: its 19 columns, the lease writes attempts, deliveries, leased
    leases: bool = False  # the partial index of leases (queue_id, channel, dequeue_at) WHERE leased
    dq4: bool = False  # the dequeue index (gen, queue_id, dequeue_at, id) WHERE channel IS NULL
    window: bool = False  # the window's two generations (needs dq4)
    pk2: bool = False  # the primary key (queue_id, id) instead of (id)
    tid: bool = False  # the lease's UPDATE by ctid instead of by id
    table: bool = False  # LonnyMQ's own message_logged (all its indexes) instead of a table of its own
    token: bool = False  # the ack finds each row by key with its token checked, deletes it by ctid
    memory: bool = False  # ack's memory: a settled row per ack
    stat: bool = False  # the queue_stat row
    columns: bool = False  # RETURNING the delivery's 15 columns

    def needs(self) -> set[str]:
        """The columns the table needs beyond (id, dequeue_at, payload)."""
        out: set[str] = set()
        if self.leases:
            out |= {"queue_id", "channel", "leased"}
        if self.dq4:
            out |= {"gen", "queue_id", "channel"}
        if self.pk2:
            out |= {"queue_id"}
        if self.token:
            out |= {"deliveries", "leased"}
        return out


_FULL_ROW = (
    "queue_id integer NOT NULL, id bigint NOT NULL, dequeue_at bigint NOT NULL, scheduled_at bigint NOT NULL,"
    " enqueued_at bigint NOT NULL, attempts integer NOT NULL DEFAULT 0, deliveries integer NOT NULL DEFAULT 0,"
    " leased boolean NOT NULL DEFAULT false, priority smallint NOT NULL DEFAULT 0, key text, channel text,"
    " kind text, content_type text, headers jsonb, state jsonb, last_error text, payload bytea NOT NULL,"
    " superseded_by bigint, gen bigint NOT NULL"
)
_COLUMN = {
    "queue_id": "queue_id integer NOT NULL",
    "gen": "gen bigint NOT NULL",
    "channel": "channel text",
    "deliveries": "deliveries integer NOT NULL DEFAULT 0",
    "leased": "leased boolean NOT NULL DEFAULT false",
}


def table_ddl(name: str, p: Piece) -> str:
    """The step's table and its indexes (one statement a line, for psql)."""
    if p.row:
        cols = _FULL_ROW
    else:
        payload = "payload bytea NOT NULL" if p.payload else "payload jsonb NOT NULL"
        cols = ", ".join(
            ["id bigint NOT NULL", "dequeue_at bigint NOT NULL", payload]
            + [_COLUMN[c] for c in sorted(p.needs())]
        )
    out = [f"CREATE TABLE abl.{name} ({cols})"]
    out.append(f"ALTER TABLE abl.{name} ADD PRIMARY KEY ({'queue_id, id' if p.pk2 else 'id'})")
    if p.dq4:
        out.append(f"CREATE INDEX ON abl.{name} (gen, queue_id, dequeue_at, id) WHERE channel IS NULL")
    else:
        out.append(f"CREATE INDEX ON abl.{name} (dequeue_at, id)")
    if p.leases:
        out.append(f"CREATE INDEX ON abl.{name} (queue_id, channel, dequeue_at) WHERE leased")
    return "\n".join(out)


def fill(name: str, p: Piece, backlog: int, q: int, gen: int) -> str:
    """The backlog, as send_batch writes it (ids 1..backlog, due a second before the clock)."""
    ready = NOW - 1000
    if p.row:
        return (
            f"INSERT INTO abl.{name} (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, payload)"
            f" SELECT {q}, i, {gen}, {ready}, {ready}, {ready}, '{si.PAYLOAD}'::bytea"
            f" FROM generate_series(1, {backlog}) i"
        )
    cols = ["id", "dequeue_at", "payload"]
    vals = ["i", str(ready), f"'{si.PAYLOAD}'::bytea" if p.payload else "'{\"i\": 1}'"]
    for c in sorted(p.needs() & {"queue_id", "gen"}):
        cols.append(c)
        vals.append(str(q if c == "queue_id" else gen))
    return f"INSERT INTO abl.{name} ({', '.join(cols)}) SELECT {', '.join(vals)} FROM generate_series(1, {backlog}) i"


_KEEP = (
    " SELECT (SELECT count(*) FROM a), set_config('b.ids', coalesce(array_agg(u.id)::text, '{{}}'), false),"
    " set_config('b.toks', coalesce(array_agg(u.tok)::text, '{{}}'), false) FROM u"
)
_IDS = "current_setting('b.ids')::bigint[]"
_TOKS = "current_setting('b.toks')::int[]"
_COLS15 = (
    "m.id, m.attempts, m.deliveries AS tok, m.dequeue_at, m.scheduled_at, m.enqueued_at, m.priority, m.key,"
    " m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload"
)


def statement(t: str, p: Piece, n: int, q: int, gen: int) -> str:
    """The step's statement on table ``t`` (qualified), batch ``n``: the ack of the previous
    deliveries, then the lease of the next, keeping their ids and tokens for the next call."""
    has = p.needs() | ({"queue_id", "deliveries", "leased", "gen", "channel"} if p.row else set())
    key = f"m.queue_id = {q} AND " if p.pk2 else ""
    if p.token:
        ack = (
            f"a AS (DELETE FROM {t} m WHERE m.ctid = ANY (ARRAY(SELECT k.tid FROM unnest({_IDS}, {_TOKS}) AS"
            f" t(id, token) CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {t} x WHERE"
            f" {key.replace('m.', 'x.')}x.id = t.id AND x.deliveries = t.token AND x.leased IS TRUE LIMIT 1) k))"
            " RETURNING m.id, m.deliveries)"
        )
    else:
        tok = "m.deliveries" if "deliveries" in has else "1"
        ack = f"a AS (DELETE FROM {t} m WHERE {key}m.id = ANY ({_IDS}) RETURNING m.id, {tok} AS deliveries)"
    ctes = [ack]
    if p.memory:
        ctes.append(
            "k AS (INSERT INTO abl.settled (queue_id, id, token, outcome, settled_at)"
            f" SELECT {q}, a.id, a.deliveries, 'acked', {NOW} FROM a)"
        )
    if p.stat:
        ctes.append(
            "st AS (INSERT INTO abl.queue_stat (queue_id, minute, acked)"
            f" SELECT {q}, {NOW} / 60000, count(*) FROM a HAVING count(*) > 0)"
        )
    pick = "x.ctid AS tid" if p.tid else "x.id AS tid"
    if p.dq4 and p.window:
        ctes.append(
            f"p AS (SELECT w.tid FROM (VALUES ({gen} - 1), ({gen})) AS g(gen) CROSS JOIN LATERAL ("
            f"SELECT {pick}, x.dequeue_at, x.id FROM {t} x WHERE x.gen = g.gen AND x.queue_id = {q}"
            f" AND x.channel IS NULL AND x.dequeue_at <= {NOW} ORDER BY x.dequeue_at, x.id LIMIT {n}"
            f" FOR UPDATE SKIP LOCKED) w ORDER BY w.dequeue_at, w.id LIMIT {n})"
        )
    else:
        where = f"x.gen = {gen} AND x.queue_id = {q} AND x.channel IS NULL AND " if p.dq4 else ""
        ctes.append(
            f"p AS (SELECT {pick} FROM {t} x WHERE {where}x.dequeue_at <= {NOW}"
            f" ORDER BY x.dequeue_at, x.id LIMIT {n} FOR UPDATE SKIP LOCKED)"
        )
    sets = [f"dequeue_at = {NOW} + {LEASE_MS}"]
    if p.row:
        sets.append("attempts = m.attempts + 1")
    if "deliveries" in has:
        sets.append("deliveries = m.deliveries + 1")
    if "leased" in has:
        sets.append("leased = true")
    check = " AND m.attempts < 5 AND m.superseded_by IS NULL" if p.row else ""
    if p.columns:
        returning = _COLS15
    else:
        returning = "m.id, " + ("m.deliveries" if "deliveries" in has else "0") + " AS tok, m.payload"
    lease = (
        f"u AS (UPDATE {t} m SET {', '.join(sets)} FROM p WHERE {'m.ctid' if p.tid else key + 'm.id'} = p.tid{check}"
        f" RETURNING {returning})"
    )
    return "WITH " + ", ".join([*ctes, lease]) + _KEEP


#: The cumulative chain: each step adds one piece to the one before.
CHAIN: list[tuple[str, str, Piece]] = []
_acc: dict[str, bool] = {}
for _label, _flag in (
    ("bare lease floor (server_instructions.py's drain floor: '{\"i\": 1}' payload)", ""),
    ("+ LonnyMQ's payload (its 42 bytes of JSON, as bytea)", "payload"),
    ("+ LonnyMQ's row (19 columns; the lease writes attempts, deliveries, leased)", "row"),
    ("+ the partial index of leases", "leases"),
    ("+ the generation-led dequeue index (gen, queue_id, dequeue_at, id), one generation", "dq4"),
    ("+ the window's second generation", "window"),
    ("+ the primary key (queue_id, id) instead of (id)", "pk2"),
    ("+ the lease by ctid instead of by id (a choice)", "tid"),
    ("+ LonnyMQ's message_logged (its channel and key indexes) instead of a table of its own", "table"),
    ("+ the token check: each acked row found by key, deleted by ctid", "token"),
    ("+ ack's memory (a settled row each)", "memory"),
    ("+ the queue_stat row", "stat"),
    ("+ RETURNING the delivery's 15 columns = leasestorefloor", "columns"),
):
    if _flag:
        _acc[_flag] = True
    CHAIN.append((f"chain:{_flag or 'bare'}", _label, Piece(**_acc)))

#: Each piece alone on the bare floor with LonnyMQ's payload (the pieces that stand alone).
ALONE: list[tuple[str, str, Piece]] = [
    (
        f"alone:{flag}",
        f"bare floor (LonnyMQ's payload) + {what} alone",
        Piece(payload=True, **{flag: True}, **extra),
    )
    for flag, what, extra in (
        ("row", "LonnyMQ's row", {}),
        ("leases", "the partial index of leases", {}),
        ("dq4", "the generation-led dequeue index, one generation", {}),
        ("window", "the generation-led dequeue index, the window's two generations", {"dq4": True}),
        ("pk2", "the primary key (queue_id, id)", {}),
        ("tid", "the lease by ctid", {}),
        ("token", "the token check (by key, delete by ctid)", {}),
        ("memory", "ack's memory", {}),
        ("stat", "the queue_stat row", {}),
    )
]

_SETS = "SET enable_seqscan = off SET enable_sort = off SET jit = off"
#: Variants of the API lease floor's function (api_floor.py's ``take``), made by the set-up.
_FUNCTION_VARIANTS = {
    # Without its plan_cache_mode = force_generic_plan: planned at every call (custom plans).
    "take_replan": lambda text: text.replace(" SET plan_cache_mode = force_generic_plan", ""),
    # take()'s other three SET clauses (sql/take.sql), which pin plans.
    "take_sets": lambda text: text.replace(
        "SET search_path = pg_catalog, pg_temp", "SET search_path = pg_catalog, pg_temp " + _SETS
    ),
}


#: The API lease floor with LonnyMQ's ack: its nested ``_ack`` (sql/settle.sql: each row locked
#: by key in id order, then deleted by ctid over the partitioned table, settled and queue_stat
#: rows), then the floor's lease. ({f}: the floor schema, {s}: LonnyMQ's.)
_P = CTES[CTES.index(" p AS (") + 1 :]
_TAKE_ACK = (
    "CREATE FUNCTION {f}.take_ack(p_queue text, p_limit integer, p_ack_ids bigint[], p_ack_tokens integer[])"
    " RETURNS SETOF {s}.delivery LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
    " SET plan_cache_mode = force_generic_plan AS $fn$ DECLARE q {s}.queue; v record; BEGIN"
    " SELECT x AS q, pg_sequence_last_value('{s}.message_gen_seq') AS gen,"
    " (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now INTO STRICT v FROM {s}.queue x"
    " WHERE x.name = p_queue; q := v.q;"
    " IF p_ack_ids IS NOT NULL THEN PERFORM {s}._ack(q, p_ack_ids, p_ack_tokens, false, v.now); END IF;"
    " RETURN QUERY WITH "
    + (_P + " " + LEASE)
    .format(
        s="{s}", q="q.id", gen="v.gen", max="q.max_attempts", lease="q.lease_ms", now="v.now", n="p_limit"
    )
    .replace("{", "{{")
    .replace("}", "}}")
    .replace("{{s}}", "{s}")
    + "; END $fn$"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="path/to/src of the lonnymq to install")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--steps", help="labels to run (default: all), comma-separated")
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="rewrite LonnyMQ's message_logged (VACUUM FULL) before each run on it, so that its backlog"
        " is packed into fresh pages as the plain steps' tables are (by default it has the free space"
        " the runs before it left, where a lease's new row version may land on its own page)",
    )
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--profiles", type=Path, help="keep callgrind's output of each run there (<step>-<calls>.out)"
    )
    args = ap.parse_args()
    if args.profiles:
        args.profiles.mkdir(parents=True, exist_ok=True)
        args.profiles.chmod(0o777)  # the single-user backend runs as postgres
    n, low, high = args.batch, max(1, args.calls // 4), args.calls
    backlog = (high + 40) * n + 500
    cluster = si.Cluster(args.bin)
    steps: list[tuple[str, str]] = []  # (label, what)
    results: dict[str, float] = {}
    try:
        dsn = cluster.start_bench()
        cluster.install(dsn, args.tree, SCHEMA)
        psql = [str(args.bin / "psql"), dsn, "-v", "ON_ERROR_STOP=1", "-qAt"]
        q, gen = (
            int(x)
            for x in subprocess.run(
                [
                    *psql,
                    "-F",
                    ",",
                    "-c",
                    f"SELECT q.id, s.last_value FROM {SCHEMA}.queue q, {SCHEMA}.message_gen_seq s WHERE q.name = 'q'",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split(",")
        )
        setup = ["CREATE SCHEMA abl"]
        setup += [stmt.as_string(None) for stmt in ddl(SCHEMA)]
        setup.append(f"CREATE UNLOGGED TABLE abl.settled (LIKE {SCHEMA}.settled)")
        setup.append("CREATE INDEX ON abl.settled USING hash (id)")
        setup.append(f"CREATE TABLE abl.queue_stat (LIKE {SCHEMA}.queue_stat INCLUDING DEFAULTS)")
        setup.append("CREATE INDEX ON abl.queue_stat (queue_id, minute)")
        plain: dict[str, tuple[str, Piece]] = {}
        for label, what, piece in [*CHAIN, *ALONE]:
            plain[label] = (what, piece)
            if label.startswith("chain:"):
                steps.append((label, what))
            if not piece.table:
                setup += table_ddl(label.replace(":", "_"), piece).split("\n")
        # The API floor's function, and its variants.
        take_fn = next(s for s in setup if f'"{FLOOR_SCHEMA}".take(' in s)
        for name, change in _FUNCTION_VARIANTS.items():
            setup.append(change(take_fn).replace(f'"{FLOOR_SCHEMA}".take(', f'"{FLOOR_SCHEMA}".{name}('))
        setup.append(_TAKE_ACK.format(f=FLOOR_SCHEMA, s=SCHEMA))
        subprocess.run([*psql, "-c", ";\n".join(setup)], check=True)
        cluster.pg_ctl("stop")
        calls_of: dict[str, str] = {
            "floor:leasestore": "WITH "
            + CTES.format(s=SCHEMA, q=q, gen=gen, max=5, lease=LEASE_MS, now=NOW, n=n, ids=_IDS, toks=_TOKS)
            + ", u AS ("
            + LEASE.format(s=SCHEMA, q=q, gen=gen, max=5, lease=LEASE_MS, now=NOW, n=n, ids=_IDS, toks=_TOKS)
            + ")"
            + _KEEP.replace("u.tok", "u.deliveries"),
            "api:floor": f"SELECT * FROM {FLOOR_SCHEMA}.take('q', {n}, {_IDS}, {_TOKS})",
            "api:take_replan": f"SELECT * FROM {FLOOR_SCHEMA}.take_replan('q', {n}, {_IDS}, {_TOKS})",
            "api:take_sets": f"SELECT * FROM {FLOOR_SCHEMA}.take_sets('q', {n}, {_IDS}, {_TOKS})",
            "api:ack": f"SELECT * FROM {FLOOR_SCHEMA}.take_ack('q', {n}, {_IDS}, {_TOKS})",
            "lonnymq:take": f"SELECT * FROM {SCHEMA}.take('q', {n}, NULL, {_IDS}, {_TOKS})",
        }
        steps += [
            ("floor:leasestore", "leasestorefloor's own statement (lease_store_floor.py), the same pieces"),
            ("api:floor", "the same through a secure function, the queue by name = apileasefloor"),
            ("api:take_replan", "the API lease floor without force_generic_plan: planned at every call"),
            (
                "api:take_sets",
                "the API lease floor + take()'s other three SET clauses (enable_seqscan, enable_sort, jit off)",
            ),
            ("api:ack", "the API lease floor with LonnyMQ's own ack instead of the floor's (a nested _ack)"),
            ("lonnymq:take", "LonnyMQ's take(q, n, ack=previous), on the server's clock"),
        ]
        steps += [(label, what) for label, what, _ in ALONE]
        wanted = set(args.steps.split(",")) if args.steps else None
        for label, what in steps:
            if wanted is not None and label not in wanted:
                continue
            head = (
                f"TRUNCATE abl.settled, abl.queue_stat, {SCHEMA}.settled, {SCHEMA}.queue_stat\n"
                f"SELECT {SCHEMA}.queue_purge('q')\n"
                f"SELECT setval('{SCHEMA}.message_gen_started_seq',"
                " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000)\n"
            )
            if label in plain and not plain[label][1].table:
                piece = plain[label][1]
                t = "abl." + label.replace(":", "_")
                head += f"TRUNCATE {t}\n{fill(t[4:], piece, backlog, q, gen)}\nVACUUM ANALYZE {t}\n"
                text = statement(t, piece, n, q, gen)
            else:
                if args.fresh:
                    head += f"VACUUM FULL {SCHEMA}.message_logged\n"
                head += (
                    f"SELECT count(*) FROM {SCHEMA}.send_batch('q', array_fill('{si.PAYLOAD}'::bytea,"
                    f" ARRAY[{backlog}]), p_now => {NOW - 1000})\nVACUUM ANALYZE {SCHEMA}.message\n"
                )
                if label in plain:
                    text = statement(f"{SCHEMA}.message_logged", plain[label][1], n, q, gen)
                    text = text.replace("abl.settled", f"{SCHEMA}.settled").replace(
                        "abl.queue_stat", f"{SCHEMA}.queue_stat"
                    )
                elif label.startswith("floor:"):
                    text = calls_of[label]
                else:
                    text = (
                        "SELECT set_config('b.ids', coalesce(array_agg(t.id)::text, '{}'), false),"
                        " set_config('b.toks', coalesce(array_agg(t.token)::text, '{}'), false) FROM ("
                        + calls_of[label]
                        + ") t"
                    )
            text = text.replace("{{", "{").replace("}}", "}")
            counts = []
            for calls in (low, high):
                script = si.calls_script(head, text, calls, "SET enable_seqscan = off\n")
                out = args.profiles / f"{label.replace(':', '_')}-{calls}.out" if args.profiles else None
                counts.append(cluster.single(script, profile=out))
            results[label] = (counts[1] - counts[0]) / (high - low) / n
            print(f"{label:16} {results[label] / 1000:8.1f}k  {what}", flush=True)
    finally:
        cluster.remove()
    if args.json:
        doc = {
            "batch": n,
            "calls": args.calls,
            "fresh": args.fresh,
            "tree": args.tree,
            "steps": [
                {"label": label, "what": what, "per_message": results.get(label)} for label, what in steps
            ],
            "leasestorefloor": "WITH " + CTES + " " + LEASE,
        }
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
