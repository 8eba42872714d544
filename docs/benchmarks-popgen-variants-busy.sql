SELECT tree_x.queue_create('e');
UPDATE tree_x.message_gen_pending SET queues = ARRAY(SELECT id FROM tree_x.queue) WHERE gen = 0;
SELECT setval('tree_x.message_gen_clear_seq', (SELECT bit_or(1::bigint << (id & 31)) FROM tree_x.queue));
