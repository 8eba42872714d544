-- Set-up for benchmarks/statement_instructions.py (branch poplean2): beside the tool's queue q
-- (which has the backlog): e (ordinary, empty), u (UNLOGGED, a backlog of 3,000).
SELECT tree_x.queue_create('e');
SELECT tree_x.queue_create('u', p_unlogged => true);
SELECT count(*) FROM tree_x.send_batch('u', array_fill('\x00'::bytea, ARRAY[3000]));
