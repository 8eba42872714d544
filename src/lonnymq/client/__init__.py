"""The LonnyMQ client: one method = one SQL function call = one atomic queue action.

- ``aio.AsyncClient``: the asyncio client, the source of truth.
- ``sync.Client``: its synchronous twin, generated from ``aio.py`` by ``tools/async_to_sync.py``.
- ``ops``: I/O-free query building, argument checks, row decoding and error mapping shared by both;
  the internal API that the worker and the Spark connector may also use.

Each client is imported on first use: a synchronous program (the CLI) does not import the
asyncio one, nor an asyncio program the synchronous one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sync import Client

__all__ = ["AsyncClient", "Client"]


# The modules importing the package used to import: `lonnymq.client.ops` and the like keep
# working after a bare `import lonnymq.client`, imported at that first use.
_SUBMODULES = {"aio", "config", "direct", "multiwait", "ops", "retry", "sync", "wait", "wait_sync"}


def __getattr__(name: str) -> Any:
    value: Any
    if name in _SUBMODULES:
        import importlib

        value = importlib.import_module(f".{name}", __name__)
    elif name == "AsyncClient":
        from .aio import AsyncClient

        value = AsyncClient
    elif name == "Client":
        from .sync import Client

        value = Client
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
