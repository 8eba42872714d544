"""plpgsql statement and branch coverage of the test suite, collected per test schema.

Opt-in: with ``LONNYMQ_SQL_COVERAGE=<file.jsonl>`` set (``tools/sqlcheck.py coverage`` sets it) and the
server running plpgsql_check's profiler (``plpgsql_check.profiler = on``, plpgsql_check preloaded so the
profiles of all sessions land in shared memory), the ``schema`` fixture calls :func:`record_schema` before
it drops the test's schema: profiles are keyed by function oid, and a dropped function's profile can no
longer be read.  Each call appends, for every plpgsql function of the schema, its statement tree once
(keyed by name, signature and an md5 of its source) and the per-statement execution counts of this test,
then resets those profiles so shared memory does not fill up.

:func:`merge` sums the counts over all tests (a statement is covered if any test ran it) and
:func:`format_report` prints the table.  Branches follow plpgsql_check's own definition
(``plpgsql_coverage_branches``): each IF path including an implicit ELSE, each CASE path including ELSE,
each loop body, and a block's body and each of its exception handlers; a path is taken when its first
statement ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ENV_VAR = "LONNYMQ_SQL_COVERAGE"

# Statement tree columns, in this order, as stored in "structure" records.
STMTID, PARENT, NOTE, BLOCK_NUM, LINENO, NAME = range(6)

_seen_sources: set[tuple[str, str]] = set()

_PROFILE_QUERY = """
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', p.prosrc,
       {ext}.plpgsql_coverage_statements(p.oid),
       {ext}.plpgsql_coverage_branches(p.oid),
       (SELECT json_agg(json_build_array(s.stmtid, s.parent_stmtid, s.parent_note, s.block_num,
                                         s.lineno, s.stmtname, s.exec_stmts) ORDER BY s.stmtid)
        FROM {ext}.plpgsql_profiler_function_statements_tb(p.oid) s)
