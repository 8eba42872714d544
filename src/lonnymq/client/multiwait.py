"""Waiting for notifications on several LISTEN connections at once: a client of a shard router
listens on one connection per shard (``wait.ShardListener``), and a send notifies on its shard.

:func:`wait_any` serves the asyncio listener (``wait.py``) and its generated sync twin
(``wait_sync.py``): the twin calls it without ``await``, so it dispatches on the connections'
class, waiting with asyncio for :class:`~psycopg.AsyncConnection` and with ``select`` for
:class:`~psycopg.Connection`.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Coroutine, Sequence
from time import monotonic
from typing import Any, overload

import psycopg
from psycopg import AsyncConnection, Connection

#: What :func:`wait_any` returns: the payloads received (queue names), and the positions of the
#: connections that failed (closed or broken: their server went away).
Waited = tuple[list[str], list[int]]


@overload
def wait_any(conns: Sequence[AsyncConnection[Any]], timeout: float) -> Coroutine[Any, Any, Waited]: ...
@overload
def wait_any(conns: Sequence[Connection[Any]], timeout: float) -> Waited: ...
def wait_any(conns: Sequence[Any], timeout: float) -> Any:
    """Wait up to ``timeout`` seconds until a notification arrives on any of ``conns`` (at least
    one) or one of them fails. Notifications already received (during an earlier statement) are
    returned at once. A connection that fails is reported, not raised: the others keep
    listening."""
    if isinstance(conns[0], AsyncConnection):
        return _wait_async(conns, timeout)
    return _wait_sync(conns, timeout)


async def _payloads(conn: AsyncConnection[Any], timeout: float) -> list[str]:
    return [n.payload async for n in conn.notifies(timeout=timeout, stop_after=1)]


async def _wait_async(conns: Sequence[AsyncConnection[Any]], timeout: float) -> Waited:
    tasks = [asyncio.ensure_future(_payloads(c, timeout)) for c in conns]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks)  # each connection is free again once its wait has stopped
    got: list[str] = []
    failed: list[int] = []
    for i, t in enumerate(tasks):
        if t.cancelled():
            continue
        e = t.exception()
        if isinstance(e, psycopg.OperationalError):
            failed.append(i)
        elif e is not None:
            raise e
        else:
            got += t.result()
    return got, failed


def _wait_sync(conns: Sequence[Connection[Any]], timeout: float) -> Waited:
    deadline = monotonic() + timeout
    while True:
        got: list[str] = []
        failed: list[int] = []
        for i, c in enumerate(conns):
            try:  # timeout=0: what is buffered or readable now, without waiting
                got += [n.payload for n in c.notifies(timeout=0, stop_after=1)]
            except psycopg.OperationalError:
                failed.append(i)
        remaining = deadline - monotonic()
        if got or failed or remaining <= 0:
            return got, failed
        select.select([c.fileno() for c in conns], [], [], remaining)
