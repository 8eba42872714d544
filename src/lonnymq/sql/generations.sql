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
--   * message_gen_pending records, transactionally, every generation that may still hold rows:
--     both of the window before rotate() moves it, in an earlier committed call (sequences are
--     not transactional: a rotate that fails after nextval must still leave a record of what it
--     pushed out; nor crash-safe in value: after a crash a sequence resumes up to 32 past its
--     last nextval), and rotate() sweeps each recorded generation outside the window until it
--     is finished.
-- A row moved or committed late by a long transaction waits at most one rotation to be seen.
--
-- A backlog is not rewritten: when a queue holds more than p_max_moves rows in the generation
-- leaving the window, they stay there and the generation joins the queue's frozen list
-- (message_gen_frozen), which its takes read, oldest first, before the window. Consumption walks
-- the dead entries of one frozen generation at a time (a few seconds of sends), never those of
-- the whole backlog; rotate() drops a generation from the list once the queue's rows there are
-- down to p_max_moves and moved forward. Rotation itself never stops.
--
-- Nor does a rotation's work grow with the number of queues (issue 19): it moves at most
-- p_max_moves rows out of the generation leaving the window (when many queues each hold a few,
-- the ones holding most stay frozen like a backlog) and as many out of frozen generations.
-- Moving every queue's few rows cost a rotation at 10,000 queues of 6 waiting messages each a
-- second or two of rewriting 60,000 rows, which the takes of the other consumers, skipping the
-- rows it held, found empty meanwhile; and a budget of 10 × p_max_moves still rewrote up to
-- 20,000 rows every 2 s (the same idle rows, frozen, thawed and moved again) while 50 consumers
-- of 1,000 queues took 100 a second on a loaded 2-core machine, rotation then taking half of
-- the server's time per message (benchmarks/scale.py --functions).
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

-- The generations that may hold plain messages of queue p_queue_id: the pending ones (stragglers
-- of long transactions, rows a sweep had to skip), the queue's frozen ones and the window (G-1,
-- G). Metrics and peek read these; take reads the frozen ones and the window. Reads
-- message_gen_seq, message_gen_pending, message_gen_frozen; takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gens_of(p_queue_id integer) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_gen bigint;
BEGIN
    SELECT s.last_value INTO v_gen FROM {schema}.message_gen_seq s;
    RETURN ARRAY(SELECT p.gen FROM {schema}.message_gen_pending p WHERE p.gen < v_gen - 1
                 UNION SELECT unnest(f.gens) FROM {schema}.message_gen_frozen f
                        WHERE f.queue_id = p_queue_id
                 UNION SELECT v_gen - 1 UNION SELECT v_gen ORDER BY 1);
END $$;

-- Whether no writer can still commit rows into generation p_gen (writers hold its advisory lock,
-- shared, until they end: _gen_write). Check it before moving rows out: a writer that commits
-- after a free lock cannot exist. Locks: tries the generation's advisory lock (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_writers_gone(p_gen bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_class integer := hashtext({schema_name} || '/gen') & 2147483647;
    v_key   integer := (p_gen % 2147483647)::integer;
BEGIN
    IF pg_try_advisory_lock(v_class, v_key) THEN
        PERFORM pg_advisory_unlock(v_class, v_key);
        RETURN true;
    END IF;
    RETURN false;
END $$;

