"""The API floors: the least a send and a pop cost through a secure SQL function API, with
nothing of LonnyMQ's own logic.

LonnyMQ's architecture is mandated: the core is SQL, one function call is one transaction and
one atomic queue action, the tables are closed to the roles, and the API functions are SECURITY
DEFINER with ``search_path`` pinned to ``pg_catalog, pg_temp`` (``src/lonnymq/sql/security.sql``;
PostgreSQL's documentation requires the pinned path for a safe security definer function). The
plain floors (``send_floor.py``, ``pop_floor.py``: one statement on LonnyMQ's tables with the
queue's id and generation as constants) are out of reach of any call through such an API. These
floors are those statements in the least such a call can be:

* a PL/pgSQL function in a schema of its own (``lonnymq_floor``), SECURITY DEFINER with the
  pinned ``search_path``, and no other SET clause (no pinned plan settings: see below);
* the queue looked up by its name (the queue table's unique index), as every API call must (a
  caller names a queue; ids are LonnyMQ's own);
* the generation read from its sequence (``pg_sequence_last_value``), the clock from the server;
* then the plain floor's statement: the rows ``send()`` writes (message + ``queue_stat``), or the
  DELETE ``take_tx(q, 1)`` does, returning what the API returns (the id; the delivery's columns,
  in take_tx's row type).

Nothing else: no argument checks (an unknown queue fails by ``INTO STRICT``: no row), no hold on
the generation, no wake-up, no frozen generations, no pause, channels or archive flags.

``send`` returns a bigint (``SELECT lonnymq_floor.send(...)``, a Result node); ``send_rows``
is the same returning ``TABLE (id bigint, outcome text)`` as LonnyMQ's ``send()`` does
(``SELECT * FROM``: a Function Scan over a tuplestore); ``benchmarks/server_instructions.py``
counts both, and the floor is the cheaper (``send``). ``pop`` reads the current generation
only, as the plain pop floor; ``pop2`` the window's two, as LonnyMQ's held-snapshot storage must
(``popfloor2``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ..harness import Ctx
from .base import Variant
from .lease_store_floor import CTES as LEASE_CTES
from .lease_store_floor import LEASE, LeaseStoreFloor, drain_loop
from .lonnymq import QUEUE, SCHEMA, LonnyMQ
from .pop_floor import COLUMNS, TEMPLATE, WINDOW_TEMPLATE, PopFloor
from .send_floor import send_loop

#: The floor functions' own schema.
FLOOR_SCHEMA = "lonnymq_floor"

#: The clock and the generation, as an API call must read them ({s}: LonnyMQ's schema).
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_GEN = "pg_sequence_last_value('{s}.message_gen_seq')"
_SECURE = "LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp"

#: The send floor's statement (send_floor.TEMPLATE, keep in step) from the queue's row found by
#: name, with the generation read from its sequence; the function's own SELECT of the id follows.
_SEND = (
    "WITH now AS (SELECT " + _NOW + " AS ms),"
    " ins AS (INSERT INTO {s}.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,"
    " priority, content_type, payload)"
    " SELECT x.id, nextval('{s}.message_id_seq'), " + _GEN + ", now.ms, now.ms, now.ms, 0,"
    " p_content_type, p_payload FROM {s}.queue x, now WHERE x.name = p_queue"
    " RETURNING m.queue_id, m.id, m.enqueued_at),"
    " st AS (INSERT INTO {s}.queue_stat (queue_id, minute, sent)"
    " SELECT ins.queue_id, ins.enqueued_at / 60000, 1 FROM ins)"
)
_ARGS = "p_queue text, p_payload bytea, p_content_type text DEFAULT NULL"

#: The pop floor's head: the queue by name (id, max_attempts), the generation and the clock, in
#: one statement (as take_tx's); an unknown queue raises (no row).
_HEAD = (
    "SELECT x.id, x.max_attempts, " + _GEN + " AS gen, " + _NOW + " AS now INTO STRICT v"
    " FROM {s}.queue x WHERE x.name = p_queue;"
)
_POP_ARGS = {"q": "v.id", "gen": "v.gen", "max": "v.max_attempts", "now": "v.now"}
_RETURNING = " RETURNING " + COLUMNS.format(lease="")
_TAKE_TX_RETURNING = " RETURNING " + COLUMNS.format(lease="NULL::bigint, ")


#: The lease floor's one SET clause: its statement takes arrays (the previous deliveries), and
#: PL/pgSQL prices a generic plan for an array parameter (10 elements) above a custom plan for
#: the array it is given, so without this it plans the statement again at every call (1.2M
#: instructions a call: docs/benchmarks.md, "The drain's floors"), as take() would without its
#: own (settle.sql's header). take()'s other three SET clauses pin plans, which the benchmarks'
#: analysed tables do not need (they are counted as a step of their own).
_GENERIC = "SET plan_cache_mode = force_generic_plan"
#: The lease floor on LonnyMQ's tables (lease_store_floor.py) on the head's values, with the
#: queue's lease, the batch and the previous deliveries as the function's arguments.
_TAKE_HEAD = _HEAD.replace("x.max_attempts, ", "x.max_attempts, x.lease_ms, ")
_TAKE_BODY = ("WITH " + LEASE_CTES + " " + LEASE).format(
    s="{s}", lease="v.lease_ms", n="p_limit", ids="p_ack_ids", toks="p_ack_tokens", **_POP_ARGS
)


def _pop_body(template: str) -> str:
    """The plain pop floor's statement (``template``) on the head's values, returning take_tx's
    row (its lease_until NULL, as a pop's)."""
    assert template.endswith(_RETURNING)
    stmt = template[: -len(_RETURNING)] + _TAKE_TX_RETURNING
    return stmt.format(s="{s}", **_POP_ARGS)


#: name: (its DDL with {f} the floor schema and {s} LonnyMQ's), one CREATE FUNCTION each.
FUNCTIONS: dict[str, str] = {
    "send": (
        "CREATE FUNCTION {f}.send(" + _ARGS + ") RETURNS bigint " + _SECURE + " AS $fn$\n"
        "DECLARE v_id bigint;\nBEGIN\n  " + _SEND + " SELECT ins.id INTO STRICT v_id FROM ins;\n"
        "  RETURN v_id;\nEND $fn$"
    ),
    "send_rows": (
        "CREATE FUNCTION {f}.send_rows("
        + _ARGS
        + ") RETURNS TABLE (id bigint, outcome text) "
        + _SECURE
        + " AS $fn$\nBEGIN\n  RETURN QUERY "
        + _SEND
        + " SELECT ins.id, 'created'::text FROM ins;\n"
        "  IF NOT FOUND THEN RAISE EXCEPTION 'no queue %', p_queue; END IF;\nEND $fn$"
    ),
    "pop": (
        "CREATE FUNCTION {f}.pop(p_queue text) RETURNS SETOF {s}.delivery " + _SECURE + " AS $fn$\n"
        "DECLARE v record;\nBEGIN\n  " + _HEAD + "\n  RETURN QUERY " + _pop_body(TEMPLATE) + ";\nEND $fn$"
    ),
    "pop2": (
        "CREATE FUNCTION {f}.pop2(p_queue text) RETURNS SETOF {s}.delivery " + _SECURE + " AS $fn$\n"
        "DECLARE v record;\nBEGIN\n  "
        + _HEAD
        + "\n  RETURN QUERY "
        + _pop_body(WINDOW_TEMPLATE)
        + ";\nEND $fn$"
    ),
    "take": (
        "CREATE FUNCTION {f}.take(p_queue text, p_limit integer, p_ack_ids bigint[], p_ack_tokens integer[])"
        " RETURNS SETOF {s}.delivery " + _SECURE + " " + _GENERIC + " AS $fn$\n"
        "DECLARE v record;\nBEGIN\n  " + _TAKE_HEAD + "\n  RETURN QUERY " + _TAKE_BODY + ";\nEND $fn$"
    ),
}

#: The calls as clients make them ({f}: the floor schema; %s, %b: a driver's parameters).
SEND_CALL = "SELECT {f}.send(%s::text, %b::bytea, %s::text)"
POP_CALL = "SELECT * FROM {f}.{fn}(%s::text)"
TAKE_CALL = "SELECT * FROM {f}.take(%s::text, %s::integer, %b::bigint[], %b::integer[])"


def ddl(schema: str = SCHEMA, floor_schema: str = FLOOR_SCHEMA) -> list[sql.Composed]:
    """The floor schema and its functions over LonnyMQ's tables in ``schema``."""
    names = {"s": sql.Identifier(schema), "f": sql.Identifier(floor_schema)}
    out = [sql.SQL("CREATE SCHEMA {f}").format(**names)]
    # The bodies are quoted text to psql and psycopg alike: a schema's name in them is an
    # identifier rendered by psycopg (quoted), never pasted.
    out += [sql.SQL(text).format(**names) for text in FUNCTIONS.values()]
    return out


def install_floor(dsn: str) -> None:
    """LonnyMQ (its migrations, its queues) and the floor functions, in ``dsn``'s database."""
    LonnyMQ().install(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        for stmt in ddl():
            c.execute(stmt)


class _ApiFloor(PopFloor):
    """Installed as LonnyMQ is plus the floor functions; emptied, preloaded and counted as the
    pop floor (as LonnyMQ is)."""

    tables = (f"{SCHEMA}.message", f"{SCHEMA}.queue_stat")
    what = ""

    def install(self, dsn: str) -> dict[str, Any]:
        install_floor(dsn)
        return {"version": self.what}


class ApiSendFloor(_ApiFloor):
    name = "apisendfloor"
    label = "API send floor"
    what = (
        "the send floor's statement in a SECURITY DEFINER plpgsql function with a pinned"
        " search_path, the queue by name, the generation from its sequence, RETURNS bigint"
    )

    def pops(self) -> list[Variant]:
        return []

    def commits(self) -> list[Variant]:
        # A reference of the producers benchmark, as the send floor (not a send of the suite).
        return [Variant(self.name, "lonnymq_floor.send()", "one", _send_one, note=self.what)]


class ApiPopFloor(_ApiFloor):
    name = "apipopfloor"
    label = "API pop floor"
    function = "pop"
    what = (
        "the pop floor's DELETE (the current generation) in a SECURITY DEFINER plpgsql function"
        " with a pinned search_path, the queue by name, RETURN QUERY of take_tx's row"
    )

    def pops(self) -> list[Variant]:
        return [
            Variant(self.name, f"lonnymq_floor.{self.function}()", "one", _pop(self.function), note=self.what)
        ]


class ApiPopFloor2(ApiPopFloor):
    name = "apipopfloor2"
    label = "API pop floor, 2 generations"
    function = "pop2"
    what = ApiPopFloor.what.replace("(the current generation)", "(the window's two generations, as take_tx)")


def _send_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = psycopg.connect(dsn, autocommit=True)
    call = sql.SQL(SEND_CALL).format(f=sql.Identifier(FLOOR_SCHEMA))
    return send_loop(c, ctx, lambda body, ctype: c.execute(call, (QUEUE, body, ctype)).fetchone())


def _pop(function: str) -> Callable[[str, Ctx], Callable[[], int]]:
    def start(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = psycopg.connect(dsn, autocommit=True)
        call = sql.SQL(POP_CALL).format(f=sql.Identifier(FLOOR_SCHEMA), fn=sql.Identifier(function))

        def work() -> int:
            n = 0
            while not ctx.expired():
                if c.execute(call, (QUEUE,)).fetchone() is None:
                    break
                n += 1
            c.close()
            return n

        return work

    return start


class ApiLeaseFloor(LeaseStoreFloor):
    """The lease floor on LonnyMQ's tables through a secure function (``lonnymq_floor.take``):
    installed as LonnyMQ is plus the floor functions; only drains."""

    name = "apileasefloor"
    label = "API lease floor"
    version = (
        "the lease floor on LonnyMQ's tables (ack by key with the token checked, settled + queue_stat,"
        " lease of the window's first n) in a SECURITY DEFINER plpgsql function with a pinned"
        " search_path, the queue by name, RETURN QUERY of take()'s row"
    )

    def install(self, dsn: str) -> dict[str, Any]:
        install_floor(dsn)
        return {"version": self.version}

    def drains(self) -> list[Variant]:
        return [
            Variant(self.name, f"lonnymq_floor.take({n}, ack=previous)", kind, _take(n), note=self.version)
            for kind, n in (("one", 1), ("batch", 100))
        ]


#: What the guarantee floor drops from LonnyMQ's tables: the partial index of leases
#: (migration 0006's ``message_leased_idx``, on the partitioned table, so every partition's).
DROP_LEASES_INDEX = "DROP INDEX {s}.message_leased_idx"


def drop_leases_index(c: psycopg.Connection[Any], schema: str = SCHEMA) -> None:
    """Drop the partial index of leases from ``schema``'s message table (a benchmark database's
    own copy: the guarantee floor's install)."""
    c.execute(sql.SQL(DROP_LEASES_INDEX).format(s=sql.Identifier(schema)))


class GuaranteeFloor(ApiLeaseFloor):
    """The API lease floor without the partial index of leases: only the pieces a guarantee
    needs. Branch ``drainfloor``'s decomposition (docs/benchmarks.md) marks every piece of the
    API lease floor required by a guarantee but one, the index of leases ``(queue_id, channel,
    dequeue_at) WHERE leased``, which LonnyMQ keeps by choice (an exact leased count bounded by
    the metrics' cap, the short take's one-probe check for an expired lease on its last
    attempt). The floor's statement never reads it (its probes say ``leased IS TRUE``), so
    without it a lease writes one index entry fewer. Installed as the API lease floor, then the
    index dropped; LonnyMQ's own functions are not run on this database."""

    name = "guaranteefloor"
    label = "guarantee floor"
    version = (
        "the API lease floor (ack by key with the token checked, settled + queue_stat, lease of the"
        " window's first n, in a secure function) on LonnyMQ's tables without the partial index of"
        " leases: only the pieces a guarantee needs"
    )

    def install(self, dsn: str) -> dict[str, Any]:
        info = super().install(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            drop_leases_index(c)
        return info


def _take(n: int) -> Callable[[str, Ctx], Callable[[], int]]:
    def start(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = psycopg.connect(dsn, autocommit=True)
        call = sql.SQL(TAKE_CALL).format(f=sql.Identifier(FLOOR_SCHEMA))

        def work() -> int:
            return drain_loop(c, ctx, lambda ids, toks: c.execute(call, (QUEUE, n, ids, toks)).fetchall())

        return work

    return start
