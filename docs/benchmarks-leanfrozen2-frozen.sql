-- leanfrozen2 (statement_instructions.py --setup): queue 'f' with a backlog of 3,000 messages frozen in
-- their generation (two forced rotations that move at most 5 rows, as benchmarks/frozen_drain.py
-- freezes its backlog), ready at server_instructions.py's fixed clock; no rotation due during the run.
SELECT tree_x.queue_create('f');
SELECT count(*) FROM tree_x.send_batch('f', array_fill('\x7b7d'::bytea, ARRAY[3000]), p_now => 1699999999000);
SELECT tree_x.rotate(p_force => true, p_max_moves => 5);
SELECT tree_x.rotate(p_force => true, p_max_moves => 5);
SELECT gens FROM tree_x.message_gen_frozen;
SELECT setval('tree_x.message_gen_started_seq', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000);
