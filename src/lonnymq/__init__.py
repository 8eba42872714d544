"""LonnyMQ: a message queue inside PostgreSQL.

The queue logic is plpgsql in its own schema; :class:`Client` and :class:`AsyncClient` are thin
bindings over it. Optional parts (worker, CLI, Spark) live in their own subpackages and are not
imported here.
"""

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
