--
-- Every object of the extension, and every column of its tables and view,
-- carries a COMMENT (what \d+ and \df+ show an operator).
--
CREATE EXTENSION idempotency;

SELECT pg_describe_object(classid, objid, 0) AS object_without_comment
FROM pg_depend
WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND deptype = 'e'
  AND obj_description(objid, classid::regclass::text) IS NULL
ORDER BY 1;

SELECT c.relname, a.attname AS column_without_comment
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'v')
  AND a.attnum > 0 AND NOT a.attisdropped AND col_description(c.oid, a.attnum) IS NULL
ORDER BY 1, 2;

SELECT count(*) > 0 AS schema_commented FROM pg_namespace
WHERE nspname = 'idempotency' AND obj_description(oid, 'pg_namespace') IS NOT NULL;

DROP EXTENSION idempotency;