FROM pg_proc p
JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = %s::regnamespace AND l.lanname = 'plpgsql'
"""

_RESET_QUERY = """
SELECT {ext}.plpgsql_profiler_reset(p.oid)
FROM pg_proc p
JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = %s::regnamespace AND l.lanname = 'plpgsql'
"""


def record_schema(
    dsn: str, schema: str, path: str | os.PathLike[str], conn: psycopg.Connection[Any] | None = None
) -> None:
    """Append the profiles of ``schema``'s plpgsql functions to the JSONL file ``path``, then reset them.

    ``conn``: an autocommit session of ``dsn`` to read them on (the test's schema pool's, kept
    between tests), else a new one."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    lines: list[str] = []
    with contextlib.nullcontext(conn) if conn is not None else psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'plpgsql_check'"
        ).fetchone()
        if row is None:
            raise RuntimeError(f"{ENV_VAR} is set but the test database lacks the plpgsql_check extension")
        ext = sql.Identifier(row[0])
        rows = conn.execute(sql.SQL(_PROFILE_QUERY).format(ext=ext), (schema,)).fetchall()
        conn.execute(sql.SQL(_RESET_QUERY).format(ext=ext), (schema,))
    for function, source, c_statements, c_branches, statements in rows:
        statements = statements or []
        # The same function in every test schema: its source names the schema, so hash it without.
        source = source.replace(schema, "{schema}")
        function = function.replace(schema, "{schema}")
        md5 = hashlib.md5(source.encode()).hexdigest()
        key = (function, md5)
        if key not in _seen_sources:
            _seen_sources.add(key)
            structure = [s[:6] for s in statements]
            lines.append(
                json.dumps(
                    {"kind": "function", "function": function, "md5": md5, "source": source,
                     "structure": structure}
                )
            )  # fmt: skip
        counts = [s[6] for s in statements]
        if any(counts):
            lines.append(
                json.dumps(
                    {"kind": "profile", "function": function, "md5": md5, "test": test, "schema": schema,
                     "exec": counts, "c_statements": c_statements, "c_branches": c_branches}
                )
            )  # fmt: skip
    if lines:
        # Under pytest-xdist each worker appends to its own file (read_records reads them all).
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        with open(f"{os.fspath(path)}.{worker}" if worker else path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def data_files(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` and the per-worker files of a pytest-xdist run next to it (``path.gw0``, ...)."""
    path = Path(path)
    return sorted(p for p in (path, *path.parent.glob(path.name + ".gw*")) if p.exists())


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    for file in data_files(path):
        with open(file, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


# -- merge and report ------------------------------------------------------------------------------


@dataclass
class Ratio:
    covered: int = 0
    total: int = 0

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.total if self.total else 100.0

    def __iadd__(self, other: Ratio) -> Ratio:
        self.covered += other.covered
        self.total += other.total
        return self


@dataclass
class Branch:
    stmtid: int  # the IF/CASE/loop/block statement owning the path
    lineno: int
    what: str  # "then body", "implicit else", "loop body", "exception 1", ...
    taken: bool


@dataclass
class FunctionCoverage:
    function: str
    md5: str
    source: str
    structure: list[list[Any]]
    display: str = ""  # the name in the report: proname, or the signature where overloaded
    exec: list[int] = field(default_factory=list)
    tests: int = 0  # how many test schemas executed it

    def add(self, counts: list[int]) -> None:
        if not self.exec:
            self.exec = [0] * len(self.structure)
        if len(counts) != len(self.exec):
            raise ValueError(f"{self.function}: statement count changed for one source version")
        self.exec = [a + b for a, b in zip(self.exec, counts, strict=True)]
        self.tests += 1

    def counts(self) -> list[int]:
        return self.exec or [0] * len(self.structure)

    def statements(self) -> Ratio:
        return statement_ratio(self.structure, self.counts())

    def branches(self) -> list[Branch]:
        return branches(self.structure, self.counts())

    def line(self, lineno: int) -> str:
        lines = self.source.splitlines()
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""

    def uncovered_statements(self) -> list[tuple[list[Any], int]]:
        """Unexecuted statements whose parent ran (or that have none), each with how many
        statements nested below it are unexecuted with it."""
        counts = self.counts()
        by_id = {s[STMTID]: (s, c) for s, c in zip(self.structure, counts, strict=True)}
        children: dict[int, list[int]] = defaultdict(list)
        for s in self.structure:
            if s[PARENT] is not None:
                children[s[PARENT]].append(s[STMTID])

        def nested(stmtid: int) -> int:
            return sum(1 + nested(c) for c in children[stmtid] if _visible(by_id[c][0]))

        out = []
        for s, c in zip(self.structure, counts, strict=True):
            if c or not _visible(s):
                continue
            parent = by_id.get(s[PARENT]) if s[PARENT] is not None else None
            if parent is None or parent[1] > 0 or not _visible(parent[0]):
                out.append((s, nested(s[STMTID])))
        return out


def _visible(stmt: list[Any]) -> bool:
    # plpgsql_check does not count the invisible outer block (lineno -1).
    return stmt[LINENO] is not None and stmt[LINENO] != -1


def statement_ratio(structure: list[list[Any]], counts: list[int]) -> Ratio:
    r = Ratio()
    for s, c in zip(structure, counts, strict=True):
        if _visible(s):
            r.total += 1
            r.covered += c > 0
    return r


def _is_loop(name: str) -> bool:
    return name in ("LOOP", "WHILE") or name.startswith("FOR")


def branches(structure: list[list[Any]], counts: list[int]) -> list[Branch]:
    """The paths of plpgsql_check's branch coverage, rebuilt from the statement tree."""
    # exec count of each statement list's first statement, by (parent stmtid, parent note)
    first: dict[tuple[int, str], int] = {}
    notes: dict[int, list[str]] = defaultdict(list)
    for s, c in zip(structure, counts, strict=True):
        if s[PARENT] is None:
            continue
        key = (s[PARENT], s[NOTE])
        if key not in first:
            notes[s[PARENT]].append(s[NOTE])
        if s[BLOCK_NUM] == 1:
            first[key] = c
    out: list[Branch] = []
    for s, c in zip(structure, counts, strict=True):
        sid, name, lineno = s[STMTID], s[NAME], s[LINENO]

        def path(note: str, what: str | None = None, sid: int = sid, lineno: int = lineno) -> None:
            out.append(Branch(sid, lineno, what or note, first.get((sid, note), 0) > 0))

        def numbered(prefix: str, sid: int = sid) -> int:
            return max((int(n.rsplit(" ", 1)[1]) for n in notes[sid] if n.startswith(prefix)), default=0)

        if _is_loop(name):
            path("loop body")
        elif name == "IF":
            path("then body")
            taken = first.get((sid, "then body"), 0)
            for i in range(1, numbered("elsif ") + 1):
                path(f"elsif {i}")
                taken += first.get((sid, f"elsif {i}"), 0)
            if "else body" in notes[sid]:
                path("else body")
            else:
                out.append(Branch(sid, lineno, "implicit else", c - taken > 0))
        elif name == "CASE":
            for i in range(1, numbered("case when ") + 1):
                path(f"case when {i}")
            path("case else")
        elif name == "statement block" and numbered("exception ") > 0:
            path("body")
            for i in range(1, numbered("exception ") + 1):
                path(f"exception {i}")
    return out


@dataclass
class Coverage:
    functions: list[FunctionCoverage]
    mismatches: list[str]  # records where this rebuild disagrees with plpgsql_check's own numbers

    def totals(self) -> tuple[Ratio, Ratio]:
        stmts, brs = Ratio(), Ratio()
        for f in self.functions:
            stmts += f.statements()
            b = f.branches()
            brs += Ratio(sum(x.taken for x in b), len(b))
        return stmts, brs


def merge(records: Iterable[dict[str, Any]]) -> Coverage:
    """Sum the execution counts of every test per (function, source version)."""
    functions: dict[tuple[str, str], FunctionCoverage] = {}
    profiles: list[dict[str, Any]] = []
    for r in records:
        key = (r["function"], r["md5"])
        if r["kind"] == "function":
            functions.setdefault(key, FunctionCoverage(r["function"], r["md5"], r["source"], r["structure"]))
        elif r["kind"] == "profile":
            profiles.append(r)
    mismatches: list[str] = []
    for r in profiles:
        f = functions[(r["function"], r["md5"])]
        f.add(r["exec"])
        # Self-check against plpgsql_check's own per-schema figures (fractions 0..1).
        mine_s = statement_ratio(f.structure, r["exec"])
        b = branches(f.structure, r["exec"])
        mine_b = Ratio(sum(x.taken for x in b), len(b))
        # plpgsql_check also counts the RETURN plpgsql appends to a function body that may fall off
        # its end; the statement list hides it, and so does this report: allow that one statement.
        theirs_s, theirs_b = r["c_statements"], r["c_branches"]
        if theirs_s is not None and mine_s.total:
            candidates = [mine_s.percent] + [
                100.0 * (mine_s.covered + k) / (mine_s.total + 1) for k in (0, 1)
            ]
            if min(abs(c - 100.0 * theirs_s) for c in candidates) > 0.01:
                mismatches.append(f"{f.function} in {r['test'] or r['schema']}: statements {mine_s.percent:.1f}%"
                                  f" here, {100.0 * theirs_s:.1f}% by plpgsql_check")  # fmt: skip
        if theirs_b is not None and mine_b.total and abs(mine_b.percent - 100.0 * theirs_b) > 0.01:
            mismatches.append(f"{f.function} in {r['test'] or r['schema']}: branches {mine_b.percent:.1f}%"
                              f" here, {100.0 * theirs_b:.1f}% by plpgsql_check")  # fmt: skip
    # Name functions by proname alone unless overloaded; a function seen with several source versions
    # (a test replaying old migrations) is listed once per version, tagged with its source hash.
    by_name: dict[str, set[str]] = defaultdict(set)
    versions: dict[str, int] = defaultdict(int)
    for f in functions.values():
        by_name[f.function.split("(", 1)[0]].add(f.function)
        versions[f.function] += 1
    for f in functions.values():
        name = f.function.split("(", 1)[0]
        f.display = name if len(by_name[name]) == 1 else f.function
        if versions[f.function] > 1:
            f.display += f" #{f.md5[:6]}"
    ordered = sorted(functions.values(), key=lambda f: (f.display, -f.tests))
    return Coverage(ordered, mismatches)


def format_report(cov: Coverage, *, show_uncovered: bool = True) -> str:
    out: list[str] = []
    width = max([len(f.display) for f in cov.functions] + [8])
    head = f"{'function':<{width}}  {'stmts':>9} {'stmt%':>6}  {'branches':>9} {'br%':>6}  tests"
    out += ["plpgsql coverage (statements / branches as plpgsql_check counts them)", head, "-" * len(head)]
    for f in cov.functions:
        st = f.statements()
        paths = f.branches()
        br = Ratio(sum(x.taken for x in paths), len(paths))
        out.append(
            f"{f.display:<{width}}  {st.covered:>4}/{st.total:<4} {st.percent:>5.1f}%  "
            f"{br.covered:>4}/{br.total:<4} {br.percent:>5.1f}%  {f.tests}"
        )
    stmts, brs = cov.totals()
    out.append("-" * len(head))
    out.append(
        f"{'TOTAL':<{width}}  {stmts.covered:>4}/{stmts.total:<4} {stmts.percent:>5.1f}%  "
        f"{brs.covered:>4}/{brs.total:<4} {brs.percent:>5.1f}%"
    )
    if show_uncovered:
        out.append("")
        out.append(
            "uncovered statements (function:line  statement  source line; +n = nested statements not run):"
        )
        for f in cov.functions:
            for stmt, nested in f.uncovered_statements():
                more = f" (+{nested})" if nested else ""
                out.append(f"  {f.display}:{stmt[LINENO]}  {stmt[NAME]}{more}  {f.line(stmt[LINENO])}")
        out.append("")
        out.append("branches never taken (function:line  statement  path):")
        for f in cov.functions:
            by_id = {stmt[STMTID]: stmt for stmt in f.structure}
            for path in f.branches():
                if not path.taken:
                    out.append(f"  {f.display}:{path.lineno}  {by_id[path.stmtid][NAME]}  {path.what}")
    if cov.mismatches:
        out.append("")
        out.append(f"note: {len(cov.mismatches)} record(s) where this report's per-test figures differ from")
        out.append(
            "plpgsql_check's own (empty handler or branch lists are invisible in the profile); first ones:"
        )
        out += [f"  {m}" for m in cov.mismatches[:5]]
    return "\n".join(out)


def main() -> None:  # `python tests/sql_coverage.py FILE.jsonl`: the report alone
    import sys

    print(format_report(merge(read_records(Path(sys.argv[1])))))


if __name__ == "__main__":
    main()
