"""The dashboard's JSON API and pages over HTTP, against a real database: counts, each page's
data, the actions, the security rules (token, CSRF, read-only) and bad input (4xx, never a
500 or a traceback)."""

from __future__ import annotations

import functools
import re
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from starlette.applications import Starlette
from starlette.routing import Mount
from web_helpers import add_schedule, beat, serve

import lonnymq.web
from lonnymq import Client
from lonnymq.web import create_app

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def web(dsn: str, schema: str) -> Iterator[httpx.Client]:
    with serve(create_app(dsn, schema=schema, token=TOKEN)) as url, httpx.Client(base_url=url) as http:
        yield http


def _fill(client: Client) -> None:
    client.create_queue("emails", max_attempts=1)
    client.create_queue("reports")
    for i in range(7):
        client.send("emails", {"n": i}, key=f"k{i}", headers={"trace": i})
    client.send("emails", "later", delay=3600)
    client.send("reports", b"\x00\x01", channel="tenant-1")
    taken = client.take("emails", 2)
    client.nack(taken[0], error="boom: it failed")  # max_attempts=1: dead


def test_queues_api_counts_and_overview(client: Client, web: httpx.Client) -> None:
    _fill(client)
    r = web.get("/api/queues")
    assert r.status_code == 200
    queues = {q["name"]: q for q in r.json()["queues"]}
    assert list(queues) == ["emails", "reports"]
    e = queues["emails"]
    assert (e["ready"], e["scheduled"], e["leased"], e["dead"]) == (5, 1, 1, 1)
    assert (queues["reports"]["ready"], queues["reports"]["dead"]) == (1, 0)
    # The minute's counters are there for the chart: 8 sent, 1 dead.
    assert sum(m["sent"] for m in e["minutes"]) == 8
    assert sum(m["dead"] for m in e["minutes"]) == 1
    page = web.get("/")
    assert page.status_code == 200
    row = re.search(r'<tr data-queue="emails">(.*?)</tr>', page.text, re.S)
    assert row is not None
    assert re.search(r'data-state="ready"><span class="num" data-count="5">', row.group(1))
    assert "<svg" in row.group(1)
    assert web.get("/healthz").json() == {"status": "ok"}
    # Only its own scripts and styles, never in a frame (every response, API and errors too).
    for r in (page, web.get("/api/queues"), web.get("/queues/nope")):
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'self' covers it
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    # Keyset paging by name.
    first = web.get("/api/queues", params={"limit": 1}).json()
    assert [q["name"] for q in first["queues"]] == ["emails"] and first["next_after"] == "emails"
    second = web.get("/api/queues", params={"limit": 1, "after": "emails"}).json()
    assert [q["name"] for q in second["queues"]] == ["reports"] and second["next_after"] is None


def test_each_page_and_its_data(client: Client, web: httpx.Client) -> None:
    _fill(client)
    client.set_channel("reports", "tenant-1", max_concurrency=2)
    add_schedule(client, "nightly", "reports")
    beat(client, "w-1", ["emails"])
    q = web.get("/api/queues/emails").json()
    assert q["settings"]["max_attempts"] == 1 and q["counts"]["ready"] == 5
    assert q["totals"]["sent"] == 8 and q["totals"]["dead"] == 1
    msgs = web.get("/api/queues/emails/messages", params={"status": "ready", "limit": 2}).json()
    assert len(msgs["messages"]) == 2 and msgs["next_after"] == msgs["messages"][-1]["id"]
    rest = web.get(
        "/api/queues/emails/messages", params={"status": "ready", "after": msgs["next_after"]}
    ).json()
    assert len(rest["messages"]) == 3 and rest["next_after"] is None
    one = web.get(f"/api/queues/emails/messages/{rest['messages'][0]['id']}").json()
    assert one["payload"]["format"] == "json" and '"n":' in one["payload"]["text"]
    assert one["headers"] == {"trace": one["headers"]["trace"]}
    by_key = web.get("/api/queues/emails/messages", params={"key": "k6"}).json()["messages"]
    assert [m["key"] for m in by_key] == ["k6"]
    dead = web.get("/api/queues/emails/dead").json()["messages"]
    assert [d["last_error"] for d in dead] == ["boom: it failed"]
    archive = web.get("/api/queues/emails/archive", params={"status": "dead"}).json()["messages"]
    assert [a["id"] for a in archive] == [dead[0]["id"]]
    channels = web.get("/api/queues/reports/channels").json()["channels"]
    assert [(c["name"], c["max_concurrency"], c["size"]) for c in channels] == [("tenant-1", 2, 1)]
    cron = web.get("/api/cron").json()["schedules"]
    assert [(s["name"], s["enabled"]) for s in cron] == [("nightly", True)] and cron[0]["next_tick_ms"]
    workers = web.get("/api/workers").json()["workers"]
    assert [(w["id"], w["queues"], w["in_flight"]) for w in workers] == [("w-1", ["emails"], 3)]
    # Every page renders, with its data.
    pages = {
        "/queues/emails": "Max attempts",
        "/queues/emails/messages": "k3",
        f"/queues/emails/messages/{rest['messages'][0]['id']}": "&#34;trace&#34;",
        "/queues/emails/dead": "boom: it failed",
        "/queues/emails/archive": "boom: it failed",
        "/queues/reports/channels": "tenant-1",
        "/cron": "nightly",
        "/workers": "host-a",
    }
    for path, text in pages.items():
        r = web.get(path)
        assert r.status_code == 200, path
        assert text in r.text, path
    # Search by key goes to the message's page.
    found = web.get("/queues/emails/messages", params={"key": "k3"}, follow_redirects=False)
    assert found.status_code == 303 and re.search(r"/queues/emails/messages/\d+$", found.headers["location"])
    missing = web.get("/queues/emails/messages", params={"id": "999999"})
    assert missing.status_code == 200 and "no live message with id 999999" in missing.text


