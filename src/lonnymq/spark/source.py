"""The ``lonnymq`` PySpark data source (PySpark 4 Python Data Source API)."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .. import errors
from ._read import BatchReader, StreamReader, read_schema
from ._write import BatchWriter, StreamWriter


class LonnyMQDataSource(DataSource):
    """``format("lonnymq")``: queues as DataFrames and streams.

    * ``spark.read``: a queue's live messages, archive or dead letters (``table=``), in
      parallel id ranges, without consuming anything.
    * ``spark.readStream``: consume a queue, at least once; acked when Spark commits a batch.
    * ``df.write`` (mode ``append``): enqueue a DataFrame exactly once per job.
    * ``writeStream``: enqueue each micro-batch exactly once across restarts.

    Common options: ``dsn`` (default ``$LONNYMQ_DSN``), ``schema`` (default ``lonnymq``),
    ``queue``. See docs/spark.md for the rest.
    """

    @classmethod
    def name(cls) -> str:
        return "lonnymq"

    def schema(self) -> StructType:
        return read_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise errors.InvalidArgument('lonnymq only appends to a queue: use .mode("append")')
        return BatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise errors.InvalidArgument("lonnymq only appends to a queue: use outputMode append or update")
        return StreamWriter(self.options, schema)
