"""The restart run, short (issue 18, item 5): benchmarks/restarts.py with 3 PostgreSQL restarts
(fast, immediate, fast) 10 s apart under a few hundred msg/s offered by producers with the default
Client, and a `lonnymq worker` with its defaults.

Checked by id from the database (the script's analysis, docs/guarantees-testing.md):

* 0 lost: every committed message (in the archive or the queue), and every id a send returned,
  was run by the handler; the queue is empty at the end;
* 0 resurrected: no run of a message with a token above the delivery its archived ack
  acknowledged; no message sent twice;
* processing resumes after each restart (a send and a handler run after the server is back), and
  the worker logs one outage line and one recovery line per outage and exits cleanly;
* 0 errors surfaced to the producers: the default client makes sends idempotent
  (``Client(idempotent_sends=True)``) and repeats one cut off in flight (before that, such a send
  raised ConnectionLost(may_have_committed=True)).

The 10-minute run at 1,000 msg/s is the same script with its defaults (README, Guarantees).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from cluster_helpers import require_pg15

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "restarts.py"
WORKERS = 1
CONCURRENCY = 8  # the worker's default


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("restarts_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_check_by_id_finds_each_violation() -> None:
    # What a clean run looks like: 1 acked by its second delivery (the first was in flight at a
    # restart: a duplicate), 2 acked by its first, 3 still queued and run (its ack pending).
    check = load_script().check_by_id
    acked = {1: (2, (0, 0)), 2: (1, (0, 1))}
    waiting = {3: (0, 2)}
    runs = [(1, 1, 0.0), (1, 2, 1.0), (2, 1, 0.5), (3, 1, 2.0)]
    v = check(acked, waiting, {1, 2, 3}, runs)
    assert (v.lost, v.resurrected, v.acked_unrun, v.phantom) == (set(), set(), set(), set())
    assert (v.double_sends, v.duplicates, v.returned_missing) == (0, 1, set())

    assert check(acked, waiting, {1, 2, 3}, runs[:-1]).lost == {3}  # committed, never run
    v = check(acked, waiting, {1, 2, 3, 4}, runs)  # a send returned 4, the database lacks it
    assert (v.lost, v.returned_missing) == ({4}, {4})
    assert check(acked, waiting, {1, 2, 3}, [*runs, (2, 2, 3.0)]).resurrected == {2}  # run after its ack
    assert check(acked, {**waiting, 2: (0, 1)}, {1, 2, 3}, runs).resurrected == {2}  # acked, queued again
    assert check(acked, waiting, {1, 2, 3}, [r for r in runs if r[:2] != (1, 2)]).acked_unrun == {1}
    assert check(acked, waiting, {1, 2, 3}, [*runs, (9, 1, 3.0)]).phantom == {9}
    assert check(acked, {**waiting, 4: (0, 2)}, {1, 2, 3, 4}, [*runs, (4, 1, 3.0)]).double_sends == 1


@pytest.mark.once
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_restarts_under_load_lose_nothing(tmp_path: Path) -> None:
    require_pg15()
    out = tmp_path / "restarts.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--rate", "300", "--minutes", "0.5", "--interval", "10"),
            *("--producers", "2", "--threads", "2", "--workers", str(WORKERS)),
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    t, restarts = result["totals"], result["restarts"]
    print(f"\n{proc.stdout[proc.stdout.find('restart  mode') :]}")

    assert [r["mode"] for r in restarts] == ["fast", "immediate", "fast"]
    assert t["committed"] > 0 and t["sent"] > 0
    # The workers' own lines first: a worker that exited explains a loss better than its ids.
    logs = "".join(result["worker_log_tails"])
    assert t["worker_exit_codes"] == [0] * WORKERS, logs
    assert t["lost"] == 0, (result["examples"]["lost"], logs)
    assert t["returned_but_missing"] == 0
    assert t["left_in_queue"] == 0
    assert t["resurrected"] == 0, result["examples"]["resurrected"]
    assert t["acked_but_never_run"] == 0
    assert t["phantom_runs"] == 0
    assert t["double_sends"] == 0, "a send committed twice"
    # Duplicates come only from deliveries in flight at a restart: at most the running handlers
    # and the acks waiting to ride on the next fetch, per worker and restart.
    assert t["duplicates"] <= 2 * CONCURRENCY * WORKERS * len(restarts), t["duplicates"]
    # Throughput resumes after every restart, within seconds.
    for r in restarts:
        assert r["first_send_s"] is not None and r["first_processed_s"] is not None, r
        assert r["first_send_s"] < 30 and r["first_processed_s"] < 30, r
    assert t["processed_after_last_restart"] > 0
    lines = t["worker_outage_lines"]
    assert lines["database unavailable"] == lines["reachable again"] >= 1, lines
    assert lines["tracebacks"] == 0, lines
    assert t["worker_exit_codes"] == [0] * WORKERS
    # The default client keys its sends (Client(idempotent_sends=True)), so it repeats a send cut
    # off in flight instead of raising ConnectionLost(may_have_committed=True).
    assert result["config"]["idempotent_send_client"]
    assert t["errors_surfaced"] == 0, t["errors_by_type"]
    assert proc.returncode == 0, proc.stderr[-3000:]
