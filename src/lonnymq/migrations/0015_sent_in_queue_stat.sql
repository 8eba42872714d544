-- LonnyMQ 0015: one counter row per send, not two (issue 12). Stored data only; the functions
-- are in ../sql/*.sql. Template: {schema} is the quoted schema identifier, {schema_name} its
-- string literal; literal braces are doubled.
--
-- sent_count (0002) and queue_stat's sent column (0010) counted the same sends (created by
-- sends, dead letters moved in, requeued dead messages), so every send appended two rows.
-- queue_stat alone now counts them: queue_metrics' total_sent is the sum of the queue's
-- queue_stat.sent. What sent_count counted before queue_stat existed (queues older than 0010)
-- moves to the queue's folded past (minute 0), so total_sent stays what it was, and
-- stats_totals' sent, which counted from 0010 on, now counts from the queue's creation too.
-- Run while producers send, the DROP waits for the sends in flight (they hold the table's
-- row lock) and holds new ones until this transaction, which also replaces the functions
-- that wrote it, commits.
INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
SELECT c.queue_id, 0, c.n - coalesce(s.sent, 0)
  FROM (SELECT x.queue_id, sum(x.n) AS n FROM {schema}.sent_count x GROUP BY x.queue_id) c
  LEFT JOIN (SELECT y.queue_id, sum(y.sent) AS sent FROM {schema}.queue_stat y
              GROUP BY y.queue_id) s ON s.queue_id = c.queue_id
 WHERE c.n > coalesce(s.sent, 0)
   AND EXISTS (SELECT FROM {schema}.queue q WHERE q.id = c.queue_id);

DROP TABLE {schema}.sent_count;
