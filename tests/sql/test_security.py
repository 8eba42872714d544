"""Roles and privileges (baseline migration, sql/security.sql), tested with real LOGIN roles.

lonnymq_producer may only send, lonnymq_consumer only take and settle, lonnymq_admin manages
queues; none of them may touch a table directly. API functions are SECURITY DEFINER with a
pinned search_path (proven against a search_path hijack that works once the pin is removed);
nothing is executable by PUBLIC; no text argument of any API function reaches SQL as code.

Roles are cluster-wide: every role made here has a unique name and is dropped afterwards.
The shared group roles (lonnymq_producer, ...) are what every install creates; they stay.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client, Envelope, errors
from lonnymq.sql import FILES

PRIVILEGE = psycopg.errors.InsufficientPrivilege
MakeLogin = Callable[..., str]


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _can_create_roles(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    if not row or not row[0]:
        pytest.skip("the test DSN's user may not create roles")


@pytest.fixture
def login(dsn: str) -> Iterator[MakeLogin]:
    """login(*member_of, **attrs) -> DSN of a new LOGIN role; all are dropped at teardown."""
    made: list[str] = []

    def make(*member_of: str, createdb_grant: bool = False) -> str:
        name = f"lmq_login_{uuid.uuid4().hex[:10]}"
        password = secrets.token_hex(12)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
            made.append(name)
            for group in member_of:
                c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name)))
            if createdb_grant:
                c.execute(
                    sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                        sql.Identifier(c.execute("SELECT current_database()").fetchone()[0]),  # type: ignore[index]
                        sql.Identifier(name),
                    )
                )
        return make_conninfo(dsn, user=name, password=password)

    yield make
    with psycopg.connect(dsn, autocommit=True) as c:
        for name in made:
            # DROP OWNED also revokes what was granted to the role (incl. on the database).
            c.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def setup(client: Client) -> Client:
    """Queue "q" (dead letters to "dlq") holding one ready message, as the owner."""
    client.create_queue("dlq")
    client.create_queue("q", dead_letter_queue="dlq", max_attempts=3)
    client.send("q", {"n": 0})
    return client


def _table_access(dsn: str, schema: str) -> list[str]:
    """Which direct table statements succeed on this login (each tried in its own transaction)."""
    allowed = []
    statements = {
        "select message": "SELECT * FROM {s}.message",
        "select message_logged": "SELECT * FROM {s}.message_logged",
        "select archive": "SELECT * FROM {s}.archive",
        "select queue": "SELECT * FROM {s}.queue",
        "select migration": "SELECT * FROM {s}.migration",
        "insert message": "INSERT INTO {s}.message (queue_id, dequeue_at, scheduled_at, enqueued_at, payload)"
        " SELECT id, 0, 0, 0, 'x' FROM {s}.queue",
        "update message": "UPDATE {s}.message SET payload = 'evil'",
        "delete message": "DELETE FROM {s}.message",
        "truncate message": "TRUNCATE {s}.message",
        "update queue": "UPDATE {s}.queue SET max_attempts = 1000",
        "select security_grant": "SELECT * FROM {s}.security_grant",
        "insert security_grant": "INSERT INTO {s}.security_grant VALUES ('queue_create', 'producer')",
        "create table": "CREATE TABLE {s}.evil (x int)",
    }
    with psycopg.connect(dsn) as c:
        for what, text in statements.items():
            try:
                with c.transaction():
                    c.execute(sql.SQL(text).format(s=sql.Identifier(schema)))  # type: ignore[arg-type]
                allowed.append(what)
            except psycopg.errors.InsufficientPrivilege:
                pass
    return allowed


def _call(dsn: str, schema: str, fn: Callable[[Client], Any]) -> Any:
    with Client(dsn, schema=schema, pool_size=1) as c:
        return fn(c)


def _denied(dsn: str, schema: str, fn: Callable[[Client], Any]) -> bool:
    try:
        _call(dsn, schema, fn)
    except errors.PermissionDenied:  # the client's typed form of InsufficientPrivilege
        return True
    return False


def _count(conn: psycopg.Connection, schema: str, table: str = "message") -> int:
    q = sql.SQL("SELECT count(*) FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    return int(conn.execute(q).fetchone()[0])  # type: ignore[index]


# -- what each role may do -----------------------------------------------------------------


def test_producer_can_only_send(
    setup: Client, schema: str, login: MakeLogin, conn: psycopg.Connection
) -> None:
    dsn = login("lonnymq_producer")
    sent = _call(dsn, schema, lambda c: c.send("q", b"from producer", key="k"))
    assert sent.outcome == "created"
    with psycopg.connect(dsn) as c:  # the plain send (what a client's plain message calls)
        plain = c.execute(
            sql.SQL("SELECT {}.send_plain('q', 'plain'::bytea)").format(sql.Identifier(schema))
        ).fetchone()
        # The keyed plain send (what a pooled client's plain message calls: it keys each send).
        once = c.execute(
            sql.SQL("SELECT {}.send_plain_once('q', 'once'::bytea, gen_random_uuid())").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    assert plain is not None and plain[0] > sent.id
    assert once is not None and once[0] > plain[0]
    assert _call(dsn, schema, lambda c: c.send("q", b"pooled")).id > once[0]
    assert [
        r.outcome for r in _call(dsn, schema, lambda c: c.send_batch("q", [b"a", Envelope(b"b", key="k")]))
    ] == ["created", "ignored"]
    for name, fn in {
        "next_ready_in": lambda c: c.run(c.ops.next_ready_in("q")),
        "take": lambda c: c.take("q"),
        "take_tx": lambda c: c.take_tx("q"),
        "peek": lambda c: c.peek("q"),
        "metrics": lambda c: c.metrics("q"),
        "create_queue": lambda c: c.create_queue("evil"),
        "purge_queue": lambda c: c.purge_queue("q"),
        "drop_queue": lambda c: c.drop_queue("q"),
        "list_queues": lambda c: c.list_queues(),
        "dead_letters": lambda c: c.dead_letters("q"),
        "requeue_dead": lambda c: c.requeue_dead("q"),
        "maintain": lambda c: c.maintain(),
    }.items():
        assert _denied(dsn, schema, fn), name
    assert _table_access(dsn, schema) == ["select migration"]
    # setup's, the keyed send, the plain sends (unkeyed, keyed, the pooled client's), the batch's new one
    assert _count(conn, schema) == 6


def test_consumer_can_only_take_and_settle(
    setup: Client, schema: str, login: MakeLogin, conn: psycopg.Connection
) -> None:
    dsn = login("lonnymq_consumer")
    with Client(dsn, schema=schema, pool_size=1) as c:
        [m] = c.take("q", lease=30)
        assert m.payload == {"n": 0}
        assert set(c.extend([m], lease=60)) == {m.id}
        assert c.nack(m, error="boom") == {m.id: "retry"}
        [m] = c.take("q")
        assert m.attempt == 2 and m.last_error == "boom"
        assert c.ack(m) == {m.id}
        setup.send("q", b"for take_tx")
        with psycopg.connect(dsn) as tx:
            assert [x.body for x in c.take_tx("q", conn=tx)] == [b"for take_tx"]
        setup.send("q", b"for receive")
        [r] = c.receive("q", timeout=5)  # LISTEN + take + next_ready_in
        c.defer(r, delay=0)
        assert c.metrics("q").ready == 1
    for name, fn in {
        "send": lambda c: c.send("q", b"x"),
        "peek": lambda c: c.peek("q"),
        "create_queue": lambda c: c.create_queue("evil"),
        "purge_queue": lambda c: c.purge_queue("q"),
        "drop_queue": lambda c: c.drop_queue("q"),
        "dead_letters": lambda c: c.dead_letters("q"),
        "requeue_dead": lambda c: c.requeue_dead("q"),
        "purge_dead": lambda c: c.purge_dead("q"),
        "maintain": lambda c: c.maintain(),
    }.items():
        assert _denied(dsn, schema, fn), name
    assert _table_access(dsn, schema) == ["select migration"]
    assert _count(conn, schema) == 1


def test_admin_manages_queues_through_functions_only(setup: Client, schema: str, login: MakeLogin) -> None:
    dsn = login("lonnymq_admin")
    with Client(dsn, schema=schema, pool_size=1) as c:
        assert c.create_queue("made.by.admin", max_attempts=1)
        assert {i.name for i in c.list_queues()} == {"dlq", "q", "made.by.admin"}
        c.send("made.by.admin", b"x")
        assert [m.body for m in c.peek("made.by.admin")] == [b"x"]
        [m] = c.take("made.by.admin")
        assert c.nack(m) == {m.id: "dead"}
        assert len(c.dead_letters("made.by.admin")) == 1
        assert c.requeue_dead("made.by.admin") == 1
        c.purge_queue("made.by.admin")
        assert c.metrics("made.by.admin").ready == 0
        assert c.maintain() == 0
        assert c.purge_dead("made.by.admin") == 0
        assert c.drop_queue("made.by.admin")
    assert _table_access(dsn, schema) == ["select migration"]
    with psycopg.connect(dsn) as c:  # internal functions are the owner's
        for fn in ("_invalid('x')", "_apply_privileges()", "_check_limit(1)"):
            with pytest.raises(PRIVILEGE):
                c.execute(sql.SQL("SELECT {}.").format(sql.Identifier(schema)) + sql.SQL(fn))  # type: ignore[operator]
            c.rollback()


#: What lonnymq_monitor may call (migrations 0011, 0014): the functions that only read.
MONITOR_READS = {
    "now_ms",
    "queue_list",
    "queue_info",
    "queue_metrics",
    "worker_queues",
    "next_ready_in",
    "peek",
    "channel_list",
    "message_get",
    "message_list",
    "archive_list",
    "dead_list",
    "stats_minutes",
    "stats_totals",
    "worker_list",
    "cron_list",
    "spark_queue_check",
    "spark_id_range",
    "spark_read_messages",
    "spark_read_archive",
    "spark_read_packed",
    "spark_write_status",
}


def test_monitor_reads_everything_and_changes_nothing(
    setup: Client, schema: str, login: MakeLogin, conn: psycopg.Connection
) -> None:
    from lonnymq.worker.ops import worker_ops

    setup.create_queue("once", max_attempts=1)
    setup.send("once", b"doomed", channel="c1")
    setup.nack(setup.take("once")[0], error="boom")
    dsn = login("lonnymq_monitor")
    with Client(dsn, schema=schema, pool_size=1) as c:
        assert [q.name for q in c.list_queues()] == ["dlq", "once", "q"]
        assert c.metrics("q").ready == 1 and c.metrics("once").dead == 1
        [m] = c.peek("q")
        assert c.get("q", id=m.id) is not None
        assert [x.id for x in c.run(c.ops.message_list("q"))] == [m.id]
        assert [d.last_error for d in c.dead_letters("once")] == ["boom"]
        assert [a.status for a in c.archived("once")] == ["dead"]
        assert c.channels("once") == []
        assert c.run(c.ops.next_ready_in("q")) == 0
        assert {x.queue for x in c.run(c.ops.stats_totals(["q", "once"]))} == {"q", "once"}
        assert c.run(c.ops.stats_minutes(["q"], since=int(time.time() * 1000) - 600_000))
        assert c.run(c.ops.worker_list()) == []
        assert c.run(worker_ops(schema).cron_list()) == []
        for name, fn in {
            "send": lambda c: c.send("q", b"x"),
            "take": lambda c: c.take("q"),
            "pause_queue": lambda c: c.pause_queue("q"),
            "purge_queue": lambda c: c.purge_queue("q"),
            "requeue_dead": lambda c: c.requeue_dead("once"),
            "cancel": lambda c: c.cancel("q", id=m.id),
            "maintain": lambda c: c.maintain(),
        }.items():
            assert _denied(dsn, schema, fn), name
    # Every other API function is refused before it runs, whatever its arguments.
    functions = conn.execute(
        "SELECT p.oid, p.proname, ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)"
        "  FROM pg_proc p WHERE p.pronamespace = %s::regnamespace AND NOT starts_with(p.proname, '_')"
        "   AND p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype ORDER BY p.proname",
        (schema,),
    ).fetchall()
    assert {name for _, name, _ in functions} >= MONITOR_READS
    refused = []
    with psycopg.connect(dsn, autocommit=True) as m_conn:
        for oid, name, types in functions:
            [(granted,)] = conn.execute(
                "SELECT has_function_privilege('lonnymq_monitor', %s, 'EXECUTE')", (oid,)
            ).fetchall()
            assert granted == (name in MONITOR_READS), name
            if name in MONITOR_READS:
                continue
            # The arguments come from a subquery (OFFSET 0 keeps it one), not as constants: the
            # planner folds a STRICT function of a NULL constant away without calling it.
            args = [sql.Identifier(f"a{i}") for i in range(len(types))]
            call = sql.SQL("SELECT {}.{}({}) FROM (SELECT {} OFFSET 0) s").format(
                sql.Identifier(schema),
                sql.Identifier(name),
                sql.SQL(", ").join(args),
                sql.SQL(", ").join(
                    sql.SQL("NULL::{} AS {}").format(sql.SQL(t), a)  # type: ignore[arg-type]
                    for t, a in zip(types, args, strict=True)
                ),
            )
            try:
                m_conn.execute(call)
            except PRIVILEGE:
                refused.append(name)
    assert sorted(refused) == sorted(name for _, name, _ in functions if name not in MONITOR_READS)
    assert {"queue_pause", "queue_resume", "send_batch", "take", "ack", "queue_drop"} <= set(refused)
    assert _table_access(dsn, schema) == ["select migration"]
    assert _count(conn, schema) == 1
    assert setup.metrics("once").dead == 1


def test_a_login_without_a_lonnymq_role_can_do_nothing(setup: Client, schema: str, login: MakeLogin) -> None:
    dsn = login()
    for fn in (
        lambda c: c.send("q", b"x"),
        lambda c: c.take("q"),
        lambda c: c.list_queues(),
        lambda c: c.create_queue("x"),
    ):
        assert _denied(dsn, schema, fn)
    assert _table_access(dsn, schema) == []


# -- the catalog: DEFINER functions are pinned, nothing is PUBLIC ---------------------------


@pytest.mark.parametrize(
    "reapplied", [(), ("take.sql",), ("security.sql",), tuple(f"{f}.sql" for f in FILES)]
)
def test_every_function_is_private_or_a_pinned_definer(dsn: str, reapplied: tuple[str, ...]) -> None:
    """After a fresh install, and after migrate re-applied function files whose recorded
    checksum is stale (an upgrade; CREATE OR REPLACE resets SECURITY DEFINER and search_path):
    no function is executable by PUBLIC; every API function (no leading '_') is SECURITY DEFINER
    with search_path = pg_catalog, pg_temp; every SECURITY DEFINER function pins search_path."""
    name = fresh_schema_name()
    try:
        with Client(dsn, schema=name, pool_size=1) as c:
            c.migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                stale = conn.execute(
                    sql.SQL(
                        "UPDATE {}.migration_repeatable SET checksum = 'stale' WHERE name = ANY (%s)"
                    ).format(sql.Identifier(name)),
                    (list(reapplied),),
                ).rowcount
            assert stale == len(reapplied)
            c.migrate()
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT p.oid::regprocedure::text, p.proname, p.prosecdef, p.proconfig,"
                "       has_function_privilege('public', p.oid, 'EXECUTE'), p.prorettype = 'trigger'::regtype"
                "  FROM pg_proc p WHERE p.pronamespace = %s::regnamespace",
                (name,),
            ).fetchall()
    finally:
        drop_schema(dsn, name)
    assert len(rows) > 20
    bad = []
    for sig, proname, definer, config, public, trigger in rows:
        if public:
            bad.append(f"{sig}: executable by PUBLIC")
        api = not proname.startswith("_") and not trigger
        # The hot paths also pin their plans (sql/settle.sql's and sql/take.sql's headers).
        pins = {
            "plan_cache_mode=force_generic_plan",
            "enable_seqscan=off",
            "enable_sort=off",
            "jit=off",
            "enable_memoize=off",
        }
        config = [c for c in config or [] if c not in pins]
        if (api or definer) and (not definer or config != ["search_path=pg_catalog, pg_temp"]):
            bad.append(f"{sig}: definer={definer} config={config}")
    assert bad == []


def test_roles_get_on_tables_exactly_what_security_grant_says(
    client: Client, schema: str, conn: psycopg.Connection
) -> None:
    """The core's tables (and both message partitions) grant nothing; the only table privileges
    are the rows of security_grant (the version table, and what later migrations registered)."""
    client.create_queue("q")
    rows = conn.execute(
        "SELECT c.relname, r.rolname, p.privilege_type"
        "  FROM pg_class c, pg_roles r, unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE',"
        "       'REFERENCES','TRIGGER']) AS p(privilege_type)"
        " WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')"
        "   AND r.rolname IN ('lonnymq_producer', 'lonnymq_consumer', 'lonnymq_admin', 'lonnymq_monitor')"
        "   AND has_table_privilege(r.oid, c.oid, p.privilege_type)",
        (schema,),
    ).fetchall()
    policy = conn.execute(
        sql.SQL(
            "SELECT g.object, r.rolname, p FROM {s}.security_grant g JOIN {s}.security_role r USING (kind),"
            " unnest(g.privileges) p WHERE p <> 'EXECUTE'"
        ).format(s=sql.Identifier(schema))
    ).fetchall()
    assert sorted(rows) == sorted(policy)
    assert ("migration", "lonnymq_producer", "SELECT") in rows
    core = {"queue", "message", "message_logged", "message_unlogged", "archive", "channel"}
    core |= {"security_role", "security_grant"}
    assert [r for r in rows if r[0] in core] == []
    assert conn.execute("SELECT has_schema_privilege('public', %s, 'USAGE')", (schema,)).fetchone() == (
        False,
    )


def test_apply_privileges_is_idempotent_and_refuses_unknown_names(
    client: Client, schema: str, conn: psycopg.Connection
) -> None:
    s = sql.Identifier(schema)
    client.create_queue("q")

    def acls() -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT proname, proacl::text, prosecdef, proconfig FROM pg_proc WHERE pronamespace = %(s)s::regnamespace"
            " UNION ALL SELECT relname, relacl::text, null, null FROM pg_class WHERE relnamespace = %(s)s::regnamespace"
            " ORDER BY 1, 2",
            {"s": schema},
        ).fetchall()

    conn.execute(sql.SQL("SELECT {}._apply_privileges()").format(s))
    before = acls()
    conn.execute(sql.SQL("SELECT {}._apply_privileges()").format(s))
    assert acls() == before
    conn.execute(
        sql.SQL("INSERT INTO {}.security_grant (object, kind) VALUES ('sned_batch', 'producer')").format(s)
    )
    with pytest.raises(psycopg.Error) as e:
        conn.execute(sql.SQL("SELECT {}._apply_privileges()").format(s))
    assert e.value.sqlstate == "LQ002" and "sned_batch" in str(e.value)
    assert acls() == before


# -- search_path hijacking --------------------------------------------------------------------


def test_a_callers_search_path_cannot_hijack_definer_functions(
    setup: Client, schema: str, login: MakeLogin, dsn: str
) -> None:
    """A consumer owning a schema defines '=' operators that raise with the current user, and puts
    that schema before pg_catalog. The pinned functions never see them. Without the pin, the
    same call runs the consumer's code as the functions' owner: the attack the pin stops."""
    consumer = login("lonnymq_consumer")
    user = psycopg.conninfo.conninfo_to_dict(consumer)["user"]
    evil = f"evil_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(evil), sql.Identifier(str(user))
            )
        )
    try:
        with psycopg.connect(consumer, autocommit=True) as c:
            e = sql.Identifier(evil)
            for t in ("text", "integer", "bigint"):
                c.execute(
                    sql.SQL(
                        "CREATE FUNCTION {e}.eq(a {t}, b {t}) RETURNS boolean LANGUAGE plpgsql AS"
                        " $$ BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END $$"
                    ).format(e=e, t=sql.SQL(t))
                )
                c.execute(
                    sql.SQL(
                        "CREATE OPERATOR {e}.= (LEFTARG = {t}, RIGHTARG = {t}, FUNCTION = {e}.eq)"
                    ).format(e=e, t=sql.SQL(t))
                )
            c.execute(sql.SQL("SET search_path = {}, pg_catalog").format(e))
            with pytest.raises(psycopg.Error, match="hijacked as"):
                c.execute("SELECT 'a'::text = 'b'::text")  # the operators work in this session
            mq = Client(c, schema=schema)
            [m] = mq.take("q")
            assert mq.ack(m) == {m.id}
        setup.send("q", b"again")
        with psycopg.connect(dsn, autocommit=True) as su:  # remove the pin from take
            su.execute(sql.SQL("ALTER FUNCTION {}.take RESET search_path").format(sql.Identifier(schema)))
            owner = su.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        with psycopg.connect(consumer, autocommit=True) as c:
            c.execute(sql.SQL("SET search_path = {}, pg_catalog").format(sql.Identifier(evil)))
            with pytest.raises(psycopg.Error, match=rf"^hijacked as {re.escape(owner)}\n"):
                Client(c, schema=schema).take("q")
    finally:
        with psycopg.connect(dsn, autocommit=True) as su:
            su.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(evil)))


# -- SQL injection through every text argument ------------------------------------------------


_VALUES: dict[str, Any] = {
    "text": "q",
    "bytea": b"x",
    "bigint": 1,
    "integer": 1,
    "smallint": 1,
    "boolean": False,
    "jsonb": {},
    "uuid": uuid.UUID(int=1),
    "text[]": ["q"],
    "bytea[]": [b"x"],
    "bigint[]": [1],
    "integer[]": [1],
    "smallint[]": [1],
    "jsonb[]": [{}],
    "boolean[]": [False],
}

_EVIL = [
    "x'); DROP TABLE {s}.canary; --",
    'x"; DROP TABLE {s}.canary; --',
    "x$$; DROP TABLE {s}.canary; $$",
    "'; DELETE FROM {s}.canary; SELECT '",
    "q' OR '1'='1",
    "canary",
    "message_1; TRUNCATE {s}.canary",
    "%I%s%L' || (SELECT count(*) FROM {s}.canary) || '",
    "\\'; DROP TABLE {s}.canary; --",
    "{s}.canary",
]


def _api_functions(conn: psycopg.Connection, schema: str) -> list[tuple[str, list[tuple[str, str, bool]]]]:
    """(name, [(arg name, type, has default)]) of every API function of the schema."""
    rows = conn.execute(
        "SELECT p.proname, p.proargnames, p.proargmodes, p.pronargs, p.pronargdefaults,"
        "       ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)"
        "  FROM pg_proc p WHERE p.pronamespace = %s::regnamespace AND p.proname !~ '^_'"
        "   AND p.prokind = 'f' ORDER BY 1",
        (schema,),
    ).fetchall()
    out = []
    for name, argnames, modes, nargs, ndefaults, types in rows:
        names = [n for n, m in zip(argnames or [], modes or ["i"] * nargs, strict=False) if m in ("i", "b")]
        out.append(
            (
                name,
                [(n, t, i >= nargs - ndefaults) for i, (n, t) in enumerate(zip(names, types, strict=True))],
            )
        )
    return out


#: What a hidden statement could change: the relations (partitions, and their indexes, of queues
#: that a legitimate call created are not code), the functions, the roles (cluster-wide: the
#: logins other tests, on other xdist workers, make are left out) and the schemas.
_OBJECTS = [
    "SELECT array_agg(c.oid::regclass::text ORDER BY c.oid) FROM pg_class c"
    " WHERE c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'pg_toast'::regnamespace,"
    "                              'information_schema'::regnamespace)"
    "   AND c.relname !~ '^message_[0-9]+($|_)' AND c.relpersistence <> 't'",
    "SELECT array_agg(p.oid::regprocedure::text ORDER BY p.oid) FROM pg_proc p"
    " WHERE p.pronamespace <> 'pg_catalog'::regnamespace",
    "SELECT array_agg(rolname::text ORDER BY rolname) FROM pg_roles"
    " WHERE rolname !~ '^(lmq_login_|lmq_worker_|lmq_web_|lq_reader_|lmqt_)'",
    "SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace",
]


def _objects(conn: psycopg.Connection) -> tuple[Any, ...]:
    """The lists of _OBJECTS."""
    return tuple(conn.execute(q).fetchone() for q in _OBJECTS)  # type: ignore[arg-type]


#: _OBJECTS' lists as md5s, in one round trip: the test reads them after each of its ~1,150
#: calls, and reading the lists themselves (thousands of names in a database of many test
#: schemas, in four statements) was half of the test's time.
_OBJECTS_DIGEST = "SELECT " + ", ".join(f"md5(({q})::text)" for q in _OBJECTS)


def _digest(conn: psycopg.Connection) -> tuple[Any, ...]:
    return tuple(conn.execute(_OBJECTS_DIGEST).fetchone() or ())  # type: ignore[arg-type]


def _changed(conn: psycopg.Connection, before: tuple[Any, ...]) -> list[Any]:
    """What differs from ``before`` (_objects' lists): the entries gone and the entries new."""
    out = []
    for (was,), (now,) in zip(before, _objects(conn), strict=True):
        out += [("gone", x) for x in sorted(set(was or ()) - set(now or ()))]
        out += [("new", x) for x in sorted(set(now or ()) - set(was or ()))]
    return out or [("reordered", None)]


def test_no_text_argument_of_any_api_function_is_executed(
    setup: Client, schema: str, conn: psycopg.Connection
) -> None:
    """Every text, text[] and jsonb argument of every API function (found in the catalog, so
    functions of later migrations are covered) gets injection strings; whether the call fails
    or not, no statement hidden in them runs: the canary, the catalog and the roles stay."""
    s = sql.Identifier(schema)
    quoted = s.as_string(conn)
    conn.execute(sql.SQL("CREATE TABLE {}.canary (x int); INSERT INTO {}.canary VALUES (1)").format(s, s))
    before = _objects(conn)
    digest = _digest(conn)
    functions = _api_functions(conn, schema)
    assert {"send_batch", "take", "ack", "queue_create"} <= {f for f, _ in functions}
    calls = 0
    for func, args in functions:
        for target, ttype, _ in args:
            if ttype not in ("text", "text[]", "jsonb", "jsonb[]"):
                continue
            for evil in (e.replace("{s}", quoted) for e in _EVIL):
                values: dict[str, Any] = {}
                for name, t, has_default in args:
                    if name == target:
                        v: Any = {
                            "text": evil,
                            "text[]": [evil],
                            "jsonb": {evil: evil},
                            "jsonb[]": [{evil: evil}],
                        }[t]
                    elif has_default:
                        continue
                    elif t in _VALUES:
                        v = _VALUES[t]
                    else:
                        pytest.fail(f"{func}.{name}: no test value for type {t}")
                    if t.startswith("jsonb"):
                        v = (
                            psycopg.types.json.Jsonb(v)
                            if t == "jsonb"
                            else [psycopg.types.json.Jsonb(x) for x in v]
                        )
                    values[name] = (t, v)
                query = sql.SQL("SELECT * FROM {}.{}({})").format(
                    s,
                    sql.Identifier(func),
                    sql.SQL(", ").join(
                        sql.SQL("{} => %s::{}").format(sql.Identifier(n), sql.SQL(t))
                        for n, (t, _) in values.items()
                    ),
                )
                calls += 1
                with conn.transaction(force_rollback=True):  # legit effects (a dropped queue) undone
                    try:
                        with conn.transaction():
                            conn.execute(query, [v for _, v in values.values()])
                    except psycopg.Error as e:
                        assert e.sqlstate and e.sqlstate[:2] in ("LQ", "22", "23", "P0"), (func, target, e)
                    if _digest(conn) != digest:
                        pytest.fail(f"{func}({target} => {evil!r}) changed {_changed(conn, before)}")
                    assert conn.execute(
                        sql.SQL("SELECT array_agg(x) FROM {}.canary").format(s)
                    ).fetchone() == ([1],)
    assert calls > 200
    assert _objects(conn) == before


# -- per-schema roles, installs without CREATEROLE, concurrent installs -------------------


def _migrate_with_prefix(dsn: str, schema: str, prefix: str) -> list[str]:
    """Install ``schema`` with lonnymq.role_prefix set; returns the server's WARNINGs."""
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.add_notice_handler(lambda d: notices.append(f"{d.severity}: {d.message_primary}"))
        c.execute("SELECT set_config('lonnymq.role_prefix', %s, false)", (prefix,))
        Client(c, schema=schema).migrate()
    return [n for n in notices if n.startswith("WARNING")]


@pytest.fixture
def prefixed(dsn: str) -> Iterator[tuple[str, str]]:
    """(schema, prefix): a schema installed with its own roles <prefix>_producer, ..."""
    prefix, name = f"lmqt_{uuid.uuid4().hex[:8]}", fresh_schema_name()
    try:
        assert _migrate_with_prefix(dsn, name, prefix) == []
        yield name, prefix
    finally:
        drop_schema(dsn, name)
        _drop_roles(dsn, prefix)


def _drop_roles(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for kind in ("producer", "consumer", "admin", "monitor"):
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(f"{prefix}_{kind}")))


