"""docs/sharding.md's Python examples, run in order in one namespace on the session's router."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.once, pytest.mark.slow]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "sharding.md"


def test_sharding_page_examples_run(sharded, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 2
    monkeypatch.setenv("ROUTER_DSN", sharded.dsn)
    monkeypatch.setenv("SHARD_DSNS", " ".join(sharded.shard_dsns))
    namespace: dict[str, Any] = {"__name__": "docs_sharding"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/sharding.md[python block {i + 1}]", "exec"), namespace)
