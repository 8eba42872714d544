"""Count the Python processes Spark starts while a command runs: daemons, the workers they fork,
streaming source runners; local session or cluster; their CPU.

    python tools/spark_pythons.py watch FILE    # polls /proc every 0.25 s until SIGTERM
    python tools/spark_pythons.py split FILE... # a table of what FILE recorded

``tools/cputime.py --sample`` names a process by its command line, and a worker that
``pyspark.daemon`` forks keeps its daemon's, so its counts add daemons and forks together. This
tells them apart by the parent (a fork's parent is a daemon), and reads each process's environment
once: a Python of the tests' local session has its zip-less SPARK_HOME (``spark-home0``,
tests/spark_fixtures.py) in PYTHONPATH, any other Spark started is the cluster's. A process that
lived less than a poll is not seen. Run ``watch`` in the background around the command (one
process reading /proc four times a second: a few % of a core) and stop it with SIGTERM.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
KEYS = ("SPARK_JOB_ARTIFACT_UUID", "SPARK_REUSE_WORKER", "SPARK_LOCAL_DIRS", "PYTHONPATH")
DAEMONS = ("pyspark.daemon", "spark_fixtures")  # the second: the local session's task daemon


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def watch(out: Path) -> None:
    signal.signal(signal.SIGTERM, _stop)
    seen: dict[int, dict[str, Any]] = {}
    try:
        while True:
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    _read(int(entry), seen)
            time.sleep(0.25)
    except KeyboardInterrupt:
        pass
    out.write_text(json.dumps(seen, indent=1))


def _read(pid: int, seen: dict[int, dict[str, Any]]) -> None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"pyspark" not in b" ".join(cmd):
            return
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        if pid not in seen:
            env: dict[str, str] = {}
            daemon = b"pyspark.daemon" in b" ".join(cmd)
            try:
                for pair in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    key, _, value = pair.decode(errors="replace").partition("=")
                    if key in KEYS or daemon:
                        env[key] = value
            except OSError:
                pass
            words = " ".join(c.decode(errors="replace") for c in cmd if c)
            seen[pid] = {"ppid": int(fields[1]), "cmd": words, "env": env, "first": time.time()}
        seen[pid]["cpu"] = (int(fields[11]) + int(fields[12])) / TICK
        seen[pid]["last"] = time.time()
    except (OSError, ValueError):
        return


def _is_daemon(cmd: str) -> bool:
    return any(word in DAEMONS for word in cmd.split())


def split(path: Path) -> None:
    d = {int(k): v for k, v in json.loads(path.read_text()).items()}
    rows: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for pid, r in d.items():
        cmd = r["cmd"]
        if not (_is_daemon(cmd) or "streaming_source_runner" in cmd):
            continue
        if "pyspark.zip" not in r["env"].get("PYTHONPATH", ""):
            continue  # not started by Spark (Spark always puts its pyspark.zip on the path)
        top = pid
        while d[top]["ppid"] in d and _is_daemon(d[d[top]["ppid"]]["cmd"]):
            top = d[top]["ppid"]
        where = "local" if "spark-home0" in r["env"].get("PYTHONPATH", "") else "cluster"
        what = "source runner" if "streaming_source_runner" in cmd else ("fork" if top != pid else "daemon")
        if what != "source runner":
            what = ("task " if cmd.split()[-1] == "pyspark.worker" else "planner ") + what
        row = rows[(where, what)]
        row[0] += 1
        row[1] += r["cpu"]
    print(path)
    for (where, what), (n, cpu) in sorted(rows.items()):
        print(f"   {where:8} {what:14} {int(n):4d} {cpu:6.1f}")
    for where in ("cluster", "local"):
        mine = [v for k, v in rows.items() if k[0] == where]
        print(f"   all {where:8} {int(sum(v[0] for v in mine)):4d} {sum(v[1] for v in mine):6.1f}")
    print(f"   total {int(sum(v[0] for v in rows.values()))} {sum(v[1] for v in rows.values()):.1f}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"] and len(argv) == 2:
        watch(Path(argv[1]))
        return 0
    if argv[:1] == ["split"] and len(argv) > 1:
        for name in argv[1:]:
            split(Path(name))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
