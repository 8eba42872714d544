"""Payload serializers: the default JSON takes datetime, date, time, UUID and Decimal (every
digit kept) and reads them back in their documented text form; bytes and str are untouched; a
client's own serializer encodes and decodes its content type (sync and async clients)."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from lonnymq import AsyncClient, Client, Envelope, errors
from lonnymq.serializer import JSON, JsonSerializer, OrjsonSerializer, Serializer

WHEN = datetime(2024, 3, 10, 2, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5)))
ID = UUID("12345678-1234-5678-1234-567812345678")
AMOUNT = Decimal("12345678901234567890.000000000000000000123")  # far beyond a float's 17 digits

SENT = {
    "at": WHEN,
    "naive": datetime(2024, 1, 1, 12, 0),
    "day": date(2024, 2, 29),
    "clock": time(23, 59, 58, 1),
    "id": ID,
    "amount": AMOUNT,
    "small": Decimal("0.10"),
    "pair": (1, "a"),
    "plain": [1, 2.5, None, True, "x"],
}
#: What Message.payload gives back for SENT: the canonical text forms (see lonnymq.serializer).
RECEIVED = {
    "at": "2024-03-10T02:30:15.123456-05:00",
    "naive": "2024-01-01T12:00:00",
    "day": "2024-02-29",
    "clock": "23:59:58.000001",
    "id": "12345678-1234-5678-1234-567812345678",
    "amount": "12345678901234567890.000000000000000000123",
    "small": "0.10",
    "pair": [1, "a"],
    "plain": [1, 2.5, None, True, "x"],
}


@pytest.fixture
def q(client: Client) -> str:
    client.create_queue("q")
    return "q"


def test_extra_types_round_trip_as_documented(client: Client, q: str) -> None:
    client.send(q, SENT)
    client.send_batch(q, [Envelope({"amount": AMOUNT}, kind="k"), ID])
    m1, m2, m3 = client.take(q, 3)
    assert m1.content_type == JSON and m1.payload == RECEIVED
    # The text forms give the values back exactly.
    p = m1.payload
    assert (
        datetime.fromisoformat(p["at"]) == WHEN
        and datetime.fromisoformat(p["at"]).utcoffset() == WHEN.utcoffset()
    )
    assert date.fromisoformat(p["day"]) == SENT["day"] and time.fromisoformat(p["clock"]) == SENT["clock"]
    assert UUID(p["id"]) == ID
    assert Decimal(p["amount"]) == AMOUNT and str(Decimal(p["amount"])) == str(AMOUNT)
    assert Decimal(p["small"]).as_tuple() == Decimal("0.10").as_tuple()  # trailing zero kept
    assert m2.payload == {"amount": str(AMOUNT)} and m2.kind == "k"
    assert m3.payload == str(ID)


def test_bytes_and_text_are_untouched(client: Client, q: str) -> None:
    raw = b'{"looks": "like json"}\x00\xff'
    client.send_batch(q, [raw, bytearray(b"ba"), "plain text", '{"a": 1}'])
    ms = client.take(q, 4)
    assert [m.payload for m in ms] == [raw, b"ba", "plain text", '{"a": 1}']
    assert [m.content_type for m in ms[:2]] == [None, None]
    assert ms[0].body == raw


@pytest.mark.parametrize(
    "payload",
    [Decimal("NaN"), {"x": Decimal("Infinity")}, math.nan, {"s": {1, 2}}, object(), {"c": 1j}],
    ids=lambda v: "object()" if type(v) is object else repr(v),  # stable across xdist workers
)
def test_unencodable_payloads_are_refused_and_nothing_is_sent(client: Client, q: str, payload: Any) -> None:
    with pytest.raises(errors.InvalidArgument, match="payload"):
        client.send_batch(q, [1, payload])
    assert client.peek(q) == []


class Tagged:
    """A serializer that gives datetimes back as datetimes (a tagged JSON of its own)."""

    content_type = "application/x-tagged+json"

    def dumps(self, value: Any) -> bytes:
        def tag(v: Any) -> Any:
            if isinstance(v, datetime):
                return {"$dt": v.isoformat()}
            raise TypeError(f"cannot tag {type(v).__name__}")

        return json.dumps(value, default=tag).encode()

    def loads(self, body: bytes) -> Any:
        def untag(d: dict[str, Any]) -> Any:
            return datetime.fromisoformat(d["$dt"]) if set(d) == {"$dt"} else d

        return json.loads(body, object_hook=untag)


def test_a_client_serializer_encodes_and_decodes_its_content_type(
    dsn: str, schema: str, client: Client, q: str
) -> None:
    assert isinstance(Tagged(), Serializer)
    with Client(dsn, schema=schema, serializer=Tagged()) as tagged:
        tagged.send(q, {"at": WHEN})
        tagged.send(q, b"raw")  # bytes and str never go through the serializer
        client.send(q, {"plain": 1})  # default JSON, decoded as JSON by both
        with pytest.raises(errors.InvalidArgument, match="Tagged"):
            tagged.send(q, {"id": ID})
        mine = tagged.peek(q, 3)
        assert [m.payload for m in mine] == [{"at": WHEN}, b"raw", {"plain": 1}]
        assert mine[0].content_type == Tagged.content_type
    # A client without that serializer does not guess: the body comes back as bytes.
    other = client.peek(q, 1)[0]
    assert other.payload == other.body and json.loads(other.body) == {"at": {"$dt": WHEN.isoformat()}}


def test_async_client_serializer(dsn: str, schema: str, q: str) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(dsn, schema=schema, serializer=Tagged()) as c:
            await c.send(q, [WHEN])
            return [m.payload for m in await c.take(q, 1)]

    assert asyncio.run(main()) == [[WHEN]]


def test_serializer_must_return_bytes(dsn: str, schema: str, q: str) -> None:
    class Text(JsonSerializer):
        def dumps(self, value: Any) -> bytes:
            return super().dumps(value).decode()  # type: ignore[return-value]  # the bug under test

    with (
        Client(dsn, schema=schema, serializer=Text()) as c,
        pytest.raises(errors.InvalidArgument, match="not bytes"),
    ):
        c.send(q, {"a": 1})


def test_orjson_serializer_reads_back_like_the_default() -> None:
    pytest.importorskip("orjson")
    fast, default = OrjsonSerializer(), JsonSerializer()
    value = {**SENT, "at_utc": WHEN.astimezone(UTC)}
    assert fast.loads(fast.dumps(value)) == default.loads(default.dumps(value))
    assert fast.loads(default.dumps(value)) == default.loads(fast.dumps(value))
    with pytest.raises(TypeError):
        fast.dumps({"x": Decimal("NaN")})
