-- LonnyMQ roles and privileges: who may call what (docs/security.md).
--
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.
--
-- Model. Three NOLOGIN group roles, cluster-wide, created here if missing:
--   <prefix>_producer  sends;
--   <prefix>_consumer  takes and settles (take, take_tx, ack, nack, extend, receive's helpers);
--   <prefix>_admin     every API function (queues, dead letters, peek, maintenance, ...).
-- <prefix> is 'lonnymq' unless the migrating session sets lonnymq.role_prefix (give each
-- lonnymq schema of a cluster its own roles that way; with the default, the roles are shared by
-- every lonnymq schema of the cluster). Applications log in as their own roles, made members:
-- GRANT lonnymq_producer TO app_web;
--
-- The API functions (every function whose name does not start with '_') are SECURITY DEFINER
-- with search_path pinned to pg_catalog, pg_temp, and the roles get EXECUTE on them, USAGE on
-- the schema and nothing on the tables: a producer can send, but it cannot read, change or
-- delete a message except through the functions' own rules. Internal functions ('_name') and
-- everything else are executable by the owner only; EXECUTE is revoked from PUBLIC everywhere.
--
-- Later migrations: register what producers/consumers may call in security_grant, then end with
--   SELECT {schema}._apply_privileges();
-- which (re)applies the whole policy to every function and table of the schema (idempotent).

CREATE TABLE {schema}.security_role (
    kind    text PRIMARY KEY CHECK (kind IN ('producer', 'consumer', 'admin')),
    rolname text NOT NULL CHECK (rolname ~ '^[a-z_][a-z0-9_]{{0,62}}$')
);

-- What each role may use beyond the defaults: admin gets EXECUTE on every API function
-- without a row here. object is a function name (all its overloads) or a table name of this
-- schema; privileges apply to it as they are (EXECUTE for functions).
CREATE TABLE {schema}.security_grant (
    object     text NOT NULL,
    kind       text NOT NULL REFERENCES {schema}.security_role (kind),
    privileges text[] NOT NULL DEFAULT ARRAY['EXECUTE']
               CHECK (cardinality(privileges) > 0
                      AND privileges <@ ARRAY['EXECUTE', 'SELECT', 'INSERT', 'UPDATE', 'DELETE']),
    PRIMARY KEY (object, kind)
);

-- Create the roles (if this session may) and record their names.
DO $$
DECLARE
    v_prefix text := coalesce(nullif(current_setting('lonnymq.role_prefix', true), ''), 'lonnymq');
    v_kind   text;
    v_role   text;
    v_can    boolean;
BEGIN
    IF v_prefix !~ '^[a-z_][a-z0-9_]{{0,53}}$' THEN
        RAISE EXCEPTION 'invalid lonnymq.role_prefix %: use 1-54 of a-z 0-9 _ starting with a letter or _',
            quote_literal(v_prefix) USING ERRCODE = 'LQ002';
    END IF;
    SELECT r.rolsuper OR r.rolcreaterole INTO v_can FROM pg_catalog.pg_roles r
     WHERE r.rolname = current_user;
    FOREACH v_kind IN ARRAY ARRAY['producer', 'consumer', 'admin'] LOOP
        v_role := v_prefix || '_' || v_kind;
        INSERT INTO {schema}.security_role (kind, rolname) VALUES (v_kind, v_role);
        CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
        IF NOT v_can THEN
            -- Installing must not need CREATEROLE: the schema stays owner-only until someone
            -- creates the role and the owner runs _apply_privileges() (docs/security.md).
            RAISE WARNING 'lonnymq: role % does not exist and % may not create roles; create it and run SELECT %.%()',
                v_role, current_user, {schema_name}, '_apply_privileges';
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- roles are cluster-wide: a concurrent install of another schema made it
        END;
    END LOOP;
END $$;

INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('send_batch',    'producer', ARRAY['EXECUTE']),
    ('take',          'consumer', ARRAY['EXECUTE']),
    ('take_tx',       'consumer', ARRAY['EXECUTE']),
    ('ack',           'consumer', ARRAY['EXECUTE']),
    ('nack',          'consumer', ARRAY['EXECUTE']),
    ('extend',        'consumer', ARRAY['EXECUTE']),
    ('next_ready_in', 'consumer', ARRAY['EXECUTE']),
    ('queue_metrics', 'consumer', ARRAY['EXECUTE']),
    ('now_ms',        'consumer', ARRAY['EXECUTE']),
    -- Clients and workers check the installed version.
    ('migration',     'producer', ARRAY['SELECT']),
    ('migration',     'consumer', ARRAY['SELECT']),
    ('migration',     'admin',    ARRAY['SELECT']);

-- (Re)apply the whole policy to every function and table of the schema: revoke everything
-- from PUBLIC and the three roles, make API functions SECURITY DEFINER with a pinned
-- search_path, then grant what security_grant says (admin: every API function). Declarative,
-- so running it again (every later migration does) converges to the same privileges.
-- Owner only. Raises LQ002 if security_grant names an object that does not exist.
CREATE FUNCTION {schema}._apply_privileges() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ns    oid := {schema_name}::regnamespace;
    v_roles text[];
    v_admin text;
    r       record;
    g       record;
    v_role  text;
BEGIN
    SELECT array_agg(s.rolname ORDER BY s.kind) INTO v_roles
      FROM {schema}.security_role s
     WHERE EXISTS (SELECT FROM pg_roles p WHERE p.rolname = s.rolname);
    v_roles := coalesce(v_roles, ARRAY[]::text[]);
    SELECT s.rolname INTO v_admin FROM {schema}.security_role s
     WHERE s.kind = 'admin' AND s.rolname = ANY (v_roles);

    SELECT sg.object INTO r FROM {schema}.security_grant sg
     WHERE NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = v_ns AND p.proname = sg.object)
       AND NOT EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = v_ns AND c.relname = sg.object
                                                AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S'))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'security_grant names %, which is neither a function nor a table of schema %',
            quote_literal(r.object), {schema_name} USING ERRCODE = 'LQ002';
    END IF;

    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM PUBLIC', {schema_name});
    FOREACH v_role IN ARRAY v_roles LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', {schema_name}, v_role);
    END LOOP;

    -- Functions. regprocedure prints the schema-qualified, quoted signature (the schema is not
    -- on this function's search_path).
    FOR r IN SELECT p.oid::regprocedure::text AS sig, p.proname, p.prokind,
                    p.prorettype IN ('trigger'::regtype, 'event_trigger'::regtype) AS is_trigger
               FROM pg_proc p WHERE p.pronamespace = v_ns ORDER BY p.oid LOOP
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', r.sig);
        FOREACH v_role IN ARRAY v_roles LOOP
            EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %I', r.sig, v_role);
        END LOOP;
        CONTINUE WHEN starts_with(r.proname, '_') OR r.is_trigger OR r.prokind NOT IN ('f', 'p');
        EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp', r.sig);
        IF v_admin IS NOT NULL THEN
            EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', r.sig, v_admin);
        END IF;
        FOR g IN SELECT s.rolname FROM {schema}.security_grant sg
                   JOIN {schema}.security_role s ON s.kind = sg.kind
                  WHERE sg.object = r.proname AND 'EXECUTE' = ANY (sg.privileges)
                    AND s.rolname = ANY (v_roles) AND s.rolname IS DISTINCT FROM v_admin
                  ORDER BY s.kind LOOP
            EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', r.sig, g.rolname);
        END LOOP;
    END LOOP;

    -- Tables, views and sequences: nothing unless security_grant says so.
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c
              WHERE c.relnamespace = v_ns AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
              ORDER BY c.relname LOOP
        EXECUTE format('REVOKE ALL ON %s %I.%I FROM PUBLIC',
                       CASE WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, {schema_name}, r.relname);
        FOREACH v_role IN ARRAY v_roles LOOP
            EXECUTE format('REVOKE ALL ON %s %I.%I FROM %I',
                           CASE WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                           {schema_name}, r.relname, v_role);
        END LOOP;
        FOR g IN SELECT s.rolname, sg.privileges FROM {schema}.security_grant sg
                   JOIN {schema}.security_role s ON s.kind = sg.kind
                  WHERE sg.object = r.relname AND s.rolname = ANY (v_roles)
                    AND sg.privileges <> ARRAY['EXECUTE']
                  ORDER BY s.kind LOOP
            EXECUTE format('GRANT %s ON %s %I.%I TO %I',
                           array_to_string(array_remove(g.privileges, 'EXECUTE'), ', '),
                           CASE WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                           {schema_name}, r.relname, g.rolname);
        END LOOP;
    END LOOP;
END $$;

SELECT {schema}._apply_privileges();
