"""The benchmark suite: LonnyMQ against pgmq, PgQueuer, a bare SKIP LOCKED queue and the floor.

    pip install -r benchmarks/requirements.txt
    python benchmarks/bench.py [--quick] [--dsn URI] [--workloads ...] [--systems ...]

See docs/benchmarks.md for what it measures and how to read the results.
"""

from __future__ import annotations

from lonnymq_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
