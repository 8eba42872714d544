-- LonnyMQ 0017: a rotation's work stays bounded however many rows frozen queues keep in pending
-- generations (issue 19, sql/generations.sql, docs/storage.md). Stored data only. Template:
-- {schema} is the quoted schema identifier, {schema_name} its string literal; literal braces
-- are doubled.

-- A pending generation remembers its sweep, so that a rotation no longer walks every row of it
-- again (three times: freeze, move, check) while a few of its rows are held:
--   swept     it was frozen and its other queues' rows moved once (what a generation leaving the
--             window gets; false for the pending generations of an existing database, which
--             get it at their next sweep);
--   leftover  the queues whose rows were held by others then: visited again, one by one;
--   scan      a pass over its queues is due (a writer still held it at the first sweep, so rows
--             may be committed there later); scan_after: the last queue the pass visited.
ALTER TABLE {schema}.message_gen_pending
    ADD COLUMN swept      boolean   NOT NULL DEFAULT false,
    ADD COLUMN leftover   integer[] NOT NULL DEFAULT '{{}}',
    ADD COLUMN scan       boolean   NOT NULL DEFAULT false,
    ADD COLUMN scan_after integer;

-- Where the thaw's round over the frozen queues resumes (the last queue it visited): a sequence,
-- like the generation clock, so that it is read and moved without a row version.
CREATE SEQUENCE {schema}.message_gen_thaw_seq AS integer MINVALUE -2147483648 START WITH -2147483648;

-- Their signatures change (sql/generations.sql defines the new ones).
DROP FUNCTION IF EXISTS {schema}._gen_sweep(bigint, bigint);
DROP FUNCTION IF EXISTS {schema}._gen_freeze(bigint, integer);
