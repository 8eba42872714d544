-- LonnyMQ queues: create, drop, purge, pause and resume, list, metrics, and the lookup every call starts with.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- The queue row named p_name; raises LQ001 (queue not found) if there is none. Reads queue.
CREATE OR REPLACE FUNCTION {schema}._queue(p_name text) RETURNS {schema}.queue
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q {schema}.queue;
BEGIN
    SELECT * INTO q FROM {schema}.queue WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(p_name) USING ERRCODE = 'LQ001';
    END IF;
    RETURN q;
END $$;

-- Create queue p_name with its settings. Its messages go to the shared message table: an
-- ordinary queue gets a positive id (message_logged), an UNLOGGED one (p_unlogged) a negative
-- id from queue_unlogged_id_seq (message_unlogged): no DDL, no lock on a shared object.
-- Returns true, or false when it exists and p_if_not_exists (else LQ005). Raises LQ002 for
-- invalid settings, LQ001 for an unknown dead-letter queue. Writes queue. Locks: the row of a
-- queue of that name if there is one (shared: waits for a drop of it to end); creators of the
-- same name meet on the name's unique index. No lock per queue created that lasts until the
-- transaction ends (an advisory lock did: 10,000 queues created in one transaction ran out of
-- shared memory on a default server).
CREATE OR REPLACE FUNCTION {schema}.queue_create(
    p_name              text,
    p_lease_ms          bigint  DEFAULT 30000,
    p_max_attempts      integer DEFAULT 5,
    p_dead_letter_queue text    DEFAULT NULL,
    p_archive           boolean DEFAULT false,
    p_retention_ms      bigint  DEFAULT 604800000,
    p_unlogged          boolean DEFAULT false,
    p_max_payload_bytes integer DEFAULT 1048576,
    p_priority_step_ms  bigint  DEFAULT 1000,
    p_if_not_exists     boolean DEFAULT false,
    -- The policy of channels created by messages (channel_set overrides it per channel).
    p_channel_max_concurrency     integer DEFAULT NULL,
    p_channel_release_interval_ms bigint  DEFAULT NULL,
    p_channel_max_size            bigint  DEFAULT NULL,
    p_channel_on_full             text    DEFAULT 'reject'
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_dlq integer;
    v_id  integer;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z][a-z0-9_.:-]{{0,62}}$' THEN
        RAISE EXCEPTION 'invalid queue name %: use 1-63 of a-z 0-9 _ . : - starting with a letter',
            quote_nullable(p_name) USING ERRCODE = 'LQ002';
    END IF;
    IF p_lease_ms IS NULL OR p_max_attempts IS NULL OR p_archive IS NULL
       OR p_max_payload_bytes IS NULL THEN
        PERFORM {schema}._invalid('queue settings must not be NULL');
    END IF;
    PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    PERFORM {schema}._check_positive(p_max_attempts, 'max_attempts');
    PERFORM {schema}._check_positive(p_max_payload_bytes, 'max_payload_bytes');
    IF p_retention_ms IS NULL OR p_retention_ms < 0 THEN
        PERFORM {schema}._invalid('retention_ms must be >= 0');
    END IF;
    IF p_priority_step_ms IS NULL OR p_priority_step_ms < 0 THEN
        PERFORM {schema}._invalid('priority_step_ms must be >= 0');
    END IF;
    IF p_max_payload_bytes > 104857600 THEN
        PERFORM {schema}._invalid('max_payload_bytes must be at most 100 MiB');
    END IF;
    PERFORM {schema}._check_channel_policy(p_channel_max_concurrency, p_channel_release_interval_ms,
                                           p_channel_max_size, p_channel_on_full);
    -- A queue being dropped is waited for (its drop holds the row), then found gone.
    PERFORM FROM {schema}.queue WHERE name = p_name FOR SHARE;
    IF FOUND THEN
        IF p_if_not_exists THEN
            RETURN false;
        END IF;
        RAISE EXCEPTION 'queue % already exists', quote_literal(p_name) USING ERRCODE = 'LQ005';
    END IF;
    IF p_dead_letter_queue IS NOT NULL THEN
        v_dlq := ({schema}._queue(p_dead_letter_queue)).id;
    END IF;
    IF p_unlogged THEN
        v_id := nextval('{schema}.queue_unlogged_id_seq')::integer;
    ELSE
        v_id := nextval(pg_get_serial_sequence('{schema}.queue', 'id'))::integer;
    END IF;
    INSERT INTO {schema}.queue (id, name, lease_ms, max_attempts, dead_letter_queue_id, archive,
                                retention_ms, unlogged, max_payload_bytes, priority_step_ms,
                                channel_max_concurrency, channel_release_interval_ms,
                                channel_max_size, channel_on_full)
    OVERRIDING SYSTEM VALUE
    VALUES (v_id, p_name, p_lease_ms, p_max_attempts, v_dlq, p_archive, p_retention_ms,
            coalesce(p_unlogged, false), p_max_payload_bytes, p_priority_step_ms,
            p_channel_max_concurrency, p_channel_release_interval_ms, p_channel_max_size,
            p_channel_on_full)
    ON CONFLICT (name) DO NOTHING;  -- a concurrent creator of the name committed first
    IF NOT FOUND THEN
        IF p_if_not_exists THEN
            RETURN false;
        END IF;
        RAISE EXCEPTION 'queue % already exists', quote_literal(p_name) USING ERRCODE = 'LQ005';
    END IF;
    RETURN true;
