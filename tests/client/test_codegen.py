"""The sync client is generated from the async one (tools/async_to_sync.py); both work."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg

from lonnymq import AsyncClient, Client, Envelope, errors

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "async_to_sync.py"


def test_generated_client_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_check_notices_a_hand_edit() -> None:
    tool = _tool()
    assert len(tool.PAIRS) >= 1
    for source_path, target_path in tool.PAIRS:
        source = source_path.read_text()
        generated = target_path.read_text()
        assert tool.convert(source, source_path, target_path) == generated
        assert "do not edit" in generated.split("\n\n")[0]
        assert "await " not in generated and "async def" not in generated
    source_path, target_path = ROOT / "src/lonnymq/client/aio.py", ROOT / "src/lonnymq/client/sync.py"
    edited = source_path.read_text().replace("Lease up to", "Leases up to")
    assert tool.convert(edited, source_path, target_path) != target_path.read_text()


def test_the_generator_transforms_the_syntax_tree(tmp_path: Path) -> None:
    source = textwrap.dedent(
        '''
        """Something on asyncio.

        More about AsyncConnection.
        """

        from collections.abc import AsyncIterable, AsyncIterator, Iterable
        from contextlib import asynccontextmanager
        from typing import Self

        from psycopg import AsyncConnection

        from .aio import AsyncClient


        class Thing:
            """Wraps AsyncConnection."""

            async def __aenter__(self) -> Self:
                return self

            @asynccontextmanager
            async def rows(self, conn: AsyncConnection, xs: AsyncIterable[int]) -> AsyncIterator[int]:
                async with conn.transaction():
                    async for x in xs:
                        yield await conn.execute("SELECT %s", (x,))
                ys = [y async for y in xs]
                s = "await this string stays"
                yield len(ys), s, AsyncClient, Iterable
        '''
    )
    src, dst = tmp_path / "aio.py", tmp_path / "sync.py"
    out = _tool().convert(source, src, dst)
    tree = ast.parse(out)
    assert not any(
        isinstance(n, (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor)) for n in ast.walk(tree)
    )
    assert not any(isinstance(n, ast.comprehension) and n.is_async for n in ast.walk(tree))
    assert "def __enter__(self)" in out and "@contextmanager" in out
    assert "def rows(self, conn: Connection, xs: Iterable[int]) -> Iterator[int]:" in out
    assert "from collections.abc import Iterable, Iterator\n" in out  # deduplicated and sorted
    assert "from psycopg import Connection\n" in out and "from .sync import Client\n" in out
    assert '"await this string stays"' in out
    assert '"""Wraps Connection."""' in out  # names map in docstrings too
    doc = ast.get_docstring(tree)
    assert doc is not None and doc.startswith("Something on asyncio.\n\nGenerated from ``aio.py``")
    assert doc.endswith("More about Connection.")
    assert out.startswith("# Generated from aio.py")
    for args in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(dst), "-"],
            input=out,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_fails_on_a_stale_target(tmp_path: Path) -> None:
    tool = _tool()
    src, dst = tmp_path / "aio.py", tmp_path / "sync.py"
    src.write_text("async def f() -> None:\n    await g()\n")
    tool.PAIRS = [(src, dst)]
    tool.ROOT = tmp_path
    assert tool.main(["--check"]) == 1  # missing
    assert tool.main([]) == 0 and "def f() -> None:\n    g()\n" in dst.read_text()
    assert tool.main(["--check"]) == 0
    dst.write_text(dst.read_text() + "# hand edit\n")
    assert tool.main(["--check"]) == 1


def test_both_clients_have_the_same_api() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            n: inspect.signature(f) for n, f in vars(cls).items() if callable(f) and not n.startswith("_")
        }

    sync, aio = public(Client), public(AsyncClient)
    assert sync.keys() == aio.keys()
    for name, sig in aio.items():
        assert [p.name for p in sig.parameters.values()] == [
            p.name for p in sync[name].parameters.values()
        ], name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name
    assert inspect.iscoroutinefunction(AsyncClient.take)


def test_async_client(dsn: str, schema: str) -> None:
    async def main() -> None:
        async with AsyncClient(dsn, schema=schema) as c:
            assert await c.migrate() == []
            await c.create_queue("q", archive=True)
            r = await c.send("q", {"n": 1}, kind="k")
            rs = await c.send_batch("q", [Envelope(b"2", key="two"), "3"])
            assert r.outcome == "created" and [x.outcome for x in rs] == ["created", "created"]
            m1, m2 = await c.take("q", 2, lease=60)
            assert (m1.id, m1.payload, m1.kind, m1.attempt) == (r.id, {"n": 1}, "k", 1)
            assert await c.nack(m2, error="again") == {m2.id: "retry"}
            [m3, m2b] = await c.take("q", 5, ack=[m1])
            assert (m3.payload, m2b.payload, m2b.attempt, m2b.last_error) == ("3", b"2", 2, "again")
            assert await c.ack([m3, m2b]) == {m3.id, m2b.id}
            assert await c.ack(m3) == {m3.id}  # a repeated ack succeeds (idempotent)
            try:
                await c.nack(m3)
                raise AssertionError("a nack after the ack must raise LeaseLost")
            except errors.LeaseLost:
                pass
            assert (await c.metrics("q")).ready == 0

            async def send_later() -> None:
                await asyncio.sleep(0.3)
                await c.send("q", b"wake")

            started = time.monotonic()
            sender = asyncio.create_task(send_later())
            got = await c.receive("q", timeout=120, poll=300)
            await sender
            assert [m.payload for m in got] == [b"wake"]
            assert time.monotonic() - started < 60  # woken by the send (room for a loaded machine)
            await c.ack(got)
            assert await c.receive("q", timeout=0.1, poll=30) == []

            await c.send("q", b"tx")
            async with await psycopg.AsyncConnection.connect(dsn) as tx:
                [m] = await c.take_tx("q", conn=tx)
                assert m.payload == b"tx"
                await tx.rollback()
            assert [m.payload for m in await c.peek("q")] == [b"tx"]
            assert len(await c.take_tx("q")) == 1
            assert (await c.metrics("q")).ready == 0

    asyncio.run(main())
