-- LonnyMQ 0020: queue_info (../sql/queues.sql), the settings of the queues named, by a probe of
-- the name's index each: the dashboard's queue page read queue_list() whole to find one queue
-- (issue 19). Stored data only: what the monitor role may call, like queue_list (admin may call
-- every API function). Template: {schema} is the quoted schema identifier, {schema_name} its
-- string literal; literal braces are doubled.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('queue_info', 'monitor', ARRAY['EXECUTE']);