def test_a_role_prefix_gives_a_schema_its_own_roles(
    setup: Client, schema: str, prefixed: tuple[str, str], login: MakeLogin
) -> None:
    other, prefix = prefixed
    with Client(setup.conninfo, schema=other, pool_size=1) as owner:
        owner.create_queue("q")
    mine, shared = login(f"{prefix}_producer"), login("lonnymq_producer")
    assert _call(mine, other, lambda c: c.send("q", b"x")).outcome == "created"
    assert _denied(mine, schema, lambda c: c.send("q", b"x"))
    assert _denied(shared, other, lambda c: c.send("q", b"x"))
    assert _call(shared, schema, lambda c: c.send("q", b"x")).outcome == "created"


def test_a_bad_role_prefix_installs_nothing(dsn: str, conn: psycopg.Connection) -> None:
    name = fresh_schema_name()
    with pytest.raises(psycopg.Error) as e:
        _migrate_with_prefix(dsn, name, "Bad-Prefix; DROP")
    assert e.value.sqlstate == "LQ002"
    assert conn.execute("SELECT to_regnamespace(%s)", (name,)).fetchone() == (None,)


def test_an_owner_without_createrole_installs_then_grants_later(dsn: str, login: MakeLogin) -> None:
    """Installing needs no CREATEROLE: the missing roles are reported, the schema stays
    owner-only, and once a DBA made the roles, _apply_privileges() grants to them. Also proves the
    DEFINER functions work for a non-superuser owner (queue_create takes an id from a sequence)."""
    owner = login(createdb_grant=True)
    prefix, name = f"lmqt_{uuid.uuid4().hex[:8]}", fresh_schema_name()
    try:
        warnings = _migrate_with_prefix(owner, name, prefix)
        assert len(warnings) == 4 and all("may not create roles" in w for w in warnings)
        with psycopg.connect(dsn, autocommit=True) as su:
            assert su.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname LIKE %s", (prefix + "%",)
            ).fetchone() == (0,)
            for kind in ("producer", "consumer", "admin", "monitor"):
                su.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(f"{prefix}_{kind}")))
        producer, admin = login(f"{prefix}_producer"), login(f"{prefix}_admin")
        assert _denied(admin, name, lambda c: c.create_queue("q"))
        with psycopg.connect(owner, autocommit=True) as c:
            c.execute(sql.SQL("SELECT {}._apply_privileges()").format(sql.Identifier(name)))
        assert _call(admin, name, lambda c: c.create_queue("q"))
        assert _call(producer, name, lambda c: c.send("q", b"x")).outcome == "created"
        assert _denied(producer, name, lambda c: c.take("q"))
    finally:
        drop_schema(dsn, name)
        _drop_roles(dsn, prefix)


