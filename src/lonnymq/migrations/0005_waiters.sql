-- LonnyMQ 0005: consumers register as waiters so that sends notify only when one waits
-- (issue 12 item 1; the functions are in ../sql/wait.sql, docs/wakeups.md). No table changes:
-- waiters are advisory locks. Consumers (receive(), the worker) call the wait functions.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('wait_begin',   'consumer', ARRAY['EXECUTE']),
    ('wait_pending', 'consumer', ARRAY['EXECUTE']),
    ('wait_end',     'consumer', ARRAY['EXECUTE']);
