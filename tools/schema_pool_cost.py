"""The CPU of tests/schema_pool.py's per-test work: N cycles of acquire, a small test, release.

    python tools/cputime.py -- python tools/schema_pool_cost.py [N] [TESTS_DIR]

On a throwaway PostgreSQL 15 with plpgsql_check's profiler on (as in ./run test's PostgreSQL 15
pass). TESTS_DIR (default: this checkout's tests/) is where schema_pool.py is imported from, so
another checkout's pool can be measured the same way (docs/testing.md, "Changes of 2026-11-27,
evening"). Run with N=1 too: the difference is N-1 cycles without the server's start.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 201
    tests = argv[1] if len(argv) > 1 else str(ROOT / "tests")
    sys.path[:0] = [str(ROOT / "tools"), tests]
    import pgcluster
    import sqlcheck

    import schema_pool
    from lonnymq import Client

    with pgcluster.temporary_cluster(sqlcheck.PROFILER_SETTINGS) as cluster:
        pool = schema_pool.SchemaPool(cluster.dsn)
        started = time.monotonic()
        for i in range(n):
            name = pool.acquire(f"t_{i}")
            with Client(cluster.dsn, schema=name) as client:
                client.create_queue("q")
                client.send("q", {"a": 1})
                client.take("q")
            pool.release(name)
        pool.close()
        print(f"{1000 * (time.monotonic() - started) / n:.1f} ms a cycle (wall)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
