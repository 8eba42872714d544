"""The sync client is generated from the async one (tools/async_to_sync.py); both work."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from lonnymq import AsyncClient, Client, Envelope, errors

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "async_to_sync.py"


def test_generated_client_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_notices_a_hand_edit() -> None:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = (ROOT / "src" / "lonnymq" / "client" / "aio.py").read_text()
    generated = (ROOT / "src" / "lonnymq" / "client" / "sync.py").read_text()
    assert tool.convert(source) == generated
    assert tool.convert(source.replace("Lease up to", "Leases up to")) != generated
    assert "await " not in generated and "async def" not in generated


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
            try:
                await c.ack(m3)
                raise AssertionError("a second ack must raise LeaseLost")
            except errors.LeaseLost:
                pass
            assert (await c.metrics("q")).ready == 0

            async def send_later() -> None:
                await asyncio.sleep(0.3)
                await c.send("q", b"wake")

            started = time.monotonic()
            sender = asyncio.create_task(send_later())
            got = await c.receive("q", timeout=20, poll=30)
            await sender
            assert [m.payload for m in got] == [b"wake"]
            assert time.monotonic() - started < 5
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
