"""Server instructions per call of statements of your own, on one tree: what
``server_instructions.py`` counts for its fixed workloads, for any statement (a variant of a
function, a call shape, a schema change), deterministic.

A throwaway cluster gets the tree's schema ``tree_x`` (migrated by the tree's own ``lonnymq``,
with a queue ``q``), then ``--setup`` (a SQL file run with psql: variants of functions, dropped
indexes, ...). Each statement (``label=SQL``, ``{s}`` for the schema, ``{payload}`` for the
suite's ~200-byte message as a bytea literal) runs as ``server_instructions.py`` runs a workload:
``PREPARE``d, ``EXECUTE``d 75 and 300 times in a single-user backend under callgrind over a
backlog, counting only the EXECUTEs; the difference over the 225 calls is one call's cost.

    python benchmarks/statement_instructions.py --tree src [--setup file.sql] [--json out.json] \\
        "value=SELECT {s}.send('q', {payload})" "from=SELECT * FROM {s}.send('q', {payload})"

``--profile out.txt`` (one statement): also where a call's instructions go, each function's
inclusive count per call (the 300-call run's less the 75-call run's, by ``callgrind_annotate
--inclusive=yes``), largest first. plpgsql's own functions are unnamed (stripped) there.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import server_instructions as si


def _profiled(cluster: si.Cluster, script: str, n: int) -> tuple[int, dict[str, int]]:
    """The instructions of ``script`` (as Cluster.single) and each function's inclusive count."""
    out = cluster.dir / f"callgrind.{n}"
    run = cluster.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--collect-atstart=no",
            "--toggle-collect=ExecuteQuery",
            str(cluster.bin / "postgres"),
            "--single",
            "-c",
            "fsync=off",
            "-D",
            str(cluster.data),
            "bench",
        ],
        input=script,
        capture_output=True,
    )
    total = si.collected(run)
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*:.*)$", line)
        if found:
            name = re.sub(r" \[/usr/lib/postgresql/\d+/(?:bin|lib)/", " [", found[2])
            counts[name] = counts.get(name, 0) + int(found[1].replace(",", ""))
    return total, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="path/to/src of the lonnymq to install")
    ap.add_argument("--setup", type=Path, help="SQL file run (psql) after the install")
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", type=Path, help="(one statement) per-function counts per call to this file")
    ap.add_argument("statements", nargs="+", help="label=SQL")
    args = ap.parse_args()
    stmts = [tuple(a.split("=", 1)) for a in args.statements]
    if any(len(s) != 2 for s in stmts):
        ap.error("each statement is label=SQL")
    if args.profile and len(stmts) != 1:
        ap.error("--profile takes one statement")
    cluster = si.Cluster(args.bin)
    results: dict[str, float] = {}
    try:
        dsn = cluster.start_bench()
        cluster.install(dsn, args.tree, "tree_x")
        if args.setup is not None:
            subprocess.run(
                [str(args.bin / "psql"), dsn, "-v", "ON_ERROR_STOP=1", "-qf", str(args.setup)], check=True
            )
        cluster.pg_ctl("stop")
        for label, stmt in stmts:
            text = stmt.replace("{payload}", f"'{si.PAYLOAD}'::bytea")
            si.WORKLOADS["_statement"] = (text, None, 1)
            if args.profile:
                low, high = (
                    _profiled(cluster, si._script("_statement", "tree_x", n, 1000), n) for n in (75, 300)
                )
                rows = sorted(((high[1].get(f, 0) - low[1].get(f, 0)) / 225, f) for f in {*low[1], *high[1]})
                args.profile.write_text("".join(f"{v:10.0f}  {f}\n" for v, f in reversed(rows) if v >= 500))
                low, high = low[0], high[0]
            else:
                low, high = (cluster.single(si._script("_statement", "tree_x", n, 1000)) for n in (75, 300))
            results[label] = (high - low) / 225
            print(f"{label:24} {results[label] / 1000:9.1f}k instructions/call", flush=True)
    finally:
        cluster.remove()
    if args.json:
        out = {"tree": args.tree, "setup": str(args.setup), "statements": dict(stmts), "results": results}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
