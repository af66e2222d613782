/* idempotency--0.4--0.5.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5'" to load this file. \quit

--
-- Which edition answers (0.5)
--
-- idempotency comes in two editions with one SQL API: this one, the C
-- extension, and the portable edition (SQL and PL/pgSQL, for managed
-- services: installed with pg_tle or as a plain script, which leaves no
-- pg_extension row). edition() is the one way a client (the helpers, the
-- sign-off runner) tells which edition it talks to and its version; the
-- portable edition defines the same function, answering 'portable'.
--
-- It takes over the EXECUTE grants of claim_operation() (as use_in_place()
-- did in 0.4), as the users' own grants (pg_init_privs holds the owner's
-- only, so pg_dump dumps them): a worker role that could claim can ask.
--

CREATE FUNCTION idempotency.edition(OUT edition text, OUT version text)
RETURNS record LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'c'::pg_catalog.text, '0.5'::pg_catalog.text $$;
COMMENT ON FUNCTION idempotency.edition() IS
'Which edition of idempotency answers in this database and its version: edition c (the C extension) or portable (SQL and PL/pgSQL, installed with pg_tle or as a plain script); the one way a client tells them apart';

REVOKE ALL ON FUNCTION idempotency.edition() FROM PUBLIC;

-- the grants of claim_operation(), carried over (see above)
DO $update$
DECLARE
    old_oid   pg_catalog.oid := 'idempotency.claim_operation(text, text, text, text, text, boolean)'::pg_catalog.regprocedure;
    new_oid   pg_catalog.oid := 'idempotency.edition()'::pg_catalog.regprocedure;
    old_acl   pg_catalog.aclitem[];
    old_owner pg_catalog.oid;
    init_acl  pg_catalog.aclitem[];
    g         record;
BEGIN
    SELECT p.proacl, p.proowner INTO old_acl, old_owner
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) old_oid;
    SELECT p.proacl INTO init_acl
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) new_oid;
    FOR g IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(old_acl) a
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) old_owner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION idempotency.edition() TO %s%s',
                                  CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                       ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                                  CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    -- what the extension itself grants: owner only
    UPDATE pg_catalog.pg_init_privs
       SET initprivs = init_acl
     WHERE objoid OPERATOR(pg_catalog.=) new_oid
       AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND objsubid OPERATOR(pg_catalog.=) 0;
END
$update$;
