"""Run a command and report the CPU of everything it started, daemons included.

    python tools/cputime.py [--json FILE] [--sample FILE] -- COMMAND [ARGS...]
    python tools/cputime.py --timeline FILE

``/usr/bin/time`` counts only the descendants its command waited for. The test suite's
PostgreSQL servers (``pg_ctl`` daemonizes them), Spark's daemons and some subprocesses are
orphaned on the way and reaped by init, so their CPU was never in such a number. This process
makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): orphans of its command are
re-parented to it, it reaps them as they end, and their CPU (with that of the children they
reaped, e.g. a postmaster's backends) is counted. It waits until every descendant has ended, so a
server the command leaves running keeps it waiting (the tests stop theirs).

Prints one JSON line: wall seconds, user and system CPU seconds, the exit code, the 1-minute load
average before and after.

``--sample FILE``: every second, also read the CPU of each descendant from ``/proc`` and, at the
end, write to FILE (JSON) each kind of process's CPU (a PostgreSQL's version, a JVM's main class,
a Python's script or module) and how many there were. A process that lived less than a second
between two reads is not seen: what the sum misses is the total's rest ("unseen").

``--timeline FILE`` reads the lines ``./run test`` wrote with ``LONNYMQ_TEST_TIMELINE=FILE``
(tests/conftest.py) and prints, for each pass's process, when it started and ended, how long it
was in tests and its last tests, then the longest groups (xdist group, else module): what each
pass's end waited for.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if argv[:1] == ["--timeline"]:
        timeline(Path(argv[1]))
        return 0
    out: Path | None = None
    if argv[:1] == ["--json"]:
        out, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sample: Path | None = None
    if argv[:1] == ["--sample"]:
        sample, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.Popen(argv)
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()
    sampler = threading.Thread(target=_sample, args=(seen, done), daemon=True)
    if sample is not None:
        sampler.start()
    # Every child is reaped as it ends, the command's orphans too (servers and daemons it
    # started): an orphan left a zombie until the command ended kept its PID alive for
    # kill(pid, 0), and a PostgreSQL killed by a test (tests/shard/test_shard_down.py) could not
    # be started again on its data directory ("lock file postmaster.pid already exists").
    rc: int | None = None
    while rc is None:
        pid, status = os.wait()
        if pid == proc.pid:
            rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc
    wall = time.monotonic() - start
    while True:  # the orphans still running when the command ended
        try:
            os.wait()
        except ChildProcessError:
            break
    done.set()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if sample is not None:
        sampler.join()
        _write_sample(sample, seen, usage.ru_utime + usage.ru_stime)
    result = {
        "cmd": " ".join(argv),
        "exit": rc,
        "wall_s": round(wall, 2),
        "all_ended_s": round(time.monotonic() - start, 2),
        "cpu_user_s": round(usage.ru_utime, 2),
        "cpu_sys_s": round(usage.ru_stime, 2),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    line = json.dumps(result)
    print(line, file=sys.stderr)
    if out is not None:
        with out.open("a") as f:
            f.write(line + "\n")
    return rc


TICK = os.sysconf("SC_CLK_TCK")


def _kind(pid: int) -> str:
    """What a process is, for the sample: PostgreSQL with its version or package, a JVM's main
    class, a Python's script or module, else the program's name."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args if a]
    if not words:
        return "?"
    exe = words[0]
    if "postgres" in exe or exe.startswith("postgres:"):
        home = "pg15" if "/postgresql/15/" in exe else "pg16" if "pgserver" in exe else "pg"
        if exe.startswith("postgres:"):  # a backend: its postmaster's version is not in its title
            return "postgres backend"
        return f"postgres {home}"
    name = Path(exe).name
    if name == "java":
        main = [w for w in words[1:] if w.startswith("org.apache.")]
        return f"java {main[0].rsplit('.', 1)[-1] if main else '?'}"
    if name.startswith("python"):
        rest = words[1:]
        if rest[:1] == ["-u"]:
            rest = rest[1:]
        if rest[:1] == ["-c"]:
            return "python -c (xdist worker)" if "exec(eval" in " ".join(rest) else "python -c"
        if rest[:1] == ["-m"] and len(rest) > 1:  # with Spark's daemon, the worker it forks
            return " ".join(["python -m", *rest[1:3]])
        return f"python {Path(rest[0]).name}" if rest else "python"
    return name


def _sample(seen: dict[int, tuple[str, float]], done: threading.Event) -> None:
    me = os.getpid()
    while not done.wait(1.0):
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            pid = int(entry)
            parent[pid] = int(fields[1])
            cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK
        for pid, used in cpu.items():
            p, hops = parent.get(pid, 0), 0
            while p not in (me, 0, 1) and hops < 64:
                p, hops = parent.get(p, 0), hops + 1
            if p != me:
                continue
            # Read again each time: Spark's launch scripts exec their JVM in the same process.
            kind = _kind(pid)
            seen[pid] = (seen[pid][0] if kind == "?" and pid in seen else kind, used)


def _write_sample(path: Path, seen: dict[int, tuple[str, float]], total: float) -> None:
    kinds: dict[str, list[float]] = {}
    for kind, used in seen.values():
        kinds.setdefault(kind, []).append(used)
    rows = sorted(((sum(v), len(v), k) for k, v in kinds.items()), reverse=True)
    out = {k: {"cpu_s": round(c, 1), "processes": n} for c, n, k in rows}
    out["unseen"] = {"cpu_s": round(total - sum(c for c, _, _ in rows), 1), "processes": 0}
    path.write_text(json.dumps(out, indent=1) + "\n")


def timeline(path: Path, groups: int = 25) -> None:
    rows: list[dict[str, Any]] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    t0 = min(r["start"] for r in rows)
    workers: dict[tuple[str, str], list[dict[str, Any]]] = {}
    spans: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        workers.setdefault((r["pass"], str(r["worker"])), []).append(r)
        spans.setdefault((r["pass"], r["group"] or r["test"].split("::")[0]), []).append(r)

    def busy(rs: list[dict[str, Any]]) -> float:
        return float(sum(r["end"] - r["start"] for r in rs))

    for (name, worker), rs in sorted(workers.items()):
        rs.sort(key=lambda r: r["start"])
        print(f"{name} {worker}: {len(rs)} tests, {rs[0]['start'] - t0:.0f}-{rs[-1]['end'] - t0:.0f} s, "
              f"in tests {busy(rs):.0f} s; last:")  # fmt: skip
        for r in rs[-3:]:
            print(f"    {r['start'] - t0:6.0f}-{r['end'] - t0:6.0f} {r['test']}")
    print(f"the {groups} longest groups (xdist group, else module): in tests, first start-last end")
    for (name, group), rs in sorted(spans.items(), key=lambda kv: -busy(kv[1]))[:groups]:
        first, last = min(r["start"] for r in rs) - t0, max(r["end"] for r in rs) - t0
        print(f"  {name} {group:70} {busy(rs):6.0f} s  {first:5.0f}-{last:5.0f}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