BAD_GETS = [
    ("/queues/nope", 404, "queue &#39;nope&#39; does not exist"),
    ("/api/queues/nope", 404, "queue 'nope' does not exist"),
    ("/api/queues/nope/dead", 404, "does not exist"),
    ("/api/queues/nope/messages", 404, "does not exist"),
    ("/queues/Bad%20Name/messages", 404, "invalid queue name"),
    ("/queues/emails/messages/abc", 400, "message id must be an integer"),
    ("/api/queues/emails/messages/0", 400, "message id must be between"),
    ("/api/queues/emails/messages/99999999999999999999999", 400, "message id must be between"),
    ("/api/queues/emails/messages/424242", 404, "no live message 424242"),
    ("/api/queues?limit=1000000", 400, "limit must be between 1 and 500"),
    ("/api/queues/emails/messages?limit=-1", 400, "limit must be between"),
    ("/api/queues/emails/messages?after=x", 400, "after must be an integer"),
    ("/api/queues/emails/messages?status=dead", 400, "status must be one of"),
    ("/api/queues/emails/archive?status=bogus", 400, "status must be one of"),
    ("/queues/emails/messages?id=abc", 400, "message id must be an integer"),
    ("/api/queues/emails/dead?after=-5", 400, "after must be between"),
    ("/api/nothing", 404, "Not Found"),
]


def test_bad_input_gets_a_clear_4xx(client: Client, web: httpx.Client) -> None:
    client.create_queue("emails")
    for path, status, text in BAD_GETS:
        r = web.get(path, headers={"Accept": "text/html"})
        assert r.status_code == status, (path, r.text)
        assert text in r.text, path
        assert "Traceback" not in r.text
        if path.startswith("/api/"):
            assert r.json()["status"] == status
        else:
            assert r.headers["content-type"].startswith("text/html"), path


