"""``lonnymq send|peek|take|ack|nack|extend``: put messages in, look at them, take them out and
settle what was taken."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from ..client import Client
from ..errors import InvalidArgument
from ..models import Envelope, Message
from . import CommandError, UsageError, _util, common

_ENVELOPE_FIELDS = {"payload", "kind", "headers", "delay", "at", "priority", "key", "channel"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "send",
        help="send messages from arguments, a file or stdin (JSON lines)",
        description="Send messages. Everything given (arguments and the whole file) is sent in one"
        " transaction: a bad line sends nothing.",
    )
    common(s)
    s.add_argument("queue")
    s.add_argument("payloads", nargs="*", help="payloads (JSON if it parses, else text)")
    s.add_argument(
        "--file",
        help="JSON-lines file ('-' for stdin): one payload per line, or with "
        "--envelopes one object per line with payload/kind/headers/delay/at/priority/key/channel",
    )
    s.add_argument("--envelopes", action="store_true", help="lines are envelope objects")
    s.add_argument("--kind")
    s.add_argument("--key")
    s.add_argument("--channel")
    s.add_argument("--delay", type=float, help="seconds before the message is deliverable")
    s.add_argument("--priority", type=int, default=0, help="-100..100")
    s.add_argument("--on-conflict", choices=["ignore", "replace", "error"], default="ignore")
    s.add_argument("--batch-size", type=int, default=5000, help="messages per round trip (default 5000)")
    s.set_defaults(func=send)

    pk = sub.add_parser("peek", help="show the next messages (ready, scheduled, leased) without taking them")
    common(pk)
    pk.add_argument("queue")
    pk.add_argument("-n", type=int, default=10, help="how many (default 10)")
    pk.set_defaults(func=peek)

    t = sub.add_parser(
        "take",
        help="lease messages; finish them with ack/nack/extend ID:TOKEN",
        description="Lease up to N ready messages for the lease time. Settle each with"
        " `lonnymq ack QUEUE ID:TOKEN` (or nack, extend) before its lease ends, or it is delivered"
        " again and counts as a failed attempt. With --ack the messages are acknowledged at once:"
        " at-most-once delivery (whatever you do with the output, they are gone).",
    )
    common(t)
    t.add_argument("queue")
    t.add_argument("-n", type=int, default=1, help="how many (default 1)")
    t.add_argument("--lease", type=float, help="lease seconds (default: the queue's)")
    t.add_argument("--ack", action="store_true", help="acknowledge at once (at-most-once)")
    t.set_defaults(func=take)

    deliveries_help = "ID:TOKEN of each delivery (as printed by take), or - to read `take --json` from stdin"
    a = sub.add_parser("ack", help="acknowledge messages taken by `take` (done: delete or archive)")
    common(a)
    a.add_argument("queue")
    a.add_argument("deliveries", nargs="+", metavar="ID:TOKEN", help=deliveries_help)
    a.set_defaults(func=ack)

    nk = sub.add_parser("nack", help="report taken messages as failed: retried later or dead-lettered")
    common(nk)
    nk.add_argument("queue")
    nk.add_argument("deliveries", nargs="+", metavar="ID:TOKEN", help=deliveries_help)
    nk.add_argument("--delay", type=float, default=0, help="seconds before the retry (default 0)")
    nk.add_argument("--error", help="the error to record (shown by dlq list)")
    nk.set_defaults(func=nack)

    ex = sub.add_parser("extend", help="extend the lease of taken messages")
    common(ex)
    ex.add_argument("queue")
    ex.add_argument("deliveries", nargs="+", metavar="ID:TOKEN", help=deliveries_help)
    ex.add_argument("--lease", type=float, help="seconds from now (default: the queue's lease)")
    ex.set_defaults(func=extend)


# -- send --------------------------------------------------------------------------------------


class _Input:
    """The lines of ``--file`` (opened at once, so a missing file fails before connecting)."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Kept open past __init__ (read lazily, closed by close()): no context manager here.
        self.stream: IO[str] = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
        self.size = None if path == "-" else os.fstat(self.stream.fileno()).st_size
        self.read = 0

    def lines(self) -> Iterator[tuple[int, str]]:
        for n, line in enumerate(self.stream, 1):
            self.read += len(line.encode("utf-8"))
            if line.strip():
                yield n, line

    def close(self) -> None:
        if self.stream is not sys.stdin:
            self.stream.close()


def _envelopes(args: argparse.Namespace, source: _Input | None) -> Iterator[Envelope]:
    defaults: dict[str, Any] = {
        "kind": args.kind,
        "key": args.key,
        "channel": args.channel,
        "delay": args.delay,
        "priority": args.priority,
    }
    for text in args.payloads:
        yield Envelope(_util.parse_payload(text), **defaults)
    if source is None:
        return
    name = "stdin" if source.path == "-" else source.path
    for n, line in source.lines():
        try:
            value = json.loads(line)
        except ValueError as e:
            raise InvalidArgument(f"{name} line {n}: not JSON ({e})") from None
        if args.envelopes:
            if not isinstance(value, dict) or "payload" not in value or set(value) - _ENVELOPE_FIELDS:
                raise InvalidArgument(
                    f"{name} line {n}: an envelope is an object with 'payload' and only"
                    f" {', '.join(sorted(_ENVELOPE_FIELDS))}"
                )
            yield Envelope(**{**defaults, **value})
        else:
            yield Envelope(value, **defaults)


