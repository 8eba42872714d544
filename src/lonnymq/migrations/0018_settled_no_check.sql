-- settled.outcome loses its CHECK (outcome IN ('acked', 'dead', 'superseded')): PostgreSQL reads
-- and compiles a table's CHECK expressions again at every statement that inserts into it (its
-- stored form, parsed by stringToNode: ~37k instructions, 3.7 % of the server's work of a drain
-- at batch 1, benchmarks/server_instructions.py), and the column is written only by lonnymq's
-- own functions, each with one of those three literals (no role may write the table directly:
-- sql/security.sql grants nothing on it).
-- An ALTER TABLE on a table every ack writes: migrate asks for its lock with a short
-- lock_timeout and tries again later rather than wait behind a long transaction that holds the
-- table while every ack waits behind it (Client.migrate).
ALTER TABLE {schema}.settled DROP CONSTRAINT IF EXISTS settled_outcome_check;
