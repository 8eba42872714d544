"""Repro of the dashboard's refresh race (docs/flaky.md): the queue page's purge (fill the
confirm field, click Purge) with a 1 s refresh, N times in a row, as
tests/web/test_web_browser.py's test_every_page_counts_and_actions does it; prints one JSON
line with the purges that did not happen (no flash within 20 s: the field was emptied).

    DSN=postgresql://root@127.0.0.1:5432/DB PYTHONPATH=src python docs/flaky/purge_race.py 80
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import psycopg
from playwright.sync_api import expect, sync_playwright
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "web"))
from web_helpers import serve

from lonnymq import Client
from lonnymq.web import create_app


def main() -> None:
    dsn, n = os.environ["DSN"], int(sys.argv[1])
    schema = "fh_" + uuid.uuid4().hex[:8]
    misses = 0
    with Client(dsn, schema=schema) as client:
        client.migrate()
        client.create_queue("reports")
        try:
            app = create_app(dsn, schema=schema, token="t", refresh_seconds=1)
            with sync_playwright() as p, serve(app) as url:
                b = p.chromium.launch(
                    executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-dev-shm-usage"]
                )
                page = b.new_context().new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{url}/login")
                page.fill("input[name=token]", "t")
                page.click("main form button")
                expect(page.locator("header")).to_contain_text("log out")
                for i in range(n):
                    client.send_batch("reports", [{"n": j} for j in range(5)])
                    page.goto(f"{url}/queues/reports")
                    page.wait_for_timeout(i % 10 * 100)  # spread the fill over the refresh period
                    page.fill("input[name=confirm]", "reports")
                    page.click("text=Purge queue")
                    try:
                        expect(page.locator(".flash")).to_contain_text("purged queue reports", timeout=20_000)
                    except AssertionError:
                        misses += 1
                        field = page.locator("input[name=confirm]").input_value()
                        print(f"miss at run {i}: the confirm field holds {field!r}", file=sys.stderr)
                b.close()
        finally:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    print(json.dumps({"runs": n, "misses": misses, "loadavg_at_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