def test_concurrent_installs_of_two_schemas_create_the_roles_once(dsn: str) -> None:
    """Roles are cluster-wide and migrations of different schemas do not lock each other: the
    second CREATE ROLE waits for the first transaction and then finds the role made."""
    prefix, first, second = f"lmqt_{uuid.uuid4().hex[:8]}", fresh_schema_name(), fresh_schema_name()
    failure: list[BaseException] = []
    try:
        with psycopg.connect(dsn) as a:
            a.execute("SELECT set_config('lonnymq.role_prefix', %s, false)", (prefix,))
            Client(a, schema=first).migrate(conn=a)  # inside a's open transaction
            b_conn = psycopg.connect(dsn, autocommit=True)
            b_pid = b_conn.info.backend_pid

            def b() -> None:
                try:
                    b_conn.execute("SELECT set_config('lonnymq.role_prefix', %s, false)", (prefix,))
                    Client(b_conn, schema=second).migrate()
                except BaseException as e:
                    failure.append(e)

            t = threading.Thread(target=b)
            t.start()
            with psycopg.connect(dsn, autocommit=True) as watch:
                for _ in range(200):
                    row = watch.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (b_pid,)
                    ).fetchone()
                    if row and row[0] == "Lock":
                        break
                    threading.Event().wait(0.05)
                else:
                    pytest.fail("the second install never waited for the first")
            a.commit()
            t.join(30)
            b_conn.close()
        assert not t.is_alive() and failure == []
        with psycopg.connect(dsn) as c:
            for schema in (first, second):
                assert c.execute(
                    "SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                    (
                        f"{prefix}_producer",
                        f"{schema}.send_batch(text,bytea[],text[],text[],jsonb[],bigint[],bigint[],smallint[],text[],text[],text,bigint,uuid)",
                    ),
                ).fetchone() == (True,)
    finally:
        drop_schema(dsn, first)
        drop_schema(dsn, second)
        _drop_roles(dsn, prefix)


