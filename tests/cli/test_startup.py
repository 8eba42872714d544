"""What a ``lonnymq`` call imports and builds before it runs (docs/startup.md): a command builds
the parser of that command only, and parses exactly as the whole parser does (help, the version
and usage errors come from the whole parser); ``import lonnymq`` imports nothing until a name is
used; a database command imports neither the asyncio client, the other commands, the
development server's machinery nor rich (with ``--json``). Nothing here is timed: the modules a
fresh interpreter holds say what it paid for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

import lonnymq.cli as cli
from lonnymq import Client
from lonnymq.cli.completion import _walk

# Command lines that run a command (each parses), one or more per command, with global options
# before and after it, and option values that are other commands' names.
RUNS = [
    ["--dsn", "postgresql://x@127.0.0.1/x", "queue", "list"],
    ["queue", "list", "--json", "--schema", "s"],
    ["queue", "create", "jobs", "--lease", "30", "--max-attempts", "3", "--if-not-exists"],
    ["queue", "stats", "a", "b", "--exact"],
    ["queue", "purge", "jobs", "--yes"],
    ["send", "jobs", "x", "y", "--priority", "2", "--json"],
    ["--schema", "queue", "send", "jobs", "take"],
    ["peek", "jobs", "-n", "3", "--utc"],
    ["take", "jobs", "-n", "2", "--lease", "10", "--ack"],
    ["ack", "jobs", "1:2", "3:4"],
    ["nack", "jobs", "1:2", "--error", "boom", "--delay", "5"],
    ["extend", "jobs", "1:2", "--lease", "60"],
    ["msg", "get", "jobs", "--id", "7"],
    ["msg", "cancel", "jobs", "--key", "k", "--archive"],
    ["archive", "list", "jobs", "--limit", "5", "--status", "dead"],
    ["dlq", "list", "jobs", "-n", "4"],
    ["dlq", "requeue", "jobs", "--id", "1"],
    ["dlq", "purge", "jobs"],
    ["migrate", "--print-sql", "--pgmq"],
    ["--connect-timeout", "2", "migrate"],
    ["server", "start", "--port", "5999"],
    ["server", "url"],
    ["demo"],
    ["worker", "app:app", "-c", "4", "-q", "a", "b", "--log-format", "json"],
    ["cron", "list"],
    ["cron", "add", "nightly", "0 3 * * *", "--queue", "jobs", "--payload", "{}"],
    ["cron", "remove", "nightly"],
    ["completion", "zsh"],
    ["shard", "status", "postgresql://r@127.0.0.1/r"],
    ["shard", "move", "orders", "1", "--archive"],
    ["web", "--read-only", "--port", "0"],
]

# Command lines the whole parser answers with help, the version or a usage error.
STOPS = [
    [],
    ["--help"],
    ["-h", "queue"],
    ["--version"],
    ["--version", "queue", "list"],
    ["nosuch"],
    ["queue"],
    ["queue", "-h", "list"],
    ["queue", "list", "--nope"],
    ["queue", "create", "x", "--lease", "notanumber"],
    ["peek"],
    ["take", "q", "--help", "x"],
    ["--dsn"],
    ["--schema", "send", "queue"],
]


def outcome(parse: Any, argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, ...]:
    """What parsing ``argv`` gives: the namespace, or the exit status and what was printed."""
    try:
        args = parse(list(argv))
    except SystemExit as e:
        out = capsys.readouterr()
        return ("exit", e.code, out.out, out.err)
    out = capsys.readouterr()
    return ("args", vars(args), out.out, out.err)


def test_the_command_table_names_every_command_in_order() -> None:
    (sub,) = [a for a in cli.build_parser()._actions if a.choices and a.dest == "command"]
    assert [c for commands in cli._COMMANDS.values() for c in commands] == list(sub.choices)


def test_parse_answers_as_the_whole_parser(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    whole = cli.build_parser()
    # What parse() leaves to the whole parser goes to this one (built once: building it is
    # most of the cost of a call, and argparse parsers are reusable).
    monkeypatch.setattr(cli, "build_parser", lambda: whole)
    for argv in RUNS:
        parsed = outcome(cli.parse, argv, capsys)
        assert parsed[0] == "args", (argv, parsed)
        assert parsed == outcome(whole.parse_args, argv, capsys), argv
    helps = [[*path.split()[1:], "--help"] for path, _, _ in _walk(whole, "lonnymq")]
    assert len(helps) > 40  # every command and subcommand
    for argv in STOPS + helps:
        stopped = outcome(cli.parse, argv, capsys)
        assert stopped[0] == "exit", (argv, stopped)
        assert stopped == outcome(whole.parse_args, argv, capsys), argv


def modules_after(code: str, *args: str) -> tuple[str, list[str]]:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``): what it printed on
    stdout, and the modules it held at the end."""
    env = {k: v for k, v in os.environ.items() if k not in ("LONNYMQ_DSN", "DATABASE_URL")}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)",
            *args,
        ],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, list(json.loads(proc.stderr.splitlines()[-1]))


