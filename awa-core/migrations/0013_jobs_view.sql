-- Awa schema, version 13: awa.jobs becomes a view of every job on either engine.
--
-- Canonical's table is renamed `awa.canonical_jobs` (its indexes, constraints, triggers and
-- `awa.jobs_id_seq`, which queue storage draws its ids from too, go with it). `awa.jobs` is a
-- view that `awa.refresh_jobs_view()` keeps in one of two shapes:
--
--  * canonical only (no queue-storage schema is readable): `SELECT <columns> FROM
--    awa.canonical_jobs`, which PostgreSQL updates automatically, so SQL written against the
--    old table (INSERT ... ON CONFLICT, UPDATE, DELETE, RETURNING, FOR UPDATE) keeps working;
--  * both engines: that UNION ALL the readable queue-storage schema's `qs_jobs`, with queue
--    storage's columns cast to canonical's types and NULL for the ones it has not. INSTEAD OF
--    triggers send INSERT, UPDATE and DELETE to canonical's rows; a write that reaches a queue
--    storage job is refused (SQLSTATE 55000): that engine changes its jobs through the client.
--
-- The readable schema is `awa.readable_queue_storage_schema()`, which the client's reads use too:
-- the active one, else the one `awa.runtime_storage_backends` names. A statement trigger on the two state
-- tables refreshes the view whenever they change, and the refresh does nothing when the shape
-- is already right (the view's comment records it), so the ACCESS EXCLUSIVE lock a redefinition
-- takes is taken only when the shape changes. The engine's own statements never read the view:
-- they use `awa.canonical_jobs` or the schema's tables, so runtimes are not behind that lock.
-- A migration that adds a column to awa.canonical_jobs must call `awa.refresh_jobs_view(NULL, true)`.

-- (Re-runnable, as every migration is: the rename happens once.)
DO $$ BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('awa.jobs')) = 'r' THEN
        ALTER TABLE awa.jobs RENAME TO canonical_jobs;
    END IF;
END $$;

-- Every function whose body names the table is recreated with the new name (bodies are resolved
-- when they run, so they would otherwise write through the view). `\M` ends the match at a word
-- boundary: `awa.jobs_dlq` and `awa.jobs_id_seq` are left alone.
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'awa' AND p.prokind = 'f' AND p.prosrc ~ 'awa\.jobs\M' LOOP
        EXECUTE regexp_replace(pg_get_functiondef(f.oid), 'awa\.jobs\M', 'awa.canonical_jobs', 'g');
    END LOOP;
END $$;

-- The route guard's refusal names the engine, not a relation (an insert through the view
-- reaches canonical's table by the view).
CREATE OR REPLACE FUNCTION awa.jobs_route_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM awa.storage_transition_state
               WHERE state = 'active' AND current_engine <> 'canonical') THEN
        RAISE EXCEPTION 'canonical storage takes no new jobs: the active storage engine is queue storage'
            USING ERRCODE = 'AWR01';
    END IF;
    RETURN NULL;
END $$;

-- The queue-storage schema whose jobs are read next to canonical's (by `awa.jobs` and by the
-- client's reads, `storage::routing::readable_queue_storage`): the active one, else the one a
-- transition in progress named; NULL when there is none.
CREATE OR REPLACE FUNCTION awa.readable_queue_storage_schema() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(awa.active_queue_storage_schema(),
                    (SELECT schema_name FROM awa.runtime_storage_backends
                     WHERE backend = 'queue_storage'))
$$;

