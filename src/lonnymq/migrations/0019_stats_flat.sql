-- LonnyMQ 0019: the dashboard's and the counters' housekeeping reads, flat in the number of
-- queues (issue 19; functions in ../sql/queues.sql and ../sql/stats.sql). Stored data, and
-- two internal functions whose signatures change.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.

-- queue_info: the settings of the queues named, by a probe of the name's index each (the
-- dashboard's queue page read queue_list() whole to find one queue). The monitor role may call
-- it, like queue_list (admin may call every API function).
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('queue_info', 'monitor', ARRAY['EXECUTE']);

-- Where maintain()'s round over the queues' counters resumes (the last queue it visited), and
-- when a heartbeat last folded the recent minutes (epoch ms): sequences, like the generation
-- clock, so that they are read and moved without a row version (stats.sql, _stats_maintain and
-- worker_beat).
CREATE SEQUENCE {schema}.queue_stat_round_seq AS integer MINVALUE -2147483648 START WITH -2147483648;
CREATE SEQUENCE {schema}.queue_stat_fold_seq AS bigint MINVALUE 0 START WITH 0;

-- _stats_fold folds the queues it is given (sql/stats.sql defines the new signature).
DROP FUNCTION IF EXISTS {schema}._stats_fold(bigint);
-- _count_messages takes the queue's generations, read once by queue_metrics (sql/queues.sql).
DROP FUNCTION IF EXISTS {schema}._count_messages(integer, bigint, bigint, boolean, bigint);
