"""LonnyMQ: a message queue inside PostgreSQL.

The queue logic is plpgsql in its own schema; :class:`Client` and :class:`AsyncClient` are thin
bindings over it. Optional parts (worker, CLI, Spark) live in their own subpackages and are not
imported here.

The names below are imported on first use (``from lonnymq import Client`` imports the client
then), so ``import lonnymq`` alone, or a ``lonnymq --help`` that only needs the version, does
not pay for psycopg and the clients (docs/startup.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors
    from .client import AsyncClient, Client
    from .migrations import DEFAULT_SCHEMA
    from .models import (
        ArchivedMessage,
        ChannelInfo,
        DeadMessage,
        Envelope,
        Message,
        QueueInfo,
        QueueMetrics,
        SendResult,
    )
    from .serializer import JsonSerializer, OrjsonSerializer, Serializer

__all__ = [
    "DEFAULT_SCHEMA",
    "ArchivedMessage",
    "AsyncClient",
    "ChannelInfo",
    "Client",
    "DeadMessage",
    "Envelope",
    "JsonSerializer",
    "Message",
    "OrjsonSerializer",
    "QueueInfo",
    "QueueMetrics",
    "SendResult",
    "Serializer",
    "errors",
]

__version__ = "0.1.0"

# Where each exported name lives (the module, relative to this package).
_HOMES = {
    "DEFAULT_SCHEMA": ".migrations",
    "ArchivedMessage": ".models",
    "AsyncClient": ".client",
    "ChannelInfo": ".models",
    "Client": ".client",
    "DeadMessage": ".models",
    "Envelope": ".models",
    "JsonSerializer": ".serializer",
    "Message": ".models",
    "OrjsonSerializer": ".serializer",
    "QueueInfo": ".models",
    "QueueMetrics": ".models",
    "SendResult": ".models",
    "Serializer": ".serializer",
}


# The subpackages `import lonnymq` used to import: `lonnymq.models` and the like keep working
# after a bare `import lonnymq`, imported at that first use.
_SUBMODULES = {"client", "errors", "migrations", "models", "serializer", "sql"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        value: Any = importlib.import_module(f".{name}", __name__)
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
