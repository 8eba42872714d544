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
-- the server's time per message (benchmarks/scale.py --functions). Nor with the rows frozen
-- queues keep in a pending generation: it is frozen and swept once, and later rotations visit
-- only the queues whose rows were held then (and, after a late writer, pass once over its
-- queues in slices); the thaw visits the frozen queues in rounds (_gen_sweep, _gen_thaw).
--
-- A rotation reads a queue's rows of one generation in the dequeue index's order (ORDER BY
-- dequeue_at, id under the LIMIT that bounds each count and move): that order only the dequeue
-- index gives, so the plan reads (gen, queue_id) there, whatever the statistics say. Statistics
-- taken while a queue's rows were all in one generation (a backlog sent at once) price
-- "gen = $1" as every row, and without the order the plan read the queue's whole range of the
-- primary key (a bitmap: inside a take, enable_seqscan is off) for a count of p_max + 1: every
-- message of a queue with a frozen backlog, twice at every rotation (300,000 messages: 22-30 ms
-- of a drain's take; tests/sql/test_gen_sweep.py, docs/benchmarks.md, branch longdrain).
--
-- The frozen flag (message_gen_frozen_seq, migration 0023): 0 says no row of
-- message_gen_frozen is committed, so that take's and take_tx's first statement (and
-- _lock_ready's, the general path's) skips its probe of the table (a fifth of take's head,
-- docs/benchmarks.md, "A frozen flag in a sequence");
-- 1 says one may be (the statement calls _gen_frozen_of(), which finds the answer). It may say
-- 1 wrongly (that costs the probe), never 0 while a committed row exists:
--   * every row written to the table sets it first (the column default flagged: rotate()'s
--     freezes, and any other writer), in the writing transaction, before the row exists;
--   * only rotate() clears it, under its advisory lock (which every rotation's writes of the
--     table are under too, until their commit is visible), when a statement after that lock
--     sees the table empty: in READ COMMITTED (a fresh snapshot, which sees every rotation
--     that committed before the lock was free) and before its transaction has written anything
--     (no transaction id: none of its own deletes, which a rollback would undo, counts as
--     empty); in any other case it leaves the flag alone until a later rotation;
--   * a sequence is not transactional: a rotation that rolls back after setting the flag
--     leaves it at 1 (the safe side); a take's read of it comes after its snapshot, so a row
--     that snapshot sees was written after the flag was set, and no clearing can have come in
--     between unless the row has been deleted since (then the window's rows it listed were
--     moved forward, and the take could not lock their old versions anyway);
--   * setval is WAL-logged and a frozen row's commit record follows its setval's: after a crash
--     the flag is at least what the committed rows need; nothing calls nextval on it;
--   * a writer outside rotate() (a hand-written INSERT) is not serialized with a clearing
--     rotation: if one cleared between its flag and its commit, the next rotation sets the
--     flag again (a row there and the flag at 0: "set when a row is there").
-- A take in a caller's REPEATABLE READ transaction reads the flag at its own time and the table
-- as of its snapshot: a row deleted since (the flag cleared since) is skipped, the rows it
-- listed having moved on (their old versions would have raised a serialization failure).
--
-- The rotor (message_gen_rotor_seq, migration 0024): the transaction id (xid8, as bigint) of
-- the last rotation that moved the window. A rotation's nextval of message_gen_seq is seen by
-- every session at once, but what it does to the generation that leaves the window (G-2 after
-- the nextval) is not, until it commits: the rows it moves forward are locked by it, and the
-- frozen row it writes for a backlog left there is invisible. From the nextval to its commit
-- (milliseconds), a take that read the new window (G-1, G) and the frozen list missed the
-- backlog, whose rows are committed and unlocked: an empty take while thousands of messages
-- were ready (two consumers draining 400,000 messages at batch 100: one left at 38,900,
-- docs/benchmarks.md, "A false empty take while another transaction rotates"). So:
--   * rotate() sets the rotor to its own pg_current_xact_id() immediately before its nextval
--     (it has written already, so that assigns no new transaction id); a reader reads the
--     generation first and the rotor second, in one statement (_lock_ready): a reader that
--     sees the new generation sees that rotation's rotor, or a later one's (one rotator at a
--     time: a later one started after it ended);
--   * the rotation is unsettled for a statement when its transaction id is not visible in the
--     statement's snapshot (_gen_rotor_open, pg_visible_in_snapshot: still running, or
--     completed after the snapshot was taken), or when it aborted (a rotation that rolled
--     back after its nextval has still moved the window: its generation's rows, back in G-2,
--     unfrozen, would wait for the next rotation's sweep of the pending generation); the
--     reader's own rotation is settled for it (it sees its own moves and freezes). Unsettled:
--     the general path reads G-2 as one more frozen generation, after the queue's frozen ones
--     (_lock_ready). In any one snapshot a row is in exactly one generation, and G-2 is not
--     read twice (it is added only when the frozen list, read by the same statement, lacks
--     it), so no row comes twice;
--   * in that snapshot, G-2 holds the backlog the rotation is freezing (committed, unlocked:
--     taken), and the rows it is moving forward, locked by it until it commits: SKIP LOCKED
--     passes them, as it passes rows another consumer holds, and once it commits they are in
--     G, in the window. If the rotation committed after the statement that found it unsettled,
--     a later statement of the same take reads G-2 still and finds there what was frozen (the
--     moved rows have left it for G, where the window's read finds them);
--   * the lean statements (take()'s one-statement drain and batch, take_tx's pop) do not read
--     the rotor (each instruction of theirs counts): they read the window and the frozen list
--     of their call's first statement. When one delivers fewer than asked, one check
--     (_gen_unsettled) sends the call to the general path if a rotation is unsettled now, or if
--     the queue's frozen list is no longer the one it read (a rotation that froze a generation
--     for the queue committed since that first statement);
--   * what remains: the rows a rotation moves are held by it until it commits (a take passes
--     them, as rows another consumer holds); a take whose first statement read the generation
--     before a rotation's nextval and whose candidate read came after that rotation's commit
--     misses the rows it moved (they are in the new G: the next take finds them); after a
--     rotation that rolled back, the next rotation's sweep of the generation it pushed out
--     (a pending one, outside the window, before that rotation's own nextval) hides the rows
--     it freezes there until it commits; a reader in REPEATABLE READ whose snapshot predates a
--     rotation's commit reads G-2 for the rest of its transaction, and meets the old versions
--     of the rows it moved with a serialization failure, as it meets rows other consumers took;
--   * the value survives a crash (setval is WAL-logged; a transaction running at the crash
--     aborted, and an aborted rotation is unsettled until the next rotation sets the rotor), and
--     a value restored from another cluster can only be unsettled (not yet completed there: G-2
--     read) until the next rotation, within a period.

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

-- Queue p_queue_id's frozen generations, oldest first (NULL: none), as take's and take_tx's first
-- statement, _lock_ready, _gen_unsettled and take's re-read after a rotation read them when the
-- frozen flag is set (a call, so that a statement that skips it does not start up its scan).
-- Reads message_gen_frozen; takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gen_frozen_of(p_queue_id integer) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT f.gens FROM {schema}.message_gen_frozen f WHERE f.queue_id = p_queue_id);
END $$;

-- Whether the rotation with transaction id p_rotor (the rotor, message_gen_rotor_seq: see the
-- header) is unsettled for snapshot p_snapshot: not completed before it, or aborted; the
-- rotation of the reader's own transaction (p_own: pg_current_xact_id_if_assigned()) is
-- settled for it. The caller reads the rotor after the generation, and the snapshot of the
-- statement that read them (_gen_rotor_unsettled, _gen_unsettled). SQL, inlined into the
-- caller's expression (one plpgsql call less in _gen_unsettled: 6k instructions,
-- docs/benchmarks.md, "A false empty take while another transaction rotates");
-- pg_xact_status (VOLATILE, hence this declaration: a STABLE or IMMUTABLE function with a
-- volatile call is not inlined) is asked only of a completed transaction, whose status no
-- longer changes (it raises for an id from the future: a value restored from another
-- cluster). Reads nothing; takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gen_rotor_open(p_rotor xid8, p_snapshot pg_snapshot, p_own xid8) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_rotor IS NULL OR p_rotor = p_own THEN false
                WHEN NOT pg_visible_in_snapshot(p_rotor, p_snapshot) THEN true
                ELSE pg_xact_status(p_rotor) IS NOT DISTINCT FROM 'aborted' END
