"""Set-up files of the ablations in docs/benchmarks.md (branch poplean): copies of a tree's
take_tx, each with one change, as ``tree_x.tt_<label>`` with the API functions' SECURITY DEFINER
and search_path, for benchmarks/statement_instructions.py ``--setup``.

    python docs/benchmarks-poplean-variants.py /tmp/poplean/base/src 1 > /tmp/variants-1.sql
    python docs/benchmarks-poplean-variants.py /tmp/poplean/base/src 2 > /tmp/variants-2.sql
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

OLDVALS = "FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)"
ONEGEN = "FROM (VALUES (v_head.gen)) AS g(gen)"
SORT = "                                  ORDER BY w.dequeue_at, w.id\n                                  LIMIT 1)"
CLOCK = "CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()"
CLOCKF = "CASE WHEN p_now IS NULL THEN (date_part('epoch', clock_timestamp()) * 1000)::bigint"
# comb2: one statement (queue, frozen generations, window, DELETE) before the head statement.
COMB = """    IF p_limit = 1 THEN
    v_now := CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                  ELSE {schema}._now(p_now) END;
    v_gen := pg_sequence_last_value('{schema}.message_gen_seq');
    RETURN QUERY
    DELETE FROM {schema}.message_logged m
     WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END
                       FROM {schema}.queue x
                       LEFT JOIN {schema}.message_gen_frozen f ON f.queue_id = x.id
                      CROSS JOIN (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                      CROSS JOIN LATERAL (
                            SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                   m.attempts < x.max_attempts AND m.superseded_by IS NULL AS ok
                              FROM {schema}.message_logged m
                             WHERE m.gen = g.gen AND m.queue_id = x.id AND m.channel IS NULL
                               AND m.dequeue_at <= v_now
                             ORDER BY m.dequeue_at, m.id
                             LIMIT 1
                               FOR UPDATE SKIP LOCKED) w
                      WHERE x.name = p_queue AND x.id >= 0 AND NOT x.paused
                        AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive)
                        AND coalesce(cardinality(f.gens), 0) = 0
                      ORDER BY w.dequeue_at, w.id
                      LIMIT 1)
    RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
              m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
              m.last_error, m.payload;
    IF FOUND THEN
        RETURN;
    END IF;
    END IF;
"""
HEAD = "    -- The queue, the clock, the generation counter"


def _comb(f: str) -> str:
    i = f.index(HEAD)
    return f[:i] + COMB + f[i:]


SETS_1: dict[str, Callable[[str], str]] = {
    "ctl": lambda f: f,
    "onegen": lambda f: f.replace(OLDVALS, ONEGEN),
    "nosortgen": lambda f: f.replace(OLDVALS, ONEGEN).replace(SORT, "                                  )"),
    "nofrozen": lambda f: f.replace(
        "LEFT JOIN {schema}.message_gen_frozen f ON f.queue_id = x.id",
        "LEFT JOIN (SELECT NULL::int AS queue_id, NULL::bigint[] AS gens) f ON f.queue_id = x.id",
    ),
    "nowholerow": lambda f: f.replace(
        "SELECT x AS q, x.id AS qid", "SELECT NULL::{schema}.queue AS q, x.id AS qid"
    ),
    "noset": lambda f: f.replace(
        "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off ",
        "",
    ),
}
SETS_2: dict[str, Callable[[str], str]] = {
    "ctl": lambda f: f,
    "clockf": lambda f: f.replace(CLOCK, CLOCKF),
    "comb2": _comb,
}
# Set 2's extra queues: e (empty), u (UNLOGGED, with a backlog).
QUEUES_2 = """SELECT tree_x.queue_create('e');
SELECT tree_x.queue_create('u', p_unlogged => true);
SELECT count(*) FROM tree_x.send_batch('u', array_fill('\\x00'::bytea, ARRAY[3000]));
"""


def main() -> None:
    src, which = sys.argv[1], sys.argv[2]
    text = (Path(src) / "lonnymq/sql/take.sql").read_text()
    i = text.index("CREATE OR REPLACE FUNCTION {schema}.take_tx(")
    fn = text[i : text.index("END $$;", i) + len("END $$;")]
    out = []
    for name, change in (SETS_1 if which == "1" else SETS_2).items():
        f = change(fn)
        assert name == "ctl" or f != fn, name
        out.append(
            f.replace("{schema}.take_tx(", "{schema}.tt_" + name + "(", 1).replace("{schema}", "tree_x")
        )
        out.append(
            f"ALTER FUNCTION tree_x.tt_{name}(text, integer, boolean, bigint)"
            " SECURITY DEFINER SET search_path = pg_catalog, pg_temp;"
        )
    print("\n".join(out))
    if which == "2":
        print(QUEUES_2, end="")


if __name__ == "__main__":
    main()
