"""LonnyMQ for Apache Spark: the ``lonnymq`` PySpark data source (``pip install lonnymq[spark]``).

    import lonnymq.spark                 # registers format("lonnymq") with the active session
    lonnymq.spark.register(spark)        # any other session (or after setting spark.lonnymq.*)
    lonnymq.spark.ship(spark)            # executors without lonnymq installed (a cluster)
    df.write.format("lonnymq").option("dsn", dsn).option("queue", "orders").mode("append").save()

PySpark is imported only when the data source is used, so ``import lonnymq`` stays light.
Needs the Spark tables and functions (``sql/spark.sql``), which ``Client.migrate()`` installs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..migrations import DEFAULT_SCHEMA
from ._ship import package_zip
from ._watch import fail_without_executors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ._write import Resolved
    from .source import LonnyMQDataSource

__all__ = [
    "LonnyMQDataSource",
    "WriteStatus",
    "fail_without_executors",
    "package_zip",
    "register",
    "resolve_in_doubt",
    "ship",
    "sweep",
    "write_status",
]

_PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
#: Set by :func:`ship` on its session, so :func:`register` keeps shipping there.
_SHIPPED = "spark.lonnymq.shipped"


def register(spark: SparkSession) -> None:
    """Register ``format("lonnymq")`` with a Spark session (classic or Spark Connect).

    ``import lonnymq.spark`` already does this for the session active at import time; call it
    for another session, or again after changing the ``spark.lonnymq.dsn`` /
    ``spark.lonnymq.password`` confs, which are read here (on the driver) and travel with the
    registered class, never through options or plans. Also turns on
    ``spark.sql.python.filterPushdown.enabled`` (off by default in Spark 4) so batch reads push
    filters down to PostgreSQL; to keep it off, read with ``.option("pushFilters", "false")``.
    On a session :func:`ship` shipped lonnymq to, registers the shipping variant again."""
    if spark.conf.get(_SHIPPED, None) == "true":
        ship(spark)
        return
    _register(spark, None)


def _register(spark: SparkSession, archive: Path | None) -> None:
    from ._conf import CONF_DSN, CONF_PASSWORD
    from .source import LonnyMQDataSource, with_conf

    conf = {k: v for k in (CONF_DSN, CONF_PASSWORD) if (v := spark.conf.get(k, None))}
    if archive is not None:
        from ._ship import shipped_source

        spark.dataSource.register(shipped_source(conf, archive))
    else:
        spark.dataSource.register(with_conf(conf) if conf else LonnyMQDataSource)
    if spark.conf.get(_PUSHDOWN, None) != "true":
        spark.conf.set(_PUSHDOWN, "true")


def ship(spark: SparkSession) -> Path:
    """Ship this process's lonnymq to every Python process of the session's queries, and
    register ``format("lonnymq")``: for clusters whose Python does not have lonnymq (classic
    sessions in client mode, and Spark Connect). Returns the zip it shipped (see
    :func:`package_zip`).

    The zip goes out with ``spark.addArtifacts(zip, pyfile=True)`` (on the path of the
    executors, the planners and your own UDFs) and inside the registered class and the readers
    and writers it makes, which unpickle by putting it on ``sys.path`` first: so it also reaches
    the processes Spark starts without the session's files (the driver-side planner of a
    streaming read; through Spark Connect, a streaming query's tasks). Those Python processes
    still need lonnymq's dependencies installed: ``psycopg[binary]``, ``psycopg-pool``,
    ``pyarrow`` and ``numpy``. Call it once per session, and again after changing the ``spark.lonnymq.*``
    confs (as :func:`register`, which keeps shipping on this session)."""
    archive = package_zip()
    if not _spark_ships(spark, archive.name):
        spark.addArtifacts(str(archive), pyfile=True)
    spark.conf.set(_SHIPPED, "true")
    _register(spark, archive)
    return archive


def _spark_ships(spark: SparkSession, name: str) -> bool:
    """Whether the session's SparkContext ships a Python file of this name already (given to
    ``spark-submit --py-files``: Spark refuses the same name again from another path)."""
    try:
        includes = spark.sparkContext._python_includes
    except Exception:  # Spark Connect: no SparkContext on the client
        return False
    return name in (includes or ())


def _register_active_session() -> None:
    """Register with the active session, if this process has one (not on executors)."""
    if "pyspark" not in sys.modules:  # nothing imported PySpark: there is no session
        return
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    except Exception:  # no JVM/Connect here (a Python worker): nothing to register with
        return
    if spark is not None:
        register(spark)


@dataclass(frozen=True)
class WriteStatus:
    """What a batch write with a ``writeId`` did to a queue (see :func:`write_status`)."""

    messages: int  # enqueued (created or replaced) by the commit
    committed_at: int  # epoch ms
    expires_at: int  # epoch ms: reruns with the id are recognised until then
    skipped: int  # reruns that found the id committed and enqueued nothing
    last_skipped_at: int | None


def write_status(dsn: str, queue: str, write_id: str, *, schema: str = DEFAULT_SCHEMA) -> WriteStatus | None:
    """The record of write id ``write_id`` on ``queue``, or None if no write with it committed
    (or its retention ran out). A rerun skipped because the id was committed shows as
    ``skipped`` going up (the driver also logs a warning)."""
    import psycopg
    from psycopg import sql

    from ..migrations import check_schema

    query = sql.SQL("SELECT * FROM {}.spark_write_status(%s::text, %s::text)").format(
        sql.Identifier(check_schema(schema))
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, (queue, write_id)).fetchone()
    if row is None:
        return None
    messages, committed_at, expires_at, skipped, last_skipped_at = row
    return WriteStatus(int(messages), int(committed_at), int(expires_at), int(skipped), last_skipped_at)


def sweep(
    dsn: str, *, schema: str = DEFAULT_SCHEMA, stage_ttl: float = 86400, stream_ttl: float = 7 * 86400
) -> tuple[int, int]:
    """Delete staging rows older than ``stage_ttl`` seconds that no commit or abort removed (a
    driver that died mid-write) and streaming-read state of queries not seen for
    ``stream_ttl`` seconds. Returns (staged rows, streams) deleted. Safe to run any time, as
    long as ``stage_ttl`` is longer than any write job runs (a swept part makes its job's commit
    fail loudly rather than enqueue a partial DataFrame)."""
    import psycopg
    from psycopg import sql

    from ..migrations import check_schema

    query = sql.SQL("SELECT * FROM {}.spark_sweep(%s::bigint, %s::bigint)").format(
        sql.Identifier(check_schema(schema))
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, (round(stage_ttl * 1000), round(stream_ttl * 1000))).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def resolve_in_doubt(dsn: str, *, schema: str = DEFAULT_SCHEMA, min_age: float = 60.0) -> list[Resolved]:
    """Finish the transactions that multi-shard writes' two-phase commits left prepared on the
    shards of router ``dsn`` at least ``min_age`` seconds ago (a driver that died in the
    commit): each write's committed where its partition 0 committed, else rolled back, as a
    rerun of the write would. Returns what it finished (docs/spark.md, "Sharded setups")."""
    from ._write import resolve_in_doubt as resolve

    return resolve(dsn, schema=schema, min_age=min_age)


def __getattr__(name: str) -> Any:
    if name == "LonnyMQDataSource":
        from .source import LonnyMQDataSource

        return LonnyMQDataSource
    raise AttributeError(name)


_register_active_session()
