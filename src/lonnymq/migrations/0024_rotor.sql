-- LonnyMQ 0024: the rotor, the transaction id of the last rotation that moved the window, so
-- that a take can tell from its own snapshot whether that rotation is settled for it (sql/
-- generations.sql, "The rotor"). Stored data only. Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled.

-- A sequence, as the frozen flag (0023): read without a snapshot, written without a row lock
-- or a row version. rotate() sets it to its own pg_current_xact_id() (an xid8, as bigint)
-- just before its nextval of message_gen_seq; nothing calls nextval on it. 1 (the bootstrap
-- transaction, committed and older than every snapshot): no rotation to wait for.
CREATE SEQUENCE {schema}.message_gen_rotor_seq AS bigint MINVALUE 1 START WITH 1 NO CYCLE;
SELECT setval('{schema}.message_gen_rotor_seq', 1, true);
