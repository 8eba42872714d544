"""``lonnymq.spark.ship`` without a JVM: the zip it sends, and that what it registers, and the
readers and writers that come out of it, unpickle in a Python without lonnymq (as Spark's
Python workers on a cluster do: PySpark from the distribution's pyspark.zip on PYTHONPATH).
The same on a real cluster: tests/spark/test_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark import cloudpickle
from pyspark.sql.types import StructField, StructType

from lonnymq import Client
from lonnymq.spark import package_zip
from lonnymq.spark._read import COLUMNS
from lonnymq.spark._ship import package_bytes, shipped_source
from spark_fixtures import bare_python, spark_home

NODE_PACKAGES = ("psycopg", "psycopg-binary", "psycopg-pool", "pyarrow", "numpy", "typing_extensions")


@pytest.fixture(scope="module")
def nodes_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bare_python(tmp_path_factory.mktemp("nodes-python"), NODE_PACKAGES)


def run_bare(python: Path, code: str, tmp: Path) -> str:
    """Run ``code`` in ``python`` as Spark runs its Python workers: PySpark from pyspark.zip and
    py4j's zip, a temporary directory of its own."""
    lib = spark_home() / "python" / "lib"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip"))),
        "TMPDIR": str(tmp),
    }
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_module_entry_point_prints_the_zip_or_one_line(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "lonnymq.spark", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    made = run(str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert Path(made.stdout.strip()) == package_zip(tmp_path)
    # A folder that does not exist: one line naming it, exit 1 (it was a traceback).
    missing = run(str(tmp_path / "missing"))
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"python -m lonnymq.spark: cannot write the zip in {tmp_path / 'missing'}: No such file or directory"
    ]


def test_package_zip_is_the_package_and_stable(tmp_path: Path) -> None:
    first = package_zip(tmp_path)
    assert package_zip(tmp_path) == first and package_bytes() == first.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert "lonnymq/__init__.py" in names and "lonnymq/spark/source.py" in names
    assert "lonnymq/sql/take.sql" in names and "lonnymq/migrations/0001_baseline.sql" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # The command docs/spark.md gives for --py-files builds the same file.
    done = subprocess.run(
        [sys.executable, "-m", "lonnymq.spark", str(tmp_path)], check=True, capture_output=True, text=True
    )
    assert done.stdout.strip() == str(first)


def test_shipped_source_and_its_readers_unpickle_without_lonnymq(
    nodes_python: Path, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("orders")  # the writer checks it at planning
    nodes_tmp = tmp_path / "node"
    nodes_tmp.mkdir()
    run_bare(nodes_python, "import importlib.util as u; assert u.find_spec('lonnymq') is None", nodes_tmp)
    source_cls = shipped_source({"spark.lonnymq.dsn": dsn}, package_zip(tmp_path))
    # What Spark pickles: the registered class (its instances, made by Spark's planner), then
    # the readers and writers the planner pickles for the executors.
    (tmp_path / "source.pkl").write_bytes(
        cloudpickle.dumps(source_cls({"queue": "orders", "schema": schema}))
    )
    columns = StructType([StructField(n, t) for n, t in COLUMNS])
    (tmp_path / "schema.json").write_text(columns.json())
    planned = run_bare(
        nodes_python,
        f"""
import pickle, sys
from pyspark import cloudpickle
from pyspark.sql.types import StructField, StructType
source = pickle.load(open({str(tmp_path / "source.pkl")!r}, "rb"))
assert "lonnymq" not in sys.modules           # the class came by value
schema = StructType.fromJson(__import__("json").load(open({str(tmp_path / "schema.json")!r})))
assert source.schema().startswith("`queue` string")
reader, stream, writer = source.reader(schema), source.streamReader(schema), source.writer(schema, False)
import lonnymq
print(lonnymq.__file__)
print(reader.target.dsn, type(reader).__mro__[1].__module__, type(stream).__name__, type(writer).__name__)
open({str(tmp_path / "parts.pkl")!r}, "wb").write(cloudpickle.dumps((reader, stream, writer)))
""",
        nodes_tmp,
    )
    origin, described = planned.splitlines()
    # lonnymq ran from the zip the class carried, unpacked in the node's temporary directory.
    assert origin.startswith(str(nodes_tmp)) and ".zip/lonnymq/" in origin
    assert described == f"{dsn} lonnymq.spark._read StreamReader BatchWriter"  # the conf came along
    # An executor: a fresh Python without lonnymq gets the readers and the writer.
    executor_tmp = tmp_path / "executor"
    executor_tmp.mkdir()
    ran = run_bare(
        nodes_python,
        f"""
import pickle, sys
reader, stream, writer = pickle.load(open({str(tmp_path / "parts.pkl")!r}, "rb"))
print(type(reader).__module__, type(stream).__qualname__, stream.num_partitions, writer.target.queue)
print(sys.modules["lonnymq"].__file__)
""",
        executor_tmp,
    )
    described, origin = ran.splitlines()
    assert described == "lonnymq.spark._read StreamReader 2 orders"
    assert origin.startswith(str(executor_tmp)) and ".zip/lonnymq/" in origin
