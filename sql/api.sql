--
-- The API as a client sees it, which both editions must show alike (the
-- portable edition runs this file with this expected output too,
-- test/portable/run.sh): the functions' names, arguments with their
-- defaults, results, volatility, strictness and comments; the tables'
-- columns, defaults, constraints, indexes, triggers and comments; the
-- types' labels; the view's columns (not its text, which each major
-- prints its own way). Not the functions' language, body or settings,
-- which are what an edition is. The portable edition's own helpers
-- (comment "Portable edition, internal: ...") are left out, and a C-only
-- function's comment there starts with "C edition only. ", which is
-- left out too (docs/portable.md).
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result, p.prokind, p.provolatile, p.proisstrict,
       p.proretset, p.prorows, p.proparallel
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND coalesce(obj_description(p.oid, 'pg_proc'), '') NOT LIKE 'Portable edition, internal%'
ORDER BY 1, 2;

SELECT p.oid::regprocedure AS function,
       regexp_replace(obj_description(p.oid, 'pg_proc'), '^C edition only\. ', '') AS comment
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND coalesce(obj_description(p.oid, 'pg_proc'), '') NOT LIKE 'Portable edition, internal%'
ORDER BY 1::text;

SELECT c.relname, c.relkind, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull, pg_get_expr(d.adbin, d.adrelid) AS default, a.attidentity,
       col_description(c.oid, a.attnum) AS comment
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'v')
ORDER BY 1, 3;

SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class') AS comment
FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
ORDER BY 1;

SELECT conrelid::regclass AS relation, conname, pg_get_constraintdef(oid) AS definition
FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace
  AND contype <> 'n'  -- 18 keeps NOT NULL as constraints too; the columns show them
ORDER BY 1::text, 2;

SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace)
ORDER BY 1::text;

SELECT tgname, tgrelid::regclass AS relation, pg_get_triggerdef(t.oid) AS definition,
       obj_description(t.oid, 'pg_trigger') AS comment
FROM pg_trigger t
WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace)
ORDER BY 1;

SELECT t.typname, obj_description(t.oid, 'pg_type') AS comment,
       (SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid) AS labels
FROM pg_type t WHERE t.typnamespace = 'idempotency'::regnamespace AND t.typtype = 'e'
ORDER BY 1;

SELECT obj_description('idempotency'::regnamespace, 'pg_namespace') AS schema_comment;

DROP EXTENSION idempotency;
