"""What a call costs the server, counted in instructions: deterministic, so a change of a few
percent shows on a shared, noisy machine where timings cannot (CPU time per call drifted
+-20% between identical runs here while other work ran).

A throwaway cluster (Debian's PostgreSQL binaries, ``initdb`` into a temporary directory) gets
one schema per source tree (``--trees name=path/to/src,...``, each migrated by its own
``lonnymq``) and the floors' bare tables. Each workload then runs in a single-user ``postgres
--single`` under valgrind's callgrind: one prepared statement, ``EXECUTE``d ``--calls`` times as
top-level statements (each its own transaction, ``synchronous_commit = on`` with ``fsync = off``:
hint bits are set and dead index entries killed as on a live server), and again ``--calls /
4`` times; the difference of the two instruction counts over the difference of the calls is the
cost of one call, without start-up, set-up and the statement's first (planning) calls.
Only the EXECUTEs are counted (callgrind's ``--toggle-collect=ExecuteQuery``): the set-up of a
run cleans up after the previous one, which differs between runs, and each call's commit,
much the same for every workload, is left out. The clock is fixed (``p_now``), so no
generation rotates during a run.

Workloads (``--workloads``), per message:

* ``pop``: ``take_tx(q, 1)``; floor: the seed queue's ``message_dequeue()`` (DELETE ... WHERE id =
  (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING *, in a PL/pgSQL function); and the pop
  floor (``popfloor``): the row ``take_tx(q, 1)`` deletes, as one plain statement on LonnyMQ's
  own tables (``lonnymq_bench/systems/pop_floor.py``, the producers benchmark's ``popfloor``; in
  the last tree's schema, the queue's id, generation and max_attempts as literals), and the same
  over the window's two generations (``popfloor2``); ``pop_clock`` likewise, the floors on the
  server's clock, and the API pop floors (``apipopfloor``, ``apipopfloor2``: the same DELETEs
  in a SECURITY DEFINER function with a pinned search_path that looks the queue up by name,
  ``lonnymq_bench/systems/api_floor.py``: the least a pop through a secure function API costs);
* ``drain1`` / ``drain10`` / ``drain100``: ``take(q, n, ack=previous)``; floor: the lease floor's one statement
  (DELETE of the previous ids, lease of the next by UPDATE of a visibility column; its backlog
  carries LonnyMQ's payload, as jsonb), and the lease floor on LonnyMQ's tables
  (``leasestorefloor``: the previous deliveries deleted by key with their token checked, ack's
  memory and the queue_stat row, the next leased from the window's two generations, one plain
  statement, ``lonnymq_bench/systems/lease_store_floor.py``; in the last tree's schema, the
  queue's id, generation, max_attempts and lease as literals); ``drain1_clock`` /
  ``drain100_clock`` likewise on the server's clock, with the API lease floor (``apileasefloor``:
  that statement in api_floor.py's secure function ``take``, the queue by name). Every drain
  floor is planned with ``enable_seqscan = off``, as take() is (its SET clause): the bare lease
  floor's UPDATE otherwise joined its ids by a hash join over a scan of the whole table whenever
  the backlog was under ~30,000 rows (``--calls 200``), and counted that scan;
* ``drain1_floor_settled`` / ``drain100_floor_settled``: the lease floor's statement with ack's
  memory (each acknowledged id also inserted into an UNLOGGED table with a hash index on the id,
  as LonnyMQ's ``settled`` since migration 0021): a floor alone, no LonnyMQ statement;
* ``take``: ``take(q, 1)`` alone (its lease; no floor);
* ``take100`` / ``ack100``: ``take(q, 100)`` alone, and the same followed by ``ack()`` of the 100
  deliveries (a batch ack's general path, ``_ack``); their difference is about the ack's cost;
* ``send``: ``send(q, payload)``; floor: ``INSERT ... RETURNING id`` into the seed's table;
* ``send_key``: ``send`` with an idempotency key, as the Python client sends by default;
* ``send_clock`` / ``send_key_clock``: the same on the server's clock (no ``p_now``), in FROM
  (``SELECT * FROM send(...)``, as the Python client calls it for a message with options: a
  plain one goes to ``send_plain`` since migration 0020); ``send_clock``'s floors: the send
  floor (``sendfloor``: the rows send() writes as one plain statement on the last tree's tables,
  ``lonnymq_bench/systems/send_floor.py``, the queue's id and generation as literals) and the
  API send floor (``apisendfloor``: that statement in a secure function that looks the queue up
  by name, returning a bigint; ``apisendfloor_rows``: the same returning ``TABLE (id,
  outcome)`` as send() does, ``api_floor.py``);
  ``send_call_clock`` / ``send_key_call_clock``: in the select list, as branch ``sendrow``
  called it (``SELECT send(...)``: one value of type ``sent``; not kept, docs/benchmarks.md;
  on today's trees a set-returning call in the select list); ``send_fields_clock``: its fields taken by
  an outer query (``SELECT (r).id, (r).outcome FROM (SELECT send(...) AS r OFFSET 0) s``).
* ``send_plain_clock``: ``SELECT send_plain(q, payload)`` (the lean plain send, a scalar, as
  the Python client calls it for a message without options), on the trees that have it;
* ``send_plain_once_clock``: ``SELECT send_plain_once(q, payload, gen_random_uuid())`` (the
  lean keyed plain send, as the Python client calls it for such a message with an idempotency
  key, a pooled ``Client``'s default; ``send_key_clock`` is what it called before), on the
  trees that have it;

pgmq's API (issue 13), the statements pgmq's own Python client sends (``pgmq/_sql.py``),
``PREPARE``d with their parameters as a driver prepares them and ``EXECUTE``d with the
parameter values (the jsonb parsed on the way in, as for a client's parameter; the rows
printed by the single-user backend as a client's are sent), against the facade over each tree
(``migrate(pgmq=True)``, one database per tree: ``facade_<name>``) and against pgmq itself (the
SQL-only ``pgmq.sql`` of the ``pgmq`` PyPI package, benchmarks/requirements.txt, in database
``pgmq``; its ``pgmq`` schema cannot share a database with the facade's); the label ``pgmq``:

* ``pgmq_send``: ``pgmq.send(queue_name, msg)``;
* ``pgmq_read_delete``: ``pgmq.read(queue_name, vt => 30, qty => 1)``, then ``pgmq.delete(queue_name,
  msg_id)`` of the id it read (kept by ``set_config`` in the read's select list, on both sides);
* ``pgmq_pop``: ``pgmq.pop(queue_name, qty => 1)``;
* ``pgmq_send_batch100``: ``pgmq.send_batch(queue_name, msgs)`` of 100 messages.

Each message is the benchmark suite's ~200-byte JSON (``lonnymq_bench.harness.payload``, as in
``benchmarks/pgmq_facade.py``). These run on the server's clock (pgmq's API takes none), so the
set-up of a facade run moves the start of LonnyMQ's current generation an hour ahead: no take
rotates generations during the run (a rotation every 2 s, amortised over a live server's
thousands of calls, would land every few dozen calls under callgrind). Each run's set-up
empties the queue (pgmq: ``TRUNCATE``; the facade: ``queue_purge`` and ``VACUUM FULL``), so a
run does not clean up after the previous one. With ``--commits`` each statement's commit is
counted too (``CommitTransactionCommand``: the commit record, the WAL written, with fsync off
the write but not the disk): pgmq and LonnyMQ do not write the same WAL for the same message.

Instructions are not time: a statement waiting on I/O, a lock or the WAL flush costs none here,
and an instruction's time varies with caches. Use it to compare the server's work of two trees
or against the floors; measure throughput with the other benchmarks.

    python benchmarks/server_instructions.py --trees before=../old/src,after=src \\
        [--workloads pop,drain1,drain100,take,send,send_key] [--calls 400] [--no-floor] [--json out.json]
    python benchmarks/server_instructions.py --trees facade=src \\
        --workloads pgmq_send,pgmq_read_delete,pgmq_pop,pgmq_send_batch100 [--commits]

Needs valgrind and PostgreSQL's server binaries (``--bin``, default Debian's 15); as root it runs
the server as the ``postgres`` user.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from lonnymq_bench.systems.api_floor import FLOOR_SCHEMA, ddl
from lonnymq_bench.systems.lease_store_floor import CLOCK_ONCE
from lonnymq_bench.systems.lease_store_floor import CTES as LEASE_CTES
from lonnymq_bench.systems.lease_store_floor import LEASE as LEASE_UPDATE
from lonnymq_bench.systems.pop_floor import CLOCK, TEMPLATE, WINDOW_TEMPLATE
from lonnymq_bench.systems.send_floor import TEMPLATE as SEND_TEMPLATE

NOW = 1_700_000_000_000  # the fixed clock (epoch ms) of every call: in the past, so p_now needs no check
PAYLOAD = "\\x7b226f72646572223a203132333435362c20226e6f7465223a2022787878787878787878787878227d"

_ACK = "current_setting('b.ids')::bigint[], current_setting('b.toks')::int[]"
_KEEP = (
    "set_config('b.ids', coalesce(array_agg(t.id)::text, '{{}}'), false),"
    " set_config('b.toks', coalesce(array_agg(t.token)::text, '{{}}'), false)"
)
# The main query reads the DELETE (its count comes first in the select list): a data-modifying
# CTE that nothing reads runs after the main query, whose set_config has by then replaced the
# ids with the ones this call leased, which it cannot delete (it changed them itself): until
# 2026-11-26 the floor deleted nothing, and its 70.5k / 237.4k counted the lease alone.
_LEASE_FLOOR = (
    "WITH a AS (DELETE FROM public.lq WHERE id = ANY (current_setting('b.ids')::bigint[]) RETURNING lq.id),"
    " p AS (SELECT lq.id FROM public.lq WHERE lq.vt <= {now} ORDER BY lq.vt, lq.id LIMIT {n}"
    " FOR UPDATE OF lq SKIP LOCKED),"
    " u AS (UPDATE public.lq SET vt = {now} + 30000 FROM p WHERE lq.id = p.id RETURNING lq.id, lq.payload)"
    " SELECT (SELECT count(*) FROM a), set_config('b.ids', coalesce(array_agg(u.id)::text, '{{}}'), false) FROM u"
)
# The lease floor with ack's memory: each acknowledged id also leaves a row (queue, id, token,
# outcome, time) in an UNLOGGED table with a hash index on the id, as LonnyMQ's settled (what
# answers a repeated ack, sql/settle.sql; its shape since migration 0021, before it a primary key
# on (queue, id) and a BRIN index on the time): a guarantee the lease floor does not pay.
_LEASE_FLOOR_SETTLED = _LEASE_FLOOR.replace(
    "RETURNING lq.id),",
    "RETURNING lq.id), s AS (INSERT INTO public.lq_settled SELECT 1, a.id, 1, 'acked', {now} FROM a),",
)
#: workload: (LonnyMQ's statement for schema {s} or None (a floor alone), the floor's statement
#: or None, messages a call)
WORKLOADS: dict[str, tuple[str | None, str | None, int]] = {
    "pop": ("SELECT * FROM {s}.take_tx('q', 1, p_now => {now})", "SELECT * FROM public.seed_dequeue()", 1),
    "drain1": (
        "SELECT " + _KEEP + " FROM {s}.take('q', 1, NULL, " + _ACK + ", p_now => {now}) t",
        _LEASE_FLOOR.replace("{n}", "1"),
        1,
    ),
    "drain100": (
        "SELECT " + _KEEP + " FROM {s}.take('q', 100, NULL, " + _ACK + ", p_now => {now}) t",
        _LEASE_FLOOR.replace("{n}", "100"),
        100,
    ),
    # A drain at batch 10: a batch ack's per-call costs (its statements, its settings) over 10.
    "drain10": (
        "SELECT " + _KEEP + " FROM {s}.take('q', 10, NULL, " + _ACK + ", p_now => {now}) t",
        _LEASE_FLOOR.replace("{n}", "10"),
        10,
    ),
    # The drain floors with ack's memory (no LonnyMQ statement: compare with drain1, drain100).
    "drain1_floor_settled": (None, _LEASE_FLOOR_SETTLED.replace("{n}", "1"), 1),
    "drain100_floor_settled": (None, _LEASE_FLOOR_SETTLED.replace("{n}", "100"), 100),
    "take": ("SELECT * FROM {s}.take('q', 1, p_now => {now})", None, 1),
    # A batch ack alone: ack100 leases 100 and acks them through ack() (its general path,
    # _ack); take100 leases 100 and acks nothing. ack100 - take100 is about the ack's part (the
    # two leave the table in different states: leased rows stay in take100's).
    "take100": ("SELECT count(*) FROM {s}.take('q', 100, p_now => {now})", None, 100),
    "ack100": (
        "SELECT count(*) FROM (SELECT array_agg(t.id) AS i, array_agg(t.token) AS k"
        " FROM {s}.take('q', 100, p_now => {now}) t) x, LATERAL {s}.ack('q', x.i, x.k, p_now => {now}) a",
        None,
        100,
    ),
    "send": (
        "SELECT * FROM {s}.send('q', '" + PAYLOAD + "'::bytea, p_now => {now})",
        "INSERT INTO public.seedq (payload) VALUES (convert_from('" + PAYLOAD + "'::bytea, 'UTF8')::jsonb)"
        " RETURNING id",
        1,
    ),
    "send_key": (
        "SELECT * FROM {s}.send('q', '"
        + PAYLOAD
        + "'::bytea, p_send_key => gen_random_uuid(), p_now => {now})",
        None,
        1,
    ),
    # send and send_key on the server's clock (no p_now, as clients call them): a p_now ahead of
    # the clock (NOW is) costs a call of _now() and its role check on every call.
    "send_clock": ("SELECT * FROM {s}.send('q', '" + PAYLOAD + "'::bytea)", None, 1),
    "send_key_clock": (
        "SELECT * FROM {s}.send('q', '" + PAYLOAD + "'::bytea, p_send_key => gen_random_uuid())",
        None,
        1,
    ),
    # The lean plain send (send_plain, a scalar): what the Python client calls for a message
    # without options, in its select list. Runs on the trees that have it (NEEDS).
    "send_plain_clock": ("SELECT {s}.send_plain('q', '" + PAYLOAD + "'::bytea)", None, 1),
    # The lean keyed plain send (send_plain_once, a scalar): what the Python client calls for a
    # message without options when it keys the call (a pooled Client's default); compare with
    # send_key_clock, what it called before. Runs on the trees that have it (NEEDS).
    "send_plain_once_clock": (
        "SELECT {s}.send_plain_once('q', '" + PAYLOAD + "'::bytea, gen_random_uuid())",
        None,
        1,
    ),
    # send and send_key called in a select list, as branch sendrow's client called send() (its
    # send returned one value of type sent, not a set: a Result node instead of a Function Scan;
    # not kept); on today's trees this is a set-returning call in the select list (a ProjectSet).
    "send_call_clock": ("SELECT {s}.send('q', '" + PAYLOAD + "'::bytea)", None, 1),
    "send_key_call_clock": (
        "SELECT {s}.send('q', '" + PAYLOAD + "'::bytea, p_send_key => gen_random_uuid())",
        None,
        1,
    ),
    # The same with its fields taken by an outer query (bigint and text columns, not a value
    # of type sent): what the client sent in the first version of the change, kept to compare.
    "send_fields_clock": (
        "SELECT (r).id, (r).outcome FROM (SELECT {s}.send('q', '" + PAYLOAD + "'::bytea) AS r OFFSET 0) s",
        None,
        1,
    ),
    # The consumers' calls on the server's clock, as clients call them (a p_now costs a call of
    # _now(), ~50k instructions, that clients never make); the set-up moves the generation's
    # start a day ahead, so that no take rotates during the run.
    "pop_clock": ("SELECT * FROM {s}.take_tx('q', 1)", None, 1),
    "drain1_clock": ("SELECT " + _KEEP + " FROM {s}.take('q', 1, NULL, " + _ACK + ") t", None, 1),
    "drain100_clock": ("SELECT " + _KEEP + " FROM {s}.take('q', 100, NULL, " + _ACK + ") t", None, 100),
    "take_clock": ("SELECT * FROM {s}.take('q', 1)", None, 1),
    "send_batch100": (
        "SELECT count(*) FROM {s}.send_batch('q', array_fill('"
        + PAYLOAD
        + "'::bytea, ARRAY[100]), p_now => {now})",
        "WITH i AS (INSERT INTO public.seedq (payload) SELECT convert_from('"
        + PAYLOAD
        + "'::bytea, 'UTF8')::jsonb FROM generate_series(1, 100) RETURNING id) SELECT count(*) FROM i",
        100,
    ),
    "send_batch100_clock": (
        "SELECT count(*) FROM {s}.send_batch('q', array_fill('" + PAYLOAD + "'::bytea, ARRAY[100]))",
        None,
        100,
    ),
    "send_batch100_key": (
        "SELECT count(*) FROM {s}.send_batch('q', array_fill('"
        + PAYLOAD
        + "'::bytea, ARRAY[100]), p_now => {now}, p_send_key => gen_random_uuid())",
        None,
        100,
    ),
}
#: Workloads that need a function a tree may not have (an older tree): run on the trees with it.
NEEDS: dict[str, str] = {"send_plain_clock": "send_plain", "send_plain_once_clock": "send_plain_once"}

# pgmq's API: the statements of pgmq's Python client (pgmq/_sql.py), with $n for its %s.
_PGMQ_READ = (
    "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers"
    " FROM pgmq.read(queue_name=>$1::text, vt=>$2::integer, qty=>$3::integer)"
)
_PGMQ_POP = (
    "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers"
    " FROM pgmq.pop(queue_name=>$1::text, qty=>$2::integer)"
)
#: workload: (the statements PREPAREd as p0, p1, ...; the EXECUTEs of one call, where {msg} is
#: one message and {msgs} a batch as literals; messages a call; whether it consumes a backlog)
PGMQ_WORKLOADS: dict[str, tuple[tuple[str, ...], str, int, bool]] = {
    "pgmq_send": (
        ("SELECT * FROM pgmq.send(queue_name=>$1::text, msg=>$2::jsonb)",),
        "EXECUTE p0('q', {msg})",
        1,
        False,
    ),
    "pgmq_read_delete": (
        (
            # The read keeps the id it got for the delete (the one addition to the client's
            # statement, the same on both sides).
            _PGMQ_READ.replace(" FROM", ", set_config('b.id', msg_id::text, false) FROM", 1),
            "SELECT pgmq.delete(queue_name=>$1::text, msg_id=>$2::bigint)",
        ),
        "EXECUTE p0('q', 30, 1)\nEXECUTE p1('q', current_setting('b.id')::bigint)",
        1,
        True,
    ),
    "pgmq_pop": ((_PGMQ_POP,), "EXECUTE p0('q', 1)", 1, True),
    "pgmq_send_batch100": (
        ("SELECT * FROM pgmq.send_batch(queue_name=>$1::text, msgs=>$2::jsonb[])",),
        "EXECUTE p0('q', {msgs})",
        100,
        False,
    ),
}
#: Floors on LonnyMQ's own tables, run in the last tree's schema (workload: [(label, statement)],
#: {s} the schema, {q} / {gen} / {max} the queue's id, generation and max_attempts): the pop
#: floor's statement (lonnymq_bench/systems/pop_floor.py) with the queue's constants, and the
#: send floor's (send_floor.py) with the message send_clock sends; the API floors
#: (api_floor.py: the same in a secure function, the queue by name) on the server's clock, as
#: clients call them.
_PAYLOAD_LIT = "'" + PAYLOAD + "'::bytea"
_POP_FLOORS = [("popfloor", TEMPLATE), ("popfloor2", WINDOW_TEMPLATE)]


# The lease floor on LonnyMQ's tables (lease_store_floor.py) with the previous call's ids and
# tokens, keeping the ones it leases (its ack read first, as the bare lease floor's; {{}} stays
# {} through the template's format); and its function (api_floor.py), on the server's clock.
def _lease_store(n: int, now: str) -> str:
    ctes = LEASE_CTES.replace("{now}", now).replace("{n}", str(n))
    ctes = ctes.replace("{ids}", "current_setting('b.ids')::bigint[]").replace(
        "{toks}", "current_setting('b.toks')::int[]"
    )
    return (
        "WITH " + ctes + ", u AS (" + LEASE_UPDATE.replace("{now}", now) + ")"
        " SELECT (SELECT count(*) FROM a), set_config('b.ids', coalesce(array_agg(u.id)::text, '{{{{}}}}'), false),"
        " set_config('b.toks', coalesce(array_agg(u.deliveries)::text, '{{{{}}}}'), false) FROM u"
    )


def _api_lease(n: int) -> str:
    return (
        "SELECT "
        + _KEEP.replace("{{", "{{{{").replace("}}", "}}}}")
        + f" FROM {FLOOR_SCHEMA}.take('q', {n}, "
        + _ACK
        + ") t"
    )


TREE_FLOORS: dict[str, list[tuple[str, str]]] = {
    "pop": [(label, t.replace("{now}", str(NOW))) for label, t in _POP_FLOORS],
    "pop_clock": [(label, t.replace("{now}", CLOCK)) for label, t in _POP_FLOORS]
    + [
        ("apipopfloor", f"SELECT * FROM {FLOOR_SCHEMA}.pop('q')"),
        ("apipopfloor2", f"SELECT * FROM {FLOOR_SCHEMA}.pop2('q')"),
    ],
    "send_clock": [
        ("sendfloor", SEND_TEMPLATE.replace("{ct}", "NULL::text").replace("{p}", _PAYLOAD_LIT)),
        ("apisendfloor", f"SELECT {FLOOR_SCHEMA}.send('q', {_PAYLOAD_LIT}, NULL::text)"),
        ("apisendfloor_rows", f"SELECT * FROM {FLOOR_SCHEMA}.send_rows('q', {_PAYLOAD_LIT}, NULL::text)"),
    ],
    "drain1": [("leasestorefloor", _lease_store(1, str(NOW)))],
    "drain100": [("leasestorefloor", _lease_store(100, str(NOW)))],
    "drain1_clock": [("leasestorefloor", _lease_store(1, CLOCK_ONCE)), ("apileasefloor", _api_lease(1))],
    "drain100_clock": [
        ("leasestorefloor", _lease_store(100, CLOCK_ONCE)),
        ("apileasefloor", _api_lease(100)),
    ],
}
_FLOOR_DDL = """CREATE TABLE public.seedq (id bigserial PRIMARY KEY, payload jsonb NOT NULL)
CREATE FUNCTION public.seed_dequeue() RETURNS SETOF public.seedq LANGUAGE plpgsql AS $f$ BEGIN RETURN QUERY DELETE FROM public.seedq WHERE id = (SELECT id FROM public.seedq ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING *; END $f$
CREATE TABLE public.lq (id bigserial PRIMARY KEY, vt bigint NOT NULL DEFAULT 0, payload jsonb NOT NULL)
CREATE INDEX lq_vt ON public.lq (vt, id)
CREATE UNLOGGED TABLE public.lq_settled (queue_id integer NOT NULL, id bigint NOT NULL, token integer NOT NULL, outcome text NOT NULL, settled_at bigint NOT NULL)
CREATE INDEX lq_settled_id ON public.lq_settled USING hash (id)
"""


def collected(out: subprocess.CompletedProcess[str]) -> int:
    """The instructions callgrind counted in single-user run ``out``; stops on a failed run."""
    found = re.search(r"Collected : (\d+)", out.stderr)
    # A single-user backend reports a failed statement on stderr and goes on: a call that fails
    # would be counted as a cheap one.
    if out.returncode != 0 or not found or "ERROR:" in out.stdout or "ERROR:" in out.stderr:
        raise SystemExit(f"single-user run failed:\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    return int(found.group(1))


class Cluster:
    """A throwaway cluster in a temporary directory, run as ``postgres`` when we are root."""

    def __init__(self, bindir: Path) -> None:
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="lonnymq-instr-"))
        self.data = self.dir / "data"
        # A port free now, not a fixed one: several engineers' runs share the machine.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")

    def run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run(prefix + args, text=True, **kw)  # type: ignore[call-overload,no-any-return]

    def initdb(self) -> None:
        self.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "root", "--auth=trust"],
            check=True,
            capture_output=True,
        )

    def pg_ctl(self, action: str) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c autovacuum=off"
        self.run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-o",
                opts,
                "-l",
                str(self.dir / "log"),
                "-w",
                action,
            ],
            check=True,
            capture_output=True,
        )

    def start_bench(self) -> str:
        """initdb, start the server and create database ``bench``: its DSN."""
        self.initdb()
        self.pg_ctl("start")
        dsn = f"postgresql://root@127.0.0.1:{self.port}/postgres"
        subprocess.run([str(self.bin / "psql"), dsn, "-qc", "CREATE DATABASE bench"], check=True)
        return dsn.rsplit("/", 1)[0] + "/bench"

    def install(self, dsn: str, src: str, schema: str) -> None:
        """LonnyMQ of the tree ``src`` (its own migrate) in ``schema``, with a queue ``q``."""
        code = (
            "import sys; from lonnymq import Client\n"
            "with Client(sys.argv[1], schema=sys.argv[2], pool_size=1) as c:\n"
            "    c.migrate(); c.create_queue('q')\n"
        )
        env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
        subprocess.run([sys.executable, "-c", code, dsn, schema], env=env, check=True)

    def single(
        self, script: str, db: str = "bench", commits: bool = False, profile: Path | None = None
    ) -> int:
        """Instructions callgrind counted for ``script`` in a single-user backend on ``db``
        (with ``commits``, each statement's commit too); with ``profile``, callgrind's output
        file is kept there (for ``callgrind_annotate --inclusive=yes``)."""
        out = self.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={profile or '/dev/null'}",
                # Only the EXECUTEs: not the set-up (which cleans up after the previous run, so
                # its cost differs between runs), nor each call's commit.
                "--collect-atstart=no",
                "--toggle-collect=ExecuteQuery",
                *(["--toggle-collect=CommitTransactionCommand"] if commits else []),
                str(self.bin / "postgres"),
                "--single",
                "-c",
                "fsync=off",
                "-D",
                str(self.data),
                db,
            ],
            input=script,
            capture_output=True,
        )
        return collected(out)

    def remove(self) -> None:
        """Stop the server if it runs, then delete the cluster's directory."""
        if (self.data / "postmaster.pid").exists():
            self.pg_ctl("stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _script(
    workload: str, schema: str | None, calls: int, backlog: int, floor_on_tree: str | None = None
) -> str:
    """The single-user script of ``calls`` calls of ``workload``: LonnyMQ's statement in
    ``schema``, the floor's on the bare tables (``schema`` None), or ``floor_on_tree`` (a
    statement on LonnyMQ's tables) in ``schema``."""
    stmt, floor, _ = WORKLOADS[workload]
    if schema is None:
        assert floor is not None
        head = (
            "TRUNCATE public.seedq, public.lq, public.lq_settled\n"
            f"INSERT INTO public.seedq (payload) SELECT '{{\"i\": 1}}' FROM generate_series(1, {backlog})\n"
            # (LonnyMQ's payload, as jsonb: until 2026-11-27 '{"i": 1}', 1k instructions a message less)
            f"INSERT INTO public.lq (payload) SELECT convert_from('{PAYLOAD}'::bytea, 'UTF8')::jsonb"
            f" FROM generate_series(1, {backlog})\n"
            "VACUUM ANALYZE public.seedq\nVACUUM ANALYZE public.lq\n"
        )
        text = floor
    else:
        head = (
            # Ack's memory and the counters from empty, whatever ran before (each run alike).
            f"TRUNCATE {schema}.settled, {schema}.queue_stat\n"
            f"SELECT {schema}.queue_purge('q')\n"
            f"SELECT count(*) FROM {schema}.send_batch('q', array_fill('{PAYLOAD}'::bytea, ARRAY[{backlog}]),"
            f" p_now => {NOW - 1000})\nVACUUM ANALYZE {schema}.message\n"
            f"SELECT setval('{schema}.message_gen_started_seq',"
            " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000)\n"
        )
        if floor_on_tree is not None:
            text = floor_on_tree
        else:
            assert stmt is not None
            text = stmt.format(s=schema, now=NOW)
    text = text.replace("{now}", str(NOW)).replace("{{", "{").replace("}}", "}")
    # A drain floor's plan is the least one, as take()'s (its SET clause): without this the bare
    # lease floor's UPDATE joined its 100 ids by a hash join over a scan of the whole table
    # whenever the backlog was below ~30,000 rows (--calls 200: 181k instructions a message).
    pin = (
        "SET enable_seqscan = off\n"
        if workload.startswith("drain") and (schema is None or floor_on_tree)
        else ""
    )
    return calls_script(head, text, calls, pin)


def calls_script(head: str, text: str, calls: int, pin: str = "") -> str:
    """A single-user script: the settings (``pin``: more of them), the set-up ``head``, then
    ``text`` prepared and executed ``calls`` times after 20 first calls (the plans are made);
    the previous call's ids and tokens travel in ``b.ids`` and ``b.toks``."""
    return (
        "SET synchronous_commit = on\nSET b.ids = '{}'\nSET b.toks = '{}'\n"
        + pin
        + head
        + f"PREPARE w AS {text}\n"
        + "EXECUTE w\n" * (20 + calls)
    )


def _pgmq_messages(n: int) -> list[str]:
    """The benchmark suite's messages 0..n-1 as JSON text (benchmarks/pgmq_facade.py's)."""
    from lonnymq_bench.harness import payload

    return [json.dumps(payload(i), separators=(",", ":")) for i in range(n)]


def _pgmq_script(workload: str, facade: bool, calls: int, backlog: int) -> str:
    """A single-user script of ``calls`` calls of a pgmq workload (after 20 that make the
    plans), on the facade's database (``facade``) or on pgmq's."""
    prepares, call, _, consumes = PGMQ_WORKLOADS[workload]
    msgs = _pgmq_messages(100)
    # Literals: a message (jsonb) and the batch (a jsonb[] literal: each message quoted).
    quoted = ",".join('"' + m.replace("\\", "\\\\").replace('"', '\\"') + '"' for m in msgs)
    body = call.format(msg=f"'{msgs[0]}'", msgs="'{" + quoted + "}'")
    head = "SELECT pgmq.purge_queue('q')\n"
    if facade:
        # No rotation during the run (see the top); a fresh table, as pgmq's TRUNCATE leaves.
        head += (
            "SELECT setval('lonnymq.message_gen_started_seq',"
            " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)\n"
            "VACUUM FULL lonnymq.message\n"
        )
    if consumes:
        head += (
            f"SELECT count(*) FROM pgmq.send_batch('q', array_fill('{msgs[0]}'::jsonb, ARRAY[{backlog}]))\n"
        )
    head += "VACUUM ANALYZE lonnymq.message\n" if facade else "VACUUM ANALYZE pgmq.q_q\n"
    prepared = "".join(f"PREPARE p{i} AS {text}\n" for i, text in enumerate(prepares))
    return "SET synchronous_commit = on\n" + head + prepared + (body + "\n") * (20 + calls)


def _pgmq_databases(cluster: Cluster, dsn: str, trees: list[tuple[str, str]]) -> None:
    """Database ``facade_<name>`` per tree, LonnyMQ migrated by the tree with the facade and its
    queue ``q``; database ``pgmq`` with pgmq's own SQL-only install and its queue ``q``."""
    from pgmq.install import get_embedded_install_sql

    psql = str(cluster.bin / "psql")
    server = dsn.rsplit("/", 1)[0]
    code = (
        "import sys; from lonnymq import Client\n"
        "with Client(sys.argv[1], pool_size=1) as c:\n"
        "    c.migrate(pgmq=True)\n"
    )
    for name, src in trees:
        subprocess.run([psql, dsn, "-qc", f'CREATE DATABASE "facade_{name}"'], check=True)
        env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
        subprocess.run([sys.executable, "-c", code, f"{server}/facade_{name}"], env=env, check=True)
        subprocess.run([psql, f"{server}/facade_{name}", "-qAtc", "SELECT pgmq.create('q')"], check=True)
    subprocess.run([psql, dsn, "-qc", "CREATE DATABASE pgmq"], check=True)
    subprocess.run(
        [psql, f"{server}/pgmq", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"],
        input=get_embedded_install_sql() + "\nSELECT pgmq.create('q');\n",
        text=True,
        check=True,
        capture_output=True,
    )


def _pgmq_count(
    cluster: Cluster, workload: str, trees: list[tuple[str, str]], low: int, high: int, commits: bool = False
) -> dict[str, float]:
    """Instructions per message of a pgmq workload: the facade over each tree, then pgmq (with
    ``commits``, the calls' commits counted too)."""
    per = PGMQ_WORKLOADS[workload][2]
    backlog = high + 40 + 500
    sides = [(name, f"facade_{name}", True) for name, _ in trees] + [("pgmq", "pgmq", False)]
    out = {}
    for label, db, facade in sides:
        counts = [
            cluster.single(_pgmq_script(workload, facade, n, backlog), db, commits) for n in (low, high)
        ]
        out[label] = (counts[1] - counts[0]) / (high - low) / per
        print(f"{workload:9} {label:10} {out[label] / 1000:9.1f}k instructions/message", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="name=path/to/src,... (the first is the reference)")
    ap.add_argument("--workloads", default="pop,drain1,drain100,take,send,send_key")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--no-floor", action="store_true")
    ap.add_argument(
        "--commits",
        action="store_true",
        help="pgmq_* workloads: count each call's commit too (CommitTransactionCommand: the commit"
        " record, the WAL it flushes, the end of the transaction)",
    )
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--profiles",
        type=Path,
        help="keep callgrind's output of each run there (<workload>-<side>-<calls>.out), to read"
        " with callgrind_annotate --inclusive=yes: where a workload's instructions go",
    )
    args = ap.parse_args()
    if args.profiles:
        args.profiles.mkdir(parents=True, exist_ok=True)
        args.profiles.chmod(0o777)  # the single-user backend runs as postgres
    trees = [tuple(t.split("=", 1)) for t in args.trees.split(",")]
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in WORKLOADS and w not in PGMQ_WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join([*WORKLOADS, *PGMQ_WORKLOADS])}")
    low, high = max(1, args.calls // 4), args.calls
    cluster = Cluster(args.bin)
    results: dict[str, dict[str, float]] = {}
    try:
        dsn = cluster.start_bench()
        subprocess.run([str(args.bin / "psql"), dsn, "-qc", _FLOOR_DDL.replace("\n", ";\n")], check=True)
        for name, src in trees:
            cluster.install(dsn, src, f"tree_{name}")
        lacking = {  # (workload, tree) pairs of NEEDS whose function the tree lacks
            (w, name)
            for w in workloads
            if w in NEEDS
            for name, _ in trees
            if subprocess.run(
                [str(args.bin / "psql"), dsn, "-qAt", "-c", f"SELECT to_regproc('tree_{name}.{NEEDS[w]}')"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            == ""
        }
        # The pop floor's constants, from the last tree's queue (nothing rotates in a run).
        last = f"tree_{trees[-1][0]}"
        got = subprocess.run(
            [
                str(args.bin / "psql"),
                dsn,
                "-qAt",
                "-F",
                ",",
                "-c",
                f"SELECT q.id, s.last_value, q.max_attempts, q.lease_ms FROM {last}.queue q, {last}.message_gen_seq s"
                " WHERE q.name = 'q'",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split(",")
        consts = dict(zip(("q", "gen", "max", "lease"), (int(x) for x in got), strict=True))
        if any(w in TREE_FLOORS for w in workloads) and not args.no_floor:
            # The API floors' functions over the last tree's tables.
            floor_ddl = ";\n".join(stmt.as_string(None) for stmt in ddl(last))
            subprocess.run([str(args.bin / "psql"), dsn, "-qc", floor_ddl], check=True)
        if any(w in PGMQ_WORKLOADS for w in workloads):
            _pgmq_databases(cluster, dsn, trees)
        cluster.pg_ctl("stop")
        for w in workloads:
            if w in PGMQ_WORKLOADS:
                results[w] = _pgmq_count(cluster, w, trees, low, high, args.commits)
                continue
            per = WORKLOADS[w][2]
            sides: list[tuple[str, str | None]] = (
                [(name, f"tree_{name}") for name, _ in trees if (w, name) not in lacking]
                if WORKLOADS[w][0] is not None
                else []
            )
            if WORKLOADS[w][1] is not None and not args.no_floor:
                sides.append(("floor", None))
            on_tree: dict[str, str] = {}  # label: a floor's statement on the last tree's tables
            if w in TREE_FLOORS and not args.no_floor:
                for label, template in TREE_FLOORS[w]:
                    # One line: the single-user backend ends a statement at a newline.
                    on_tree[label] = " ".join(template.format(s=last, **consts).split())
                    sides.append((label, last))
            for label, schema in sides:
                backlog = (high + 40) * per + 500
                counts = [
                    cluster.single(
                        _script(w, schema, n, backlog, on_tree.get(label)),
                        profile=args.profiles / f"{w}-{label}-{n}.out" if args.profiles else None,
                    )
                    for n in (low, high)
                ]
                results.setdefault(w, {})[label] = (counts[1] - counts[0]) / (high - low) / per
                print(f"{w:9} {label:10} {results[w][label] / 1000:9.1f}k instructions/message", flush=True)
    finally:
        cluster.remove()
    ref = trees[0][0]
    print(f"\nratios to {ref} (instructions per message; lower is less work):")
    for w, row in results.items():
        if ref in row:  # (not a floor alone)
            print(f"  {w:9} " + "  ".join(f"{k} {v / row[ref]:.3f}" for k, v in row.items()))
    if args.json:
        args.json.write_text(
            json.dumps({"calls": args.calls, "trees": dict(trees), "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
