"""Repro of the dashboard's refresh races (docs/flaky.md), as tests/web/test_web_browser.py's
test_every_page_counts_and_actions meets them, with a 1 s refresh, N times in a row:

* purge: the queue page's purge (fill the confirm field, click Purge); a miss is a purge that
  did not happen (no flash within 20 s: a refresh emptied the field);
* click: the overview's link to the queue; a miss is a click that did not navigate (within
  10 s: a refresh swapped the link between the press and the release).

Prints one JSON line with the misses.

    DSN=postgresql://root@127.0.0.1:5432/DB PYTHONPATH=src python docs/flaky/refresh_race.py purge 80
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
    dsn, mode, n = os.environ["DSN"], sys.argv[1], int(sys.argv[2])
    if mode not in ("purge", "click"):
        raise SystemExit("usage: refresh_race.py purge|click N")
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
                    if mode == "purge":
                        client.send_batch("reports", [{"n": j} for j in range(5)])
                    page.goto(f"{url}/queues/reports" if mode == "purge" else f"{url}/")
                    page.wait_for_timeout(i % 10 * 100)  # spread the action over the refresh period
                    try:
                        if mode == "purge":
                            page.fill("input[name=confirm]", "reports")
                            page.click("text=Purge queue")
                            flash = page.locator(".flash")
                            expect(flash).to_contain_text("purged queue reports", timeout=20_000)
                        else:
                            page.click('tr[data-queue="reports"] >> text=reports')
                            expect(page.locator("h1")).to_contain_text("reports", timeout=10_000)
                    except AssertionError:
                        misses += 1
                        field = page.locator("input[name=confirm]")
                        left = repr(field.input_value()) if mode == "purge" else page.url
                        print(f"miss at run {i}: {left}", file=sys.stderr)
                b.close()
        finally:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    print(json.dumps({"mode": mode, "runs": n, "misses": misses, "loadavg_at_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