-- Move the plain messages of generation p_gen (outside the window) into p_target, skipping rows
-- others hold and the rows of queues that keep p_gen frozen. Returns true when p_gen is
-- finished: no writer can still commit rows there and no row was left behind but frozen ones.
-- Writes message (gen). Locks: the rows it moves (SKIP LOCKED); tries the generation's advisory
-- lock (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_sweep(p_gen bigint, p_target bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_no_more boolean := {schema}._gen_writers_gone(p_gen);
BEGIN
    -- A queue that keeps p_gen frozen is one key probe away (thousands of them may). The rows
    -- go by ctid (a TID scan): a join of the candidates with the table is planned from
    -- statistics, and a sweep so planned took seconds at 1,000 queues (issue 19). A row that
    -- another transaction changed after this statement began stays locked, unmoved, and keeps
    -- the generation pending for the next sweep. The conditions are checked again on the row
    -- changed: a ctid names a row of either partition (a row of the other one with the same
    -- ctid is moved only if it is a candidate too, then waited for rather than skipped).
    UPDATE {schema}.message m SET gen = p_target
     WHERE m.ctid = ANY (ARRAY(
           SELECT x.ctid FROM {schema}.message x
            WHERE x.gen = p_gen AND x.channel IS NULL
              AND NOT EXISTS (SELECT FROM {schema}.message_gen_frozen f
                               WHERE f.queue_id = x.queue_id AND p_gen = ANY (f.gens))
              FOR UPDATE OF x SKIP LOCKED))
       AND (m.gen = p_gen AND m.channel IS NULL) IS TRUE
       AND NOT EXISTS (SELECT FROM {schema}.message_gen_frozen f
                        WHERE f.queue_id = m.queue_id AND p_gen = ANY (f.gens));
    RETURN v_no_more AND NOT EXISTS (SELECT FROM {schema}.message x
                                      WHERE x.gen = p_gen AND x.channel IS NULL
                                        AND NOT EXISTS (SELECT FROM {schema}.message_gen_frozen f
                                                         WHERE f.queue_id = x.queue_id
                                                           AND p_gen = ANY (f.gens)));
END $$;

-- Freeze generation p_gen (leaving the window) for the queues whose rows there are not to move:
-- every queue holding more than p_max of its plain messages there (a backlog), and, while the
-- others together hold more than p_max, the ones holding most of them (thousands of queues
-- with a few messages each), so that what moves stays within that. Their rows stay, and
-- p_gen joins each one's frozen list. One walk of the generation. Writes message_gen_frozen.
CREATE OR REPLACE FUNCTION {schema}._gen_freeze(p_gen bigint, p_max integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.message_gen_frozen AS f (queue_id, gens)
    SELECT c.queue_id, ARRAY[p_gen]
      FROM (SELECT x.queue_id, count(*) AS n,
                   sum(count(*)) OVER (ORDER BY count(*), x.queue_id) AS upto
              FROM {schema}.message x
             WHERE x.gen = p_gen AND x.channel IS NULL
               AND NOT EXISTS (SELECT FROM {schema}.message_gen_frozen g
                                WHERE g.queue_id = x.queue_id AND p_gen = ANY (g.gens))
             GROUP BY x.queue_id) c
     WHERE c.n > p_max OR c.upto > p_max
    ON CONFLICT (queue_id) DO UPDATE SET gens = f.gens || p_gen
     WHERE NOT p_gen = ANY (f.gens);
END $$;

-- Thaw frozen generations: forget queues that are gone; move forward, for up to 100 frozen
-- queues picked at random, the rows of their oldest frozen generations (up to four a queue)
-- where the queue holds p_max rows or fewer, p_max rows in all; then drop from every
-- queue's list the generations where it holds no row any more and no writer can add one. So a
-- rotation's work stays bounded however many queues are frozen. Writes message (gen),
-- message_gen_frozen. Locks: the rows it moves (SKIP LOCKED); tries the generations' advisory
-- locks (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_thaw(p_target bigint, p_max integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    f        {schema}.message_gen_frozen;
    v_gen    bigint;
    v_n      bigint;
    v_budget bigint := p_max::bigint;
    v_done   bigint[];
BEGIN
    DELETE FROM {schema}.message_gen_frozen x
     WHERE NOT EXISTS (SELECT FROM {schema}.queue q WHERE q.id = x.queue_id);
    -- Before moving: a writer that is gone now cannot commit rows there later.
    v_done := ARRAY(SELECT d.gen FROM (SELECT DISTINCT unnest(x.gens) AS gen
                                         FROM {schema}.message_gen_frozen x) d
                     WHERE {schema}._gen_writers_gone(d.gen));
    FOR f IN SELECT * FROM {schema}.message_gen_frozen ORDER BY random() LIMIT 100 LOOP
        EXIT WHEN v_budget <= 0;
        FOREACH v_gen IN ARRAY f.gens[1:4] LOOP
            SELECT count(*) INTO v_n FROM (SELECT FROM {schema}.message x
                                            WHERE x.gen = v_gen AND x.queue_id = f.queue_id
                                              AND x.channel IS NULL
                                            LIMIT p_max + 1) c;
            CONTINUE WHEN v_n = 0 OR v_n > p_max OR v_n > v_budget;
            UPDATE {schema}.message m SET gen = p_target
             WHERE m.ctid = ANY (ARRAY(
                   SELECT x.ctid FROM {schema}.message x
                    WHERE x.gen = v_gen AND x.queue_id = f.queue_id AND x.channel IS NULL
                      FOR UPDATE SKIP LOCKED))
               AND (m.gen = v_gen AND m.queue_id = f.queue_id) IS TRUE;  -- (its partition)
            v_budget := v_budget - v_n;
        END LOOP;
    END LOOP;
    -- Every queue's list, in one statement: a key probe per generation listed (a scalar
    -- subquery, so that the probe keeps both columns: as NOT EXISTS the planner made it an anti
    -- join on queue_id alone, 2 ms a queue, 30 s at 8,000 frozen queues).
    UPDATE {schema}.message_gen_frozen x
       SET gens = k.kept
      FROM (SELECT y.queue_id, y.gens,
                   ARRAY(SELECT g.gen FROM unnest(y.gens) WITH ORDINALITY AS g(gen, ord)
                          WHERE NOT (g.gen = ANY (v_done)
                                     AND (SELECT m.id FROM {schema}.message m
                                           WHERE m.gen = g.gen AND m.queue_id = y.queue_id
                                             AND m.channel IS NULL
                                           LIMIT 1) IS NULL)
                          ORDER BY g.ord) AS kept
              FROM {schema}.message_gen_frozen y) k
     WHERE x.queue_id = k.queue_id AND k.kept <> k.gens;
    DELETE FROM {schema}.message_gen_frozen x WHERE cardinality(x.gens) = 0;
END $$;

-- Open a new generation when the current one is p_period_ms old (or p_force): the one that
-- leaves the window is frozen for the queues that hold more than p_max_moves rows there (their
-- backlog is not rewritten), and for the queues holding most of the rest beyond p_max_moves,
-- and its other live plain messages move forward; then pending generations are swept and
-- frozen ones thawed (p_max_moves rows at most). One rotator at a time: another caller returns
-- NULL at once. Returns the current generation. Called by take() when due, by maintain(), or
-- directly. Writes message (gen), message_gen_pending, message_gen_frozen, the generation
-- sequences. Locks: an advisory transaction lock (try), the rows it moves (SKIP LOCKED).
CREATE OR REPLACE FUNCTION {schema}.rotate(
    p_force     boolean DEFAULT false,
    p_period_ms bigint  DEFAULT 2000,
    p_max_moves integer DEFAULT 1000,
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
    -- Generations pushed out earlier that may still hold rows (a backlog there stays frozen).
    FOR v_old IN SELECT p.gen FROM {schema}.message_gen_pending p WHERE p.gen < v_gen - 1
                  ORDER BY p.gen LOOP
        PERFORM {schema}._gen_freeze(v_old, p_max_moves);
        IF {schema}._gen_sweep(v_old, v_gen) THEN
            DELETE FROM {schema}.message_gen_pending p WHERE p.gen = v_old;
        END IF;
    END LOOP;
    PERFORM {schema}._gen_thaw(v_gen, p_max_moves);
    PERFORM setval('{schema}.message_gen_started_seq', v_now);
    -- Both generations of the window are on record before the window moves, in an earlier,
    -- committed call: a generation leaves the window only once its record is committed (a
    -- rotation that rolls back after nextval has still moved the window), and the current one
    -- is on record too because a sequence is not crash-safe in value: after a crash or a
    -- failover it resumes up to 32 values past its last nextval (it WAL-logs ahead), which
    -- pushes the whole window out at once; the recorded generations are then swept forward.
    IF NOT EXISTS (SELECT FROM {schema}.message_gen_pending p WHERE p.gen = v_gen - 1)
       OR NOT EXISTS (SELECT FROM {schema}.message_gen_pending p WHERE p.gen = v_gen) THEN
        INSERT INTO {schema}.message_gen_pending (gen) VALUES (v_gen - 1), (v_gen)
            ON CONFLICT DO NOTHING;
        RETURN v_gen;
    END IF;
    v_gen := nextval('{schema}.message_gen_seq');
    INSERT INTO {schema}.message_gen_pending (gen) VALUES (v_gen) ON CONFLICT DO NOTHING;
    PERFORM {schema}._gen_freeze(v_gen - 2, p_max_moves);
    IF {schema}._gen_sweep(v_gen - 2, v_gen) THEN
        DELETE FROM {schema}.message_gen_pending p WHERE p.gen = v_gen - 2;
    END IF;
    RETURN v_gen;
END $$;