END $$;

-- Drop queue p_name: its messages, its archive rows, its channels. Returns true, or false
-- when it does not exist and p_if_exists (else LQ001). Raises LQ006 while it is the dead-letter
-- queue of another queue. Locks: the queue row, so concurrent drops serialise (the second finds
-- nothing), a create of the name waits for the drop, and a queue that became a dead-letter queue
-- meanwhile is refused as in use.
CREATE OR REPLACE FUNCTION {schema}.queue_drop(p_name text, p_if_exists boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue;
BEGIN
    -- The row: a concurrent drop waits here and then finds nothing.
    SELECT * INTO q FROM {schema}.queue WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RETURN false;
        END IF;
        PERFORM {schema}._queue(p_name);
    END IF;
    IF EXISTS (SELECT FROM {schema}.queue WHERE dead_letter_queue_id = q.id) THEN
        RAISE EXCEPTION 'queue % is the dead-letter queue of %', quote_literal(p_name),
            (SELECT string_agg(quote_literal(name), ', ') FROM {schema}.queue
              WHERE dead_letter_queue_id = q.id)
            USING ERRCODE = 'LQ006';
    END IF;
    DELETE FROM {schema}.message WHERE queue_id = q.id;
    DELETE FROM {schema}.archive WHERE queue_id = q.id;
    DELETE FROM {schema}.settled WHERE queue_id = q.id;
    DELETE FROM {schema}.queue_stat WHERE queue_id = q.id;
    BEGIN
        DELETE FROM {schema}.queue WHERE id = q.id;
    EXCEPTION WHEN foreign_key_violation THEN
        -- A queue naming this one as its dead-letter queue committed since the check above.
        RAISE EXCEPTION 'queue % became the dead-letter queue of another queue', quote_literal(p_name)
            USING ERRCODE = 'LQ006';
    END;
    RETURN true;
END $$;

-- Delete every message of queue p_name and empty its channels; configured channels stay.
-- Archive and dead letters are kept. Locks: the queue's message rows (waits for a take that
-- holds some, never for other queues), then its channel rows.
CREATE OR REPLACE FUNCTION {schema}.queue_purge(p_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_name);
BEGIN
    DELETE FROM {schema}.message m WHERE m.queue_id = q.id;
    -- Its channels are empty now (after the messages, in lock order). Configured channels stay,
    -- with their rate limit state.
    DELETE FROM {schema}.channel c WHERE c.queue_id = q.id AND NOT c.explicit;
    UPDATE {schema}.channel c
       SET current_size = 0, current_concurrency = 0, blocked_until = NULL, ready_at = NULL
     WHERE c.queue_id = q.id;
END $$;

