-- Set-up for benchmarks/statement_instructions.py (branch poplean): two empty queues beside the
-- tool's queue q (which has the backlog): e (ordinary) and ue (UNLOGGED).
SELECT tree_x.queue_create('e');
SELECT tree_x.queue_create('ue', p_unlogged => true);
