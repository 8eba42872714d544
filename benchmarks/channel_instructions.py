"""A channel take's server work against the number of channels, counted in instructions
(issue 19 item 2; docs/channels.md): deterministic, where the channel series of
``benchmarks/scale.py`` (messages a second) moves by a factor of 2 between repetitions on a
shared machine.

For each count C a queue ``ch<C>`` gets a backlog spread round robin over C channels
(max(2 C, 40,000) messages, as scale.py's channel series); then, in a single-user backend under
callgrind (``server_instructions.py``'s cluster, the current generation's start moved an hour
ahead so that no take rotates), ``take(ch<C>, n, ack => the previous call's deliveries)`` is
executed 45 and 120 times, and the difference over 75 calls is the cost of one, per message:

    python benchmarks/channel_instructions.py                       # 10, 1,000, 100,000 channels
    python benchmarks/channel_instructions.py --channels 10,100000 --sizes 1
    python benchmarks/channel_instructions.py --src /tmp/before/src --json before.json  # another tree
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import server_instructions as si

_LOAD = """import sys
from lonnymq import Client, Envelope
with Client(sys.argv[1], pool_size=1) as c:
    c.migrate()
    for n in [int(x) for x in sys.argv[2].split(",")]:
        q = f"ch{n}"
        c.create_queue(q)
        total = max(2 * n, 40000)
        for s in range(0, total, 5000):
            c.send_batch(q, [Envelope(b'{"order": 123456, "note": "xxxxxxxxxxxx"}', channel=f"t{i % n}")
                             for i in range(s, s + 5000)])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", default="10,1000,100000")
    ap.add_argument("--sizes", default="1,100", help="take sizes (messages a call)")
    ap.add_argument("--src", default="src")
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--json", type=Path, help="also write the counts here (raw, per message)")
    args = ap.parse_args()
    counts = [int(x) for x in args.channels.split(",")]
    results: list[dict[str, object]] = []
    cluster = si.Cluster(args.bin)
    try:
        cluster.initdb()
        cluster.pg_ctl("start")
        dsn = f"postgresql://root@127.0.0.1:{cluster.port}/postgres"
        env = dict(os.environ, PYTHONPATH=os.path.abspath(args.src))
        subprocess.run([sys.executable, "-c", _LOAD, dsn, args.channels], env=env, check=True)
        subprocess.run([str(args.bin / "psql"), dsn, "-qc", "VACUUM ANALYZE"], check=True)
        cluster.pg_ctl("stop")
        low, high = 25, 100
        for size in (int(x) for x in args.sizes.split(",")):
            for n in counts:
                stmt = f"SELECT {si._KEEP} FROM lonnymq.take('ch{n}', {size}, NULL, {si._ACK}) t"
                stmt = stmt.replace("{{", "{").replace("}}", "}")
                got = []
                for calls in (low, high):
                    script = (
                        "SET synchronous_commit = on\nSET b.ids = '{}'\nSET b.toks = '{}'\n"
                        "SELECT setval('lonnymq.message_gen_started_seq',"
                        " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)\n"
                        f"PREPARE w AS {stmt}\n" + "EXECUTE w\n" * (20 + calls)
                    )
                    got.append(cluster.single(script, "postgres"))
                per = (got[1] - got[0]) / (high - low) / size
                results.append(
                    {
                        "size": size,
                        "channels": n,
                        "calls": [low, high],
                        "instructions": got,
                        "per_message": per,
                        "load": os.getloadavg(),
                    }
                )
                if args.json:
                    args.json.write_text(json.dumps({"src": args.src, "results": results}, indent=1) + "\n")
                print(
                    f"take({size}) + ack at {n:>7} channels: {per / 1000:8.1f}k instructions/message",
                    flush=True,
                )
    finally:
        cluster.remove()


if __name__ == "__main__":
    main()
