"""Which DDL a storage ring can run while a pg_dump-like holder (REPEATABLE READ, ACCESS SHARE on
the queue tables it found at its start) is open: each statement with a 300 ms lock_timeout.

    python docs/storage/locks_under_dump.py [DSN]
"""

import psycopg, time
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/test"
a = psycopg.connect(D, autocommit=True)
b = psycopg.connect(D, autocommit=True)
b.execute("DROP SCHEMA IF EXISTS lockexp CASCADE; CREATE SCHEMA lockexp")
b.execute("CREATE TABLE lockexp.parent (gen bigint NOT NULL, id bigint, pad text) PARTITION BY RANGE (gen)")
b.execute("CREATE TABLE lockexp.p0 PARTITION OF lockexp.parent FOR VALUES FROM (0) TO (10)")
b.execute("CREATE INDEX ON lockexp.parent (gen, id)")
b.execute("INSERT INTO lockexp.parent SELECT 1, g, 'x' FROM generate_series(1,1000) g")
# the holder: like pg_dump
a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
a.execute("LOCK TABLE lockexp.parent, lockexp.p0 IN ACCESS SHARE MODE")
a.execute("SELECT count(*) FROM lockexp.parent").fetchone()


def tr(label, stmt):
    t = time.perf_counter()
    try:
        b.execute("SET lock_timeout = '300ms'")
        b.execute(stmt)
        r = "ok"
    except Exception as e:
        r = type(e).__name__ + ": " + str(e).splitlines()[0]
    print(f"{label:45s} {r}  ({(time.perf_counter() - t) * 1000:.0f} ms)")


tr(
    "CREATE TABLE PARTITION OF (new)",
    "CREATE TABLE lockexp.p1 PARTITION OF lockexp.parent FOR VALUES FROM (10) TO (20)",
)
tr("CREATE TABLE standalone", "CREATE TABLE lockexp.p2 (LIKE lockexp.parent INCLUDING ALL)")
tr(
    "ATTACH PARTITION (standalone)",
    "ALTER TABLE lockexp.parent ATTACH PARTITION lockexp.p2 FOR VALUES FROM (20) TO (30)",
)
tr("INSERT into new partition", "INSERT INTO lockexp.parent SELECT 25, g, 'y' FROM generate_series(1,1000) g")
tr("TRUNCATE new partition", "TRUNCATE lockexp.p2")
tr("TRUNCATE old partition (held)", "TRUNCATE lockexp.p0")
tr("DETACH new partition", "ALTER TABLE lockexp.parent DETACH PARTITION lockexp.p2")
tr("DROP new partition", "DROP TABLE lockexp.p2")
# standalone tables outside any partitioned parent
tr("CREATE ring table", "CREATE TABLE lockexp.r1 (gen bigint, id bigint, pad text)")
tr("TRUNCATE ring table created after", "INSERT INTO lockexp.r1 VALUES (1,1,'x'); TRUNCATE lockexp.r1")
tr("DROP ring table created after", "DROP TABLE lockexp.r1")
print("snapshot sees", a.execute("SELECT count(*) FROM lockexp.parent").fetchone())
a.execute("ROLLBACK")
b.execute("RESET lock_timeout")
b.execute("DROP SCHEMA lockexp CASCADE")
