"""The server a benchmark runs on: the one given, or a throwaway embedded PostgreSQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def dsn_or_temporary(dsn: str | None) -> Iterator[str]:
    """``dsn`` if given; otherwise the DSN of a throwaway embedded server (``lonnymq[embedded]``)
    that lives for the ``with`` block and is deleted afterwards."""
    if dsn:
        yield dsn
        return
    from lonnymq.embedded import temporary_server

    with temporary_server() as srv:
        yield srv.dsn
