-- Least privilege (issue #19): the role that migrates is not the role that
-- serves (docs/security.md#database-roles).
--
-- The migration role runs these migrations and owns every table
-- (DATABASE_MIGRATION_URL, `onceflow migrate`). The components connect as
-- a login role that is a member of onceflow_runtime (DATABASE_URL), which
-- may read and write the rows of onceflow's tables and nothing else: no
-- DDL, no TRUNCATE, no direct access to partitions, no writes to the
-- migration versions. onceflow_runtime is a cluster-wide group role: it
-- is made here when missing (the migration role then needs CREATEROLE, or
-- an administrator makes it first), and never dropped, since other
-- databases of the cluster may grant to it.
--
-- What the components did that only an owner may do runs inside
-- SECURITY DEFINER functions with a fixed search path: creating and
-- dropping the daily partitions of idempotency_keys and inbox, and of no
-- other table.
--
-- Row-level security on the tables that hold tenants' rows, as defence in
-- depth behind every query's own tenant predicate: a session that sets
-- onceflow.tenant (ingest's reads do, for the caller's tenant, in a
-- read-only transaction) sees and writes only that tenant's rows; one that
-- leaves it unset (the writers: ingest's accept batches, the relay, the
-- projector, operators), every row. FORCE, so the owner is held to it too
-- when it serves (a deployment with one role); superusers and roles with
-- BYPASSRLS are not. A domain's read model opts in with
-- onceflow_tenant_rls('table') in its own migrations. audit_log stays out:
-- no tenant reads it (operators do), and the projector writes it with
-- COPY, which Postgres refuses on a table under row-level security.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'onceflow_runtime') THEN
        CREATE ROLE onceflow_runtime NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL; -- another database of the cluster made it at the same moment
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION onceflow_ensure_daily_partitions(parent text, first_day date, days int)
RETURNS int LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d       date;
    name    text;
    created int := 0;
BEGIN
    -- The runtime role calls this with the owner's rights: only for the
    -- tables partitioned by day.
    IF parent NOT IN ('idempotency_keys', 'inbox') THEN
        RAISE EXCEPTION 'onceflow_ensure_daily_partitions: % is not partitioned by day', parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Two processes creating the same partition at once would collide.
    PERFORM pg_advisory_xact_lock(hashtextextended('onceflow_partitions:' || parent, 0));
    FOR i IN 0 .. days - 1 LOOP
        d := first_day + i;
        name := parent || '_p' || to_char(d, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                name, parent,
                (d::timestamp AT TIME ZONE 'UTC'),
                ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION onceflow_drop_daily_partitions(parent text, cutoff timestamptz)
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    part record;
BEGIN
    IF parent NOT IN ('idempotency_keys', 'inbox') THEN
        RAISE EXCEPTION 'onceflow_drop_daily_partitions: % is not partitioned by day', parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('onceflow_partitions:' || parent, 0));
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent::regclass
          AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        RETURN NEXT part.relname;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- A SECURITY DEFINER function must not find its objects through the
-- caller's search path: pin it to the schema onceflow's tables are in.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION onceflow_ensure_daily_partitions(text, date, int) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION onceflow_drop_daily_partitions(text, timestamptz) SET search_path = %I, pg_temp', current_schema());
END;
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION onceflow_ensure_daily_partitions(text, date, int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION onceflow_drop_daily_partitions(text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION onceflow_ensure_daily_partitions(text, date, int) TO onceflow_runtime;
GRANT EXECUTE ON FUNCTION onceflow_drop_daily_partitions(text, timestamptz) TO onceflow_runtime;

-- onceflow_grant_runtime grants onceflow_runtime what it needs on every
-- table of this schema: rows (SELECT, INSERT, UPDATE, DELETE) of each
-- table, partitioned parents included and their partitions not (a
-- partition read directly would skip its parent's row-level security),
-- and only SELECT of goose's version tables (a component checks that the
-- database is migrated). pipeline/postgres.Migrate calls it after every
-- migration run that applied something, so a domain's new read models
-- get the same; it is idempotent.
-- +goose StatementBegin
CREATE FUNCTION onceflow_grant_runtime() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO onceflow_runtime', current_schema());
    FOR t IN
        SELECT c.oid::regclass AS rel, c.relname LIKE 'goose\_db\_version%' AS versions
        FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relkind IN ('r', 'p') AND NOT c.relispartition
    LOOP
        IF t.versions THEN
            EXECUTE format('GRANT SELECT ON %s TO onceflow_runtime', t.rel);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO onceflow_runtime', t.rel);
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- onceflow_tenant_rls puts tbl (which has a tenant column) under the
-- tenant policy: with onceflow.tenant set, only that tenant's rows are
-- seen and may be written; unset (or empty), every row. A domain's
-- migration calls it for a read model its queries read per tenant.
-- +goose StatementBegin
CREATE FUNCTION onceflow_tenant_rls(tbl regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS onceflow_tenant ON %s', tbl);
    EXECUTE format($f$CREATE POLICY onceflow_tenant ON %s
        USING (coalesce(current_setting('onceflow.tenant', true), '') IN ('', tenant))
        WITH CHECK (coalesce(current_setting('onceflow.tenant', true), '') IN ('', tenant))$f$, tbl);
END;
$$;
-- +goose StatementEnd

-- onceflow_copy_table_access gives target what a CREATE TABLE ... (LIKE
-- source INCLUDING ALL) leaves out: source's owner, its row-level
-- security (enabled, forced, every policy) and its grants. A projection
-- rebuild calls it on each shadow table before the swap, so the rebuilt
-- read model keeps its policies and the runtime role keeps its access.
-- +goose StatementBegin
CREATE FUNCTION onceflow_copy_table_access(source regclass, target regclass) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s record;
    p record;
    g record;
BEGIN
    SELECT relowner, relrowsecurity, relforcerowsecurity, relacl INTO s FROM pg_class WHERE oid = source;
    EXECUTE format('ALTER TABLE %s OWNER TO %I', target, pg_get_userbyid(s.relowner));
    IF s.relrowsecurity THEN
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', target);
    END IF;
    IF s.relforcerowsecurity THEN
        EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', target);
    END IF;
    FOR p IN
        SELECT polname, polpermissive, polroles,
            CASE polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END AS cmd,
            pg_get_expr(polqual, polrelid) AS qual, pg_get_expr(polwithcheck, polrelid) AS check_expr
        FROM pg_policy WHERE polrelid = source
    LOOP
        EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s', p.polname, target,
                CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END, p.cmd,
                (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r)) END, ', ')
                 FROM unnest(p.polroles) AS r))
            || coalesce(' USING (' || p.qual || ')', '')
            || coalesce(' WITH CHECK (' || p.check_expr || ')', '');
    END LOOP;
    FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM aclexplode(s.relacl) AS a WHERE a.grantee <> s.relowner LOOP
        EXECUTE format('GRANT %s ON %s TO %s', g.privilege_type, target,
                CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END)
            || CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END;
    END LOOP;