# -- the clock ------------------------------------------------------------------------------


def test_a_consumer_cannot_move_the_clock(setup: Client, schema: str, login: MakeLogin) -> None:
    """p_now (the tests' clock) may not run ahead of the server's clock for anyone but the
    owner: a consumer cannot take another consumer's live lease or a scheduled message early."""
    first, second = login("lonnymq_consumer"), login("lonnymq_consumer")
    [m] = _call(first, schema, lambda c: c.take("q", lease=600))
    setup.send("q", b"later", delay=3600)
    s = sql.Identifier(schema)
    with psycopg.connect(second) as c:
        for func, args in (
            ("take", "'q', 5, NULL, NULL, NULL"),
            ("take_tx", "'q', 5, NULL"),
            ("pop", "'q', 5"),
            ("extend", f"'q', ARRAY[{m.id}]::bigint[], ARRAY[{m.token}], NULL"),
        ):
            with pytest.raises(psycopg.Error) as e:
                c.execute(
                    sql.SQL("SELECT * FROM {}.{}(" + args + ", %s)").format(s, sql.Identifier(func)),  # type: ignore[operator]
                    (m.lease_until + 1,),
                )
            assert e.value.sqlstate == "LQ002", func
            c.rollback()
        # A past clock buys nothing: what it could take is ready anyway.
        assert (
            c.execute(sql.SQL("SELECT * FROM {}.take('q', 5, NULL, NULL, NULL, 0)").format(s)).fetchall()
            == []
        )
    assert _call(first, schema, lambda c: c.ack(m)) == {m.id}
    with psycopg.connect(setup.conninfo) as owner:  # the owner (tests) may
        rows = owner.execute(
            sql.SQL("SELECT id FROM {}.take('q', 5, NULL, NULL, NULL, %s)").format(s),
            (m.lease_until + 3600_000,),
        ).fetchall()
    assert len(rows) == 1
