"""Payload serializers: how values other than ``bytes`` and ``str`` become a message body.

``bytes`` are always stored untouched (no content type) and ``str`` as UTF-8 text; every other
payload goes through the client's serializer, which names the content type stored with the
message. A message whose content type is the serializer's is decoded with it
(``Message.payload``); other JSON and text messages are decoded as plain JSON and text.

The default, :class:`JsonSerializer`, writes standard JSON and also accepts the values
applications commonly put in payloads, written in their canonical text form so nothing is lost:

=================  ===============================  ========================================
sent               stored as                        read back (``Message.payload``)
=================  ===============================  ========================================
``datetime``       ISO 8601 string (offset kept)    ``str``: ``datetime.fromisoformat(s)``
``date``/``time``  ISO 8601 string                  ``str``: ``date/time.fromisoformat(s)``
``UUID``           canonical string                 ``str``: ``UUID(s)``
``Decimal``        string of its exact digits       ``str``: ``Decimal(s)`` (every digit kept)
tuple              array                            ``list``
=================  ===============================  ========================================

Reading them back as strings keeps the stored JSON plain for every other reader (SQL, Spark,
other languages); an application that wants typed values back plugs in its own serializer
(``Client(serializer=...)``), e.g. one built on pydantic. NaN and infinities are refused.

:class:`OrjsonSerializer` is the same contract on ``orjson`` (the ``orjson`` extra), faster on
large payloads; opt in with ``Client(serializer=OrjsonSerializer())``. It is not chosen
automatically because it differs at the edges (dict keys must be strings, NaN becomes null).
"""

from __future__ import annotations

import json
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

__all__ = ["JSON", "JsonSerializer", "OrjsonSerializer", "Serializer", "default_serializer"]

JSON = "application/json"


@runtime_checkable
class Serializer(Protocol):
    """Turns payloads into bytes and back. ``dumps`` raises TypeError or ValueError for a value
    it cannot encode (the client reports it as :class:`~lonnymq.errors.InvalidArgument`)."""

    content_type: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, body: bytes) -> Any: ...


def _default(value: Any) -> Any:
    """The JSON form of the extra types (called by the encoder for what JSON has no type for)."""
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"Decimal {value} is not a finite number")
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class JsonSerializer:
    """Standard JSON (compact, NaN refused) plus datetime, date, time, UUID and Decimal."""

    content_type = JSON

    def __init__(self) -> None:
        # One shared encoder: json.dumps(...) with options builds a new one on every call.
        self._encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_default).encode

    def dumps(self, value: Any) -> bytes:
        return self._encode(value).encode()

    def loads(self, body: bytes) -> Any:
        return json.loads(body)

    def __repr__(self) -> str:
        return "JsonSerializer()"


class OrjsonSerializer:
    """:class:`JsonSerializer`'s contract on ``orjson`` (``pip install lonnymq[orjson]``)."""

    content_type = JSON

    def __init__(self) -> None:
        """:raises MissingExtra: orjson is not installed (``pip install 'lonnymq[orjson]'``)."""
        try:
            import orjson
        except ModuleNotFoundError as e:
            if e.name != "orjson":
                raise
            from .errors import MissingExtra

            raise MissingExtra.of(e, "orjson", "OrjsonSerializer") from e

        self._orjson = orjson

    def dumps(self, value: Any) -> bytes:
        return self._orjson.dumps(value, default=_default)  # its errors are TypeErrors

    def loads(self, body: bytes) -> Any:
        return self._orjson.loads(body)

    def __repr__(self) -> str:
        return "OrjsonSerializer()"


_DEFAULT = JsonSerializer()


def default_serializer() -> JsonSerializer:
    """The serializer clients use unless given another."""
    return _DEFAULT
