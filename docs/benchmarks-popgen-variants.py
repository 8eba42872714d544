"""Set-up of the ablations in docs/benchmarks.md (branch popgen): copies of main's take_tx
(tt_<name>(text, integer, boolean, bigint), SECURITY DEFINER with the API's search_path), each
reading the window's older generation differently, and the two stores of a record that they read
(a column queues on message_gen_pending, a sequence message_gen_clear_seq):

    git -C /work/main archive main src | tar -x -C /tmp/popgen_before
    python docs/benchmarks-popgen-variants.py /tmp/popgen_before/src > /tmp/v.sql
    cat /tmp/v.sql docs/benchmarks-popgen-variants-clear.sql > /tmp/all_clear.sql   # (or -busy.sql)
    PYTHONPATH=src:benchmarks python benchmarks/statement_instructions.py --tree /tmp/popgen_before/src \
        --setup /tmp/all_clear.sql "ctl=SELECT * FROM {s}.tt_ctl('q', 1)" "s1=SELECT * FROM {s}.tt_s1('q', 1)" ...

The variants rec_* and val_filter predate the cheaper layout (s1, s1p: the record's generation in
the high 32 bits, its mask in the low 32, bit queue_id & 31); the busy set-up's setval is that
layout's."""
import sys
from pathlib import Path

src = sys.argv[1]
text = (Path(src) / "lonnymq/sql/take.sql").read_text()
i = text.index("CREATE OR REPLACE FUNCTION {schema}.take_tx(")
fn = text[i : text.index("END $$;", i) + len("END $$;")]

HEAD_FROM = """      INTO v_head
      FROM {schema}.queue x
      LEFT JOIN {schema}.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;"""
assert HEAD_FROM in fn
LEAN_EXPR = """p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive)"""
assert LEAN_EXPR + " AS lean" in fn
i = fn.index("        RETURN QUERY\n        DELETE FROM {schema}.message_logged m")
j = fn.index("        IF FOUND THEN\n            RETURN;\n        END IF;\n    END IF;", i)
TWO = fn[i:j]
assert "(VALUES (v_head.gen - 1), (v_head.gen))" in TWO
RET = TWO[TWO.index("        RETURNING"):]
ONE_PLAIN = """        RETURN QUERY
        DELETE FROM {schema}.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN m.attempts < v_head.max_attempts AND m.superseded_by IS NULL
                                     THEN m.ctid END  -- (no row: NULL)
                           FROM {schema}.message_logged m
                          WHERE m.gen = v_head.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                            AND m.dequeue_at <= v_head.now
                          ORDER BY m.dequeue_at, m.id
                          LIMIT 1
                            FOR UPDATE SKIP LOCKED)
""" + RET
FOUND = "        IF FOUND THEN\n            RETURN;\n        END IF;\n"


def rename(f, name):
    return f.replace("{schema}.take_tx(", "{schema}.tt_" + name + "(", 1)


def lean_block(f, block):
    """Replace the lean IF's body (the DELETE) with block."""
    return f.replace(TWO, block, 1)


def with_one(f, one_expr, extra_from="", one_block=ONE_PLAIN, decl=""):
    """Head computes `one` (lean and G-1 known clear of the queue); IF one: one_block, ELSIF lean: the two-gen DELETE."""
    f = f.replace(LEAN_EXPR + " AS lean", LEAN_EXPR + " AS lean,\n           " + LEAN_EXPR + " AND " + one_expr + " AS one", 1)
    f = f.replace(HEAD_FROM, HEAD_FROM.replace("\n     WHERE x.name", extra_from + "\n     WHERE x.name"), 1)
    old = "    IF v_head.lean THEN\n"
    k = f.index(old)
    end = f.index(FOUND + "    END IF;", k) + len(FOUND + "    END IF;")
    new = ("    IF v_head.one THEN\n" + one_block + FOUND + "    ELSIF v_head.lean THEN\n" + TWO + FOUND + "    END IF;")
    f = f[:k] + new + f[end:]
    if decl:
        f = f.replace("    v_head     record;\n", "    v_head     record;\n" + decl, 1)
    return f