-- Pause queue p_queue: it still accepts sends, but take and take_tx hand out nothing (and
-- next_ready_in reports nothing ready) until queue_resume. Messages already leased keep their
-- lease and may be acked, nacked and extended. A take that read the queue row before the pause
-- committed may still deliver. Returns true if this call paused it, false if it was paused
-- already. Raises LQ001. Writes queue (its row lock, until commit).
CREATE OR REPLACE FUNCTION {schema}.queue_pause(p_queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    UPDATE {schema}.queue SET paused = true WHERE id = q.id AND NOT paused;
    RETURN FOUND;
END $$;

-- Resume queue p_queue: take hands out its ready messages again, in the usual order, and the
-- consumers waiting on it are woken (as by a send: _wake). Returns true if this call resumed
-- it, false if it was not paused. Raises LQ001. Writes queue (its row lock, until commit).
-- Locks: the queue's send lock (shared, until commit; see wait.sql).
CREATE OR REPLACE FUNCTION {schema}.queue_resume(p_queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    UPDATE {schema}.queue SET paused = false WHERE id = q.id AND paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {schema}._wake(q.id, q.name);
    RETURN true;
END $$;

-- The queues with their settings, by name: all of them, or p_limit at a time after the name
-- p_after (keyset paging on the name's unique index, as fast at 10,000 queues as at 10: a page
-- starts at p_after in the index, in a generic plan too, where "p_after IS NULL OR q.name >
-- p_after" walked the index from its first name).
-- paused: see queue_pause. Raises LQ002 for a p_limit below 1. Reads queue.
CREATE OR REPLACE FUNCTION {schema}.queue_list(p_limit integer DEFAULT NULL, p_after text DEFAULT NULL)
RETURNS TABLE (
    name text, lease_ms bigint, max_attempts integer, dead_letter_queue text, archive boolean,
    retention_ms bigint, unlogged boolean, max_payload_bytes integer, priority_step_ms bigint,
    created_at timestamptz, paused boolean
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_limit IS NOT NULL THEN
        PERFORM {schema}._check_limit(p_limit);
    END IF;
    RETURN QUERY
    SELECT q.name, q.lease_ms, q.max_attempts, d.name, q.archive, q.retention_ms, q.unlogged,
           q.max_payload_bytes, q.priority_step_ms, q.created_at, q.paused
      FROM {schema}.queue q
      LEFT JOIN {schema}.queue d ON d.id = q.dead_letter_queue_id
     WHERE q.name > coalesce(p_after, '')  -- '' sorts before every name
     ORDER BY q.name
     LIMIT p_limit;
END $$;

-- The settings of the queues named in p_names, by name, as queue_list gives them (unknown names
-- are left out): a probe of the name's unique index each, whatever the number of queues (the
-- dashboard's queue page read queue_list() whole to find one: every queue row). Reads queue;
-- takes no lock.
CREATE OR REPLACE FUNCTION {schema}.queue_info(p_names text[])
RETURNS TABLE (
    name text, lease_ms bigint, max_attempts integer, dead_letter_queue text, archive boolean,
    retention_ms bigint, unlogged boolean, max_payload_bytes integer, priority_step_ms bigint,
    created_at timestamptz, paused boolean
)
LANGUAGE sql STABLE AS $$
    -- The dead-letter queue's name by a probe of its key (a join may be planned as a hash of
    -- every queue row).
    SELECT q.name, q.lease_ms, q.max_attempts,
           (SELECT d.name FROM {schema}.queue d WHERE d.id = q.dead_letter_queue_id), q.archive,
           q.retention_ms, q.unlogged, q.max_payload_bytes, q.priority_step_ms, q.created_at,
           q.paused
      FROM {schema}.queue q
     WHERE q.name = ANY (p_names)
     ORDER BY q.name
$$;

-- Up to p_limit messages of a queue with p_after < dequeue_at <= p_until (optionally unleased
-- ones only), counted through the dequeue indexes: plain messages from theirs (in the
-- generations p_gens, the queue's _gens_of), channel messages channel by channel from theirs,
-- so the cost is O(channels + p_limit) however many there are.
CREATE OR REPLACE FUNCTION {schema}._count_messages(
    p_queue_id integer, p_gens bigint[], p_after bigint, p_until bigint, p_unleased boolean,
    p_limit bigint
) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM (
        (SELECT 1 FROM unnest(p_gens) AS g(gen)
           CROSS JOIN LATERAL (SELECT 1 FROM {schema}.message m
                                WHERE m.gen = g.gen AND m.queue_id = p_queue_id AND m.channel IS NULL
                                  AND m.dequeue_at > p_after AND m.dequeue_at <= p_until
                                  AND NOT (p_unleased AND m.leased)
                                LIMIT p_limit) x
          LIMIT p_limit)
        UNION ALL
        (SELECT 1 FROM {schema}.channel c
           CROSS JOIN LATERAL (SELECT 1 FROM {schema}.message m
                                WHERE m.queue_id = p_queue_id AND m.channel = c.name
                                  AND m.dequeue_at > p_after AND m.dequeue_at <= p_until
                                  AND NOT (p_unleased AND m.leased)
                                LIMIT p_limit) x
          WHERE c.queue_id = p_queue_id)
        LIMIT p_limit) s);
END $$;

-- The state of queue p_name on one snapshot and clock. Counts of ready, scheduled, leased and
-- dead messages are exact (index-only scans over each state's range); with p_cap, each stops
-- at p_cap rows, and the *_at_least flag of a count that reached it says "at least" (cheap on a
-- queue of millions). total_sent: messages ever sent to the queue (created by sends, dead
-- letters moved in, requeued dead messages: the sum of its queue_stat rows' sent).
-- oldest_age_ms / newest_age_ms: age of the first and the last live message by id (ids grow
-- with enqueue time), NULL when empty.
-- oldest_ready_age_ms: how late the most overdue ready message is (looks a bounded way into
-- the head); next_scheduled_at: when the next scheduled message comes due. paused: the queue
-- hands out nothing (queue_pause; its ready messages still count as ready). Raises LQ001,
-- LQ002 (bad cap). Reads message, channel, archive, queue_stat; takes no lock.
-- Runs with plan_cache_mode = force_generic_plan (and, for those plans, enable_seqscan and jit
-- off), as take and ack do (settle.sql): PL/pgSQL priced the generic plans of its dozen
-- statements above custom ones and planned them again on every call, most of the call (the
-- dashboard's overview calls it for each of its 100 queues: 556 -> 48-58 ms for 100 calls on a
-- warm session, PostgreSQL 15; docs/storage.md).
CREATE OR REPLACE FUNCTION {schema}.queue_metrics(p_name text, p_cap integer DEFAULT NULL, p_now bigint DEFAULT NULL)
RETURNS TABLE (
    queue text, ready bigint, scheduled bigint, leased bigint, dead bigint,
    oldest_ready_age_ms bigint, next_scheduled_at bigint, total_sent bigint,
    oldest_age_ms bigint, newest_age_ms bigint, ready_at_least boolean,
    scheduled_at_least boolean, leased_at_least boolean, dead_at_least boolean, paused boolean
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_name);
    v_now bigint := {schema}._read_now(p_now);  -- STABLE: all counts on one snapshot and clock
    -- The queue's generations, read once: every count below sees the same ones (a rotation
    -- between two statements cannot take one away from a later count), and _gens_of's three
    -- reads were a third of a call when each statement made them.
    v_gens bigint[] := {schema}._gens_of(q.id);
    v_future bigint;
    v_leased bigint;
BEGIN
    IF p_cap IS NOT NULL THEN
        PERFORM {schema}._check_limit(p_cap);
    END IF;
    queue := q.name;
    paused := q.paused;
    -- LIMIT NULL is no limit: without a cap every count below is exact.
    ready := {schema}._count_messages(q.id, v_gens, -9223372036854775807, v_now, false, p_cap);
    SELECT count(*) INTO leased FROM (
        SELECT 1 FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.leased AND m.dequeue_at > v_now LIMIT p_cap) s;
    -- Future rows are the leased ones plus the scheduled ones. While leased is exact, count
    -- that many rows further so scheduled is exact up to p_cap as well; once leased is capped
    -- the unleased future rows must be told apart row by row.
    v_leased := leased;
    IF p_cap IS NULL OR v_leased < p_cap THEN
        v_future := {schema}._count_messages(q.id, v_gens, v_now, 9223372036854775807, false,
                                             p_cap + v_leased);
        scheduled := least(v_future - v_leased, p_cap);
    ELSE
        scheduled := {schema}._count_messages(q.id, v_gens, v_now, 9223372036854775807, true, p_cap);
    END IF;
    SELECT count(*) INTO dead FROM (
        SELECT 1 FROM {schema}.archive a
         WHERE a.queue_id = q.id AND a.status = 'dead' LIMIT p_cap) s;
    -- NULL cap: the comparisons are NULL, the counts exact.
    ready_at_least := coalesce(ready >= p_cap, false);
    scheduled_at_least := coalesce(scheduled >= p_cap, false);
    leased_at_least := coalesce(leased >= p_cap, false);
    dead_at_least := coalesce(dead >= p_cap, false);
    SELECT coalesce(sum(c.sent), 0)::bigint INTO total_sent FROM {schema}.queue_stat c
     WHERE c.queue_id = q.id;
    oldest_age_ms := (SELECT v_now - m.enqueued_at FROM {schema}.message m
                       WHERE m.queue_id = q.id ORDER BY m.id LIMIT 1);
    newest_age_ms := (SELECT v_now - m.enqueued_at FROM {schema}.message m
                       WHERE m.queue_id = q.id ORDER BY m.id DESC LIMIT 1);
    -- The head of the index is what is delivered next; look a bounded way into it (and at the
    -- head of each channel).
    SELECT max(v_now - h.scheduled_at) INTO oldest_ready_age_ms FROM (
        (SELECT x.scheduled_at FROM unnest(v_gens) AS g(gen)
           CROSS JOIN LATERAL (SELECT m.scheduled_at FROM {schema}.message m
                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                  AND m.dequeue_at <= v_now
                                ORDER BY m.dequeue_at, m.id LIMIT 1000) x)
        UNION ALL
        (SELECT x.scheduled_at FROM {schema}.channel c
           CROSS JOIN LATERAL (SELECT m.scheduled_at FROM {schema}.message m
                                WHERE m.queue_id = q.id AND m.channel = c.name
                                  AND m.dequeue_at <= v_now
                                ORDER BY m.dequeue_at, m.id LIMIT 1) x
          WHERE c.queue_id = q.id)) h;
    SELECT min(h.dequeue_at) INTO next_scheduled_at FROM (
        (SELECT x.dequeue_at FROM unnest(v_gens) AS g(gen)
           CROSS JOIN LATERAL (SELECT m.dequeue_at FROM {schema}.message m
                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                  AND m.dequeue_at > v_now AND NOT m.leased
                                ORDER BY m.dequeue_at LIMIT 1) x)
        UNION ALL
        (SELECT x.dequeue_at FROM {schema}.channel c
           CROSS JOIN LATERAL (SELECT m.dequeue_at FROM {schema}.message m
                                WHERE m.queue_id = q.id AND m.channel = c.name
                                  AND m.dequeue_at > v_now AND NOT m.leased
                                ORDER BY m.dequeue_at LIMIT 1) x
          WHERE c.queue_id = q.id)) h;
    RETURN NEXT;
END $$;

-- What a consumer needs to know of the queues it serves: the lease (to pace heartbeats) and
-- the attempt limit. Queues that do not exist are left out. Narrower than queue_list, which
-- stays with admin.
CREATE OR REPLACE FUNCTION {schema}.worker_queues(p_names text[])
RETURNS TABLE (name text, lease_ms bigint, max_attempts integer)
LANGUAGE sql STABLE AS $$
    SELECT q.name, q.lease_ms, q.max_attempts FROM {schema}.queue q
     WHERE q.name = ANY (p_names) ORDER BY q.name
$$;
