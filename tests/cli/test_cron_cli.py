"""``lonnymq cron add`` with a time zone: the ``CRON_TZ=`` prefix and ``--timezone`` store the
same schedule; the help says how."""

from __future__ import annotations

import json

import pytest

from lonnymq.cli import main


def test_cron_add_in_a_time_zone(dsn: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--dsn", dsn, "--schema", schema]
    assert main(["queue", "create", "emails", *base]) == 0
    assert main(["cron", "add", "a", "CRON_TZ=Europe/Paris 0 8 * * mon", "--queue", "emails", *base]) == 0
    assert (
        main(["cron", "add", "b", "0 8 * * mon", "--timezone", "Europe/Paris", "--queue", "emails", *base])
        == 0
    )
    capsys.readouterr()
    assert main(["cron", "list", "--json", *base]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["a"]["schedule"] == rows["b"]["schedule"] == "CRON_TZ=Europe/Paris 0 8 * * mon"
    assert rows["a"]["next_tick"] == rows["b"]["next_tick"]
    assert rows["a"]["next_tick"].endswith(("T06:00:00+00:00", "T07:00:00+00:00"))  # 08:00 CEST or CET
    bad = ["cron", "add", "c", "CRON_TZ=Asia/Tokyo 0 8 * * *", "--timezone", "Europe/Paris"]
    assert main([*bad, "--queue", "emails", *base]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert (
        main(["cron", "add", "d", "0 8 * * *", "--timezone", "Mars/Olympus", "--queue", "emails", *base]) == 2
    )
    capsys.readouterr()


def test_cron_add_help_mentions_time_zones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["cron", "add", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "CRON_TZ=<IANA zone>" in text and "--timezone ZONE" in text and "(UTC)" not in text
