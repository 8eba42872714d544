-- LonnyMQ 0022: send_plain_once, one plain message's lean send with an idempotency key (issue
-- 12; the function is in ../sql/send.sql). Stored data only: producers may call it, as send
-- and send_plain.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('send_plain_once', 'producer', ARRAY['EXECUTE']);
