"""The LonnyMQ client: one method = one SQL function call = one atomic queue action.

- ``aio.AsyncClient``: the asyncio client, the source of truth.
- ``sync.Client``: its synchronous twin, generated from ``aio.py`` by ``tools/async_to_sync.py``.
- ``ops``: I/O-free query building, argument checks, row decoding and error mapping shared by both;
  the internal API that the worker and the Spark connector may also use.

Each client is imported on first use: a synchronous program (the CLI) does not import the
asyncio one, nor an asyncio program the synchronous one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sync import Client

__all__ = ["AsyncClient", "Client"]


if not TYPE_CHECKING:
    from .. import _lazy_attributes

    # The modules importing the package used to import stay reachable as attributes
    # (`lonnymq.client.ops` after a bare `import lonnymq.client`), imported at first use.
    __getattr__, __dir__ = _lazy_attributes(
        __name__,
        {"AsyncClient": ".aio", "Client": ".sync"},
        {"aio", "config", "direct", "multiwait", "ops", "retry", "sync", "wait", "wait_sync"},
    )
