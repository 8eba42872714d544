"""What consuming costs the server: backend CPU (µs per call, from ``/proc/<pid>/schedstat``,
so the client's Python and other processes do not count) of two source trees side by side, each
migrated into a schema of its own on one server, alternating in rounds on one connection each:
``take(1)`` then ``ack()`` of that delivery (two calls, as a consumer of many queues makes them),
the drain ``take(1, ack=previous)`` (one call) and the pop ``take_tx(1)`` (one call in its own
transaction: take-and-delete). The ratios are the medians over rounds of
after / before (side by side: a round's load is common to both).

    python benchmarks/consume_cpu.py --before ../main/src --after src --dsn postgresql://... \\
        [--calls 2000] [--rounds 5] [--commit off]

The server must run on this machine (``/proc/<backend pid>``).
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

from send_cpu import _cpu  # type: ignore[import-not-found,unused-ignore]
from send_path import _setup  # type: ignore[import-not-found,unused-ignore]
from send_path_sql import PAYLOAD, before_after_args  # type: ignore[import-not-found,unused-ignore]


def main() -> None:
    args = before_after_args(__doc__, calls=2000, rounds=5).parse_args()

    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:6]
    trees = {"before": (args.before, f"consume_before_{tag}"), "after": (args.after, f"consume_after_{tag}")}
    for src, schema in trees.values():
        _setup(src, args.dsn, schema)
    conns = {name: psycopg.connect(args.dsn, autocommit=True) for name in trees}
    # (workload, tree) -> µs per call of each round
    spent: dict[tuple[str, str], list[float]] = {}
    try:
        for c in conns.values():
            c.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(args.commit)))
        for r in range(args.rounds):
            for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
                c, s = conns[name], sql.Identifier(trees[name][1])
                pid = c.info.backend_pid
                send = sql.SQL("SELECT * FROM {}.send('q', %s)").format(s)
                take = sql.SQL("SELECT id, token FROM {}.take('q', 1)").format(s)
                drain = sql.SQL(
                    "SELECT id, token FROM {}.take('q', 1, NULL, %s::bigint[], %s::int[])"
                ).format(s)
                ack = sql.SQL("SELECT * FROM {}.ack('q', %s::bigint[], %s::int[])").format(s)
                for _ in range(3 * args.calls):
                    c.execute(send, [PAYLOAD]).fetchall()
                took = acked = 0.0
                for _ in range(args.calls):
                    t0 = _cpu(pid)
                    row: Any = c.execute(take).fetchone()
                    t1 = _cpu(pid)
                    c.execute(ack, [[row[0]], [row[1]]]).fetchall()
                    took, acked = took + t1 - t0, acked + _cpu(pid) - t1
                spent.setdefault(("take(1)", name), []).append(took / args.calls * 1e6)
                spent.setdefault(("ack(1)", name), []).append(acked / args.calls * 1e6)
                prev: list[Any] = [None, None]
                t0 = _cpu(pid)
                for _ in range(args.calls):
                    row = c.execute(drain, prev).fetchone()
                    prev = [[row[0]], [row[1]]]
                spent.setdefault(("take(1, ack=previous)", name), []).append(
                    (_cpu(pid) - t0) / args.calls * 1e6
                )
                c.execute(ack, prev).fetchall()
                pop = sql.SQL("SELECT id FROM {}.take_tx('q', 1)").format(s)
                t0 = _cpu(pid)
                for _ in range(args.calls):
                    c.execute(pop).fetchall()
                spent.setdefault(("take_tx(1)", name), []).append((_cpu(pid) - t0) / args.calls * 1e6)
    finally:
        for c in conns.values():
            c.close()
        with psycopg.connect(args.dsn, autocommit=True) as c:
            for _, schema in trees.values():
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    print(f"server CPU, µs a call ({args.rounds} rounds of {args.calls}; commit {args.commit})")
    print("| call | before | after | after / before (median of rounds) |")
    print("|---|---|---|---|")
    for work in ("take(1)", "ack(1)", "take(1, ack=previous)", "take_tx(1)"):
        b, a = spent[(work, "before")], spent[(work, "after")]
        ratio = statistics.median(y / x for x, y in zip(b, a, strict=True))
        print(f"| {work} | {statistics.median(b):.0f} | {statistics.median(a):.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