def test_bad_mutation_input_gets_a_4xx(client: Client, web: httpx.Client) -> None:
    client.create_queue("emails")
    cases = [
        ("/api/queues/emails/purge", {"confirm": "other"}, 400, "type the name 'emails'"),
        ("/api/queues/emails/dead/purge", {}, 400, "type the name"),
        ("/api/queues/emails/dead/requeue", {}, 400, "select messages"),
        ("/api/queues/emails/dead/requeue", {"ids": ["x"]}, 400, "message id must be an integer"),
        ("/api/queues/emails/dead/requeue", {"ids": list(range(1, 600))}, 400, "at most 500"),
        ("/api/queues/emails/channels", {"channel": "c", "max_concurrency": "0"}, 400, "between 1"),
        ("/api/queues/emails/channels", {"channel": "c", "on_full": "explode"}, 400, "on_full"),
        ("/api/queues/emails/messages/abc/cancel", {}, 400, "message id"),
        ("/api/queues/nope/purge", {"confirm": "nope"}, 404, "does not exist"),
        ("/api/cron/none/enable", {}, 404, "no schedule"),
    ]
    for path, body, status, text in cases:
        r = web.post(path, json=body, headers=BEARER)
        assert r.status_code == status, (path, r.text)
        assert text in r.json()["error"], (path, r.text)
    too_big = web.post("/api/queues/emails/dead/requeue", json={"ids": [1] * 200_000}, headers=BEARER)
    assert too_big.status_code == 413 and "larger than" in too_big.json()["error"]
    deep = web.post(
        "/api/queues/emails/dead/requeue",
        content=b"[" * 100_000,
        headers={**BEARER, "content-type": "application/json"},
    )
    assert deep.status_code == 400
    r = web.post(
        "/api/queues/emails/dead/requeue",
        content=b"[1,",
        headers={**BEARER, "content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_actions_through_the_api(client: Client, web: httpx.Client) -> None:
    _fill(client)
    client.create_queue("jobs", max_attempts=1)
    ids = [client.send("jobs", {"i": i}).id for i in range(4)]
    for m in client.take("jobs", 4):
        client.nack(m, error="bad")
    one = web.post("/api/queues/jobs/dead/requeue", json={"ids": [ids[0]]}, headers=BEARER)
    assert one.json() == {"ok": True, "done": "requeued 1 dead message(s)", "requeued": 1}
    assert client.metrics("jobs").ready == 1
    rest = web.post("/api/queues/jobs/dead/requeue", json={"all": True}, headers=BEARER).json()
    assert rest["requeued"] == 3 and client.metrics("jobs").ready == 4
    for m in client.take("jobs", 4):
        client.nack(m, error="bad again")
    purged = web.post("/api/queues/jobs/dead/purge", json={"confirm": "jobs"}, headers=BEARER).json()
    assert purged["purged"] == 4 and client.metrics("jobs").dead == 0
    # Cancel one message, purge a queue.
    target = client.peek("emails", 1)[0].id
    assert (
        web.post(f"/api/queues/emails/messages/{target}/cancel", headers=BEARER).json()["cancelled"] is True
    )
    assert client.get("emails", id=target) is None
    assert (
        web.post(f"/api/queues/emails/messages/{target}/cancel", headers=BEARER).json()["cancelled"] is False
    )
    assert (
        web.post("/api/queues/reports/purge", json={"confirm": "reports"}, headers=BEARER).status_code == 200
    )
    assert client.metrics("reports").ready == 0
    # Channel limits: set, then reset.
    r = web.post(
        "/api/queues/emails/channels",
        json={
            "channel": "acme",
            "max_concurrency": 3,
            "release_interval": "1.5",
            "max_size": 10,
            "on_full": "drop",
        },
        headers=BEARER,
    ).json()
    assert (
        r["channel"]["max_concurrency"],
        r["channel"]["release_interval_ms"],
        r["channel"]["max_size"],
    ) == (
        3,
        1500,
        10,
    )
    (acme,) = client.channels("emails")
    assert (acme.max_concurrency, acme.on_full, acme.explicit) == (3, "drop", True)
    assert web.post(
        "/api/queues/emails/channels", json={"channel": "acme", "reset": 1}, headers=BEARER
    ).json()["reset"]
    assert client.channels("emails") == []
    # Schedules: disable, enable.
    add_schedule(client, "nightly", "emails")
    assert web.post("/api/cron/nightly/disable", headers=BEARER).status_code == 200
    assert web.get("/api/cron").json()["schedules"][0]["enabled"] is False
    assert web.post("/api/cron/nightly/enable", headers=BEARER).status_code == 200
    assert web.get("/api/cron").json()["schedules"][0]["enabled"] is True


def test_mutations_need_the_token_and_csrf(client: Client, web: httpx.Client) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", "x")
    client.nack(client.take("jobs")[0], error="bad")
    path = "/api/queues/jobs/dead/requeue"
    # No credential, a wrong one: refused, nothing done.
    assert web.post(path, json={"all": True}).status_code == 403
    assert web.post(path, json={"all": True}, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert client.metrics("jobs").dead == 1
    # The pages show no action until logged in.
    assert '<form method="post" action="/queues/jobs/dead/requeue"' not in web.get("/queues/jobs/dead").text
    assert "log in to make changes" in web.get("/").text
    # Logging in needs the CSRF value the login page set, and the right token.
    csrf = web.cookies["lonnymq_csrf"]
    assert web.post("/login", data={"token": TOKEN, "csrf_token": "forged"}).status_code == 403
    assert web.post("/login", data={"token": "wrong", "csrf_token": csrf}).status_code == 403
    r = web.post("/login", data={"token": TOKEN, "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and "lonnymq_auth" in web.cookies
    assert TOKEN not in web.cookies["lonnymq_auth"]
    page = web.get("/queues/jobs/dead").text
    assert 'action="/queues/jobs/dead/requeue"' in page and f'value="{csrf}"' in page
    # Logged in, a form without the CSRF value (a forged cross-site post) is refused...
    assert web.post("/queues/jobs/dead/requeue", data={"all": "1"}).status_code == 403
    assert web.post(path, json={"all": True}, headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert client.metrics("jobs").dead == 1
    # ...and one with it works, back to the page with a note of what was done.
    r = web.post("/queues/jobs/dead/requeue", data={"all": "1", "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/queues/jobs/dead"
    assert client.metrics("jobs").ready == 1
    assert "requeued 1 dead message(s)" in web.get("/queues/jobs/dead").text
    # Logging out ends it.
    web.post("/logout", data={"csrf_token": csrf})
    assert web.post("/queues/jobs/purge", data={"confirm": "jobs", "csrf_token": csrf}).status_code == 403


def test_read_only_shows_and_accepts_no_change(dsn: str, schema: str, client: Client) -> None:
    _fill(client)
    add_schedule(client, "nightly", "emails")
    client.set_channel("reports", "tenant-1", max_size=5)
    app = create_app(dsn, schema=schema, read_only=True, token=TOKEN)
    with serve(app) as url, httpx.Client(base_url=url) as web:
        dead_id = web.get("/api/queues/emails/dead").json()["messages"][0]["id"]
        msg_id = web.get("/api/queues/emails/messages").json()["messages"][0]["id"]
        for path in [
            "/",
            "/queues/emails",
            "/queues/emails/messages",
            f"/queues/emails/messages/{msg_id}",
            "/queues/emails/dead",
            "/queues/emails/archive",
            "/queues/reports/channels",
            "/cron",
            "/workers",
        ]:
            r = web.get(path)
            assert r.status_code == 200, path
            assert 'method="post"' not in r.text, path
            assert "read-only" in r.text
        for path, body in [
            ("/api/queues/emails/dead/requeue", {"all": True}),
            ("/api/queues/emails/purge", {"confirm": "emails"}),
            (f"/api/queues/emails/messages/{msg_id}/cancel", {}),
            ("/api/cron/nightly/disable", {}),
            ("/queues/emails/dead/purge", {"confirm": "emails"}),
            ("/api/queues/emails/pause", {}),
            ("/api/queues/emails/resume", {}),
        ]:
            r = web.post(path, json=body, headers=BEARER)
            assert r.status_code == 403, path
            assert "read-only" in r.text
        assert web.get("/login").status_code == 404
    assert client.metrics("emails").dead == 1 and client.get("emails", id=msg_id) is not None
    assert dead_id


def test_pause_and_resume_through_the_api(client: Client, web: httpx.Client) -> None:
    _fill(client)
    r = web.post("/api/queues/emails/pause", headers=BEARER)
    assert r.json() == {"ok": True, "done": "paused queue emails", "paused": True, "changed": True}
    again = web.post("/api/queues/emails/pause", headers=BEARER).json()
    assert (again["done"], again["changed"]) == ("queue emails was paused already", False)
    assert client.take("emails") == []
    queues = {q["name"]: q for q in web.get("/api/queues").json()["queues"]}
    assert (queues["emails"]["paused"], queues["reports"]["paused"]) == (True, False)
    one = web.get("/api/queues/emails").json()
    assert one["paused"] is True and one["settings"]["paused"] is True
    page = web.get("/queues/emails").text
    assert "data-paused" in page and 'action="/queues/emails/resume"' not in page  # not logged in
    assert web.post("/api/queues/nope/pause", headers=BEARER).status_code == 404
    assert web.post("/api/queues/emails/resume").status_code == 403  # no credential
    r = web.post("/api/queues/emails/resume", headers=BEARER)
    assert r.json() == {"ok": True, "done": "resumed queue emails", "paused": False, "changed": True}
    assert web.get("/api/queues/emails").json()["paused"] is False
    assert len(client.take("emails", 10)) == 5


@contextmanager
def _login_in(dsn: str, group: str) -> Iterator[str]:
    """The DSN of a new LOGIN role that is a member of ``group``; dropped afterwards."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not row or not row[0]:
            pytest.skip("the test DSN's user may not create roles")
        name, password = f"lmq_web_{uuid.uuid4().hex[:10]}", secrets.token_hex(12)
        c.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password))
        )
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name)))
        yield make_conninfo(dsn, user=name, password=password)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_read_only_dashboard_as_the_monitor_role(dsn: str, schema: str, client: Client) -> None:
    """A login that is only a member of lonnymq_monitor serves every page and API route of the
    read-only dashboard; as a dashboard with a token it still changes nothing: the database
    refuses (403)."""
    _fill(client)
    add_schedule(client, "nightly", "emails")
    client.set_channel("reports", "tenant-1", max_size=5)
    beat(client, "worker-1", ["emails"])
    msg_id = client.peek("emails", 1)[0].id
    with _login_in(dsn, "lonnymq_monitor") as monitor:
        with (
            serve(create_app(monitor, schema=schema, read_only=True)) as url,
            httpx.Client(base_url=url) as web,
        ):
            for path in [
                "/",
                "/queues/emails",
                "/queues/emails/messages",
                "/queues/emails/messages?status=leased",
                f"/queues/emails/messages/{msg_id}",
                "/api/queues/emails/messages?key=k3",
                "/queues/emails/dead",
                "/queues/emails/archive",
                "/queues/reports/channels",
                "/cron",
                "/workers",
                "/healthz",
                "/api/queues",
                "/api/queues/emails",
                "/api/queues/emails/messages",
                f"/api/queues/emails/messages/{msg_id}",
                "/api/queues/emails/dead",
                "/api/queues/emails/archive",
                "/api/queues/reports/channels",
                "/api/cron",
                "/api/workers",
            ]:
                r = web.get(path)
                assert r.status_code == 200, (path, r.text[:300])
                assert 'method="post"' not in r.text, path
            assert web.get("/api/workers").json()["workers"][0]["id"] == "worker-1"
            assert web.get("/api/cron").json()["schedules"][0]["name"] == "nightly"
        with serve(create_app(monitor, schema=schema, token=TOKEN)) as url, httpx.Client(base_url=url) as web:
            for path, body in [
                ("/api/queues/emails/pause", {}),
                ("/api/queues/emails/dead/requeue", {"all": True}),
                ("/api/queues/emails/purge", {"confirm": "emails"}),
                (f"/api/queues/emails/messages/{msg_id}/cancel", {}),
                ("/api/cron/nightly/disable", {}),
            ]:
                r = web.post(path, json=body, headers=BEARER)
                assert r.status_code == 403, (path, r.text[:300])
    m = client.metrics("emails")
    assert (m.ready, m.dead, m.paused) == (5, 1, False)
    assert client.get("emails", id=msg_id) is not None


def test_without_a_token_changes_are_off(
    dsn: str, schema: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LONNYMQ_WEB_TOKEN", raising=False)
    client.create_queue("jobs")
    with serve(create_app(dsn, schema=schema)) as url, httpx.Client(base_url=url) as web:
        r = web.post("/api/queues/jobs/purge", json={"confirm": "jobs"}, headers=BEARER)
        assert r.status_code == 403 and "start the dashboard with a token" in r.json()["error"]
        assert 'method="post" action="/queues/jobs/purge"' not in web.get("/queues/jobs").text


def test_mounted_in_a_host_app_with_its_own_auth(dsn: str, schema: str, client: Client) -> None:
    """Mounted under /ops in another Starlette app whose authorize() hook decides; links and
    cookies follow the mount; CSRF still applies to its forms."""
    client.create_queue("jobs")
    client.send("jobs", "x")
    dashboard = create_app(
        dsn, schema=schema, authorize=lambda request: request.headers.get("x-staff") == "yes"
    )
    host = Starlette(routes=[Mount("/ops", app=dashboard)])
    with serve(host) as url, httpx.Client(base_url=url) as web:
        page = web.get("/ops/queues/jobs")
        assert page.status_code == 200 and 'href="/ops/queues/jobs/messages"' in page.text
        assert (
            'href="/ops/static/dashboard.css"' in page.text
            and web.get("/ops/static/dashboard.css").status_code == 200
        )
        assert 'action="/ops/queues/jobs/purge"' not in page.text
        staff = {"x-staff": "yes"}
        page = web.get("/ops/queues/jobs", headers=staff).text
        assert 'action="/ops/queues/jobs/purge"' in page
        csrf = web.cookies["lonnymq_csrf"]
        assert web.post("/ops/queues/jobs/purge", data={"confirm": "jobs"}, headers=staff).status_code == 403
        r = web.post(
            "/ops/queues/jobs/purge",
            data={"confirm": "jobs", "csrf_token": csrf},
            headers=staff,
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"] == "/ops/queues/jobs"
        assert client.metrics("jobs").ready == 0


def test_base_path(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    with (
        serve(create_app(dsn, schema=schema, base_path="/lonnymq/")) as url,
        httpx.Client(base_url=url) as web,
    ):
        assert web.get("/", follow_redirects=False).headers["location"] == "/lonnymq/"
        page = web.get("/lonnymq/")
        assert page.status_code == 200 and 'href="/lonnymq/queues/jobs"' in page.text
        assert [q["name"] for q in web.get("/lonnymq/api/queues").json()["queues"]] == ["jobs"]


def test_the_mount_example_of_the_docs(
    dsn: str, schema: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/dashboard.md's "Mount it in your application" example, run as it is (its
    create_app() pointed at the test's schema)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "Mount(" in b]
    client.create_queue("jobs")
    monkeypatch.setenv("LONNYMQ_DSN", dsn)
    monkeypatch.setattr(lonnymq.web, "create_app", functools.partial(create_app, schema=schema))
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/dashboard.md", "exec"), namespace)
    with serve(namespace["app"]) as url, httpx.Client(base_url=url) as web:
        assert web.get("/").text == "my service"
        assert 'href="/lonnymq/queues/jobs"' in web.get("/lonnymq/").text
        assert 'action="/lonnymq/queues/jobs/purge"' not in web.get("/lonnymq/queues/jobs").text
        staff = web.get("/lonnymq/queues/jobs", headers={"x-staff-user": "ada"}).text
        assert 'action="/lonnymq/queues/jobs/purge"' in staff


def test_reschedule(client: Client, web: httpx.Client) -> None:
    client.create_queue("jobs")
    json_id = client.send(
        "jobs", {"n": 1}, key="k1", headers={"h": 1}, kind="job", priority=3, channel="c"
    ).id
    text_id = client.send("jobs", "plain text").id
    raw_id = client.send("jobs", b"\x00\xff").id
    r = web.post(f"/api/queues/jobs/messages/{json_id}/reschedule", json={"delay": 3600}, headers=BEARER)
    assert r.status_code == 200, r.text
    new_id = r.json()["id"]
    assert client.get("jobs", id=json_id) is None
    moved = client.get("jobs", id=new_id)
    assert moved is not None and moved.status == "scheduled"
    assert (moved.payload, moved.key, moved.headers, moved.kind, moved.priority, moved.channel) == (
        {"n": 1},
        "k1",
        {"h": 1},
        "job",
        3,
        "c",
    )
    assert abs(moved.scheduled_at - (r.json()["at"])) == 0
    # Text and raw bytes come back byte for byte, content type kept; a time in the past is now.
    for mid, body in ((text_id, "plain text"), (raw_id, b"\x00\xff")):
        r = web.post(
            f"/api/queues/jobs/messages/{mid}/reschedule", json={"at": "2020-01-01T00:00:00Z"}, headers=BEARER
        )
        got = client.get("jobs", id=r.json()["id"])
        assert got is not None and got.payload == body and got.status == "ready"
    # Refused: leased, not live, no time, a malformed time.
    (leased,) = client.take("jobs", 1)
    cases = [
        (leased.id, {"delay": 5}, 409, "leased"),
        (json_id, {"delay": 5}, 409, "not live"),
        (new_id, {}, 400, "give at"),
        (new_id, {"at": "tomorrow"}, 400, "ISO 8601"),
        (new_id, {"delay": "-1"}, 400, "between 0"),
    ]
    for mid, body, status, text in cases:
        r = web.post(f"/api/queues/jobs/messages/{mid}/reschedule", json=body, headers=BEARER)
        assert r.status_code == status and text in r.json()["error"], (mid, body, r.text)
    assert client.get("jobs", id=new_id) is not None