def send(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    if not args.payloads and not args.file:
        raise UsageError("nothing to send: give payloads or --file")
    if args.batch_size < 1:
        raise UsageError("--batch-size must be positive")
    source = _Input(args.file) if args.file else None
    results = []
    try:
        with (
            _util.connection(args) as conn,
            Client(conn, schema=_util.schema(args)) as c,
            Progress(
                console=Console(stderr=True),
                transient=True,
                disable=args.json or not sys.stdout.isatty(),
            ) as bar,
        ):
            task = bar.add_task("sending", total=source.size if source else None)
            try:
                # Through a shard router a call cannot join this transaction (each runs in the
                # shard's own): send the input as one batch, one transaction on the shard.
                routed = c.is_router()
                with contextlib.nullcontext() if routed else conn.transaction():
                    envelopes = _envelopes(args, source)
                    batches = [list(envelopes)] if routed else _util.chunks(envelopes, args.batch_size)
                    for batch in batches:
                        results.extend(c.send_batch(args.queue, batch, on_conflict=args.on_conflict))
                        bar.update(
                            task,
                            completed=source.read if source else len(results),
                            description=f"sending: {len(results)} messages",
                        )
            except InvalidArgument as e:
                raise InvalidArgument(f"{e}; nothing was sent (the input is sent in one transaction)") from e
    finally:
        if source is not None:
            source.close()
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    if args.json:
        _util.emit(args, results, ["id", "outcome"])
    else:
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing to send"
        print(f"{args.queue}: {summary}")
    return 0


# -- peek and take -----------------------------------------------------------------------------

_TIMES = ("scheduled_at", "lease_until", "enqueued_at")


def peek(args: argparse.Namespace) -> int:
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        messages = c.peek(args.queue, args.n)
        now = _util.db_now_ms(conn)
    rows = [{**_util.jsonable(m), "state": _util.state(m, now)} for m in messages]
    _util.emit(
        args,
        rows,
        [
            "id",
            "state",
            "attempt",
            "priority",
            "kind",
            "key",
            "channel",
            "scheduled_at",
            "lease_until",
            "payload",
        ],
        title=args.queue,
        times=_TIMES,
    )
    return 0


def take(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        messages = c.take(args.queue, args.n, lease=args.lease)
        if args.ack and messages:
            c.ack(messages)
    _util.emit(
        args,
        messages,
        ["id", "token", "attempt", "lease_until", "kind", "key", "channel", "payload"],
        title=f"{args.queue} ({'taken and acknowledged' if args.ack else 'leased: settle with ack ID:TOKEN'})",
        times=_TIMES,
    )
    return 0


# -- settle ------------------------------------------------------------------------------------


def _handle(queue: str, id_: int, token: int) -> Message:
    """A delivery named by id and token: all that ack, nack and extend read of a Message."""
    return Message(
        queue=queue,
        id=id_,
        token=token,
        attempt=0,
        lease_until=None,
        scheduled_at=0,
        enqueued_at=0,
        priority=0,
        key=None,
        channel=None,
        kind=None,
        content_type=None,
        headers=None,
        state=None,
        last_error=None,
        body=b"",
    )


def _deliveries(args: argparse.Namespace) -> list[Message]:
    if args.deliveries == ["-"]:
        try:
            items = json.load(sys.stdin)
            pairs = [(int(d["id"]), int(d["token"])) for d in items]
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(f"stdin: expected the JSON of `lonnymq take --json` ({e})") from None
    else:
        pairs = []
        for text in args.deliveries:
            id_, sep, token = text.partition(":")
            if not sep or not id_.isdigit() or not token.lstrip("-").isdigit():
                raise UsageError(f"expected ID:TOKEN (as printed by take), got {text!r}")
            pairs.append((int(id_), int(token)))
    if not pairs:
        raise UsageError("no deliveries given")
    return [_handle(args.queue, i, t) for i, t in pairs]


def _settled(args: argparse.Namespace, verb: str, handles: list[Message], done: Any) -> int:
    stale = [m.id for m in handles if m.id not in done]
    if args.json:
        _util.print_json({"queue": args.queue, verb: done, "stale": stale})
    elif done:
        print(f"{args.queue}: {verb} {len(done)} message(s)")
    if stale:
        raise CommandError(
            f"{args.queue}: {len(stale)} delivery(ies) not {verb}, token stale (the lease expired and the"
            f" message was taken again, or it was already settled): ids {', '.join(map(str, stale))}"
        )
    return 0


def ack(args: argparse.Namespace) -> int:
    handles = _deliveries(args)
    with _util.client(args) as c:
        done = sorted(c.ack(handles))
    return _settled(args, "acknowledged", handles, done)


def nack(args: argparse.Namespace) -> int:
    handles = _deliveries(args)
    with _util.client(args) as c:
        outcomes = c.nack(handles, delay=args.delay, error=args.error)
    if not args.json:
        for id_, outcome in sorted(outcomes.items()):
            print(f"{id_}: {'will be retried' if outcome == 'retry' else 'dead-lettered'}")
    return _settled(args, "nacked", handles, outcomes)


def extend(args: argparse.Namespace) -> int:
    handles = _deliveries(args)
    with _util.client(args) as c:
        leases = c.extend(handles, lease=args.lease)
    if not args.json:
        for id_, until in sorted(leases.items()):
            print(f"{id_}: leased until {_util.when(until, args)}")
    return _settled(args, "extended", handles, leases)
