-- LonnyMQ 0020: send_plain, one plain message's lean send (issue 12; the function is in
-- ../sql/send.sql). Stored data only: producers may call it, as send.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('send_plain', 'producer', ARRAY['EXECUTE']);
