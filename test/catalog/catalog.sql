--
-- test/catalog/catalog.sql: the catalog of the idempotency extension in the
-- current database, as canonical text: one line per fact, each line naming
-- its object, no OIDs, sorted. Two databases that print the same text have
-- the same extension, whatever scripts built it (test/catalog/run.sh runs
-- it on a fresh install and on 0.1 updated to the default version).
--
--   psql -X -At -v ON_ERROR_STOP=1 -f test/catalog/catalog.sql
--
-- What it prints, per object of the extension's schema(s) (the schemas that
-- are members of the extension) and of the extension itself:
--   extension   owner, schema, relocatable; extconfig/extcondition (what
--               pg_dump dumps: tables by name, conditions, in order); the
--               member objects (pg_depend deptype 'e'); a member of a kind
--               this file does not describe in detail prints an
--               "UNCOMPARED" line, which run.sh refuses
--   schema      owner, ACL, comment
--   type        kind, category, owner, ACL, array type, base type, enum
--               labels in their order, domain default and not null
--   relation    kind, owner, persistence, options, ACL, replica identity,
--               row security, access method; columns (number, name, type
--               with typmod, not null, default expression, identity,
--               generated, collation, storage, compression, statistics
--               target, options, ACL, dropped); sequence parameters
--               (pg_sequence) and state; views (pg_get_viewdef); indexes
--               (pg_get_indexdef and flags)
--   constraint  pg_get_constraintdef and its flags
--   trigger     pg_get_triggerdef, enabled state (internal ones counted)
--   rule        pg_get_ruledef; policies; statistics objects
--   function    kind, owner, language, arguments and result (with
--               defaults), strict, volatility, parallel safety, security
--               definer, leakproof, cost, rows, support function, settings
--               (proconfig), probin, the body (prosrc, line by line, and
--               the SQL-standard body), ACL
--   every comment (pg_description), initial privilege (pg_init_privs),
--   dependency (pg_depend) and shared dependency (pg_shdepend) that
--   involves an object made after initdb (OID >= 16384): in a fresh
--   database of a throwaway cluster, the extension's. This session's own
--   temp schema is left out.
--
-- Toast relations are named after their table's OID (pg_toast_16384); they
-- are printed as pg_toast.pg_toast_<the table's name>. The column option
-- pg_attver=N that 15.20 (this host's) writes on every column (N differs from
-- one CREATE TABLE to the next) is printed as pg_attver=*.
--
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
-- a big query: JIT would compile it for seconds, for 1 ms of work
SET jit = off;
SET search_path = pg_catalog, pg_temp;
SET extra_float_digits = 3;
SET DateStyle = ISO;
SET IntervalStyle = postgres;
\pset format unaligned
\pset tuples_only on
\pset pager off
\pset null '<null>'

-- pg_describe_object without OIDs: a toast relation by its table's name;
-- a missing object (a dangling catalog row) by its catalog alone
CREATE FUNCTION pg_temp.d(classid oid, objid oid, objsubid integer) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := pg_describe_object(classid, objid, objsubid);
    m text[];
BEGIN
    IF objid IS NULL OR objid = 0 THEN
        RETURN NULL;
    END IF;
    IF t IS NULL THEN
        RETURN format('<missing object of %s>', classid::regclass);
    END IF;
    m := regexp_match(t, 'pg_toast_(\d+)');
    IF m IS NOT NULL THEN
        t := regexp_replace(t, 'pg_toast_' || m[1] || '(?!\d)',
                            'pg_toast_<' || COALESCE((SELECT c.oid::regclass::text FROM pg_class c
                                                      WHERE c.oid = m[1]::oid), '?') || '>', 'g');
    END IF;
    RETURN t;
END
$$;

-- objects this test looks at: made after initdb, not in this session's
-- temp schema (pg_temp.d above)
CREATE FUNCTION pg_temp.mine(classid oid, objid oid) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT objid >= 16384
   AND NOT (classid = 'pg_proc'::regclass
            AND EXISTS (SELECT FROM pg_proc p WHERE p.oid = objid
                        AND p.pronamespace = pg_my_temp_schema()))
   AND NOT (classid = 'pg_namespace'::regclass
            AND objid IN (pg_my_temp_schema(),
                          (SELECT n.oid FROM pg_namespace n
                           WHERE n.nspname = 'pg_toast_temp_' || substr(pg_my_temp_schema()::regnamespace::text, 9))))
