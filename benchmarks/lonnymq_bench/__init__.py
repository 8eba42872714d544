"""The benchmark suite: LonnyMQ side by side with pgmq, PgQueuer, the seed design's bare SKIP
LOCKED queue and the PostgreSQL floor, on one server, in one run.

Not part of the ``lonnymq`` package: run it from a checkout as ``python benchmarks/bench.py``
(see docs/benchmarks.md). The peers' packages are imported only when their system is selected:
``pip install -r benchmarks/requirements.txt``.
"""

from __future__ import annotations

from .runner import add_arguments, main, run

__all__ = ["add_arguments", "main", "run"]
