"""Failing a streaming query whose micro-batch cannot run: Spark waits for executors forever.

When every executor of an application is lost and the cluster manager has none to replace them
(a standalone cluster whose workers died, a queue without capacity), the scheduler keeps the
running micro-batch's tasks pending without a message, and the query looks busy forever. The
driver is the only place that knows; this watches it from the driver's Python.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("lonnymq.spark")


def fail_without_executors(
    spark: SparkSession, query: StreamingQuery, timeout: float = 120.0
) -> threading.Thread | None:
    """Fail ``query`` once one of its micro-batches has waited ``timeout`` seconds with no
    executor to run on. The batch's Spark jobs are cancelled with a reason saying so
    ("Job 12 cancelled because micro-batch ... waited 120 s with no executor ..."), which
    ends the query with that error: ``awaitTermination()`` raises it and listeners see it.
    Messages the batch leased stay leased until their lease (option ``lease``) runs out, then
    go to the next consumer; a restart from the query's checkpoint replays the batch instead.

    Watches from a daemon thread, returned, that ends with the query. Needs a classic session
    (the driver's SparkContext): a Spark Connect client cannot see the server's executors.
    Returns None in local mode, where the driver runs the tasks itself."""
    if timeout <= 0:
        raise errors.InvalidArgument(f"timeout must be positive, got {timeout!r}")
    try:
        sc = spark.sparkContext
    except Exception as e:  # Spark Connect: no SparkContext on the client
        raise errors.InvalidArgument(
            "lonnymq.spark.fail_without_executors needs a classic SparkSession (the driver's"
            " SparkContext); a Spark Connect client cannot see the server's executors"
        ) from e
    jsc: Any = sc._jsc.sc()
    if jsc.isLocal():
        return None
    thread = threading.Thread(
        target=_watch,
        args=(jsc, query, timeout, min(5.0, max(0.5, timeout / 4))),
        name=f"lonnymq-executor-watch-{query.id}",
        daemon=True,
    )
    thread.start()
    return thread


def _watch(jsc: Any, query: StreamingQuery, timeout: float, interval: float) -> None:
    waiting_since: float | None = None
    while True:
        try:
            if query.awaitTermination(interval):  # type: ignore[arg-type]  # classic takes seconds as a float
                return
            # getExecutorInfos lists the driver too
            stuck = query.status["isTriggerActive"] and len(jsc.statusTracker().getExecutorInfos()) <= 1
        except Exception:  # the query failed or the session stopped: nothing left to watch
            return
        now = time.monotonic()
        if not stuck:
            waiting_since = None
            continue
        if waiting_since is None:
            waiting_since = now
        if now - waiting_since < timeout:
            continue
        name = f"{query.name!r} (id {query.id})" if query.name else f"id {query.id}"
        reason = (
            f"because a micro-batch of streaming query {name} waited {timeout:g} s with no executor"
            " to run on: every executor was lost and none replaced them"
            " (lonnymq.spark.fail_without_executors). Messages the batch leased from a lonnymq queue"
            " return to it when their lease (option lease) runs out; restarting the query from its"
            " checkpoint replays the batch."
        )
        log.error("lonnymq: no executor for %g s: cancelling the jobs of streaming query %s", timeout, name)
        # Jobs of a streaming query run in the job group of its run id (StreamExecution).
        jsc.cancelJobGroup(str(query.runId), reason)
