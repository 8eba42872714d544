"""Modules imported on first use.

Spark starts a Python process for each planning step of a query (look up the source, its
schema, its partitions, make a writer, commit, and each streaming query's offsets), forked
from a daemon that imports nothing of ours: each one imports the module of the data source
again. numpy and pyarrow are most of that import (about 0.25 s of CPU each time, measured in
docs/spark.md) and only the reading and writing tasks use them, which import them anyway.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module ``name``, imported at the first attribute read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)
