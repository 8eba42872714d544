"""The functions of the SQL core, one file per concept (``take.sql`` holds ``take``).

Function files are repeatable: each defines its functions with ``CREATE OR REPLACE FUNCTION``
only, and ``migrate`` re-applies a file whenever its rendered text differs from the one recorded
in ``<schema>.migration_repeatable`` (see :mod:`lonnymq.migrations`). Stored data (tables,
indexes, types, rows) belongs to the versioned migrations instead. Each file is a template like
a migration: ``{schema}`` is the quoted schema identifier, ``{schema_name}`` its string literal,
literal braces are doubled.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from psycopg import sql

#: The function files in the order they are applied. plpgsql bodies are only checked when they
#: run, but an SQL-language function needs what it calls to exist when it is created: util
#: first (now_ms, _dequeue_at); messages before dead (dead_list reads through archive_list);
#: stats (the counters and the worker registry) before maintenance; security last (it applies privileges to everything else).
FILES: tuple[str, ...] = (
    "util",
    "generations",
    "wait",
    "queues",
    "channels",
    "send",
    "take",
    "settle",
    "messages",
    "dead",
    "stats",
    "maintenance",
    "cron",
    "spark",
    "security",
)

#: ``CREATE [OR REPLACE] FUNCTION {schema}.name(`` at the start of a line, in a template.
FUNCTION_RE = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+\{schema\}\.(\w+)\s*\(", re.M | re.I)


@dataclass(frozen=True)
class FunctionFile:
    name: str
    template: str

    def render(self, schema: str) -> sql.Composed:
        """The file's SQL for ``schema``, identifiers quoted by psycopg."""
        return sql.SQL(self.template).format(schema=sql.Identifier(schema), schema_name=sql.Literal(schema))

    def checksum(self, schema: str) -> str:
        """sha256 of the rendered text: what ``migration_repeatable`` records."""
        return hashlib.sha256(self.render(schema).as_string().encode()).hexdigest()


@cache
def function_files() -> tuple[FunctionFile, ...]:
    """Every function file of the package, in :data:`FILES` order."""
    folder = resources.files(__package__)
    shipped = {e.name[: -len(".sql")] for e in folder.iterdir() if e.name.endswith(".sql")}
    if shipped != set(FILES):
        raise RuntimeError(f"sql/ files {sorted(shipped)} do not match sql.FILES {sorted(FILES)}")
    return tuple(
        FunctionFile(f"{name}.sql", folder.joinpath(f"{name}.sql").read_text(encoding="utf-8"))
        for name in FILES
    )


def defined_functions(template: str) -> list[str]:
    """The names of the functions a template creates, in order (with repeats)."""
    return FUNCTION_RE.findall(template)


def function_text(name: str) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` statement of ``name`` as its sql/ file has it
    (template text, ``{schema}`` unexpanded), for tests and tools that read function bodies."""
    for f in function_files():
        for match in FUNCTION_RE.finditer(f.template):
            if match[1] == name:
                body = f.template.index("$$", match.start())
                end = f.template.index("$$", body + 2) + 2
                return f.template[match.start() : end].strip() + ";"
    raise LookupError(f"no sql/ file defines {name}()")
