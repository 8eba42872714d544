"""``lonnymq send|peek|take``: put messages in and look at or take them out."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidArgument
from ..models import Envelope
from . import _util, common

_ENVELOPE_FIELDS = {"payload", "kind", "headers", "delay", "at", "priority", "key", "channel"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("send", help="send messages from arguments, a file or stdin (JSON lines)")
    common(s, json=True)
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
    s.add_argument("--batch-size", type=int, default=5000)
    s.set_defaults(func=send)

    pk = sub.add_parser("peek", help="show the next messages without taking them")
    common(pk, json=True)
    pk.add_argument("queue")
    pk.add_argument("-n", type=int, default=10)
    pk.set_defaults(func=peek)

    t = sub.add_parser("take", help="lease messages (and optionally ack them at once)")
    common(t, json=True)
    t.add_argument("queue")
    t.add_argument("-n", type=int, default=1)
    t.add_argument("--lease", type=float, help="lease seconds (queue default)")
    t.add_argument("--ack", action="store_true", help="acknowledge what was taken")
    t.set_defaults(func=take)


def _lines(path: str) -> Iterator[str]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        for line in stream:
            if line.strip():
                yield line
    finally:
        if stream is not sys.stdin:
            stream.close()


def _envelopes(args: argparse.Namespace) -> Iterator[Envelope]:
    defaults: dict[str, Any] = {
        "kind": args.kind,
        "key": args.key,
        "channel": args.channel,
        "delay": args.delay,
        "priority": args.priority,
    }
    for text in args.payloads:
        yield Envelope(_util.parse_payload(text), **defaults)
    if args.file:
        for n, line in enumerate(_lines(args.file), 1):
            try:
                value = json.loads(line)
            except ValueError as e:
                raise InvalidArgument(f"line {n}: not JSON: {e}") from None
            if args.envelopes:
                if not isinstance(value, dict) or "payload" not in value or set(value) - _ENVELOPE_FIELDS:
                    raise InvalidArgument(
                        f"line {n}: an envelope needs 'payload' and only {sorted(_ENVELOPE_FIELDS)}"
                    )
                yield Envelope(**{**defaults, **value})
            else:
                yield Envelope(value, **defaults)


def send(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    results = []
    with (
        _util.client(args) as c,
        Progress(transient=True, disable=args.json or not sys.stderr.isatty()) as bar,
    ):
        task = bar.add_task("sending", total=None)
        for batch in _util.chunks(_envelopes(args), args.batch_size):
            results.extend(c.send_batch(args.queue, batch, on_conflict=args.on_conflict))
            bar.advance(task, len(batch))
    if args.json:
        _util.emit(args, results, ["id", "outcome"])
    else:
        counts: dict[str, int] = {}
        for r in results:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing to send"
        print(f"{args.queue}: {summary}")
    return 0


_COLUMNS = ["id", "attempt", "token", "priority", "kind", "key", "channel", "scheduled_at", "payload"]


def peek(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        _util.emit(args, c.peek(args.queue, args.n), _COLUMNS, title=args.queue)
    return 0


def take(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        messages = c.take(args.queue, args.n, lease=args.lease)
        if args.ack and messages:
            c.ack(messages)
    _util.emit(args, messages, [*_COLUMNS, "lease_until"], title=args.queue)
    return 0