$$;

-- one body per line, each line prefixed: what a diff shows stays readable
CREATE FUNCTION pg_temp.lines(prefix text, body text) RETURNS SETOF text
LANGUAGE sql IMMUTABLE AS $$
SELECT prefix || ' line ' || lpad(n::text, 4, '0') || '| ' || l
FROM regexp_split_to_table(body, E'\n') WITH ORDINALITY AS s(l, n)
WHERE body IS NOT NULL ORDER BY n
$$;

-- ext_nsp: the extension's own schemas
WITH ext_nsp AS (
    SELECT d.objid AS oid
    FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
    WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
      AND d.classid = 'pg_namespace'::regclass AND e.extname = 'idempotency')
SELECT x FROM (
-- extension
SELECT format('extension %I: owner %s, schema %s, relocatable %s, extversion <not compared>',
              e.extname, e.extowner::regrole, e.extnamespace::regnamespace, e.extrelocatable) AS x
FROM pg_extension e WHERE e.extname = 'idempotency'
UNION ALL
SELECT format('extension %I: extconfig %s: %s condition %L',
              e.extname, u.n, u.c::regclass, u.cond)
FROM pg_extension e,
     unnest(e.extconfig, e.extcondition) WITH ORDINALITY AS u(c, cond, n)
WHERE e.extname = 'idempotency'
UNION ALL
SELECT format('extension %I: member %s', e.extname, pg_temp.d(d.classid, d.objid, d.objsubid))
FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'idempotency'
UNION ALL
SELECT format('UNCOMPARED: member %s (a %s; test/catalog/catalog.sql does not describe this kind of object)',
              pg_temp.d(d.classid, d.objid, d.objsubid), d.classid::regclass)
FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'idempotency'
  AND (d.classid NOT IN ('pg_namespace'::regclass, 'pg_class'::regclass, 'pg_type'::regclass, 'pg_proc'::regclass)
       OR (d.classid = 'pg_class'::regclass AND d.objid NOT IN (SELECT c.oid FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid))
       OR (d.classid = 'pg_type'::regclass AND d.objid NOT IN (SELECT t.oid FROM pg_type t JOIN ext_nsp n ON t.typnamespace = n.oid))
       OR (d.classid = 'pg_proc'::regclass AND d.objid NOT IN (SELECT p.oid FROM pg_proc p JOIN ext_nsp n ON p.pronamespace = n.oid)))

-- schema
UNION ALL
SELECT format('schema %I: owner %s, acl %s', s.nspname, s.nspowner::regrole, s.nspacl)
FROM pg_namespace s JOIN ext_nsp n ON s.oid = n.oid

-- types
UNION ALL
SELECT format('type %s: kind %s, category %s, owner %s, acl %s, array type %s, element %s, relation %s, base %s, not null %s, default %s, collation %s, input %s',
              t.oid::regtype, t.typtype, t.typcategory, t.typowner::regrole, t.typacl,
              NULLIF(t.typarray, 0)::regtype, NULLIF(t.typelem, 0)::regtype,
              pg_temp.d('pg_class'::regclass, NULLIF(t.typrelid, 0), 0),
              CASE WHEN t.typbasetype <> 0 THEN format_type(t.typbasetype, t.typtypmod) END,
              t.typnotnull, t.typdefault, NULLIF(t.typcollation, 0)::regcollation, t.typinput)
FROM pg_type t JOIN ext_nsp n ON t.typnamespace = n.oid
UNION ALL
SELECT format('type %s: enum labels %s', t.oid::regtype,
              (SELECT string_agg(quote_literal(l.enumlabel), ', ' ORDER BY l.enumsortorder)
               FROM pg_enum l WHERE l.enumtypid = t.oid))
FROM pg_type t JOIN ext_nsp n ON t.typnamespace = n.oid
WHERE t.typtype = 'e'

-- relations
UNION ALL
SELECT format('relation %s: kind %s, owner %s, persistence %s, options %s, acl %s, replica identity %s, row security %s/%s, access method %s, partition %s, tablespace %s, of type %s',
              c.oid::regclass, c.relkind, c.relowner::regrole, c.relpersistence, c.reloptions,
              c.relacl, c.relreplident, c.relrowsecurity, c.relforcerowsecurity,
              (SELECT a.amname FROM pg_am a WHERE a.oid = c.relam), c.relispartition,
              NULLIF(c.reltablespace, 0), NULLIF(c.reloftype, 0)::regtype)
FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid
UNION ALL
SELECT format('relation %s: column %s %I: type %s, not null %s, default %s, identity %L, generated %L, collation %s, storage %s, compression %L, statistics target %s, options %s, fdw options %s, acl %s, dropped %s, local %s, inherited %s, missing value %s',
              c.oid::regclass, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
              a.attnotnull,
              pg_get_expr(ad.adbin, ad.adrelid), a.attidentity, a.attgenerated,
              NULLIF(a.attcollation, 0)::regcollation, a.attstorage, a.attcompression,
              a.attstattarget,
              (SELECT array_agg(regexp_replace(o, '^pg_attver=.*', 'pg_attver=*') ORDER BY o)
               FROM unnest(a.attoptions) AS o),
              a.attfdwoptions, a.attacl, a.attisdropped,
              a.attislocal, a.attinhcount, a.atthasmissing)
FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
UNION ALL
SELECT format('relation %s: sequence of type %s, start %s, increment %s, max %s, min %s, cache %s, cycle %s, last value %s, owned by %s',
              c.oid::regclass, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmax,
              s.seqmin, s.seqcache, s.seqcycle,
              (SELECT ps.last_value FROM pg_sequences ps
               WHERE ps.schemaname = n2.nspname AND ps.sequencename = c.relname),
              (SELECT string_agg(pg_temp.d(dep.refclassid, dep.refobjid, dep.refobjsubid) || ' (' || dep.deptype::text || ')', ', ')
               FROM pg_depend dep WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
                 AND dep.refclassid = 'pg_class'::regclass AND dep.deptype IN ('a', 'i')))
FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid
JOIN pg_namespace n2 ON n2.oid = c.relnamespace
JOIN pg_sequence s ON s.seqrelid = c.oid
UNION ALL
SELECT l FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid,
     pg_temp.lines(format('relation %s: view definition', c.oid::regclass), pg_get_viewdef(c.oid)) AS l
WHERE c.relkind IN ('v', 'm')
UNION ALL
SELECT format('relation %s: index %s, primary %s, unique %s, nulls not distinct %s, exclusion %s, immediate %s, clustered %s, valid %s, ready %s, live %s, replica identity %s',
              i.indexrelid::regclass, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique,
              i.indnullsnotdistinct,
              i.indisexclusion, i.indimmediate, i.indisclustered, i.indisvalid, i.indisready,
              i.indislive, i.indisreplident)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN ext_nsp n ON c.relnamespace = n.oid

-- constraints (of tables and of domains)
UNION ALL
SELECT format('constraint %I on %s: type %s, %s, deferrable %s, deferred %s, validated %s, local %s, inherited %s, no inherit %s, index %s',
              co.conname,
              COALESCE(NULLIF(co.conrelid, 0)::regclass::text, 'domain ' || NULLIF(co.contypid, 0)::regtype::text),
              co.contype, pg_get_constraintdef(co.oid), co.condeferrable, co.condeferred,
              co.convalidated, co.conislocal, co.coninhcount, co.connoinherit,
              NULLIF(co.conindid, 0)::regclass)
FROM pg_constraint co
WHERE co.connamespace IN (SELECT oid FROM ext_nsp)
   OR co.conrelid IN (SELECT c.oid FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid)

-- triggers
UNION ALL
SELECT format('trigger %I on %s: %s, enabled %s', t.tgname, t.tgrelid::regclass,
              pg_get_triggerdef(t.oid), t.tgenabled)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ext_nsp n ON c.relnamespace = n.oid
WHERE NOT t.tgisinternal
UNION ALL
SELECT format('relation %s: %s internal triggers', c.oid::regclass,
              (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgisinternal))
FROM pg_class c JOIN ext_nsp n ON c.relnamespace = n.oid
WHERE c.relkind IN ('r', 'p')

-- rules, policies, statistics objects
UNION ALL
SELECT l FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN ext_nsp n ON c.relnamespace = n.oid,
     pg_temp.lines(format('rule %I on %s: enabled %s, definition', r.rulename, c.oid::regclass, r.ev_enabled),
                   pg_get_ruledef(r.oid)) AS l
UNION ALL
SELECT format('policy %I on %s: command %s, permissive %s, roles %s, using %s, check %s',
              p.polname, p.polrelid::regclass, p.polcmd, p.polpermissive,
              (SELECT string_agg(CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END, ', ' ORDER BY 1)
               FROM unnest(p.polroles) AS r),
              pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid JOIN ext_nsp n ON c.relnamespace = n.oid
UNION ALL
SELECT format('statistics %s: %s', s.oid, pg_get_statisticsobjdef(s.oid))
FROM pg_statistic_ext s JOIN ext_nsp n ON s.stxnamespace = n.oid

-- functions and procedures
UNION ALL
SELECT format('function %s: kind %s, owner %s, language %s, arguments (%s), identity arguments (%s), result %s, returns set %s, nargs %s, ndefaults %s, variadic %s, strict %s, volatility %s, parallel %s, security definer %s, leakproof %s, cost %s, rows %s, support %s, settings %s, transforms %s, probin %L, acl %s',
              p.oid::regprocedure, p.prokind, p.proowner::regrole,
              (SELECT l.lanname FROM pg_language l WHERE l.oid = p.prolang),
              pg_get_function_arguments(p.oid), pg_get_function_identity_arguments(p.oid),
              pg_get_function_result(p.oid), p.proretset, p.pronargs, p.pronargdefaults,
              NULLIF(p.provariadic, 0)::regtype, p.proisstrict, p.provolatile, p.proparallel,
              p.prosecdef, p.proleakproof, p.procost, p.prorows, NULLIF(p.prosupport, 0)::regproc,
              p.proconfig, p.protrftypes, p.probin, p.proacl)
FROM pg_proc p JOIN ext_nsp n ON p.pronamespace = n.oid
UNION ALL
SELECT l FROM pg_proc p JOIN ext_nsp n ON p.pronamespace = n.oid,
     pg_temp.lines(format('function %s: prosrc', p.oid::regprocedure), p.prosrc) AS l
UNION ALL
SELECT l FROM pg_proc p JOIN ext_nsp n ON p.pronamespace = n.oid,
     pg_temp.lines(format('function %s: SQL-standard body', p.oid::regprocedure),
                   CASE WHEN p.prosqlbody IS NOT NULL THEN pg_get_function_sqlbody(p.oid) END) AS l

-- every comment, initial privilege and dependency of an object made
-- after initdb
UNION ALL
SELECT format('comment on %s: %L', pg_temp.d(de.classoid, de.objoid, de.objsubid), de.description)
FROM pg_description de WHERE pg_temp.mine(de.classoid, de.objoid)
UNION ALL
SELECT format('initial privileges of %s: type %s, %s', pg_temp.d(ip.classoid, ip.objoid, ip.objsubid),
              ip.privtype, ip.initprivs)
FROM pg_init_privs ip WHERE pg_temp.mine(ip.classoid, ip.objoid)
UNION ALL
SELECT format('depend: %s -> %s (%s)', pg_temp.d(dp.classid, dp.objid, dp.objsubid),
              pg_temp.d(dp.refclassid, dp.refobjid, dp.refobjsubid), dp.deptype)
FROM pg_depend dp
WHERE (pg_temp.mine(dp.classid, dp.objid) OR pg_temp.mine(dp.refclassid, dp.refobjid))
UNION ALL
SELECT format('shared depend: %s -> %s (%s)', pg_temp.d(sd.classid, sd.objid, sd.objsubid),
              CASE sd.refclassid WHEN 'pg_authid'::regclass THEN 'role ' || sd.refobjid::regrole::text
                   ELSE pg_temp.d(sd.refclassid, sd.refobjid, 0) END, sd.deptype)
FROM pg_shdepend sd
WHERE sd.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND pg_temp.mine(sd.classid, sd.objid)
) AS facts
ORDER BY x COLLATE "C";
