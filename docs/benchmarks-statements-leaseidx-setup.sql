-- queues for branch leaseidx's counts: e (empty), s2 (10 leases expiring after 10,000 scheduled
-- messages come due), s3 (2,000 leases expiring before 10,000 scheduled messages come due)
SELECT tree_x.queue_create('e');
SELECT tree_x.queue_create('s2');
SELECT tree_x.queue_create('s3');
INSERT INTO tree_x.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, attempts, deliveries, leased, payload)
SELECT (SELECT id FROM tree_x.queue WHERE name = 's2'), (SELECT last_value FROM tree_x.message_gen_seq),
       CASE WHEN i <= 10 THEN 1700000000000 + 3600000 + i ELSE 1700000000000 + 600000 + i END,
       1700000000000 - 1000, 1700000000000 - 1000, (i <= 10)::int, (i <= 10)::int, i <= 10, '\x00'
  FROM generate_series(1, 10010) i;
INSERT INTO tree_x.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, attempts, deliveries, leased, payload)
SELECT (SELECT id FROM tree_x.queue WHERE name = 's3'), (SELECT last_value FROM tree_x.message_gen_seq),
       CASE WHEN i <= 2000 THEN 1700000000000 + 30000 + i ELSE 1700000000000 + 3600000 + i END,
       1700000000000 - 1000, 1700000000000 - 1000, (i <= 2000)::int, (i <= 2000)::int, i <= 2000, '\x00'
  FROM generate_series(1, 12000) i;
VACUUM ANALYZE tree_x.message;