G1_INIT = "(SELECT pg_sequence_last_value('{schema}.message_gen_seq') - 1)"
out = {
    "ctl": fn,
    "one_values": lean_block(fn, TWO.replace("(VALUES (v_head.gen - 1), (v_head.gen))", "(VALUES (v_head.gen))")),
    "one_plain": lean_block(fn, ONE_PLAIN),
    # The record in message_gen_pending's row of G-1 (queues: the queues holding rows there), by a LEFT JOIN.
    "rec_join": with_one(fn, "p.queues IS NOT NULL AND NOT x.id = ANY (p.queues)",
                         "\n      LEFT JOIN {schema}.message_gen_pending p ON p.gen = " + G1_INIT),
    "rec_join_var": with_one(fn, "p.queues IS NOT NULL AND NOT x.id = ANY (p.queues)",
                             "\n      LEFT JOIN {schema}.message_gen_pending p ON p.gen = v_g1",
                             decl="    v_g1       bigint := pg_sequence_last_value('{schema}.message_gen_seq') - 1;\n"),
    "rec_sub": with_one(fn, "NOT coalesce((SELECT x.id = ANY (p.queues) FROM {schema}.message_gen_pending p"
                            " WHERE p.gen = pg_sequence_last_value('{schema}.message_gen_seq') - 1), true)"),
    # 31 buckets (queue id mod 31) and the generation in one sequence value.
    "rec_seq": with_one(fn, "pg_sequence_last_value('{schema}.message_gen_clear_seq') >> 31"
                            " = pg_sequence_last_value('{schema}.message_gen_seq') - 1"
                            " AND pg_sequence_last_value('{schema}.message_gen_clear_seq') & (1::bigint << (x.id % 31)) = 0"),
    # One statement: the VALUES list filtered (no IF): the older generation's descent skipped.
    "val_filter": lean_block(
        fn.replace(LEAN_EXPR + " AS lean", LEAN_EXPR + " AS lean,\n           coalesce(p.queues IS NOT NULL AND NOT x.id = ANY (p.queues), false) AS one", 1)
          .replace(HEAD_FROM, HEAD_FROM.replace("\n     WHERE x.name", "\n      LEFT JOIN {schema}.message_gen_pending p ON p.gen = " + G1_INIT + "\n     WHERE x.name"), 1),
        TWO.replace("                                  ORDER BY w.dequeue_at, w.id",
                    "                                  WHERE NOT (v_head.one AND g.gen < v_head.gen)\n"
                    "                                  ORDER BY w.dequeue_at, w.id", 1)),
}
print("ALTER TABLE tree_x.message_gen_pending ADD COLUMN queues integer[];")
print("CREATE SEQUENCE tree_x.message_gen_clear_seq AS bigint MINVALUE -1 START WITH -1;")
for name, f in out.items():
    print(rename(f, name).replace("{schema}", "tree_x") + "\n")
    print(f"ALTER FUNCTION tree_x.tt_{name}(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;")

more = {
    # no record: one = lean (unsafe), the IF/ELSIF structure only
    "if_only": with_one(fn, "true"),
    # one extra sequence read in the head, unused
    "one_plain_seq": lean_block(fn, ONE_PLAIN).replace(
        "AS lean\n", "AS lean,\n           pg_sequence_last_value('{schema}.message_gen_clear_seq') AS clear\n", 1),
    # the record in one sequence read, decided by a plpgsql IF over the head's fields
    "rec_seq1": with_one(fn, "true").replace(
        "AS one\n", "AS one,\n           pg_sequence_last_value('{schema}.message_gen_clear_seq') AS clear\n", 1).replace(
        "    IF v_head.one THEN\n",
        "    IF v_head.lean AND v_head.clear >> 31 = v_head.gen - 1 AND v_head.clear & (1::bigint << (v_head.qid % 31)) = 0 THEN\n", 1),
}
for name, f in more.items():
    print(rename(f, name).replace("{schema}", "tree_x") + "\n")
    print(f"ALTER FUNCTION tree_x.tt_{name}(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;")

ONE_SQL = ("(pg_sequence_last_value('{schema}.message_gen_clear_seq')"
           " - ((pg_sequence_last_value('{schema}.message_gen_seq') - 1) << 32))"
           " & ((-1::bigint << 32) | (1::bigint << (x.id & 31))) = 0")


def nested(f, head_extra, cond):
    f = f.replace("AS lean\n", "AS lean,\n           " + head_extra + "\n", 1)
    old = "    IF v_head.lean THEN\n"
    k = f.index(old)
    end = f.index(FOUND + "    END IF;", k) + len(FOUND + "    END IF;")
    new = ("    IF v_head.lean THEN\n        IF " + cond + " THEN\n    " + ONE_PLAIN.replace("\n        ", "\n            ")
           + "        ELSE\n    " + TWO.replace("\n        ", "\n            ") + "        END IF;\n" + FOUND + "    END IF;")
    return f[:k] + new + f[end:]


more2 = {
    "s1": nested(fn, ONE_SQL + " AS one", "v_head.one"),
    "s1p": nested(fn, "pg_sequence_last_value('{schema}.message_gen_clear_seq') AS clear",
                  "(v_head.clear - ((v_head.gen - 1) << 32)) & ((-1::bigint << 32) | (1::bigint << (v_head.qid & 31))) = 0"),
    "s1_true": nested(fn, "true AS one", "v_head.one"),
}
for name, f in more2.items():
    print(rename(f, name).replace("{schema}", "tree_x") + "\n")
    print(f"ALTER FUNCTION tree_x.tt_{name}(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;")
