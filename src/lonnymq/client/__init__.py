"""The LonnyMQ client: one method = one SQL function call = one atomic queue action.

- ``aio.AsyncClient``: the asyncio client, the source of truth.
- ``sync.Client``: its synchronous twin, generated from ``aio.py`` by ``tools/async_to_sync.py``.
- ``ops``: I/O-free query building, argument checks, row decoding and error mapping shared by both;
  the internal API that the worker and the Spark connector may also use.
"""

from .aio import AsyncClient
from .sync import Client

__all__ = ["AsyncClient", "Client"]
