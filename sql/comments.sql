--
-- Every object of the extension, and every column of its tables and view,
-- carries a COMMENT (what \d+ and \df+ show an operator).
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

-- From PostgreSQL 17 on, the row type of each table and view, and the array
-- type of each type, are extension members too. They are made implicitly
-- with their table or type, which carries the comment, and \dT lists none
-- of them: left out, so that every major answers alike.
SELECT pg_describe_object(d.classid, d.objid, 0) AS object_without_comment
FROM pg_depend d
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND d.deptype = 'e'
  AND obj_description(d.objid, d.classid::regclass::text) IS NULL
  AND NOT EXISTS (
      SELECT FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
      WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
        AND (t.typcategory = 'A' OR c.relkind IN ('r', 'v', 'm', 'p', 'f')))
ORDER BY 1;

SELECT c.relname, a.attname AS column_without_comment
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'v')
  AND a.attnum > 0 AND NOT a.attisdropped AND col_description(c.oid, a.attnum) IS NULL
ORDER BY 1, 2;

SELECT count(*) > 0 AS schema_commented FROM pg_namespace
WHERE nspname = 'idempotency' AND obj_description(oid, 'pg_namespace') IS NOT NULL;

DROP EXTENSION idempotency;
