-- leanfrozen2 (statement_instructions.py --setup): an empty queue 'e' beside the backlog of 'q'; no rotation due during the run.
SELECT tree_x.queue_create('e');
SELECT setval('tree_x.message_gen_started_seq', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000);
