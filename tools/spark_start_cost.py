"""The CPU of the tests' local SparkSession (tests/spark_fixtures.py's builder): start, two small
queries, stop, with the given JVM options (default: the tests').

    python tools/cputime.py -- python tools/spark_start_cost.py ["-XX:TieredStopAtLevel=1 ..."]

(docs/testing.md, "Changes of 2026-11-27, evening").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The tests' own builder, from tests/ (not a package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from spark_fixtures import JAVA_OPTIONS, local_builder


def main(argv: list[str]) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = local_builder(argv[0] if argv else JAVA_OPTIONS).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    print(session.range(1000).selectExpr("sum(id)").collect())
    print(session.createDataFrame([(1, "a")], "a int, b string").collect())
    session.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