$$;

-- Whether the last rotation that moved the window is unsettled for the calling statement's
-- snapshot (_gen_rotor_open of the rotor, read now: after the generation when the caller
-- read that first in the same statement, as _lock_ready does). STABLE, so that it sees the
-- caller's snapshot (pg_current_snapshot()). Reads message_gen_rotor_seq; takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gen_rotor_unsettled() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- (A variable: _gen_rotor_open uses its argument four times, and a call with a volatile
    -- argument used more than once is not inlined.)
    v_rotor xid8 := pg_sequence_last_value('{schema}.message_gen_rotor_seq')::text::xid8;
BEGIN
    RETURN {schema}._gen_rotor_open(v_rotor, pg_current_snapshot(), pg_current_xact_id_if_assigned());
END $$;

-- Whether a take whose lean statement read queue p_queue_id's frozen list p_frozen (its call's
-- first statement) and the window must look again on the general path (_lock_ready) before
-- it reports fewer than asked: a rotation is unsettled for this statement (the generation it
-- pushes out, G-2, holds rows the window's read did not see), or the queue's frozen list has
-- changed since (a rotation that froze a generation for the queue committed in between). See
-- the header, "The rotor". Reads message_gen_rotor_seq, the frozen flag, message_gen_frozen;
-- takes no lock.
CREATE OR REPLACE FUNCTION {schema}._gen_unsettled(p_queue_id integer, p_frozen bigint[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_rotor xid8 := pg_sequence_last_value('{schema}.message_gen_rotor_seq')::text::xid8;
BEGIN
    RETURN {schema}._gen_rotor_open(v_rotor, pg_current_snapshot(), pg_current_xact_id_if_assigned())
        OR (CASE WHEN pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 0 THEN NULL
                 ELSE {schema}._gen_frozen_of(p_queue_id) END) IS DISTINCT FROM p_frozen;
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

-- Add generation p_gen to queue p_queue_id's frozen list (kept oldest first), if not there.
-- Writes message_gen_frozen.
CREATE OR REPLACE FUNCTION {schema}._gen_frozen_add(p_queue_id integer, p_gen bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.message_gen_frozen AS f (queue_id, gens) VALUES (p_queue_id, ARRAY[p_gen])
    ON CONFLICT (queue_id) DO UPDATE
       SET gens = ARRAY(SELECT g.gen FROM unnest(f.gens || p_gen) AS g(gen) ORDER BY g.gen)
     WHERE NOT p_gen = ANY (f.gens);
END $$;

-- Settle queue p_queue_id's plain messages in generation p_gen (outside the window): nothing if
-- the queue keeps p_gen frozen; freeze p_gen for it if it holds more than p_max rows there (their
-- rows stay; takes read them there); else move them into p_target, skipping rows others hold.
-- Reads the queue's range of the dequeue index only (at most p_max + 1 rows, plus one probe).
-- Returns moved (rows moved) and held (rows were left behind, held by others: visit again).
-- Writes message (gen), message_gen_frozen. Locks: the rows it moves (SKIP LOCKED).
CREATE OR REPLACE FUNCTION {schema}._gen_sweep_queue(p_gen bigint, p_queue_id integer, p_target bigint,
                                          p_max integer, OUT moved integer, OUT held boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_n bigint;
BEGIN
    moved := 0;
    held := false;
    IF EXISTS (SELECT FROM {schema}.message_gen_frozen f
                WHERE f.queue_id = p_queue_id AND p_gen = ANY (f.gens)) THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_n FROM (SELECT FROM {schema}.message x
                                    WHERE x.gen = p_gen AND x.queue_id = p_queue_id AND x.channel IS NULL
                                    ORDER BY x.dequeue_at, x.id  -- (the dequeue index: see the header)
                                    LIMIT p_max + 1) c;
    IF v_n = 0 THEN
        RETURN;
    ELSIF v_n > p_max THEN
        PERFORM {schema}._gen_frozen_add(p_queue_id, p_gen);
        RETURN;
    END IF;
    -- By ctid (a TID scan): a join with the table would be planned from statistics. A row that
    -- another transaction changed after this statement began stays locked, unmoved (held).
    UPDATE {schema}.message m SET gen = p_target
     WHERE m.ctid = ANY (ARRAY(
           SELECT x.ctid FROM {schema}.message x
            WHERE x.gen = p_gen AND x.queue_id = p_queue_id AND x.channel IS NULL
            ORDER BY x.dequeue_at, x.id
            LIMIT p_max + 1
              FOR UPDATE OF x SKIP LOCKED))
       AND (m.gen = p_gen AND m.queue_id = p_queue_id AND m.channel IS NULL) IS TRUE;  -- (its partition)
    GET DIAGNOSTICS moved = ROW_COUNT;
    held := EXISTS (SELECT FROM {schema}.message x
                     WHERE x.gen = p_gen AND x.queue_id = p_queue_id AND x.channel IS NULL
                     ORDER BY x.dequeue_at, x.id LIMIT 1);
END $$;

-- Freeze generation p_gen (leaving the window) for the queues whose rows there are not to move:
-- every queue holding more than p_max of its plain messages there (a backlog), and, while the
-- others together hold more than p_max, the ones holding most of them (thousands of queues
-- with a few messages each), so that what moves stays within that. Their rows stay, and
-- p_gen joins each one's frozen list. One walk of the generation, done once per generation
-- (_gen_sweep). Returns the queues whose rows are to move, p_max rows at most in all. Writes
-- message_gen_frozen.
CREATE OR REPLACE FUNCTION {schema}._gen_freeze(p_gen bigint, p_max integer) RETURNS integer[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_move integer[];
BEGIN
    WITH c AS MATERIALIZED (
        SELECT y.queue_id, (y.n > p_max OR y.upto > p_max) AS freeze
          FROM (SELECT x.queue_id, count(*) AS n,
                       sum(count(*)) OVER (ORDER BY count(*), x.queue_id) AS upto
                  FROM {schema}.message x
                 WHERE x.gen = p_gen AND x.channel IS NULL
                   AND NOT EXISTS (SELECT FROM {schema}.message_gen_frozen g
                                    WHERE g.queue_id = x.queue_id AND p_gen = ANY (g.gens))
                 GROUP BY x.queue_id) y
    ), frozen AS (
        INSERT INTO {schema}.message_gen_frozen AS f (queue_id, gens)
        SELECT c.queue_id, ARRAY[p_gen] FROM c WHERE c.freeze
        ON CONFLICT (queue_id) DO UPDATE
           SET gens = ARRAY(SELECT g.gen FROM unnest(f.gens || p_gen) AS g(gen) ORDER BY g.gen)
         WHERE NOT p_gen = ANY (f.gens)
    )
    SELECT coalesce(array_agg(c.queue_id ORDER BY c.queue_id), ARRAY[]::integer[]) INTO v_move
      FROM c WHERE NOT c.freeze;
    RETURN v_move;
END $$;

-- Sweep pending generation p_gen (outside the window) towards p_target: what is left there,
-- besides the rows of queues that keep it frozen, moves forward. Returns true when p_gen is
-- finished (its message_gen_pending row is then deleted): no writer can still commit rows there
-- and no row is left but frozen ones. Work per call: the first call freezes the generation and
-- moves the rows of its other queues (one walk of the generation, _gen_freeze); later calls
-- visit only the queues whose rows were held by others then, one index range each, and, if a
-- writer still held the generation at the first call, pass once over its queues (10 × p_max
-- queues a call, so that a late message is still moved by the next rotation at up to 10,000
-- queues by default: a skip scan of (gen, queue_id) that passes over a frozen queue's rows with
-- one descent and a key probe) once no writer is left. So a rotation never walks the rows that frozen queues keep
-- in pending generations again (it walked every one of them three times a rotation while any
-- row of the generation was held: 60,000 at 10,000 queues, issue 19). Writes message (gen),
-- message_gen_frozen, message_gen_pending. Locks: the rows it moves (SKIP LOCKED); tries the
-- generation's advisory lock (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_sweep(p_gen bigint, p_target bigint, p_max integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p        {schema}.message_gen_pending;
    r        record;
    v_queue  integer;
    v_held   integer[] := ARRAY[]::integer[];
    v_visits bigint := 10 * p_max::bigint;
    v_from   bigint;
BEGIN
    SELECT * INTO p FROM {schema}.message_gen_pending x WHERE x.gen = p_gen;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    IF NOT p.swept THEN
        -- Before the walk: a writer that is gone now has committed what it wrote there.
        p.scan := NOT {schema}._gen_writers_gone(p_gen);
        p.scan_after := NULL;
        FOREACH v_queue IN ARRAY {schema}._gen_freeze(p_gen, p_max) LOOP
            r := {schema}._gen_sweep_queue(p_gen, v_queue, p_target, p_max);
            IF r.held THEN
                v_held := v_held || v_queue;
            END IF;
        END LOOP;
        p.swept := true;
    ELSE
        FOREACH v_queue IN ARRAY p.leftover LOOP
            r := {schema}._gen_sweep_queue(p_gen, v_queue, p_target, p_max);
            IF r.held THEN
                v_held := v_held || v_queue;
            END IF;
        END LOOP;
        -- The pass starts once no writer is left (rows committed before that are seen by it).
        IF p.scan AND (p.scan_after IS NOT NULL OR {schema}._gen_writers_gone(p_gen)) THEN
            LOOP
                IF v_visits <= 0 THEN
                    EXIT;
                END IF;
                v_visits := v_visits - 1;
                v_from := coalesce(p.scan_after::bigint + 1, -2147483648);
                v_queue := (SELECT x.queue_id FROM {schema}.message x
                             WHERE x.gen = p_gen AND x.channel IS NULL AND x.queue_id >= v_from
                             ORDER BY x.queue_id LIMIT 1);
                IF v_queue IS NULL THEN
                    p.scan := false;
                    p.scan_after := NULL;
                    EXIT;
                END IF;
                r := {schema}._gen_sweep_queue(p_gen, v_queue, p_target, p_max);
                IF r.held AND NOT v_queue = ANY (v_held) THEN
                    v_held := v_held || v_queue;
                END IF;
                p.scan_after := v_queue;
            END LOOP;
        END IF;
    END IF;
    IF NOT p.scan AND cardinality(v_held) = 0 THEN
        DELETE FROM {schema}.message_gen_pending x WHERE x.gen = p_gen;
        RETURN true;
    END IF;
    UPDATE {schema}.message_gen_pending x
       SET swept = p.swept, leftover = v_held, scan = p.scan, scan_after = p.scan_after
     WHERE x.gen = p_gen;
    RETURN false;
END $$;

-- Thaw frozen generations, for the next p_max frozen queues in a round over them all (resumed
-- where the last rotation stopped: message_gen_thaw_seq): forget those that are gone; move
-- forward the rows of their oldest frozen generations (up to four a queue) where the queue
-- holds p_max rows or fewer (in its newest one, only once none of them waits: all leased),
-- p_max rows counted and p_max moved in all (the round resumes at the first queue not
-- counted); then drop from their lists the generations where they hold no row any more and no
-- writer can add one. So a rotation's work stays bounded however many
-- queues are frozen (visiting all of them every rotation cost a key probe per queue and
-- generation: 10,000 at 10,000 frozen queues). Writes message (gen),
-- message_gen_frozen, message_gen_thaw_seq. Locks: the rows it moves (SKIP LOCKED); tries the
-- generations' advisory locks (never waits).
CREATE OR REPLACE FUNCTION {schema}._gen_thaw(p_target bigint, p_max integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    f        {schema}.message_gen_frozen;
    v_gen    bigint;
    v_n      bigint;
    v_waiting bigint;
    v_budget bigint := p_max::bigint;
    v_reads  bigint := p_max::bigint;
    v_after  bigint;
    v_next   integer;
    v_round  integer[];
    v_done   bigint[];
BEGIN
    SELECT s.last_value INTO v_after FROM {schema}.message_gen_thaw_seq s;
    v_round := ARRAY(SELECT x.queue_id FROM {schema}.message_gen_frozen x
                      WHERE x.queue_id > v_after ORDER BY x.queue_id LIMIT p_max);
    -- The round resumes after the last queue visited, or from the start once it has seen them all.
    v_next := CASE WHEN cardinality(v_round) = p_max THEN v_round[p_max] ELSE -2147483648 END;
    IF coalesce(cardinality(v_round), 0) = 0 THEN
        PERFORM setval('{schema}.message_gen_thaw_seq', v_next);
        RETURN;
    END IF;
    DELETE FROM {schema}.message_gen_frozen x
     WHERE x.queue_id = ANY (v_round)
       AND NOT EXISTS (SELECT FROM {schema}.queue q WHERE q.id = x.queue_id);
    -- Before moving: a writer that is gone now cannot commit rows there later.
    v_done := ARRAY(SELECT d.gen FROM (SELECT DISTINCT unnest(x.gens) AS gen
                                         FROM {schema}.message_gen_frozen x
                                        WHERE x.queue_id = ANY (v_round)) d
                     WHERE {schema}._gen_writers_gone(d.gen));
    FOR f IN SELECT * FROM {schema}.message_gen_frozen x WHERE x.queue_id = ANY (v_round)
              ORDER BY x.queue_id LOOP
        IF v_budget <= 0 OR v_reads <= 0 THEN
            v_next := greatest(f.queue_id, -2147483647) - 1;  -- counted nothing of it: next round
            EXIT;
        END IF;
        FOREACH v_gen IN ARRAY f.gens[1:4] LOOP
            SELECT count(*), count(*) FILTER (WHERE c.waiting) INTO v_n, v_waiting
              FROM (SELECT x.leased IS NOT TRUE AS waiting FROM {schema}.message x
                     WHERE x.gen = v_gen AND x.queue_id = f.queue_id AND x.channel IS NULL
                     ORDER BY x.dequeue_at, x.id  -- (the dequeue index: see the header)
                     LIMIT p_max + 1) c;
            v_reads := v_reads - v_n;
            -- A queue's newest frozen generation stays while messages wait there: its takes
            -- read it anyway, and moving them forward only for the next rotation to freeze them
            -- again was a churn of idle small queues (p_max rows rewritten a rotation, issue 19).
            CONTINUE WHEN v_n = 0 OR v_n > p_max OR v_n > v_budget
                       OR (v_waiting > 0 AND v_gen = f.gens[cardinality(f.gens)]);
            UPDATE {schema}.message m SET gen = p_target
             WHERE m.ctid = ANY (ARRAY(
                   SELECT x.ctid FROM {schema}.message x
                    WHERE x.gen = v_gen AND x.queue_id = f.queue_id AND x.channel IS NULL
                    ORDER BY x.dequeue_at, x.id
                    LIMIT p_max + 1
                      FOR UPDATE SKIP LOCKED))
               AND (m.gen = v_gen AND m.queue_id = f.queue_id) IS TRUE;  -- (its partition)
            v_budget := v_budget - v_n;
        END LOOP;
    END LOOP;
    PERFORM setval('{schema}.message_gen_thaw_seq', v_next);
    -- Their lists, in one statement: a key probe per generation listed (a scalar subquery, so
    -- that the probe keeps both columns: as NOT EXISTS the planner made it an anti join on
    -- queue_id alone, 2 ms a queue, 30 s at 8,000 frozen queues).
    UPDATE {schema}.message_gen_frozen x
       SET gens = k.kept
      FROM (SELECT y.queue_id, y.gens,
                   ARRAY(SELECT g.gen FROM unnest(y.gens) WITH ORDINALITY AS g(gen, ord)
                          WHERE NOT (g.gen = ANY (v_done)
                                     AND (SELECT m.id FROM {schema}.message m
                                           WHERE m.gen = g.gen AND m.queue_id = y.queue_id
                                             AND m.channel IS NULL
                                           ORDER BY m.dequeue_at, m.id
                                           LIMIT 1) IS NULL)
                          ORDER BY g.ord) AS kept
              FROM {schema}.message_gen_frozen y
             WHERE y.queue_id = ANY (v_round)) k
     WHERE x.queue_id = k.queue_id AND k.kept <> k.gens;
    DELETE FROM {schema}.message_gen_frozen x WHERE x.queue_id = ANY (v_round) AND cardinality(x.gens) = 0;
END $$;

-- Open a new generation when the current one is p_period_ms old (or p_force): the one that
-- leaves the window is frozen for the queues that hold more than p_max_moves rows there (their
-- backlog is not rewritten), and for the queues holding most of the rest beyond p_max_moves,
-- and its other live plain messages move forward; then pending generations are swept and
-- frozen ones thawed (p_max_moves rows at most). One rotator at a time: another caller returns
-- NULL at once. Returns the current generation. Called by take() when due, by maintain(), or
-- directly. Writes message (gen), message_gen_pending, message_gen_frozen, the generation
-- sequences, the frozen flag (message_gen_frozen_seq) and, just before it moves the window,
-- the rotor (message_gen_rotor_seq: its transaction id; both: see the header). Locks: an
-- advisory transaction lock (try), the rows it moves (SKIP LOCKED).
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
    -- The frozen flag (see the header): cleared when the table is seen empty in what others
    -- committed, before this rotation writes anything (its freezes below set it again); set
    -- when a row is there and the flag is not (a row written by a writer that raced a clearing
    -- rotation, a restored dump).
    IF NOT EXISTS (SELECT FROM {schema}.message_gen_frozen f) THEN
        IF pg_current_xact_id_if_assigned() IS NULL
           AND current_setting('transaction_isolation') = 'read committed'
           AND pg_sequence_last_value('{schema}.message_gen_frozen_seq') IS DISTINCT FROM 0 THEN
            PERFORM setval('{schema}.message_gen_frozen_seq', 0);
        END IF;
    ELSIF pg_sequence_last_value('{schema}.message_gen_frozen_seq') IS DISTINCT FROM 1 THEN
        PERFORM setval('{schema}.message_gen_frozen_seq', 1);
    END IF;
    -- Generations pushed out earlier that may still hold rows (a backlog there stays frozen).
    FOR v_old IN SELECT p.gen FROM {schema}.message_gen_pending p WHERE p.gen < v_gen - 1
                  ORDER BY p.gen LOOP
        PERFORM {schema}._gen_sweep(v_old, v_gen, p_max_moves);
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
    -- The rotor first (see the header): a reader that sees the new generation sees it.
    PERFORM setval('{schema}.message_gen_rotor_seq', pg_current_xact_id()::text::bigint);
    v_gen := nextval('{schema}.message_gen_seq');
    INSERT INTO {schema}.message_gen_pending (gen) VALUES (v_gen) ON CONFLICT DO NOTHING;
    PERFORM {schema}._gen_sweep(v_gen - 2, v_gen, p_max_moves);
    RETURN v_gen;
END $$;
