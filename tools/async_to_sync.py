"""Generate the synchronous twins of asyncio modules: ``client/sync.py`` from ``client/aio.py``.

The async module is the source of truth; its twin is produced by transforming the syntax tree,
never by editing text: ``async def`` becomes ``def``, ``await x`` becomes ``x``, ``async with``
and ``async for`` become ``with`` and ``for``, and the names in ``NAMES`` are mapped (in code and
in docstrings). The tree is printed with ``ast.unparse`` and formatted with ruff, so the twin
passes ``ruff check`` and ``ruff format --check``. Comments do not survive ``ast.unparse``;
docstrings do. The module docstring becomes a "generated, do not edit" header.

Run ``python tools/async_to_sync.py`` to regenerate every twin of ``PAIRS``, or with
``--check`` to exit 1 if one is stale (tests/test_codegen.py does). To generate another module,
add a (source, target) pair to ``PAIRS``; an import of a paired module (``from .aio import x``)
is mapped to its twin (``from .sync import x``).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "src" / "lonnymq" / "client"

#: (async source, generated sync target) pairs.
PAIRS: list[tuple[Path, Path]] = [
    (CLIENT / "aio.py", CLIENT / "sync.py"),
    (CLIENT / "wait.py", CLIENT / "wait_sync.py"),
]

#: Names (identifiers, attributes, imported names, methods) mapped from async to sync.
NAMES: dict[str, str] = {
    "AsyncClient": "Client",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncIterator": "Iterator",
    "AsyncListener": "Listener",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "asleep": "sleep",
}

#: Docstring phrases that say "asyncio", and what the sync twin says instead.
DOC_PHRASES: dict[str, str] = {
    "The asyncio client; ``sync.py`` is generated from it by ``tools/async_to_sync.py``.": (
        "The synchronous client."
    ),
    "A LonnyMQ client on asyncio.": "A LonnyMQ client (synchronous; thread-safe when built on a pool).",
}

COMMENT = "# Generated from {source} by tools/async_to_sync.py: do not edit; edit {source} and regenerate.\n"
GENERATED = "Generated from ``{source}`` by ``tools/async_to_sync.py``: do not edit."

_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, NAMES), key=len, reverse=True)) + r")\b")


def _map_text(text: str) -> str:
    for old, new in DOC_PHRASES.items():
        text = text.replace(old, new)
    return _WORD.sub(lambda m: NAMES[m.group(1)], text)


def _docstring(body: list[ast.stmt]) -> str | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        value = first.value.value
        return value if isinstance(value, str) else None
    return None


def _set_docstring(body: list[ast.stmt], text: str) -> None:
    if _docstring(body) is None:
        body.insert(0, ast.Expr(ast.Constant(text)))
    else:
        body[0] = ast.Expr(ast.Constant(text))


class AsyncToSync(ast.NodeTransformer):
    """The tree transformation; ``modules`` maps relative module names (``.aio``) to twins."""

    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules

    def _fields(self, node: ast.AST) -> dict[str, Any]:
        return {f: getattr(node, f) for f in node._fields if hasattr(node, f)}

    def _docstring(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = _docstring(node.body)
            if doc is not None:
                _set_docstring(node.body, _map_text(doc))

    def visit_Module(self, node: ast.Module) -> ast.Module:
        self._docstring(node)
        self.generic_visit(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.FunctionDef:
        self._docstring(node)
        self.generic_visit(node)
        new = ast.FunctionDef(**self._fields(node))
        new.name = NAMES.get(new.name, new.name)
        return ast.copy_location(new, node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        self._docstring(node)
        self.generic_visit(node)
        node.name = NAMES.get(node.name, node.name)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        self._docstring(node)
        self.generic_visit(node)
        node.name = NAMES.get(node.name, node.name)
        return node

    def visit_Await(self, node: ast.Await) -> ast.expr:
        return self.visit(node.value)  # type: ignore[no-any-return]  # visit() is typed Any

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.With:
        self.generic_visit(node)
        return ast.copy_location(ast.With(**self._fields(node)), node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.For:
        self.generic_visit(node)
        return ast.copy_location(ast.For(**self._fields(node)), node)

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.is_async = 0
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = NAMES.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        self.generic_visit(node)
        node.attr = NAMES.get(node.attr, node.attr)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level and node.module is not None:
            relative = "." * node.level + node.module
            if relative in self.modules:
                node.module = self.modules[relative].lstrip(".")
        seen: set[tuple[str, str | None]] = set()
        names = []
        for alias in node.names:
            alias.name = NAMES.get(alias.name, alias.name)
            if (alias.name, alias.asname) not in seen:  # AsyncIterable and Iterable both -> Iterable
                seen.add((alias.name, alias.asname))
                names.append(alias)
        node.names = names
        return node


def _relative_modules() -> dict[str, str]:
    """``.aio`` -> ``.sync`` for every pair whose two modules share a package."""
    return {f".{s.stem}": f".{t.stem}" for s, t in PAIRS if s.parent == t.parent}


def _ruff(args: Sequence[str], text: str, target: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(target), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on the generated {target}:\n{done.stderr}")
    return done.stdout


def convert(source: str, source_path: Path, target_path: Path) -> str:
    """The sync twin of the module text ``source`` (read from ``source_path``), formatted."""
    tree = AsyncToSync(_relative_modules()).visit(ast.parse(source, filename=str(source_path)))
    # The module docstring keeps its first paragraph (the title, mapped) and its body; the
    # "do not edit" notice goes in between.
    generated = GENERATED.format(source=source_path.name)
    title, _, rest = (_docstring(tree.body) or "").strip().partition("\n\n")
    _set_docstring(tree.body, "\n\n".join(p for p in (title, generated, rest) if p) + "\n")
    text = COMMENT.format(source=source_path.name) + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    # Imports first (sorted, and those only the async code used removed), then the layout.
    text = _ruff(["check", "--fix-only", "--select", "I,F401"], text, target_path)
    return _ruff(["format"], text, target_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    for source_path, target_path in PAIRS:
        out = convert(source_path.read_text(), source_path, target_path)
        current = target_path.read_text() if target_path.exists() else None
        if current == out:
            continue
        if args.check:
            stale.append(target_path.relative_to(ROOT))
        else:
            target_path.write_text(out)
            print(f"wrote {target_path.relative_to(ROOT)}")
    if stale:
        for path in stale:
            print(f"{path} is out of date: run python tools/async_to_sync.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
