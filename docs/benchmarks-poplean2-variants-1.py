"""Set-up of the ablations in docs/benchmarks.md (branch poplean2), set 1: copies of main's
take_tx (tt_ctl) and of a pop of one message in a frame of its own (tt_a3: three arguments, one
record, the head statement without the queue's whole row, the lean DELETE, take_tx for the rest),
with one change each, SECURITY DEFINER with the API's search_path:

    git -C /work/main archive main src | tar -x -C /tmp/pl2 && mv /tmp/pl2/src /tmp/pl2/base_src
    python docs/benchmarks-poplean2-variants-1.py /tmp/pl2/base_src > /tmp/pl2/v1b.sql
    cat docs/benchmarks-poplean2-setup.sql >> /tmp/pl2/v1b.sql

(The variants without jit = off were dropped from the set: see docs/benchmarks.md.)"""

import sys
from pathlib import Path

src = sys.argv[1]
text = (Path(src) / "lonnymq/sql/take.sql").read_text()
i = text.index("CREATE OR REPLACE FUNCTION {schema}.take_tx(")
fn = text[i : text.index("END $$;", i) + len("END $$;")]
SETS = "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off"

DELETE = """DELETE FROM {schema}.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM {schema}.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload"""

HEAD = """SELECT x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('{schema}.message_gen_seq') AS gen,
           CLOCK AS now,
           x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT ARCH AS lean
      INTO v_head
      FROM {schema}.queue x
      LEFT JOIN {schema}.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue"""
CLOCK_P = """CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE {schema}._now(p_now) END"""
CLOCK_C = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def lean(name, args, head, sets=SETS, body=None, ret="SETOF {schema}.delivery", decl="v_head record;", fb=None):
    fb = fb or "RETURN QUERY SELECT * FROM {schema}.tt_ctl(p_queue, 1, p_archive, p_now);"
    body = body or f"""    {head};
    IF v_head.lean THEN
        RETURN QUERY
        {DELETE};
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    {fb}"""
    return f"""CREATE OR REPLACE FUNCTION {{schema}}.tt_{name}({args}) RETURNS {ret}
LANGUAGE plpgsql VOLATILE
{sets} AS $$
DECLARE
    {decl}
BEGIN
{body}
END $$;"""


H3 = HEAD.replace("CLOCK", CLOCK_P).replace("ARCH", "coalesce(p_archive, x.archive)")
H1 = HEAD.replace("CLOCK", CLOCK_C).replace("ARCH", "x.archive")
A3 = "p_queue text, p_archive boolean DEFAULT NULL, p_now bigint DEFAULT NULL"
out = {
    "ctl": fn.replace("{schema}.take_tx(", "{schema}.tt_ctl(", 1),
    "a3": lean("a3", A3, H3),
    "a3_nopcm": lean("a3_nopcm", A3, H3, sets=SETS.replace("SET plan_cache_mode = force_generic_plan ", "")),
    "a3_nosort": lean("a3_nosort", A3, H3, sets=SETS.replace(" SET enable_sort = off", "")),
    "a3_noseq": lean("a3_noseq", A3, H3, sets=SETS.replace(" SET enable_seqscan = off", "")),
    "a1": lean("a1", "p_queue text", H1, fb="RETURN QUERY SELECT * FROM {schema}.tt_ctl(p_queue, 1);"),
    "a3_scalar": lean(
        "a3_scalar", A3, H3, ret="{schema}.delivery", decl="v_head record;\n    v_row {schema}.delivery;",
        body=f"""    {H3};
    IF v_head.lean THEN
        {DELETE}
        INTO v_row;
        IF FOUND THEN
            RETURN v_row;
        END IF;
    END IF;
    SELECT * INTO v_row FROM {{schema}}.tt_ctl(p_queue, 1, p_archive, p_now);
    RETURN v_row;""",
    ),
}
sig = {"a1": "text", "ctl": "text, integer, boolean, bigint"}
for name, f in out.items():
    print(f.replace("{schema}", "tree_x"))
    print(f"ALTER FUNCTION tree_x.tt_{name}({sig.get(name, 'text, boolean, bigint')}) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;")
