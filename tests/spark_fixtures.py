"""Spark for the tests: one local SparkSession per test run, and fault-injecting variants of the
lonnymq data source.

The session is ``local[2,3]``: two cores and up to three attempts per task (plain ``local[2]``
ignores ``spark.task.maxFailures``), so an injected first-attempt failure is retried like on a
cluster. Executors' Python workers import this module by name (the data source subclasses
below), so this directory is put on their PYTHONPATH before the JVM starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


#: An environment variable holding the test server's DSN, set before the JVM starts (the
#: driver's Python workers, which plan queries, inherit the JVM's environment): ``dsnEnv``.
DSN_ENV = "LONNYMQ_SPARK_TEST_DSN"


@pytest.fixture(scope="session", name="spark")
def spark_session(dsn: str) -> Iterator[Any]:
    """The shared SparkSession (import this fixture into a test module to use ``spark``)."""
    pytest.importorskip("pyspark")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ[DSN_ENV] = dsn
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    import lonnymq.spark

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("lonnymq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    lonnymq.spark.register(session)
    session.dataSource.register(FlakyDataSource)
    yield session
    session.stop()


# -- fault injection ------------------------------------------------------------------------------
# Defined at import time only if PySpark is there, so collecting tests never needs it.

try:
    from pyspark import TaskContext

    from lonnymq.spark._conf import option
    from lonnymq.spark._write import BatchWriter, Staged, StreamWriter
    from lonnymq.spark.source import LonnyMQDataSource
except ImportError:  # pragma: no cover - the spark tests are skipped then
    pass
else:

    def _fail_here(options: Mapping[str, str]) -> bool:
        """True in the task attempt the options ask to fail: partition ``failPartition``,
        attempts below ``failAttempts`` (default 1: only the first attempt), and, for streams,
        micro-batch ``failBatch`` (default 0)."""
        part = option(options, "failPartition")
        if part is None:
            return False
        ctx = TaskContext.get()
        assert ctx is not None
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if batch is not None and int(batch) != int(option(options, "failBatch", "0") or 0):
            return False
        attempts = int(option(options, "failAttempts", "1") or 1)
        return ctx.partitionId() == int(part) and ctx.attemptNumber() < attempts

    class FlakyBatchWriter(BatchWriter):
        """Stages its rows, then fails the task (so the failed attempt's rows stay staged)."""

        def __init__(self, options: Mapping[str, str], schema: Any, conf: Mapping[str, str]) -> None:
            super().__init__(options, schema, conf)
            self.fault_options = dict(options)

        def write(self, iterator: Iterator[Any]) -> Staged:
            staged = super().write(iterator)
            if _fail_here(self.fault_options):
                raise RuntimeError(f"injected task failure after staging {staged.rows} rows")
            return staged

    class FlakyStreamWriter(StreamWriter):
        """Fails a task after staging (``failPartition``), and/or crashes right after the
        database commit of micro-batch ``crashAfterCommit`` while the file ``crashFlag``
        exists (it is removed first, so the restarted query gets through)."""

        def __init__(self, options: Mapping[str, str], schema: Any, conf: Mapping[str, str]) -> None:
            super().__init__(options, schema, conf)
            self.fault_options = dict(options)

        def write(self, iterator: Iterator[Any]) -> Staged:
            staged = super().write(iterator)
            if _fail_here(self.fault_options):
                raise RuntimeError(f"injected task failure after staging {staged.rows} rows")
            return staged

        def commit(self, messages: list[Any], batchId: int) -> None:
            super().commit(messages, batchId)
            flag = option(self.fault_options, "crashFlag")
            crash = option(self.fault_options, "crashAfterCommit")
            if flag and crash is not None and int(crash) == batchId and os.path.exists(flag):
                os.remove(flag)
                raise RuntimeError(f"injected crash after committing batch {batchId}")

    class FlakyDataSource(LonnyMQDataSource):
        @classmethod
        def name(cls) -> str:
            return "lonnymq_flaky"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return FlakyBatchWriter(self.options, schema, self.conf)

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return FlakyStreamWriter(self.options, schema, self.conf)
