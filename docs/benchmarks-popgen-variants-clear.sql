SELECT tree_x.queue_create('e');
UPDATE tree_x.message_gen_pending SET queues = '{}' WHERE gen = 0;
SELECT setval('tree_x.message_gen_clear_seq', 0);
