"""Run a command and report the CPU of everything it started, daemons included.

    python tools/cputime.py [--json FILE] -- COMMAND [ARGS...]

``/usr/bin/time`` counts only the descendants its command waited for. The test suite's
PostgreSQL servers (``pg_ctl`` daemonizes them), Spark's daemons and some subprocesses are
orphaned on the way and reaped by init, so their CPU was never in such a number. This process
makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): orphans of its command are
re-parented to it, it reaps them as they end, and their CPU (with that of the children they
reaped, e.g. a postmaster's backends) is counted. It waits until every descendant has ended, so a
server the command leaves running keeps it waiting (the tests stop theirs).

Prints one JSON line: wall seconds, user and system CPU seconds, the exit code, the 1-minute load
average before and after.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    out: Path | None = None
    if argv[:1] == ["--json"]:
        out, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.Popen(argv)
    rc = proc.wait()
    wall = time.monotonic() - start
    while True:  # the orphans: servers and daemons the command started
        try:
            os.wait()
        except ChildProcessError:
            break
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
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


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
