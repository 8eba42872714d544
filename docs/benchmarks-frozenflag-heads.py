"""Set-up of docs/benchmarks.md, "A frozen flag in a sequence" (branch frozenflag): take()'s head
statement as functions of their own, from h0 of docs/benchmarks-takehead-heads.sql (main's head),
with its frozen-generations sub-select changed: k1 the flag and the sub-select in a CASE, k2 no
frozen lookup at all, k3 the flag's read alone, k4 the flag and _gen_frozen_of() in a CASE (kept;
the function exists in the branch's tree only):

    python docs/benchmarks-frozenflag-heads.py > /tmp/heads.sql
    cd benchmarks; PYTHONPATH=../src:. python statement_instructions.py --tree ../src \\
        --setup /tmp/heads.sql "h0=SELECT {s}.h0('q', 1, NULL, '{{1}}', '{{1}}')" ... (k1-k4 alike)
"""

from pathlib import Path

base = (Path(__file__).parent / "benchmarks-takehead-heads.sql").read_text()
h0 = base[base.index("CREATE FUNCTION tree_x.h0(") : base.index("-- h1:")]
SUB = "           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,\n"
assert SUB in h0
FLAG = "pg_sequence_last_value('tree_x.message_gen_frozen_seq')"
VARIANTS = {
    "k1": f"           CASE WHEN {FLAG} = 0 THEN NULL\n"
    "                ELSE (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) END AS frozen,\n",
    "k2": "           NULL::bigint[] AS frozen,\n",
    "k3": f"           {FLAG} AS frozen,\n",
    "k4": f"           CASE WHEN {FLAG} = 0 THEN NULL\n                ELSE tree_x._gen_frozen_of(x.id) END AS frozen,\n",
}
print(h0, end="")
for name, column in VARIANTS.items():
    print(h0.replace("tree_x.h0(", f"tree_x.{name}(").replace(SUB, column), end="")
