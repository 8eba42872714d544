"""The benchmark suite as a script: the same as ``lonnymq bench`` / ``python -m lonnymq.bench``.

    .venv/bin/python benchmarks/bench.py [--quick] [--dsn URI] [--workloads ...] [--systems ...]

See docs/benchmarks.md for what it measures and how to read the results.
"""

from __future__ import annotations

from lonnymq.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
