-- LonnyMQ utilities: the clock, argument checks and errors, the ordering value of a message.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- The database clock in epoch milliseconds (clock_timestamp, so it moves within a transaction).
-- Public (consumers compute delays and schedules on it); touches no table.
CREATE OR REPLACE FUNCTION {schema}.now_ms() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- The clock of a call: the server's, or p_now. Tests drive time through p_now; for anyone but
-- members of the schema owner's role, p_now may not run ahead of the real clock (by more than
-- a second), so an API caller cannot take messages early or steal live leases by moving time.
-- Reads the clock itself rather than calling now_ms(): now_ms() is public, hence SECURITY
-- DEFINER with a pinned search_path, and calling it switched search_path on every call.
-- Raises LQ002 for a p_now in the future from anyone else. Touches no table.
CREATE OR REPLACE FUNCTION {schema}._now(p_now bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_clock bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
BEGIN
    IF p_now IS NULL THEN
        RETURN v_clock;
    ELSIF p_now <= v_clock + 1000 OR pg_catalog.pg_has_role(session_user,
            (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = {schema_name}), 'MEMBER') THEN
        RETURN p_now;
    END IF;
    RAISE EXCEPTION 'p_now may not be in the future except for the schema owner (it exists for tests)'
        USING ERRCODE = 'LQ002';
END $$;

-- The clock of a call that only reads (queue_metrics, next_ready_in): p_now checked as _now
-- does, else the time the current statement started (statement_timestamp) rather than the
-- moving clock_timestamp. One value per statement keeps these functions STABLE, so all their
-- queries run on the calling statement's snapshot and agree with each other (a VOLATILE
-- function takes a fresh snapshot per query). Raises LQ002 as _now does. Touches no table.
CREATE OR REPLACE FUNCTION {schema}._read_now(p_now bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_clock bigint := (extract(epoch FROM statement_timestamp()) * 1000)::bigint;
BEGIN
    IF p_now IS NULL THEN
        RETURN v_clock;
    ELSIF p_now <= v_clock + 1000 OR pg_catalog.pg_has_role(session_user,
            (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = {schema_name}), 'MEMBER') THEN
        RETURN p_now;
    END IF;
    RAISE EXCEPTION 'p_now may not be in the future except for the schema owner (it exists for tests)'
        USING ERRCODE = 'LQ002';
END $$;

-- Errors use SQLSTATE class LQ so every binding can map them to typed exceptions:
-- LQ001 queue not found, LQ002 invalid argument, LQ003 payload too large,
-- LQ004 duplicate key, LQ005 queue exists, LQ006 queue in use, LQ007 channel full.
-- _invalid raises LQ002 (invalid argument) with p_message. STABLE, not IMMUTABLE although it
-- depends on its argument only: the planner evaluates an IMMUTABLE call with constant arguments
-- while planning, so `PERFORM _invalid('...')` would raise when its statement is prepared (as
-- plpgsql_check does for every statement), and in a CASE branch that never runs.
CREATE OR REPLACE FUNCTION {schema}._invalid(p_message text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
-- plpgsql_check suggests IMMUTABLE; STABLE is intended, see above. Volatility is a finding
-- about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = 'LQ002';
END $$;

-- Raises LQ002 unless p_value (named p_what in the message) is NULL or positive.
CREATE OR REPLACE FUNCTION {schema}._check_positive(p_value bigint, p_what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NOT NULL AND p_value <= 0 THEN
        RAISE EXCEPTION '% must be positive, got %', p_what, p_value USING ERRCODE = 'LQ002';
    END IF;
END $$;

-- Raises LQ002 unless 1 <= p_limit <= 100000 (the batch size of take, peek, lists, ...).
CREATE OR REPLACE FUNCTION {schema}._check_limit(p_limit integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'limit must be between 1 and 100000, got %', p_limit USING ERRCODE = 'LQ002';
    END IF;
END $$;

-- The ordering value of a message due at p_at with priority p_priority. Priority moves a message
-- that is due now into the past (it is served as if sent p_priority * step earlier); a message
-- scheduled for later is never delivered before p_at (a negative priority still delays it).
CREATE OR REPLACE FUNCTION {schema}._dequeue_at(p_at bigint, p_priority integer, p_step bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN p_at > p_now THEN p_at + greatest(0, -p_priority * p_step)
                  ELSE p_at - p_priority * p_step END $$;
