"""The ablations of docs/benchmarks.md's "The floors of a function-call API" (branch apifloor):
prints the --setup SQL of benchmarks/statement_instructions.py, variants of the API floors'
functions (benchmarks/lonnymq_bench/systems/api_floor.py) over its schema tree_x (queue 'q':
id 1, generation 1). ``1`` prints run 1's (docs/benchmarks-apifloor-ablations-1.json), ``2``
run 2's; the statements counted are in each JSON. Run from benchmarks/ with src/ and benchmarks/ on PYTHONPATH.
"""

import sys

from lonnymq_bench.systems.api_floor import _GEN, _NOW, _TAKE_TX_RETURNING, ddl
from lonnymq_bench.systems.pop_floor import CLOCK, TEMPLATE, WINDOW_TEMPLATE
from lonnymq_bench.systems.send_floor import TEMPLATE as ST

SD = " SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
PINS = " SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off"
stmts = [s.as_string(None) for s in ddl("tree_x")]
schema, send, send_rows, pop, pop2 = stmts
out = list(stmts)


def var(src: str, old_name: str, new_name: str, *subs: tuple[str, str]) -> None:
    t = src.replace(f'"lonnymq_floor".{old_name}(', f'"lonnymq_floor".{new_name}(')
    for a, b in subs:
        assert a in t, (new_name, a)
        t = t.replace(a, b)
    out.append(t)


if sys.argv[1] == "1":
    gen = _GEN.replace("{s}", '"tree_x"')
    var(send, "send", "send_nosd", (SD, ""))
    var(send, "send", "send_idn", ("(queue_id, id, gen,", "(queue_id, gen,"), ("""nextval('"tree_x".message_id_seq'), """, ""))
    var(send, "send", "send_gen1", (gen, "1::bigint"))
    var(send, "send", "send_q1", ("x.id, nextval", "1, nextval"), ('FROM "tree_x".queue x, now WHERE x.name = p_queue', "FROM now"))
    var(send, "send", "send_seq", (SD, SD + " SET enable_seqscan = off"))
    var(pop, "pop", "pop_nosd", (SD, ""))
    var(pop, "pop", "pop_pinned", (SD, SD + PINS))
    var(pop, "pop", "pop_q1", ("x.id, x.max_attempts, ", "1 AS id, 5 AS max_attempts, "), (' FROM "tree_x".queue x WHERE x.name = p_queue', ""))
    var(pop2, "pop2", "pop2_pinned", (SD, SD + PINS))
else:
    SECURE = "LANGUAGE plpgsql VOLATILE" + SD
    head = f"(SELECT q.id, q.max_attempts, {_GEN} AS gen, {_NOW} AS now FROM {{s}}.queue q WHERE q.name = p_queue) h"
    for name, t in (("pop_one", TEMPLATE), ("pop2_one", WINDOW_TEMPLATE)):
        stmt = t.format(s="{s}", q="h.id", gen="h.gen", max="h.max_attempts", now="h.now")
        stmt = stmt.replace("DELETE FROM {s}.message_logged m WHERE", f"DELETE FROM {{s}}.message_logged m USING {head} WHERE", 1)
        stmt = stmt[: stmt.index(" RETURNING ")] + _TAKE_TX_RETURNING
        body = f"CREATE FUNCTION lonnymq_floor.{name}(p_queue text) RETURNS SETOF {{s}}.delivery {SECURE} AS $fn$\nBEGIN\n  RETURN QUERY {stmt};\nEND $fn$"
        out.append(body.replace("{s}", '"tree_x"'))
    PLAIN = "LANGUAGE plpgsql VOLATILE"
    send_stmt = " ".join(ST.format(s='"tree_x"', q=1, gen=1, ct="p_content_type", p="p_payload").split())
    send_stmt = send_stmt.replace("SELECT id FROM ins", "SELECT ins.id INTO STRICT v_id FROM ins")
    out.append(
        "CREATE FUNCTION lonnymq_floor.send_frame(p_queue text, p_payload bytea, p_content_type text DEFAULT NULL)"
        f" RETURNS bigint {PLAIN} AS $fn$\nDECLARE v_id bigint;\nBEGIN\n  {send_stmt};\n  RETURN v_id;\nEND $fn$"
    )
    pop_stmt = TEMPLATE.format(s='"tree_x"', q=1, gen=1, max=5, now=CLOCK)
    pop_stmt = pop_stmt[: pop_stmt.index(" RETURNING ")] + _TAKE_TX_RETURNING
    out.append(
        f'CREATE FUNCTION lonnymq_floor.pop_frame(p_queue text) RETURNS SETOF "tree_x".delivery {PLAIN} AS $fn$\n'
        f"BEGIN\n  RETURN QUERY {pop_stmt};\nEND $fn$"
    )
print(";\n".join(out) + ";")
