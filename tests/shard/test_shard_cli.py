"""``lonnymq shard init|status`` in-process: output, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest

from lonnymq.cli import main

pytestmark = [pytest.mark.once, pytest.mark.slow]


def test_status_lists_shards_and_queues(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["queue", "create", "cli_q", "--dsn", sharded.dsn]) == 0
    capsys.readouterr()
    assert main(["shard", "status", "--dsn", sharded.dsn]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok;") == 2 and "cli_q" in out
    assert main(["shard", "status", sharded.dsn, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["index"] for s in data["shards"]] == [0, 1]
    assert sum("cli_q" in s["queues"] for s in data["shards"]) == 1


def test_init_again_through_the_cli(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["shard", "init", sharded.dsn, *sharded.shard_dsns]) == 0
    assert "over 2 shard(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (lambda s: [s.dsn, *s.shard_dsns, s.shard_dsns[0]], "power-of-two"),
        (lambda s: [s.dsn, "postgresql://postgres@127.0.0.1:1/test"], "cannot connect to the shard 0"),
        (lambda s: [s.shard_dsns[0], s.shard_dsns[1]], "not a lonnymq router"),
    ],
    ids=["three-shards", "unreachable-shard", "router-holds-lonnymq"],
)
def test_init_errors_are_one_actionable_line(sharded, capsys, argv, expected) -> None:  # type: ignore[no-untyped-def]
    assert main(["shard", "init", *argv(sharded)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert expected in err and err.count("\n") == 0 and "Traceback" not in err, err


def test_status_of_a_database_that_is_no_router(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["shard", "status", sharded.shard_dsns[0]]) == 1
    err = capsys.readouterr().err.strip()
    assert "is not a lonnymq router" in err and "shard init" in err and "\n" not in err
