"""``python -m lonnymq.bench``: the same as ``lonnymq bench``."""

from __future__ import annotations

from .runner import main

raise SystemExit(main())
