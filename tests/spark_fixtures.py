"""Spark for the tests: one local SparkSession per test run, and fault-injecting variants of the
lonnymq data source.

The session is ``local[2,3]``: two cores and up to three attempts per task (plain ``local[2]``
ignores ``spark.task.maxFailures``), so an injected first-attempt failure is retried like on a
cluster. Executors' Python workers import this module by name (the data source subclasses
below), so this directory is put on their PYTHONPATH before the JVM starts.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


#: An environment variable holding the test server's DSN, set before the JVM starts (the
#: driver's Python workers, which plan queries, inherit the JVM's environment): ``dsnEnv``.
DSN_ENV = "LONNYMQ_SPARK_TEST_DSN"

#: JVM options of every Spark JVM the tests start (drivers, executors, cluster daemons), all of
#: which live minutes at most: the C1 compiler only (C2's compiler threads spend more CPU than
#: they save in so short a life, on 2 shared cores), the serial collector (no parallel GC
#: threads for a small heap), and no bytecode verification of the classes loaded from Spark's
#: jars (the JDK's own are never verified; verifying Spark's took about 1.5 of the 10 s of CPU a
#: local session's start and first query cost: docs/testing.md). None changes what Spark does.
JAVA_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)


def _home_without_zip(root: Path) -> Path:
    """A SPARK_HOME for the local session: the installed PySpark's bin/, jars/ and the rest,
    linked, without its python/ directory. Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first
    on every Python worker's path, and a module imported from a zip is compiled again each time
    (the zip holds no bytecode): 3.2-3.7 s of CPU for each worker that does not fork from the
    daemon (a stream's source runner, a write's commit, a scan's planning), 0.4 s from the
    installed package's cached bytecode. Under load that start-up outlived the 10 s the JVM waits
    for a worker to connect back ("Python worker failed to connect back"). Without the zip the
    workers import the same PySpark, installed in this interpreter's environment."""
    for entry in spark_home().iterdir():
        if entry.name != "python":
            (root / entry.name).symlink_to(entry)
    return root


def local_builder(java_options: str = JAVA_OPTIONS) -> Any:
    """The builder of the tests' local SparkSession (tools/spark_start_cost.py measures it)."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,3]")
        .appName("lonnymq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", java_options)
    )


@pytest.fixture(scope="session", name="spark")
def spark_session(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The shared SparkSession (import this fixture into a test module to use ``spark``)."""
    pytest.importorskip("pyspark")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ[DSN_ENV] = dsn
    os.environ["SPARK_HOME"] = str(_home_without_zip(tmp_path_factory.mktemp("spark-home")))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    import lonnymq.spark

    # The tasks' Python daemon is this module (the __main__ block below), which imports the
    # lonnymq data source and its test variants once, before it forks a worker per task.
    session = local_builder().config("spark.python.daemon.module", "spark_fixtures").getOrCreate()
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


# -- a standalone cluster ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    """The installed PySpark distribution: its bin/, sbin/ and jars/ are a SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@functools.cache
def cluster_home() -> Path:
    """A SPARK_HOME for the cluster's processes (its daemons, the applications submitted to it,
    the Connect server): the installed PySpark linked, as :func:`_home_without_zip` does, but with
    its ``python/lib`` zips, which Spark puts first on the path of every Python it starts, kept:
    the cluster's Python has lonnymq's dependencies and no PySpark (test_cluster.py), so its
    PySpark comes from ``pyspark.zip``, as on a real cluster. Each zip is rebuilt with the
    bytecode this environment already cached for the sources it installed unchanged, next to
    them (``_compiled_zip``): the same modules, not compiled again by every Python Spark starts
    (a daemon took 1.0-1.5 s of CPU from the plain zip, 0.3-0.5 s from the installed package;
    docs/testing.md). Made once per process, removed at its exit."""
    root = Path(tempfile.mkdtemp(prefix="lonnymq-spark-home-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    source = spark_home()
    for entry in source.iterdir():
        if entry.name != "python":
            (root / entry.name).symlink_to(entry)
    for entry in (source / "python").rglob("*"):
        target = root / "python" / entry.relative_to(source / "python")
        if entry.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif entry.suffix == ".zip" and entry.parent.name == "lib":
            _compiled_zip(entry, target, source.parent)
        else:
            target.symlink_to(entry)
    return root


def _compiled_zip(source: Path, target: Path, site: Path) -> None:
    """Copy the zip ``source`` to ``target``, adding ``name.pyc`` next to each ``name.py`` whose
    same bytes are installed under ``site`` with bytecode cached for this interpreter: that
    bytecode, as a checked hash-based .pyc (PEP 552), so zipimport uses it while the source in the
    zip hashes the same, and compiles the source otherwise (a zip's .pyc must sit next to its
    source; the installed one is in ``__pycache__``, stamped with the installed file's mtime)."""
    magic = importlib.util.MAGIC_NUMBER
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(zipfile.ZipInfo(info.filename, info.date_time), data)  # stored: no inflating
            if not info.filename.endswith(".py"):
                continue
            installed = site / info.filename
            cached = Path(importlib.util.cache_from_source(str(installed)))
            if not cached.is_file() or installed.read_bytes() != data:
                continue
            compiled = cached.read_bytes()
            if compiled[:4] != magic or not _fresh(compiled, installed, data):
                continue
            checked = (0b11).to_bytes(4, "little")  # hash-based, check the source
            zout.writestr(
                info.filename[:-3] + ".pyc",
                magic + checked + importlib.util.source_hash(data) + compiled[16:],
            )


def _fresh(compiled: bytes, source: Path, data: bytes) -> bool:
    """Whether the cached bytecode ``compiled`` is of ``source`` (whose bytes are ``data``), as
    the import system checks it: the source's mtime and size for a timestamp .pyc, its hash
    for a hash-based one."""
    flags = int.from_bytes(compiled[4:8], "little")
    if flags & 0b1:
        return compiled[8:16] == importlib.util.source_hash(data)
    st = source.stat()
    stamp = int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF
    return (int.from_bytes(compiled[8:12], "little"), int.from_bytes(compiled[12:16], "little")) == stamp


def spark_env(**more: str) -> dict[str, str]:
    """This process's environment for Spark's scripts: :func:`cluster_home` as SPARK_HOME,
    loopback only, JAVA_OPTIONS for every JVM started with it (JAVA_TOOL_OPTIONS: the launchers,
    the daemons, drivers, and the executors, which inherit a worker's environment), and none of
    this session's Spark settings (a Connect URL, the Python of the local tests) or PYTHONPATH
    (Spark hands it on to every Python it starts, the cluster's too)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
    }
    env.update(
        SPARK_HOME=str(cluster_home()), SPARK_LOCAL_IP="127.0.0.1", JAVA_TOOL_OPTIONS=JAVA_OPTIONS, **more
    )
    return env


def stop_group(proc: Any, wait: float = 30) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class StandaloneCluster:
    """A Spark standalone master and workers on loopback ports, run from the installed PySpark
    (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``: PyPI's
    PySpark has no sbin/start-master.sh). Each worker runs in its own process group, with the
    executors it launches, so :meth:`kill_workers` takes them all down like a lost machine."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "512m") -> None:
        self.root = root
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.sizes = (workers, cores, memory)
        self.env = spark_env(SPARK_DAEMON_MEMORY="256m", SPARK_CONF_DIR=str(root / "conf"))
        (root / "conf").mkdir(parents=True, exist_ok=True)
        self.master = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port()),
        )  # fmt: skip
        self._wait_for(self.root / "master.log", "I have been elected leader", self.master)
        # The port the master bound: Spark moves on to the next one when another process took
        # the free port first (spark.port.maxRetries), so its own log line, not the port asked for.
        bound = re.search(r"Starting Spark master at (spark://\S+)", (self.root / "master.log").read_text())
        if bound:
            self.url = bound.group(1)
            self.port = int(self.url.rsplit(":", 1)[1])
        self.workers: list[Any] = []
        self.generation = 0
        self.start_workers()

    def _start(self, name: str, cls: str, *args: str) -> Any:
        with (self.root / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), cls, *args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    @staticmethod
    def _wait_for(log: Path, line: str, proc: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while line not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{log.name}: no {line!r} (exit {proc.poll()}):\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.3)

    def start_workers(self) -> None:
        """Start the workers (again, after :meth:`kill_workers`) and wait for them to register."""
        workers, cores, memory = self.sizes
        self.generation += 1
        for i in range(workers):
            args = ["--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                    "--work-dir", str(self.root / f"worker{i + 1}"), "--webui-port", str(free_port())]  # fmt: skip
            name = f"worker{i + 1}-{self.generation}"
            self.workers.append(self._start(name, "org.apache.spark.deploy.worker.Worker", *args, self.url))
        for i, proc in enumerate(self.workers[-workers:]):
            self._wait_for(
                self.root / f"worker{i + 1}-{self.generation}.log", "Successfully registered", proc
            )

    def kill_workers(self) -> None:
        """SIGKILL every worker with its executors and their Python workers: lost machines."""
        for proc in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.workers.clear()

    def driver_files(self, name: str) -> list[Path]:
        """Files ``name`` (stdout, stderr) of the drivers run on the workers (cluster mode)."""
        return sorted(self.root.glob(f"worker*/driver-*/{name}"))

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            stop_group(proc)


def bare_python(root: Path, packages: tuple[str, ...]) -> Path:
    """A virtualenv at ``root`` with only ``packages`` (distributions installed here, linked in,
    with what they import) and no lonnymq: the Python of cluster nodes that do not have lonnymq
    installed. Returns its interpreter. ``--system-site-packages`` would not do: it would see
    this interpreter's base site-packages and, in an editable install's venv, lonnymq."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    for name in packages:
        dist = distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops):
            target = Path(str(dist.locate_file(top)))
            if target.exists() and not (site / top).exists():
                (site / top).symlink_to(target)
    return python


if __name__ == "__main__":
    # ``python -m spark_fixtures pyspark.worker``: the daemon of the local session's task workers
    # (``spark.python.daemon.module``). pyspark.daemon forks a process per task worker (again
    # after a worker failed or sat idle a minute) and each imports the data source's module
    # after the fork: about 0.35 s of CPU each time (lonnymq, psycopg, PySpark's data source
    # API; docs/testing.md). Imported here, before any fork, each worker inherits them. Only
    # modules that start no thread (pyspark.daemon forks from a single thread; numpy and pyarrow
    # start threads at import, and lonnymq imports them on first use): checked here, so a change
    # that breaks this fails loudly instead of forking a process with a lock held by a thread.
    import importlib

    importlib.import_module("spark_fixtures")  # what the workers unpickle: this module's classes
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError(f"spark_fixtures: {threads} threads before pyspark.daemon forks (must be 1)")
    from pyspark.daemon import manager

    manager()
