"""LonnyMQ for Apache Spark: the ``lonnymq`` PySpark data source (``pip install lonnymq[spark]``).

    import lonnymq.spark
    lonnymq.spark.register(spark)
    df.write.format("lonnymq").option("dsn", dsn).option("queue", "orders").mode("append").save()

PySpark is imported only when the data source is used, so ``import lonnymq`` stays light.
Needs the Spark tables and functions (``sql/spark.sql``), which ``Client.migrate()`` installs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..migrations import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .source import LonnyMQDataSource

__all__ = ["LonnyMQDataSource", "register", "sweep"]


def register(spark: SparkSession) -> None:
    """Register ``format("lonnymq")`` with a Spark session (needed once per session)."""
    from .source import LonnyMQDataSource

    spark.dataSource.register(LonnyMQDataSource)


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


def __getattr__(name: str) -> Any:
    if name == "LonnyMQDataSource":
        from .source import LonnyMQDataSource

        return LonnyMQDataSource
    raise AttributeError(name)
