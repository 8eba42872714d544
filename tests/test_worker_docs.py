"""The Python examples of docs/worker.md, executed in order in one namespace against a fresh
database, so the documentation cannot drift from the code."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

DOC = Path(__file__).resolve().parent.parent / "docs" / "worker.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_worker_doc_examples_run(dsn: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 5
    name = f"docs_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    monkeypatch.setenv("LONNYMQ_DSN", make_conninfo(dsn, dbname=name))
    namespace: dict[str, Any] = {"__name__": "worker_docs"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{DOC.name}[python block {i + 1}]", "exec"), namespace)
    finally:
        client = namespace.get("client")
        if client is not None:
            client.close()
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
