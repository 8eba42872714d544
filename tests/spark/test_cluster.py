"""lonnymq on a real Spark standalone cluster whose Python does not have lonnymq installed: the
shipping routes of docs/spark.md ("Running on a cluster") and what happens when the cluster
loses its executors.

One master and one worker (2 cores, 1 GiB) run for the module, from the installed PySpark, on
loopback ports; each application runs one executor (1 core, 512 MiB), and in cluster mode its
driver takes the worker's other core. The cluster's Python is a virtualenv made for the module with
lonnymq's dependencies only (psycopg, psycopg-pool, pyarrow, numpy): executors, the driver-side
planners, and in cluster mode the driver itself, run it. Each route runs tests/spark/cluster_job.py
with the command docs/spark.md shows: a batch write, a batch read, and a readStream into a
writeStream, checked in PostgreSQL.

* client mode: ``spark-submit --master spark://...``, the driver in this venv; the same
  application then runs a stream whose executors the test kills;
* cluster mode: Spark refuses Python applications in standalone cluster mode (the test checks
  the error), so the driver goes to a worker as the JVM application SparkSubmit, which then
  runs the Python driver there with the cluster's Python and ``--py-files`` lonnymq's zip;
* Spark Connect: a Connect server whose executors are the cluster; the client in this venv (the
  suite's only Connect server: the client-side calls are the same whatever runs the server).

Run alone: ``.venv/bin/python -m pytest tests/spark/test_cluster.py -q``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lonnymq import Client
from spark_fixtures import StandaloneCluster, bare_python, free_port, spark_env, spark_home, stop_group

pytestmark = [pytest.mark.once, pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).with_name("cluster_job.py")
#: What the cluster's Python needs to run lonnymq's data source (docs/spark.md), with PySpark
#: (which the workers put on their Python's path themselves).
NODE_PACKAGES = ("psycopg", "psycopg-binary", "psycopg-pool", "pyarrow", "numpy", "typing_extensions")
#: Confs every application on the cluster needs: one executor of 1 core and 512 MiB (an executor
#: JVM is the costliest thing a test starts; what the tests check needs no second one).
APP_CONF = ("--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
            "--conf", "spark.cores.max=1", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2")  # fmt: skip
EVENTS = 300


@pytest.fixture(scope="module")
def nodes_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's Python: lonnymq's dependencies, no lonnymq."""
    python = bare_python(tmp_path_factory.mktemp("nodes-python"), NODE_PACKAGES)
    probe = subprocess.run(
        [str(python), "-c", "import psycopg, psycopg_pool, pyarrow, numpy; import lonnymq"],
        env=spark_env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'lonnymq'" in probe.stderr, probe.stderr
    return python


@pytest.fixture(scope="module")
def driver_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver's Python (client mode, the Connect client): this interpreter with the lonnymq
    these tests import. If that comes from PYTHONPATH (a checkout other than the installed one),
    a wrapper sets it for the driver's Python alone: Spark would hand a PYTHONPATH of the
    driver's JVM on to every Python it starts, the planners' too (see spark_env)."""
    import lonnymq

    mine = Path(lonnymq.__file__).resolve()
    seen = subprocess.run(
        [sys.executable, "-c", "import lonnymq; print(lonnymq.__file__)"],
        env=spark_env(), capture_output=True, text=True,
    )  # fmt: skip
    if seen.returncode == 0 and Path(seen.stdout.strip()).resolve() == mine:
        return Path(sys.executable)
    wrapper = tmp_path_factory.mktemp("driver-python") / "python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{mine.parents[1]}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    pytest.importorskip("pyspark")
    # One worker: room for a cluster-mode driver and an executor (1 core, 512 MiB each).
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=1, cores=2, memory="1g")
    try:
        yield c
    finally:
        c.stop()


def spark_submit(*args: str, log: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    with log.open("w") as out:
        done = subprocess.run(
            [str(spark_home() / "bin" / "spark-submit"), *args],
            env=spark_env(), stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
        )  # fmt: skip
    return subprocess.CompletedProcess(done.args, done.returncode, log.read_text(errors="replace"), "")


def queues(client: Client) -> list[int]:
    """The queues of cluster_job.py, and EVENTS events to stream; returns their ids."""
    for name in ("orders", "events", "copies"):
        client.create_queue(name)
    return [m.id for m in client.send_batch("events", [{"i": i} for i in range(EVENTS)])]


def check_routes(client: Client, report: dict[str, Any], events: list[int]) -> None:
    """What cluster_job.py's four modes must have done, in PostgreSQL and in its report."""
    # Batch write: 200 rows, one message each, with its key; batch read: all of them, and by key
    # with the filter pushed down (no Filter left in Spark's optimized plan).
    orders = client.peek("orders", 1000)
    assert sorted(m.payload["n"] for m in orders) == list(range(200))
    assert {m.key for m in orders} == {f"k{i}" for i in range(200)}
    assert report["read"] == list(range(200))
    assert report["pushed"] == [6, 7, 8, 9]
    assert "Filter" not in report["pushed_plan"] and "lonnymq" in report["pushed_plan"].lower()
    # readStream -> writeStream: each event copied once, in batches of at most 100, all acked.
    copies = client.peek("copies", 1000)
    assert sorted(int(m.key) for m in copies) == events
    assert sorted(m.payload["i"] for m in copies) == list(range(EVENTS))
    assert [n for n in report["stream_batches"] if n] == [100, 100, 100]
    m = client.metrics("events")
    assert (m.ready, m.scheduled, m.leased) == (0, 0, 0)


def test_cluster_mode(
    cluster: StandaloneCluster, nodes_python: Path, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    # Spark runs no Python application in standalone cluster mode:
    refused = spark_submit(
        "--master", cluster.url, "--deploy-mode", "cluster", str(JOB), "submit", dsn, schema, str(tmp_path),
        log=tmp_path / "refused.log", timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0
    assert (
        "Cluster deploy mode is currently not supported for python applications on standalone clusters."
        in refused.stdout
    )
    # ... so the driver goes to a worker as the JVM application SparkSubmit (any jar as its
    # primary resource), which runs the Python driver there in the cluster's Python, with
    # lonnymq from --py-files.
    dist = tmp_path / "dist"
    dist.mkdir()
    built = subprocess.run(
        [sys.executable, "-m", "lonnymq.spark", str(dist)], check=True, capture_output=True, text=True
    )
    zip_path = Path(built.stdout.strip())
    assert zip_path.parent == dist and zip_path.name.startswith("lonnymq-")
    jar = tmp_path / "launcher.jar"
    with zipfile.ZipFile(jar, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    events = queues(client)
    done = spark_submit(
        "--master", cluster.url, "--deploy-mode", "cluster", "--class", "org.apache.spark.deploy.SparkSubmit",
        "--driver-memory", "512m", "--conf", "spark.standalone.submit.waitAppCompletion=true", str(jar),
        "--master", cluster.url, *APP_CONF,
        "--conf", f"spark.pyspark.driver.python={nodes_python}",
        "--conf", f"spark.pyspark.python={nodes_python}",
        "--py-files", str(zip_path),
        str(JOB), "submit", dsn, schema, str(tmp_path),
        log=tmp_path / "submit.log",
    )  # fmt: skip
    drivers = "\n".join(p.read_text(errors="replace")[-3000:] for p in cluster.driver_files("stderr"))
    assert done.returncode == 0 and "is FINISHED" in done.stdout, f"{done.stdout[-3000:]}\n{drivers}"
    report = json.loads((tmp_path / "report.json").read_text())
    # The driver ran in the cluster's Python, with lonnymq from the zip it was given.
    assert report["driver_python"] == str(nodes_python)
    assert report["lonnymq"].startswith(f"{zip_path.name}/") or f"/{zip_path.name}/" in report["lonnymq"]
    assert report["shipped"] == zip_path.name  # ship() sends that same zip on
    check_routes(client, report, events)


def test_spark_connect(
    cluster: StandaloneCluster,
    nodes_python: Path,
    driver_python: Path,
    dsn: str,
    schema: str,
    client: Client,
    tmp_path: Path,
) -> None:
    pytest.importorskip("grpc", reason="needs the connect extra: pip install 'lonnymq[connect]'")
    port = free_port()
    log = tmp_path / "connect.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(spark_home() / "sbin" / "start-connect-server.sh"), "--wait", "--master", cluster.url,
             *APP_CONF, "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.port.maxRetries=16"],
            env=spark_env(PYSPARK_PYTHON=str(nodes_python), SPARK_LOG_DIR=str(tmp_path), SPARK_PID_DIR=str(tmp_path)),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        # The port it bound: the next one when another process took the free port first.
        bound = re.search(r"Spark Connect server started at: \S*:(\d+)", log.read_text(errors="replace"))
        port = int(bound.group(1)) if bound else port
        events = queues(client)
        done = subprocess.run(
            [str(driver_python), str(JOB), f"sc://127.0.0.1:{port}", dsn, schema, str(tmp_path)],
            env=spark_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["executors"] == [f"{nodes_python} False"]
        assert report["watch"] == "refused"  # a Connect client cannot see the executors
        check_routes(client, report, events)
    finally:
        stop_group(server)


def wait_for(path: Path, job: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert job.poll() is None, f"the job ended (exit {job.returncode}):\n{log.read_text()[-5000:]}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s:\n{log.read_text()[-5000:]}"
        time.sleep(0.3)


def test_client_mode_and_lost_executors(
    cluster: StandaloneCluster,
    nodes_python: Path,
    driver_python: Path,
    dsn: str,
    schema: str,
    client: Client,
    tmp_path: Path,
) -> None:
    """Client mode runs the four routes; then the same application (one driver, one executor JVM
    less than two) runs a stream whose executors the test kills: fail_without_executors fails
    the query, its leased messages return when the lease runs out, and a new query gets each
    once."""
    events = queues(client)
    client.create_queue("held")
    client.create_queue("held_copies")
    sent = sorted(m.id for m in client.send_batch("held", [{"i": i} for i in range(20)]))
    (tmp_path / "hold").touch()  # the stream's tasks wait while this exists
    log = tmp_path / "submit.log"
    with log.open("wb") as out:
        job = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url, *APP_CONF,
             "--conf", f"spark.pyspark.driver.python={driver_python}",  # the driver: lonnymq installed
             "--conf", f"spark.pyspark.python={nodes_python}",  # executors and planners: not
             str(JOB), "submit", dsn, schema, str(tmp_path), "routes+lost"],
            env=spark_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(tmp_path / "routes.json", job, log, 600)
        report = json.loads((tmp_path / "routes.json").read_text())
        assert report["executors"] == [f"{nodes_python} False"]  # before ship(): no lonnymq there
        assert report["watch"] is True  # fail_without_executors watched the stream
        check_routes(client, report, events)

        # The lost stream's first micro-batch leased the 20 messages and its tasks are reading
        # them: the executors go down with their workers.
        wait_for(tmp_path / "task-running", job, log, 300)
        leased = client.peek("held", 100)
        assert sorted(m.id for m in leased) == sent and client.metrics("held").leased == len(sent)
        lease_until = max(m.lease_until or 0 for m in leased)
        killed = time.time()
        cluster.kill_workers()

        # Nothing can run the batch: fail_without_executors(timeout=15) fails the query with a
        # message, instead of Spark waiting for executors forever.
        wait_for(tmp_path / "failed", job, log, 180)
        failed = json.loads((tmp_path / "failed").read_text())
        assert "waited 15 s with no executor to run on" in (failed["error"] or ""), failed["error"]
        assert failed["failed_at"] - killed < 15 + 60
        # Its messages stay leased (nothing acked them, nothing else can take them) until the
        # lease runs out (on a loaded machine it may have by now: then they are all ready) ...
        m = client.metrics("held")
        read_at = time.time() * 1000
        assert m.ready + m.leased == 20
        if read_at < lease_until:
            assert (m.ready, m.leased) == (0, 20)
        assert client.peek("held_copies", 100) == []

        # ... until the lease (45 s) runs out: then a new query, once the cluster is back,
        # gets each of them once.
        cluster.start_workers()
        (tmp_path / "hold").unlink()
        (tmp_path / "restart").touch()
        deadline = time.monotonic() + 300
        while len(copies := client.peek("held_copies", 100)) < len(sent):
            assert job.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, (
                f"{len(copies)} of {len(sent)} copied:\n{log.read_text()[-5000:]}"
            )
            time.sleep(1)
        assert sorted(int(c.key) for c in copies) == sent
        assert min(c.enqueued_at for c in copies) >= lease_until
        (tmp_path / "stop").touch()
        assert job.wait(180) == 0, log.read_text()[-5000:]
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["second_error"] is None
    finally:
        stop_group(job)
        if not cluster.workers:
            cluster.start_workers()
