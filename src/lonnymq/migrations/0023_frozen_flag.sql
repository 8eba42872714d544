-- LonnyMQ 0023: a signal that no queue has a frozen generation, so that take's and take_tx's
-- first statement skips its probe of message_gen_frozen in the common case (issue 12;
-- sql/generations.sql, "The frozen flag"; docs/storage.md). Stored data only. Template:
-- {schema} is the quoted schema identifier, {schema_name} its string literal; literal braces
-- are doubled.

-- The flag: 0 when no row of message_gen_frozen is committed, 1 when one may be. A sequence:
-- read without a snapshot and written without a row lock or a row version (a flag on the queue
-- row made a rotation wait behind any transaction that held the row: docs/benchmarks.md,
-- "Tried and reverted"). Set (1) by every row written to message_gen_frozen, before the row
-- (the column default below), cleared (0) only by a rotation that sees the table empty
-- (rotate()). Bounded to 0..1 without cycling: nothing calls nextval on it, and one would only
-- move it towards 1, the safe value; after a crash it holds the last setval whose WAL record
-- was flushed, and a frozen row's commit record follows its setval's.
CREATE SEQUENCE {schema}.message_gen_frozen_seq AS smallint MINVALUE 0 MAXVALUE 1 START WITH 0 NO CYCLE;
SELECT setval('{schema}.message_gen_frozen_seq', 0, true);

-- The hook that sets the flag, on every row written to the table, by any writer (rotate()'s,
-- and a hand-written INSERT too): a column default, since a trigger's function could only be
-- created after the migrations (the function files come last) and function files hold nothing
-- but functions. Read first, written only when 0 (a setval is a WAL record). Adding it
-- evaluates it for the rows already there: an existing database with a frozen generation
-- leaves this migration with the flag set, one without with it clear. An ALTER TABLE of a table
-- every take reads: migrate asks for its lock with a short lock_timeout and tries again later
-- (Client.migrate); the table holds a row per frozen queue, its rewrite is immediate.
ALTER TABLE {schema}.message_gen_frozen
    ADD COLUMN flagged boolean NOT NULL
        DEFAULT (pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 1
                 OR setval('{schema}.message_gen_frozen_seq', 1) = 1);
