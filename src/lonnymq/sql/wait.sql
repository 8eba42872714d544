-- LonnyMQ wake-ups: a send notifies only when a consumer is waiting on the queue.
--
-- PostgreSQL serialises the commits of every transaction that called pg_notify on one global
-- lock, so a NOTIFY per send caps concurrent producers. Instead, a consumer about to sleep
-- registers as a waiter (a session-level shared advisory lock, the "wait lock", keyed by the
-- queue id; released when it stops waiting or its session ends), and a send notifies only if
-- that lock is held. No wake-up is lost: every send also holds the queue's "send lock" shared
-- until it commits, taken before it looks for waiters, and a consumer that has just registered
-- waits for the transactions holding the send lock at that moment (wait_begin returns them,
-- wait_pending says which still run) before its last look at the queue: a send that looked
-- before the registration has committed by then (its message is seen), one that looked after
-- it notifies. See docs/wakeups.md.
--
-- Locks: advisory (classid = a hash of the schema name and the lock's role, objid = queue id)
-- in the current database. No tables are written.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled.

-- The advisory lock keys of the queue p_queue_id: (send lock class, wait lock class, objid).
-- Non-negative, so they compare equal to pg_locks' oid columns. _wake computes them inline.
CREATE OR REPLACE FUNCTION {schema}._wait_keys(
    p_queue_id integer, OUT k_send integer, OUT k_wait integer, OUT k_queue integer
)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT hashtext({schema_name} || '/send') & 2147483647,
           hashtext({schema_name} || '/wait') & 2147483647,
           p_queue_id
$$;

-- Producer side, called by every function that makes messages available (send_batch, nack's
-- retries, dead-lettering, replays): hold the queue's send lock shared until commit, then
-- notify channel {schema_name} with payload p_queue_name if a consumer waits on the queue.
-- PostgreSQL folds identical notifications of one transaction into one. With the session
-- setting lonnymq.wake = 'always' it notifies unconditionally (the behaviour before waiters
-- existed; benchmarks/notify_tax.py compares the two). With 'deferred' (transaction-local, set
-- by the Spark writer's two-phase commit: a transaction that has notified cannot be prepared;
-- spark/_write.py, commit_shards) it does nothing: the caller notifies once it has committed.
-- Only this function reads 'deferred': send()'s and send_batch's one-statement plain paths
-- inline their wake-up and ignore it (the Spark publish never takes them).
-- Locks: the send lock (xact, shared; never waited for: a send that cannot have it notifies);
-- probes the wait lock (session, exclusive, released at once: a concurrent probe may make
-- another send notify needlessly, never skip one).
CREATE OR REPLACE FUNCTION {schema}._wake(p_queue_id integer, p_queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    -- _wait_keys(p_queue_id), inlined: calling it would cost a send 8 us of its 12.
    k_send integer := hashtext({schema_name} || '/send') & 2147483647;
    k_wait integer := hashtext({schema_name} || '/wait') & 2147483647;
BEGIN
    -- One test on the usual path (the setting unset), as before 'deferred' existed.
    IF current_setting('lonnymq.wake', true) IN ('always', 'deferred') THEN
        IF current_setting('lonnymq.wake', true) = 'always' THEN
            PERFORM pg_notify({schema_name}, p_queue_name);
        END IF;
        RETURN;
    END IF;
    -- Only a foreign session can hold the send lock exclusively: then notify rather than wait.
    IF NOT pg_try_advisory_xact_lock_shared(k_send, p_queue_id) THEN
        PERFORM pg_notify({schema_name}, p_queue_name);
    ELSIF pg_try_advisory_lock(k_wait, p_queue_id) THEN
        PERFORM pg_advisory_unlock(k_wait, p_queue_id);
    ELSE
        PERFORM pg_notify({schema_name}, p_queue_name);
    END IF;
END $$;

-- Consumer side: register this session as a waiter on queue p_queue (it must LISTEN on
-- {schema_name} already). Returns the virtual transaction ids of the sends that may have missed
-- the registration (they hold the send lock): look at the queue once wait_pending returns none
-- of them. A session registered twice must call wait_end twice (or once with p_all).
-- Raises LQ001 if the queue does not exist. Locks: the wait lock (session, shared), waiting for
-- sends probing it (microseconds each) at most lock_timeout (1 s; then SQLSTATE 55P03).
CREATE OR REPLACE FUNCTION {schema}.wait_begin(p_queue text) RETURNS text[]
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    v_id      integer := ({schema}._queue(p_queue)).id;
    k         record := {schema}._wait_keys(v_id);
    v_timeout text := current_setting('lock_timeout');
BEGIN
    -- Not a SET clause: API functions carry only their pinned search_path (security.sql).
    PERFORM set_config('lock_timeout', '1s', true);
    PERFORM pg_advisory_lock_shared(k.k_wait, k.k_queue);
    PERFORM set_config('lock_timeout', v_timeout, true);
    RETURN ARRAY(
        SELECT l.virtualtransaction FROM pg_catalog.pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
           AND l.classid = k.k_send::oid AND l.objid = k.k_queue::oid AND l.objsubid = 2);
END $$;

-- Which of the virtual transactions p_vxids (from wait_begin) are still running.
CREATE OR REPLACE FUNCTION {schema}.wait_pending(p_vxids text[]) RETURNS text[]
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT ARRAY(SELECT l.virtualxid FROM pg_catalog.pg_locks l
                  WHERE l.locktype = 'virtualxid' AND l.virtualxid = ANY (p_vxids))
$$;

-- Stop waiting on queue p_queue: release this session's wait lock on it (every registration
-- if p_all). Returns whether it was registered. A queue dropped meanwhile is not an error.
CREATE OR REPLACE FUNCTION {schema}.wait_end(p_queue text, p_all boolean DEFAULT true) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    v_id  integer;
    k     record;
    v_any boolean := false;
BEGIN
    SELECT q.id INTO v_id FROM {schema}.queue q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    k := {schema}._wait_keys(v_id);
    -- Unlocking a lock not held logs a WARNING: ask pg_locks first.
    WHILE EXISTS (SELECT FROM pg_catalog.pg_locks l
                   WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
                     AND l.classid = k.k_wait::oid AND l.objid = k.k_queue::oid AND l.objsubid = 2) LOOP
        PERFORM pg_advisory_unlock_shared(k.k_wait, k.k_queue);
        v_any := true;
        EXIT WHEN NOT p_all;
    END LOOP;
    RETURN v_any;
END $$;
