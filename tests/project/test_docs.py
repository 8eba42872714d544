"""The Python examples of the README and docs/, executed in order in one namespace per page
against a fresh database, so the documentation cannot drift from the code."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[2]
# Pages whose every ```python block runs as written (Spark's page needs a JVM: tests/spark/).
PAGES = ["README.md", "docs/worker.md", "docs/channels.md", "docs/payloads.md"]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_doc_examples_run(
    page: str, dsn: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / page
    blocks = python_blocks(path.read_text())
    assert blocks, f"{page} has no python examples"
    name = f"docs_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    monkeypatch.setenv("LONNYMQ_DSN", make_conninfo(dsn, dbname=name))
    monkeypatch.chdir(ROOT)
    namespace: dict[str, Any] = {"__name__": f"docs_{path.stem}"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{page}[python block {i + 1}]", "exec"), namespace)
    finally:
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if type(value).__name__ == "Client" and callable(close):
                close()
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
