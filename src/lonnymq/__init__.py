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
    from collections.abc import Callable, Collection, Mapping

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


def _lazy_attributes(
    package: str, homes: Mapping[str, str], submodules: Collection[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__`` for names imported at first use: each
    name of ``homes`` from its module (relative to ``package``), each of ``submodules`` as the
    submodule. Packages define them under ``if not TYPE_CHECKING`` (type checkers see the
    ``TYPE_CHECKING`` imports, so a misspelt name stays an error)."""
    import importlib
    import sys

    def __getattr__(name: str) -> Any:
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in homes:
            value = getattr(importlib.import_module(homes[name], package), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # the next lookup finds it without coming here
        return value

    def __dir__() -> list[str]:
        module = sys.modules[package]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __getattr__, __dir__


if not TYPE_CHECKING:
    # The exported names, each from its module; and the subpackages `import lonnymq` used to
    # import, so that `lonnymq.models` and the like still work after a bare `import lonnymq`.
    __getattr__, __dir__ = _lazy_attributes(
        __name__,
        {
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
        },
        {"client", "errors", "migrations", "models", "serializer", "sql"},
    )