def test_import_lonnymq_imports_nothing_until_a_name_is_used() -> None:
    _, loaded = modules_after("import lonnymq")
    assert [m for m in loaded if m.startswith(("psycopg", "lonnymq."))] == []
    code = (
        "import lonnymq\n"
        "from lonnymq import *\n"
        "for name in lonnymq.__all__:\n"
        "    value = getattr(lonnymq, name)\n"
        "    home = value.__name__ if name == 'errors' else getattr(value, '__module__', repr(value))\n"
        "    print(name, home)\n"
        # what `import lonnymq` used to import is still reachable as attributes
        "print('submodules', lonnymq.models.Message is lonnymq.Message,"
        " lonnymq.client.ops.MAX_LIMIT > 0, bool(lonnymq.sql.FILES), lonnymq.migrations.pgmq.__name__)\n"
    )
    out, _ = modules_after(code)
    *names, submodules = out.splitlines()
    assert submodules == "submodules True True True lonnymq.migrations.pgmq"
    homes = dict(line.split() for line in names)
    assert homes == {
        "DEFAULT_SCHEMA": "'lonnymq'",
        "ArchivedMessage": "lonnymq.models",
        "AsyncClient": "lonnymq.client.aio",
        "ChannelInfo": "lonnymq.models",
        "Client": "lonnymq.client.sync",
        "DeadMessage": "lonnymq.models",
        "Envelope": "lonnymq.models",
        "JsonSerializer": "lonnymq.serializer",
        "Message": "lonnymq.models",
        "OrjsonSerializer": "lonnymq.serializer",
        "QueueInfo": "lonnymq.models",
        "QueueMetrics": "lonnymq.models",
        "SendResult": "lonnymq.models",
        "Serializer": "lonnymq.serializer",
        "errors": "lonnymq.errors",
    }


def test_a_database_command_imports_only_what_it_runs(
    dsn: str, schema: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.create_queue("jobs")
    assert (
        cli.main(["cron", "add", "tick", "0 8 * * *", "--queue", "jobs", "--dsn", dsn, "--schema", schema])
        == 0
    )
    capsys.readouterr()
    code = "from lonnymq.cli import main\nimport sys\nassert main(sys.argv[1:]) == 0"

    def unused(loaded: list[str], *modules: str) -> list[str]:
        return [m for m in loaded if any(m == u or m.startswith(f"{u}.") for u in modules)]

    out, loaded = modules_after(code, "--dsn", dsn, "--schema", schema, "queue", "list", "--json")
    assert [q["name"] for q in json.loads(out)] == ["jobs"]
    assert "lonnymq.client.sync" in loaded  # the checks below look at a command that really ran
    assert sorted(m for m in loaded if m.startswith("lonnymq.cli.")) == [
        "lonnymq.cli._util",
        "lonnymq.cli.queue",
    ]
    assert unused(loaded, "lonnymq.client.aio", "lonnymq.client.wait", "lonnymq.embedded.server") == []
    assert unused(loaded, "lonnymq.worker", "rich") == []

    # Periodic messages are the worker's, but listing them needs no worker runtime (the asyncio
    # client, the Prometheus meters).
    out, loaded = modules_after(code, "--dsn", dsn, "--schema", schema, "cron", "list", "--json")
    assert [c["name"] for c in json.loads(out)] == ["tick"]
    assert "lonnymq.worker.ops" in loaded
    assert unused(loaded, "lonnymq.worker.runtime", "lonnymq.client.aio", "prometheus_client") == []
