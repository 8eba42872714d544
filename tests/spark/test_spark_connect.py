"""The lonnymq data source through Spark Connect: a real Connect server (PySpark's
``sbin/start-connect-server.sh``, ``local[2]``) and a Connect client in a subprocess (a Connect
session sets process-wide state, ``SPARK_CONNECT_MODE_ENABLED``, that would turn the classic
session other tests share into a Connect one). The client runs this file as a script: it
registers the source on the Connect session (on import, then by conf), and runs a batch write,
a batch read with a pushed-down filter, and a ``readStream`` into a ``writeStream`` with
``availableNow``; the test checks the database.

Run alone: ``.venv/bin/python -m pytest tests/spark/test_spark_connect.py -q`` (docs/spark.md,
"Spark Connect").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.once, pytest.mark.spark, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://localhost:<port>`` of a Spark Connect server started for this module."""
    pytest.importorskip("pyspark")
    pytest.importorskip("grpc", reason="needs the connect extra: pip install 'lonnymq[connect]'")
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    logs = tmp_path_factory.mktemp("connect")
    port = free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(logs),
        "SPARK_PID_DIR": str(logs),
        # The server's Python workers plan and run the data source: they need lonnymq.
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("SPARK_REMOTE", None)
    log = logs / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(home / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"the Spark Connect server did not start (exit {server.poll()}):\n{tail}")
            time.sleep(0.5)
        yield f"sc://localhost:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the script's process group: the script and its JVM
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def run_client(url: str, *args: str) -> dict[str, Any]:
    """Run this file as the Connect client; its last stdout line is a JSON report."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    done = subprocess.run(
        [sys.executable, __file__, url, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"the Connect client failed:\n{done.stdout[-2000:]}\n{done.stderr[-5000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_batch_and_streaming_through_spark_connect(
    connect_url: str, dsn: str, schema: str, client: Any, tmp_path: Path
) -> None:
    client.create_queue("orders")
    client.create_queue("events")
    client.create_queue("copies")
    sent = client.send_batch("events", [{"i": i} for i in range(25)])

    report = run_client(connect_url, dsn, schema, str(tmp_path / "ckpt"))

    # Batch writes (registered on import with option dsn; then by register() with the DSN from
    # the spark.lonnymq.dsn conf): one message per row, once.
    orders = client.peek("orders", 1000)
    assert sorted(m.payload["order_id"] for m in orders) == [*range(10), 100]
    assert {m.key for m in orders} == {None, *(f"k{i}" for i in range(10))}
    # Batch read with option dsn; the filter went down to PostgreSQL (no Filter left in Spark).
    assert report["read"] == [6, 7, 8, 9]
    assert "Filter" not in report["optimized_plan"] and "lonnymq" in report["optimized_plan"].lower()
    # readStream -> writeStream, availableNow: every event copied once, and acked at the source.
    assert [n for n in report["stream_batches"] if n] == [10, 10, 5]  # maxRowsPerBatch=10
    copies = client.peek("copies", 1000)
    assert sorted(m.payload["i"] for m in copies) == list(range(25))
    assert {m.key for m in copies} == {str(m.id) for m in sent}
    m = client.metrics("events")
    assert (m.ready, m.scheduled, m.leased) == (0, 0, 0)


# -- the Connect client (run as a script by run_client) -------------------------------------------


def main(url: str, dsn: str, schema: str, checkpoint: str) -> None:
    import warnings

    # PySpark 4.3 warns about pandas 3 when the Connect client loads; nothing here uses pandas.
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    import lonnymq.spark  # registers format("lonnymq") with the active (Connect) session

    def opts(queue: str, **more: str) -> dict[str, str]:
        return {"dsn": dsn, "schema": schema, "queue": queue, **more}

    # The import registered the source: a write with option dsn works right away.
    spark.createDataFrame([(100,)], "order_id long").write.format("lonnymq").options(
        **opts("orders", writeId="import")
    ).mode("append").save()

    # The DSN from a Spark conf: register again after setting it.
    spark.conf.set("spark.lonnymq.dsn", dsn)
    lonnymq.spark.register(spark)
    orders = spark.createDataFrame([(i, f"k{i}") for i in range(10)], "order_id long, key string")
    orders.write.format("lonnymq").option("schema", schema).option("queue", "orders").mode("append").save()

    # Batch read with option dsn, and a filter pushed down (key IN: the key index).
    read = (
        spark.read.format("lonnymq")
        .options(**opts("orders"))
        .load()
        .where("key IN ('k6', 'k7', 'k8', 'k9')")
        .selectExpr("CAST(get_json_object(payload, '$.order_id') AS int) AS n")
    )
    plan = read._explain_string(extended=True)
    optimized = plan.split("== Optimized Logical Plan ==")[1].split("== Physical Plan ==")[0]
    ns = sorted(r.n for r in read.collect())

    q = (
        spark.readStream.format("lonnymq")
        .options(**opts("events", maxRowsPerBatch="10"))
        .load()
        .selectExpr("payload", "CAST(id AS string) AS key")
        .writeStream.format("lonnymq")
        .options(**opts("copies", payloadFormat="json"))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    batches = [p.numInputRows for p in q.recentProgress]
    print(json.dumps({"read": ns, "optimized_plan": optimized, "stream_batches": batches}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
