-- LonnyMQ generations: what keeps take's index scan short while a snapshot is held (issue 17,
-- docs/storage.md).
--
-- Every plain message (channel IS NULL) carries a generation number, and the plain dequeue index
-- leads with it: (gen, queue_id, dequeue_at, id). A take reads only the window, the current
-- generation G (message_gen_seq) and G-1. rotate() opens a new generation every couple of
-- seconds and moves the live rows of the one leaving the window forward (leased, scheduled and
-- waiting messages keep their id, token, attempts and dequeue_at). The index entries that leases,
-- acks and moves leave behind stay in old generations, which no take reads again: while vacuum
-- cannot remove them (an open snapshot, a pg_dump holding its locks) they cost space, never time.
--
-- No committed message is ever left behind in an old generation:
--   * writers (sends, dead letters, requeues, replaces) get their generation from _gen_write(),
--     which holds a shared advisory lock on it until their transaction ends; a generation is
--     finished only when rotate() can take that lock exclusively (no writer left) and has moved
--     every row (none skipped because a take or ack held it);
--   * message_gen_pending records, transactionally, every generation outside the window that may
--     still hold rows; rotate() records G-1 there in one call and moves G only in a later one
--     (sequences are not transactional: a rotate that fails after nextval must still leave a
--     record of what it pushed out), and sweeps each recorded generation until it is finished.
-- A row moved or committed late by a long transaction waits at most one rotation to be seen.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- The generation a writer puts new plain messages in: the current one, held (advisory lock,
-- shared, until the transaction ends) so that rotate() knows the writer may still commit rows
-- there. Re-reads the generation after locking: a rotation in between moves the writer on.
-- Reads message_gen_seq. Locks: the generation's advisory lock (shared, transaction).
CREATE OR REPLACE FUNCTION {schema}._gen_write() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_class integer := hashtext({schema_name} || '/gen') & 2147483647;
    v_gen   bigint;
    v_now   bigint;
BEGIN
    SELECT s.last_value INTO v_gen FROM {schema}.message_gen_seq s;
    LOOP
        PERFORM pg_advisory_xact_lock_shared(v_class, (v_gen % 2147483647)::integer);
        SELECT s.last_value INTO v_now FROM {schema}.message_gen_seq s;
        EXIT WHEN v_now = v_gen;
        v_gen := v_now;
    END LOOP;
    RETURN v_gen;
END $$;

-- The generations that may hold plain messages: the window (G-1, G) and the pending ones
-- (stragglers of long transactions, rows a sweep had to skip). Metrics and peek read these;
-- take reads the window only. Reads message_gen_seq, message_gen_pending; takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gens_live() RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_gen bigint;
BEGIN
    SELECT s.last_value INTO v_gen FROM {schema}.message_gen_seq s;
    RETURN ARRAY(SELECT p.gen FROM {schema}.message_gen_pending p WHERE p.gen < v_gen - 1
                 UNION SELECT v_gen - 1 UNION SELECT v_gen ORDER BY 1);
END $$;

-- Move the plain messages of generation p_gen (outside the window) into p_target, skipping rows
-- others hold. Returns true when p_gen is finished: no writer can still commit rows there (its
-- advisory lock was free before the move) and no row was left behind. Writes message (gen).
-- Locks: the rows it moves (SKIP LOCKED); tries the generation's advisory lock (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_sweep(p_gen bigint, p_target bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_class   integer := hashtext({schema_name} || '/gen') & 2147483647;
    v_key     integer := (p_gen % 2147483647)::integer;
    v_no_more boolean;
BEGIN
    -- First the lock, then the move: a writer that commits after a free lock cannot exist.
    v_no_more := pg_try_advisory_lock(v_class, v_key);
    IF v_no_more THEN
        PERFORM pg_advisory_unlock(v_class, v_key);
    END IF;
    UPDATE {schema}.message m SET gen = p_target
      FROM (SELECT x.queue_id, x.id FROM {schema}.message x
             WHERE x.gen = p_gen AND x.channel IS NULL
               FOR UPDATE SKIP LOCKED) c
     WHERE m.queue_id = c.queue_id AND m.id = c.id;
    RETURN v_no_more AND NOT EXISTS (SELECT FROM {schema}.message x
                                      WHERE x.gen = p_gen AND x.channel IS NULL);
END $$;

-- Open a new generation when the current one is p_period_ms old (or p_force), and move the live
-- plain messages of the one that leaves the window forward; then sweep pending generations.
-- Skips the move (and tries again a period later) while the generation leaving the window holds
-- more than p_max_moves messages: a large backlog or many scheduled messages would cost more to
-- rewrite than its dead index entries cost takes. One rotator at a time: another caller returns
-- NULL at once. Returns the current generation. Called by take() when due, by maintain(), or
-- directly. Writes message (gen), message_gen_pending, the generation sequences. Locks: an
-- advisory transaction lock (try), the rows it moves (SKIP LOCKED).
CREATE OR REPLACE FUNCTION {schema}.rotate(
    p_force     boolean DEFAULT false,
    p_period_ms bigint  DEFAULT 2000,
    p_max_moves integer DEFAULT 10000,
    p_now       bigint  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now     bigint := {schema}._now(p_now);
    v_gen     bigint;
    v_started bigint;
    v_old     bigint;
BEGIN
    PERFORM {schema}._check_positive(p_max_moves, 'max_moves');
    IF NOT pg_try_advisory_xact_lock(hashtext({schema_name} || '/rotate'), 0) THEN
        RETURN NULL;
    END IF;
    SELECT s.last_value INTO v_gen FROM {schema}.message_gen_seq s;
    SELECT s.last_value INTO v_started FROM {schema}.message_gen_started_seq s;
    IF NOT coalesce(p_force, false) AND v_now - v_started < p_period_ms THEN
        RETURN v_gen;
    END IF;
    -- Generations pushed out earlier that may still hold rows.
    FOR v_old IN SELECT p.gen FROM {schema}.message_gen_pending p WHERE p.gen < v_gen - 1
                  ORDER BY p.gen LOOP
        IF {schema}._gen_sweep(v_old, v_gen) THEN
            DELETE FROM {schema}.message_gen_pending p WHERE p.gen = v_old;
        END IF;
    END LOOP;
    PERFORM setval('{schema}.message_gen_started_seq', v_now);
    -- G-1 leaves the window with the next generation: only once its record is committed.
    IF NOT EXISTS (SELECT FROM {schema}.message_gen_pending p WHERE p.gen = v_gen - 1) THEN
        INSERT INTO {schema}.message_gen_pending (gen) VALUES (v_gen - 1);
        RETURN v_gen;
    END IF;
    IF (SELECT count(*) FROM (SELECT FROM {schema}.message m
                               WHERE m.gen = v_gen - 1 AND m.channel IS NULL
                               LIMIT p_max_moves + 1) x) > p_max_moves THEN
        RETURN v_gen;
    END IF;
    v_gen := nextval('{schema}.message_gen_seq');
    IF {schema}._gen_sweep(v_gen - 2, v_gen) THEN
        DELETE FROM {schema}.message_gen_pending p WHERE p.gen = v_gen - 2;
    END IF;
    -- The next generation to leave the window, recorded for a later call.
    INSERT INTO {schema}.message_gen_pending (gen) VALUES (v_gen - 1) ON CONFLICT DO NOTHING;
    RETURN v_gen;
END $$;
