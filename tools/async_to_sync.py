"""Generate the sync client (src/lonnymq/client/sync.py) from the async one (src/lonnymq/client/aio.py).

Writing the client once keeps the two from drifting; tests/test_codegen.py fails if the
committed client.py is not what this script produces. Run: python tools/async_to_sync.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "lonnymq" / "client" / "aio.py"
TARGET = ROOT / "src" / "lonnymq" / "client" / "sync.py"

# Whole-word replacements, applied in order.
WORDS = [
    ("AsyncConnectionPool", "ConnectionPool"),
    ("AsyncConnection", "Connection"),
    ("AsyncClient", "Client"),
    ("AsyncIterator", "Iterator"),
    ("asynccontextmanager", "contextmanager"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
]
PATTERNS = [
    (r"\basync def ", "def "),
    (r"\basync with ", "with "),
    (r"\basync for ", "for "),
    (r"\bawait ", ""),
    (
        r"The asyncio client\. ``client\.py`` is generated from this file by ``tools/async_to_sync\.py``\.",
        "The synchronous client.\n\nGenerated from ``aio.py`` by ``tools/async_to_sync.py``: do not edit.",
    ),
    (r"A LonnyMQ client on asyncio\.", "A LonnyMQ client (synchronous; thread-safe when built on a pool)."),
]


def convert(text: str) -> str:
    for old, new in WORDS:
        text = re.sub(rf"\b{old}\b", new, text)
    for pattern, new in PATTERNS:
        text = re.sub(pattern, new, text)
    return text


def main() -> int:
    out = convert(SOURCE.read_text())
    if "--check" in sys.argv:
        if TARGET.read_text() != out:
            print(f"{TARGET} is out of date: run python tools/async_to_sync.py")
            return 1
        return 0
    TARGET.write_text(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
