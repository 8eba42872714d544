"""The real ``lonnymq`` command line in a subprocess: configuration, failures a human can act on
(one line, exit 1; usage errors exit 2), and the commands for messages, queues and dead
letters."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client

_NOT_CONFIG = ("LONNYMQ_DSN", "DATABASE_URL", "LONNYMQ_CONNECT_TIMEOUT")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a machine where nothing is configured and no dev server runs."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_CONFIG and not k.startswith("PG")}
    env["LONNYMQ_DATA_DIR"] = str(tmp_path / "no-server" / "pgdata")
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


def run(tmp_path: Path, *args: str, input: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lonnymq", *args],
        env=_env(tmp_path, **env),
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_failure(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def db(dsn: str, schema: str) -> list[str]:
    """The global options pointing at this test's schema (given after the command)."""
    return ["--dsn", dsn, "--schema", schema]


# -- configuration and connection failures -------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["queue", "list"], ["send", "jobs", "x"], ["peek", "jobs"], ["dlq", "list", "jobs"], ["migrate"]],
)
def test_nothing_configured_fails_fast_naming_what_to_set(tmp_path: Path, command: list[str]) -> None:
    t0 = time.monotonic()
    line = one_line_failure(run(tmp_path, *command))
    # At once: no server started, no connection waited for (the bound only leaves room for a
    # slow interpreter start on a loaded machine; starting a server takes longer than that).
    assert time.monotonic() - t0 < 20
    assert "LONNYMQ_DSN" in line and "lonnymq server start" in line
    assert not (tmp_path / "no-server").exists()  # nothing was started or initialised


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("before", [True, False])
def test_unreachable_server_is_one_line_at_once(tmp_path: Path, before: bool) -> None:
    dsn = f"postgresql://nobody@127.0.0.1:{_closed_port()}/nothing"
    args = ["--dsn", dsn, "queue", "list"] if before else ["queue", "list", "--dsn", dsn]
    t0 = time.monotonic()
    line = one_line_failure(run(tmp_path, *args))
    # No retries: a refused connection fails at once (the bound leaves room for a slow
    # interpreter start; the client's retry deadline is 30 s).
    assert time.monotonic() - t0 < 20
    assert line.startswith("lonnymq: cannot connect to nobody@127.0.0.1:") and "refused" in line


def test_dsn_from_environment_chain(tmp_path: Path, dsn: str, schema: str) -> None:
    # DATABASE_URL when LONNYMQ_DSN is unset; LONNYMQ_DSN wins over it; --dsn over both.
    bad = f"postgresql://nobody@127.0.0.1:{_closed_port()}/nothing"
    assert run(tmp_path, "queue", "list", "--schema", schema, DATABASE_URL=dsn).returncode == 0
    one_line_failure(run(tmp_path, "queue", "list", "--schema", schema, DATABASE_URL=dsn, LONNYMQ_DSN=bad))
    proc = run(tmp_path, "queue", "list", "--schema", schema, "--dsn", dsn, LONNYMQ_DSN=bad)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "bad", ["not a dsn", "http://db.example.com", "postgresql://app:s3cret@127.0.0.1/app?bogus=1"]
)
@pytest.mark.parametrize(
    "command",
    [["queue", "list"], ["shard", "status"], ["shard", "move", "jobs", "1"], ["worker", "dsn_app:app"]],
    ids=" ".join,
)
def test_malformed_dsn_says_what_a_dsn_looks_like(tmp_path: Path, bad: str, command: list[str]) -> None:
    # Was "database error: missing "=" after "not" in connection info string".
    (tmp_path / "dsn_app.py").write_text(
        "from lonnymq.worker import App\napp = App()\n@app.handler('jobs')\ndef h(job): pass\n"
    )
    path = os.pathsep.join(p for p in [str(tmp_path), os.environ.get("PYTHONPATH")] if p)
    line = one_line_failure(run(tmp_path, *command, LONNYMQ_DSN=bad, PYTHONPATH=path))
    assert line.startswith("lonnymq: invalid DSN (")
    assert "postgresql://USER@HOST:PORT/DBNAME" in line and "host=HOST dbname=DBNAME" in line
    assert "s3cret" not in line