-- The view in the shape the current state asks for. `p_exclude` names a schema whose objects
-- are about to be dropped (a reset), so the view stops depending on them first; `p_force`
-- redefines it even when its recorded shape matches (after canonical gains a column). It runs
-- as its owner (the schema's), since a storage step taken by the application role may change
-- the shape and only the owner may redefine the view.
CREATE OR REPLACE FUNCTION awa.refresh_jobs_view(p_exclude text DEFAULT NULL,
                                                 p_force boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schema text;
    v_shape text;
    v_cols text;
    v_qs_cols text;
    v_set text;
    v_defaults text;
BEGIN
    v_schema := awa.readable_queue_storage_schema();
    IF v_schema IS NOT DISTINCT FROM p_exclude
       OR to_regclass(format('%I.qs_jobs', v_schema)) IS NULL THEN
        v_schema := NULL;
    END IF;
    v_shape := CASE WHEN v_schema IS NULL THEN 'canonical'
                    ELSE 'canonical+queue_storage:' || v_schema END;
    IF NOT p_force AND to_regclass('awa.jobs') IS NOT NULL
       AND obj_description(to_regclass('awa.jobs'), 'pg_class') IS NOT DISTINCT FROM v_shape THEN
        RETURN;
    END IF;

    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum),
           string_agg(CASE WHEN q.attname IS NULL
                           THEN format('NULL::%s', format_type(a.atttypid, a.atttypmod))
                           ELSE format('q.%I::%s', a.attname, format_type(a.atttypid, a.atttypmod))
                      END, ', ' ORDER BY a.attnum),
           string_agg(format('%I = n.%I', a.attname, a.attname), ', ' ORDER BY a.attnum)
                FILTER (WHERE a.attname <> 'id')
    INTO v_cols, v_qs_cols, v_set
    FROM pg_attribute a
    LEFT JOIN pg_attribute q
      ON v_schema IS NOT NULL AND q.attrelid = to_regclass(format('%I.qs_jobs', v_schema))
     AND q.attname = a.attname AND q.attnum > 0 AND NOT q.attisdropped
    WHERE a.attrelid = 'awa.canonical_jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped;

    IF to_regclass('awa.jobs') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS awa_jobs_view_insert ON awa.jobs;
        DROP TRIGGER IF EXISTS awa_jobs_view_update ON awa.jobs;
        DROP TRIGGER IF EXISTS awa_jobs_view_delete ON awa.jobs;
    END IF;
    IF v_schema IS NULL THEN
        EXECUTE format('CREATE OR REPLACE VIEW awa.jobs AS SELECT %s FROM awa.canonical_jobs',
                       v_cols);
    ELSE
        EXECUTE format('CREATE OR REPLACE VIEW awa.jobs AS SELECT %s FROM awa.canonical_jobs
                        UNION ALL SELECT %s FROM %I.qs_jobs q', v_cols, v_qs_cols, v_schema);
        -- The writes of ad-hoc SQL, on canonical's rows (the column list is baked in).
        EXECUTE format($f$
            CREATE OR REPLACE FUNCTION awa.jobs_view_write() RETURNS trigger
            LANGUAGE plpgsql AS $body$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO awa.canonical_jobs (%1$s) SELECT (NEW).*
                    RETURNING * INTO NEW;
                    RETURN NEW;
                END IF;
                IF TG_OP = 'UPDATE' THEN
                    UPDATE awa.canonical_jobs t SET %2$s FROM (SELECT (NEW).*) n
                    WHERE t.id = OLD.id
                    RETURNING t.* INTO NEW;
                ELSE
                    DELETE FROM awa.canonical_jobs WHERE id = OLD.id;
                END IF;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'job %% is on queue storage: change it through the client, not awa.jobs',
                        OLD.id USING ERRCODE = '55000';
                END IF;
                IF TG_OP = 'UPDATE' THEN
                    RETURN NEW;
                END IF;
                RETURN OLD;
            END $body$;
            $f$, v_cols, v_set);
        CREATE TRIGGER awa_jobs_view_insert INSTEAD OF INSERT ON awa.jobs
            FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_write();
        CREATE TRIGGER awa_jobs_view_update INSTEAD OF UPDATE ON awa.jobs
            FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_write();
        CREATE TRIGGER awa_jobs_view_delete INSTEAD OF DELETE ON awa.jobs
            FOR EACH ROW EXECUTE FUNCTION awa.jobs_view_write();
    END IF;
    -- canonical's defaults, so an INSERT through the view fills what it leaves out as before
    SELECT string_agg(format('ALTER VIEW awa.jobs ALTER COLUMN %I SET DEFAULT %s', a.attname,
                             pg_get_expr(d.adbin, d.adrelid)), '; ')
    INTO v_defaults
    FROM pg_attrdef d
    JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
    WHERE d.adrelid = 'awa.canonical_jobs'::regclass;
    IF v_defaults IS NOT NULL THEN
        EXECUTE v_defaults;
    END IF;
    EXECUTE format('COMMENT ON VIEW awa.jobs IS %L', v_shape);
END $$;

CREATE OR REPLACE FUNCTION awa.refresh_jobs_view_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.refresh_jobs_view();
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS awa_storage_state_jobs_view ON awa.storage_transition_state;
CREATE TRIGGER awa_storage_state_jobs_view
    AFTER INSERT OR UPDATE OR DELETE ON awa.storage_transition_state
    FOR EACH STATEMENT EXECUTE FUNCTION awa.refresh_jobs_view_trigger();
DROP TRIGGER IF EXISTS awa_storage_backends_jobs_view ON awa.runtime_storage_backends;
CREATE TRIGGER awa_storage_backends_jobs_view
    AFTER INSERT OR UPDATE OR DELETE ON awa.runtime_storage_backends
    FOR EACH STATEMENT EXECUTE FUNCTION awa.refresh_jobs_view_trigger();

SELECT awa.refresh_jobs_view();

-- Whoever could read or write the table may do the same through the view (default privileges
-- cover roles granted that way; this covers grants made on the table itself).
DO $$
DECLARE
    a record;
BEGIN
    FOR a IN SELECT x.grantee, x.privilege_type
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) x
             WHERE c.oid = 'awa.canonical_jobs'::regclass AND x.grantee <> c.relowner
               AND x.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') LOOP
        EXECUTE format('GRANT %s ON awa.jobs TO %s', a.privilege_type,
                       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(a.grantee)) END);
    END LOOP;
END $$;
