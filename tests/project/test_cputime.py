"""tools/cputime.py, the rehearsals' CPU counter (docs/testing.md): as a child subreaper it
inherits its command's orphans, and it must reap each one as it ends, not once the command has
ended. A zombie keeps its PID alive for kill(pid, 0): a PostgreSQL a test killed with kill -9
(daemonized by pg_ctl, so an orphan) could not be started again on its data directory while it
was one ("lock file postmaster.pid already exists"; test_kill_9_of_a_shard)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CPUTIME = Path(__file__).resolve().parents[2] / "tools" / "cputime.py"

#: The command: an orphan (a sleep started by a subshell that exits at once), killed with
#: SIGKILL; then up to 10 s for its PID to go (reaped), else exit 1 with the orphan's state.
ORPHAN_KILLED = r"""
pid=$( (sleep 60 >/dev/null 2>&1 & echo $!) )
kill -9 "$pid"
for _ in $(seq 100); do
    [ -e "/proc/$pid" ] || exit 0
    sleep 0.1
done
echo "orphan $pid not reaped: $(cut -d' ' -f3 "/proc/$pid/stat")" >&2
exit 1
"""


def test_an_orphan_killed_while_the_command_runs_is_reaped_at_once() -> None:
    done = subprocess.run(
        [sys.executable, str(CPUTIME), "--", "bash", "-c", ORPHAN_KILLED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_commands_exit_code_is_its_own() -> None:
    done = subprocess.run(
        [sys.executable, str(CPUTIME), "--", "bash", "-c", "(sleep 0.2 &); exit 3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert '"exit": 3' in done.stderr
