"""The producers benchmark (issue 12 item 4): one-message sends from 1, 8 and 32 producer
processes, batch sends of 1,000, pop, drains at batch 1 and 100 and idle pickup p50/p99, for
LonnyMQ, pgmq, PgQueuer, the seed queue and the PostgreSQL floors side by side in one run,
printed as ratios with the command that reproduces them.

    pip install -r benchmarks/requirements.txt
    python benchmarks/producers.py [--quick] [--dsn URI] [--workloads ...] [--systems ...]

See docs/benchmarks.md ("Producers") for what it measures and how to read the results.
"""

from __future__ import annotations

from lonnymq_bench.producers import main

if __name__ == "__main__":
    raise SystemExit(main())
