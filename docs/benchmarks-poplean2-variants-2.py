"""Set-up of the ablations in docs/benchmarks.md (branch poplean2), set 2: copies of this
branch's take_tx_one as first committed (tt_i1: FOUND and the look for an undeliverable lease in
one IF), with that test split in two (tt_i2, as kept) and without the queue's whole row in the
head statement (tt_i3, the queue read again by _queue on the empty path):

    git show f10a793:src/lonnymq/sql/take.sql  # the tree it ran on: take.sql of commit f10a793
    python docs/benchmarks-poplean2-variants-2.py <src of f10a793> > /tmp/pl2/v2.sql
    cat docs/benchmarks-poplean2-setup.sql >> /tmp/pl2/v2.sql"""

import sys
from pathlib import Path

text = Path(sys.argv[1], "lonnymq/sql/take.sql").read_text()
i = text.index("CREATE OR REPLACE FUNCTION {schema}.take_tx_one(")
fn = text[i : text.index("END $$;", i) + len("END $$;")]
IFOR = """        IF FOUND OR NOT {schema}._undeliverable_ready(v_head.q, v_head.now) THEN
            RETURN;
        END IF;"""
SPLIT = """        IF FOUND THEN
            RETURN;
        END IF;
        IF NOT {schema}._undeliverable_ready(v_head.q, v_head.now) THEN
            RETURN;
        END IF;"""
SPLITQ = """        IF FOUND THEN
            RETURN;
        END IF;
        IF NOT {schema}._undeliverable_ready({schema}._queue(p_queue), v_head.now) THEN
            RETURN;
        END IF;"""
assert IFOR in fn
out = {
    "i1": fn,
    "i2": fn.replace(IFOR, SPLIT),
    "i3": fn.replace(IFOR, SPLITQ).replace("SELECT x AS q, x.id AS qid", "SELECT x.id AS qid"),

}
for name, f in out.items():
    assert name == "i1" or f != fn, name
    print(f.replace("{schema}.take_tx_one(", "{schema}.tt_" + name + "(", 1).replace("{schema}", "tree_x"))
    print(f"ALTER FUNCTION tree_x.tt_{name}(text, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;")
