-- LonnyMQ privileges (docs/security.md): the roles and the security_grant rows are stored data
-- (baseline migration); this applies them. migrate calls _apply_privileges() after it changed
-- anything, because CREATE OR REPLACE FUNCTION resets SECURITY DEFINER and search_path.
--
-- The API functions (every function whose name does not start with '_') are SECURITY DEFINER
-- with search_path pinned to pg_catalog, pg_temp, and the roles get EXECUTE on them, USAGE on
-- the schema and nothing on the tables: a producer can send, but it cannot read, change or
-- delete a message except through the functions' own rules. Internal functions ('_name') and
-- everything else are executable by the owner only; EXECUTE is revoked from PUBLIC everywhere.
-- A new API function for producers or consumers needs a security_grant row (a new migration).
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- (Re)apply the whole policy to every function and table of the schema: revoke everything
-- from PUBLIC and the three roles, make API functions SECURITY DEFINER with a pinned
-- search_path, then grant what security_grant says (admin: every API function). Declarative,
-- so running it again (migrate does after every change) converges to the same privileges.
-- Owner only. Raises LQ002 if security_grant names an object that does not exist.
CREATE OR REPLACE FUNCTION {schema}._apply_privileges() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ns    oid := {schema_name}::regnamespace::oid;
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

    -- Functions. sig is a regprocedure, not text: its output is the schema-qualified signature
    -- with every name quoted as needed (the schema is not on this function's search_path), so
    -- format('%s') puts a safe identifier in the statement.
    FOR r IN SELECT p.oid::regprocedure AS sig, p.proname, p.prokind,
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