END;
$$;
-- +goose StatementEnd

SELECT onceflow_tenant_rls('api_keys');
SELECT onceflow_tenant_rls('idempotency_keys');
SELECT onceflow_tenant_rls('command_status');
SELECT onceflow_grant_runtime();

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['api_keys', 'idempotency_keys', 'command_status'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS onceflow_tenant ON %I', t);
        EXECUTE format('ALTER TABLE %I NO FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', t);
    END LOOP;
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM onceflow_runtime', current_schema());
    EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM onceflow_runtime', current_schema());
END;
$$;
-- +goose StatementEnd
DROP FUNCTION onceflow_copy_table_access(regclass, regclass);
DROP FUNCTION onceflow_tenant_rls(regclass);
DROP FUNCTION onceflow_grant_runtime();
REVOKE EXECUTE ON FUNCTION onceflow_ensure_daily_partitions(text, date, int) FROM onceflow_runtime;
REVOKE EXECUTE ON FUNCTION onceflow_drop_daily_partitions(text, timestamptz) FROM onceflow_runtime;
GRANT EXECUTE ON FUNCTION onceflow_ensure_daily_partitions(text, date, int) TO PUBLIC;
GRANT EXECUTE ON FUNCTION onceflow_drop_daily_partitions(text, timestamptz) TO PUBLIC;
-- The functions keep their check of the parent: only these two tables
-- are partitioned by day.
ALTER FUNCTION onceflow_ensure_daily_partitions(text, date, int) SECURITY INVOKER RESET search_path;
ALTER FUNCTION onceflow_drop_daily_partitions(text, timestamptz) SECURITY INVOKER RESET search_path;
