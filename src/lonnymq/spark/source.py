"""The ``lonnymq`` PySpark data source (PySpark 4 Python Data Source API)."""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .. import errors
from ._conf import CONF_DSN, CONF_PASSWORD, option
from ._read import BatchReader, StreamReader, read_schema
from ._write import BatchWriter, StreamWriter

#: Options whose values are never shown (repr, messages).
SECRET_OPTIONS = ("dsn",)


class LonnyMQDataSource(DataSource):
    """``format("lonnymq")``: queues as DataFrames and streams.

    * ``spark.read``: a queue's live messages, archive or dead letters (``table=``), in
      parallel id ranges, without consuming anything; filters are pushed down to PostgreSQL.
    * ``spark.readStream``: consume a queue, at least once; acked when Spark commits a batch.
    * ``df.write`` (mode ``append``): enqueue a DataFrame exactly once per job.
    * ``writeStream``: enqueue each micro-batch exactly once across restarts.

    Common options: ``dsn`` (or ``dsnEnv``, the Spark conf ``spark.lonnymq.dsn``, or
    ``$LONNYMQ_DSN``), ``schema`` (default ``lonnymq``), ``queue``. A shard router's DSN is
    followed to the queue's shard(s) (docs/spark.md, "Sharded setups"). See docs/spark.md.
    """

    #: ``spark.lonnymq.*`` confs captured by :func:`lonnymq.spark.register` (a subclass per
    #: registration carries them to the planner and the executors, pickled with the class).
    conf: ClassVar[dict[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "lonnymq"

    def __repr__(self) -> str:
        shown = {k: ("***" if k.lower() in SECRET_OPTIONS else v) for k, v in self.options.items()}
        return f"LonnyMQDataSource({shown})"

    def schema(self) -> str:
        return read_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        if (option(self.options, "pushFilters", "true") or "true").lower() == "false":
            return PlainBatchReader(self.options, schema, self.conf)
        return BatchReader(self.options, schema, self.conf)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.options, schema, self.conf)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise errors.InvalidArgument('lonnymq only appends to a queue: use .mode("append")')
        return BatchWriter(self.options, schema, self.conf)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise errors.InvalidArgument("lonnymq only appends to a queue: use outputMode append or update")
        return StreamWriter(self.options, schema, self.conf)


class PlainBatchReader(BatchReader):
    """A batch read without filter pushdown (``pushFilters=false``), for sessions that keep
    ``spark.sql.python.filterPushdown.enabled`` off: Spark refuses a reader implementing
    ``pushFilters`` then."""

    pushFilters = DataSourceReader.pushFilters  # type: ignore[assignment]  # Spark checks identity


def with_conf(conf: dict[str, str]) -> type[LonnyMQDataSource]:
    """A subclass of :class:`LonnyMQDataSource` carrying ``conf`` (``spark.lonnymq.dsn`` /
    ``.password``). It is defined here, not importable by name, so cloudpickle ships it by value
    with its conf to wherever Spark plans or runs the query."""
    wanted = {k: v for k, v in conf.items() if k in (CONF_DSN, CONF_PASSWORD) and v}
    cls = type(
        "LonnyMQDataSource",
        (LonnyMQDataSource,),
        {"conf": wanted, "__module__": __name__, "__qualname__": "with_conf.<locals>.LonnyMQDataSource"},
    )
    return cls
