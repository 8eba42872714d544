"""``python -m lonnymq_bench`` (from ``benchmarks/``): the same as ``python benchmarks/bench.py``."""

from __future__ import annotations

from .runner import main

raise SystemExit(main())