def test_pg_variables_mean_libpq_defaults(tmp_path: Path) -> None:
    # With only PGHOST/PGPORT set, libpq's defaults are used (not the dev-server advice).
    line = one_line_failure(run(tmp_path, "queue", "list", PGHOST="127.0.0.1", PGPORT=str(_closed_port())))
    assert "cannot connect to libpq's defaults" in line and "refused" in line


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run(tmp_path, "queue").returncode == 2
    assert run(tmp_path, "peek").returncode == 2  # missing queue
    assert run(tmp_path, "--no-such-option", "queue", "list").returncode == 2
    bad_pair = run(tmp_path, "ack", "jobs", "12", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert bad_pair.returncode == 2 and "ID:TOKEN" in bad_pair.stderr


def test_version(tmp_path: Path) -> None:
    import lonnymq

    proc = run(tmp_path, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"lonnymq {lonnymq.__version__}"


def test_schema_not_installed_says_migrate(tmp_path: Path, dsn: str) -> None:
    line = one_line_failure(
        run(tmp_path, "queue", "list", "--dsn", dsn, "--schema", "lonnymq_never_installed")
    )
    assert "run `lonnymq migrate --schema lonnymq_never_installed`" in line


def test_unknown_queue(tmp_path: Path, db: list[str]) -> None:
    for command in (["peek", "nope"], ["send", "nope", "x"], ["queue", "purge", "nope", "--yes"]):
        line = one_line_failure(run(tmp_path, *command, *db))
        assert "nope" in line and "does not exist" in line


def test_migrate_blocked_by_a_long_transaction_says_who(tmp_path: Path, dsn: str) -> None:
    """Migration 0018 alters `settled`, which every ack writes: while a forgotten transaction
    holds the table, migrate gives way (lock_timeout) and at last names the session; once it
    has ended, migrate applies it."""
    schema = fresh_schema_name()
    try:
        with Client(dsn, schema=schema, pool_size=1) as c:
            c.migrate(target=17)
        with psycopg.connect(dsn) as holder:
            holder.execute(sql.SQL("SELECT count(*) FROM {}.settled").format(sql.Identifier(schema)))
            args = ("migrate", "--dsn", dsn, "--schema", schema, "--lock-timeout", "0.1", "--attempts", "2")
            line = one_line_failure(run(tmp_path, *args))
            assert f"pid {holder.info.backend_pid} (idle in transaction" in line, line
            assert "gave up after 2 attempt(s)" in line and "nothing was changed" in line
        proc = run(tmp_path, *args)
        assert proc.returncode == 0 and "applied migrations [18" in proc.stdout, proc.stderr
    finally:
        drop_schema(dsn, schema)


# -- send ------------------------------------------------------------------------------------------


def test_send_missing_file(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    line = one_line_failure(run(tmp_path, "send", "jobs", "--file", str(tmp_path / "missing.jsonl"), *db))
    assert "missing.jsonl: No such file or directory" in line


def test_send_malformed_line_sends_nothing(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    path = tmp_path / "events.jsonl"
    # More lines than one batch before the bad one: earlier batches must roll back too.
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(5)) + "\n{not json\n" + '{"n": 99}\n')
    line = one_line_failure(run(tmp_path, "send", "jobs", "--file", str(path), "--batch-size", "2", *db))
    assert "line 7" in line and "nothing was sent" in line
    assert client.metrics("jobs").ready == 0


def test_send_file_and_stdin(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    path = tmp_path / "events.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\n')
    proc = run(tmp_path, "send", "jobs", "--file", str(path), *db)
    assert proc.returncode == 0 and "2 created" in proc.stdout
    proc = run(tmp_path, "send", "jobs", "--file", "-", "--json", *db, input='"three"\n')
    assert [r["outcome"] for r in json.loads(proc.stdout)] == ["created"]
    assert [m.payload for m in client.peek("jobs")] == [{"n": 1}, {"n": 2}, "three"]


# -- take, ack, nack, extend -------------------------------------------------------------------------


def _take(tmp_path: Path, db: list[str], *extra: str) -> list[dict[str, object]]:
    proc = run(tmp_path, "take", "jobs", *extra, "--json", *db)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)
    return rows


def test_take_then_ack_nack_extend_by_id_and_token(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs", max_attempts=5)
    client.send_batch("jobs", ["a", "b", "c"])
    a, b, c = _take(tmp_path, db, "-n", "3")
    pair = f"{a['id']}:{a['token']}"
    ext = run(tmp_path, "extend", "jobs", pair, "--lease", "120", *db)
    assert ext.returncode == 0 and "leased until" in ext.stdout
    assert run(tmp_path, "ack", "jobs", pair, *db).returncode == 0
    # The same delivery again (a retry after a lost reply): settling is idempotent.
    assert run(tmp_path, "ack", "jobs", pair, *db).returncode == 0
    # A token this message never had is stale: refused, naming the id.
    line = one_line_failure(run(tmp_path, "ack", "jobs", f"{b['id']}:{b['token'] + 7}", *db))
    assert "stale" in line and str(b["id"]) in line
    nack = run(tmp_path, "nack", "jobs", f"{b['id']}:{b['token']}", "--error", "boom", *db)
    assert nack.returncode == 0 and "will be retried" in nack.stdout
    # `take --json | ack -`
    piped = run(tmp_path, "ack", "jobs", "-", *db, input=json.dumps([c]))
    assert piped.returncode == 0, piped.stderr
    [again] = client.take("jobs")
    assert again.payload == "b" and again.last_error == "boom" and again.attempt == 2


def test_take_ack_is_at_most_once(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "once")
    [row] = _take(tmp_path, db, "--ack")
    assert row["payload"] == "once"
    assert client.peek("jobs") == []
    assert "at-most-once" in run(tmp_path, "take", "--help").stdout


# -- peek, dlq, purge, stats -------------------------------------------------------------------------


def test_peek_shows_state_and_iso_times(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["now", "held"])
    client.send("jobs", "later", delay=3600)
    client.take("jobs")  # "now" is leased
    proc = run(tmp_path, "peek", "jobs", "--utc", *db)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "leased" in out and "ready" in out and "scheduled" in out
    assert "+00:00" in out  # ISO 8601 in UTC
    local = run(tmp_path, "peek", "jobs", *db, TZ="Asia/Kolkata")
    assert "+05:30" in local.stdout
    rows = json.loads(run(tmp_path, "peek", "jobs", "--json", *db).stdout)
    assert sorted(r["state"] for r in rows) == ["leased", "ready", "scheduled"]


def test_peek_wraps_instead_of_cutting(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x" * 150 + "END")
    out = run(tmp_path, "peek", "jobs", *db, COLUMNS="60").stdout
    assert "END" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 60


def test_create_with_a_missing_dead_letter_queue_says_create_it_first(tmp_path: Path, db: list[str]) -> None:
    # Was "queue 'jobs.dead' does not exist (see `lonnymq queue list`)", for a queue being created.
    line = one_line_failure(run(tmp_path, "queue", "create", "jobs", "--dead-letter-queue", "jobs.dead", *db))
    assert line == (
        "lonnymq: dead-letter queue 'jobs.dead' does not exist: create it first"
        " (`lonnymq queue create jobs.dead`)"
    )
    assert run(tmp_path, "queue", "create", "jobs.dead", *db).returncode == 0
    proc = run(tmp_path, "queue", "create", "jobs", "--dead-letter-queue", "jobs.dead", *db)
    assert proc.returncode == 0 and proc.stdout == "created queue 'jobs'\n", proc.stderr


def test_migrate_pgmq_says_the_facade_is_installed(
    tmp_path: Path, dsn: str, conn: psycopg.Connection
) -> None:
    # Was "schema 'lonnymq' is up to date (...)" alone, on a database that had no facade before.
    name = f"cli_pgmq_{uuid.uuid4().hex[:10]}"  # one pgmq schema per database: a database of its own
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(dsn, dbname=name)
        assert run(tmp_path, "migrate", "--dsn", url).returncode == 0
        proc = run(tmp_path, "migrate", "--pgmq", "--dsn", url)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith("; the pgmq facade (schema pgmq) serves schema 'lonnymq'")
        data = json.loads(run(tmp_path, "migrate", "--pgmq", "--json", "--dsn", url).stdout)
        assert data == {"schema": "lonnymq", "applied": [], "pgmq": True}
    finally:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_queue_create_help_gives_the_defaults(tmp_path: Path) -> None:
    # Was silent on --max-attempts and --max-payload-bytes and on every default.
    proc = run(tmp_path, "queue", "create", "--help")
    assert proc.returncode == 0
    # Each option's help, wherever argparse wrapped it: from the option to the next one.
    helps = {h.split()[0]: " ".join(h.split()) for h in re.split(r"\n(?=  -)", proc.stdout)}
    for option, default in [
        ("--lease", "(default 30)"),
        ("--max-attempts", "(default 5)"),
        ("--retention", "(default 604800: 7 days)"),
        ("--max-payload-bytes", "(default 1048576: 1 MiB"),
        ("--priority-step", "(default 1)"),
    ]:
        assert default in helps[option], helps[option]


def test_web_on_a_port_in_use_is_one_line(tmp_path: Path, db: list[str]) -> None:
    # Was our "dashboard at http://...:PORT/" and then uvicorn's "ERROR: [Errno 98] ...", exit 3.
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_failure(run(tmp_path, "web", "--read-only", "--port", str(port), *db))
    assert (
        line == f"lonnymq: cannot listen on 127.0.0.1:{port}: address already in use (choose another --port)"
    )


def test_migrate_prints_the_warnings_of_roles_it_could_not_create(
    tmp_path: Path, dsn: str, conn: psycopg.Connection
) -> None:
    # A login without CREATEROLE installs, and the migration warns that it could not create the
    # roles and what to run once they exist: the CLI printed nothing of it (docs/security.md).
    suffix = uuid.uuid4().hex[:10]
    login, prefix, dbname = f"cli_nocreaterole_{suffix}", f"cli_roles_{suffix}", f"cli_roles_{suffix}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
    conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(dbname), sql.Identifier(login)))
    try:
        url = make_conninfo(dsn, dbname=dbname, user=login, options=f"-c lonnymq.role_prefix={prefix}")
        proc = run(tmp_path, "migrate", "--dsn", url)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.splitlines() == [
            f"lonnymq migrate: warning: role {prefix}_{kind} does not exist and {login} may not create"
            " roles; create it and run SELECT lonnymq._apply_privileges()"
            for kind in ("producer", "consumer", "admin", "monitor")
        ]
    finally:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def test_dlq_list_follows_the_dead_letter_queue(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs.dead")
    client.create_queue("jobs", max_attempts=1, dead_letter_queue="jobs.dead")
    client.create_queue("other", max_attempts=1)
    client.send("jobs", {"job": 1})
    client.nack(client.take("jobs")[0], error="it broke")
    client.send("other", {"job": 2})
    client.nack(client.take("other")[0], error="archived")
    rows = json.loads(run(tmp_path, "dlq", "list", "jobs", "--json", *db).stdout)
    assert [(r["in"], r["last_error"], r["payload"]) for r in rows] == [("jobs.dead", "it broke", {"job": 1})]
    rows = json.loads(run(tmp_path, "dlq", "list", "other", "--json", *db).stdout)
    assert [(r["in"], r["last_error"]) for r in rows] == [("archive", "archived")]


def test_purge_asks_and_counts(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["a", "b", "c"])
    refused = run(tmp_path, "queue", "purge", "jobs", *db, input="")
    line = one_line_failure(refused, code=2)
    assert "--yes" in line
    assert client.metrics("jobs").ready == 3
    proc = run(tmp_path, "queue", "purge", "jobs", "--yes", *db)
    assert proc.returncode == 0 and "purged 3 message(s)" in proc.stdout
    assert client.metrics("jobs").ready == 0


def test_stats_counts_are_exact_past_the_cap(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["a", "b", "c", "d"])
    client.send("jobs", "later", delay=3600)
    client.take("jobs")
    assert client.metrics("jobs", cap=2).ready == 2  # the bounded count stops at its cap
    [row] = json.loads(run(tmp_path, "queue", "stats", "jobs", "--cap", "2", "--json", *db).stdout)
    assert (row["ready"], row["scheduled"], row["leased"]) == (3, 1, 1)
    [exact] = json.loads(run(tmp_path, "queue", "stats", "--exact", "--json", *db).stdout)
    clock = ("oldest_ready_age_ms", "oldest_age_ms", "newest_age_ms")  # read at different instants
    assert {k: v for k, v in exact.items() if k not in clock} == {
        k: v for k, v in row.items() if k not in clock
    }


def test_json_everywhere_and_options_before_the_command(tmp_path: Path, dsn: str, schema: str) -> None:
    g = ["--dsn", dsn, "--schema", schema, "--json"]
    assert json.loads(run(tmp_path, *g, "queue", "create", "jobs").stdout) == {
        "queue": "jobs",
        "created": True,
    }
    assert json.loads(run(tmp_path, *g, "send", "jobs", "1").stdout)[0]["outcome"] == "created"
    assert json.loads(run(tmp_path, *g, "queue", "purge", "jobs", "--yes").stdout)["purged"] == 1
    assert json.loads(run(tmp_path, *g, "dlq", "purge", "jobs").stdout)["deleted"] == 0
    assert json.loads(run(tmp_path, *g, "queue", "drop", "jobs").stdout)["dropped"] is True
    assert json.loads(run(tmp_path, *g, "migrate").stdout)["applied"] == []


def test_bash_completion(tmp_path: Path) -> None:
    proc = run(tmp_path, "completion", "bash")
    assert proc.returncode == 0
    script = tmp_path / "lonnymq.bash"
    script.write_text(proc.stdout)
    check = (
        f"source {script}\n"
        "COMP_WORDS=(lonnymq queue pu); COMP_CWORD=2; _lonnymq; echo ${COMPREPLY[@]}\n"
        "COMP_WORDS=(lonnymq --dsn x queue purge --y); COMP_CWORD=5; _lonnymq; echo ${COMPREPLY[@]}\n"
        "COMP_WORDS=(lonnymq se); COMP_CWORD=1; _lonnymq; echo ${COMPREPLY[@]}\n"
    )
    out = subprocess.run(["bash", "-c", check], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["purge", "--yes", "send server"]


def test_pause_and_resume(tmp_path: Path, db: list[str], client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "a")
    proc = run(tmp_path, "queue", "pause", "jobs", *db)
    assert proc.returncode == 0 and "paused queue 'jobs'" in proc.stdout
    assert client.take("jobs") == []
    again = json.loads(run(tmp_path, "queue", "pause", "jobs", "--json", *db).stdout)
    assert again == {"queue": "jobs", "paused": True, "changed": False}
    [listed] = json.loads(run(tmp_path, "queue", "list", "--json", *db).stdout)
    assert listed["paused"] is True
    assert "paused" in run(tmp_path, "queue", "list", *db).stdout
    [stats] = json.loads(run(tmp_path, "queue", "stats", "jobs", "--json", *db).stdout)
    assert (stats["paused"], stats["ready"]) == (True, 1)
    proc = run(tmp_path, "queue", "resume", "jobs", *db)
    assert proc.returncode == 0 and "resumed queue 'jobs'" in proc.stdout
    assert json.loads(run(tmp_path, "queue", "resume", "jobs", "--json", *db).stdout)["changed"] is False
    assert [m.payload for m in client.take("jobs")] == ["a"]
    line = one_line_failure(run(tmp_path, "queue", "pause", "nope", *db))
    assert "nope" in line and "does not exist" in line
