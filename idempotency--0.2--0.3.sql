/* idempotency--0.2--0.3.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit

--
-- Faults between a worker and the database
--
-- A reply that is lost after the server committed a claim (a dropped
-- connection, a pooler restart, a client timeout) used to cost a lease: the
-- worker's retry found its own claim and was told in_progress. A claim now
-- takes a delivery token, a string the caller makes unique to one delivery
-- and reuses only when it retries the same call; a claim whose young record
-- was made by the same delivery gets its own claim back. The record keeps a
-- 64-bit digest of the token and of the verdict it got (run or verify), not
-- the token (SQS's receipt handles run to a kilobyte).
--
-- And a claim that meets another transaction's uncommitted claim of the
-- same key used to wait for that transaction without bound; with
-- wait => false it answers in_progress at once.
--
-- Adding a nullable column without a default rewrites nothing.
--

ALTER TABLE idempotency.operations ADD COLUMN delivery bigint;
COMMENT ON COLUMN idempotency.operations.delivery IS
'Digest (64 bits) of the delivery token given with the claim that holds the current attempt, and of the verdict it got; a retry of that call inside the lease gets the same verdict and attempt. NULL: that claim gave no token';

--
-- claim_operation() gains two parameters. The parameters of a function
-- cannot change in place (CREATE OR REPLACE keeps them), and a second
-- function beside the old one would make every call that leaves the new
-- parameters out ambiguous. So it is dropped and created anew, and what the
-- old one had is carried over: its owner and every grant on it (made again
-- by the owner). The grants are the users' own, not the extension's: they
-- are taken out of pg_init_privs again, so that pg_dump keeps dumping them.
-- An object of the user's that depends on the old function (a view, a
-- function with a SQL-standard body) makes the update fail, and changes
-- nothing.
--

DO $update$
DECLARE
    old_oid   pg_catalog.oid := 'idempotency.claim_operation(text, text, text, text)'::pg_catalog.regprocedure;
    new_oid   pg_catalog.oid;
    old_owner pg_catalog.oid;
    old_acl   pg_catalog.aclitem[];
    init_acl  pg_catalog.aclitem[];
    g         record;
BEGIN
    SELECT p.proowner, p.proacl INTO old_owner, old_acl
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) old_oid;

    DROP FUNCTION idempotency.claim_operation(text, text, text, text);
    CREATE FUNCTION idempotency.claim_operation(
        job_type text,
        operation_key text,
        fingerprint text DEFAULT NULL,
        worker text DEFAULT NULL,
        delivery text DEFAULT NULL,
        wait boolean DEFAULT true)
    RETURNS TABLE (verdict text, attempt integer, result jsonb)
    AS 'MODULE_PATHNAME', 'claim_operation_0_3'
    LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1;
    REVOKE ALL ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) FROM PUBLIC;
    EXECUTE pg_catalog.format('ALTER FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) OWNER TO %I',
                              pg_catalog.pg_get_userbyid(old_owner));
    new_oid := 'idempotency.claim_operation(text, text, text, text, text, boolean)'::pg_catalog.regprocedure;
    SELECT p.proacl INTO init_acl
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) new_oid;

    FOR g IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(old_acl) a
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) old_owner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) TO %s%s',
                                  CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                       ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                                  CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;

    -- what the extension itself grants: owner only, as 0.1 made it
    UPDATE pg_catalog.pg_init_privs
       SET initprivs = init_acl
     WHERE objoid OPERATOR(pg_catalog.=) new_oid
       AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND objsubid OPERATOR(pg_catalog.=) 0;
END
$update$;

COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop). delivery: a token unique to this delivery, reused only to retry this call (a retry after a lost reply gets its own claim back). wait => false: in_progress at once instead of waiting for another transaction''s uncommitted claim of the key. A caller without the job type''s worker_role is refused (42501)';

--
-- Batches: many keys of one job type in one call, so in one commit. Each
-- key gets exactly the single call's answer; the keys are taken in one
-- order (by their bytes) whatever order they come in, so two batches that
-- share keys never deadlock; a record that refuses a completion or a
-- release is reported on its row. At most 1000 keys per call.
--

CREATE FUNCTION idempotency.claim_operations(
    job_type text,
    operation_keys text[],
    fingerprints text[] DEFAULT NULL,
    worker text DEFAULT NULL,
    deliveries text[] DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (operation_key text, verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) IS
'Claim many operations of one job type in one call (at most 1000): one row per key, in the order given, each with the verdict claim_operation would give it. fingerprints and deliveries are parallel to operation_keys (NULL: none). A key given twice is answered as two deliveries would be (run, then in_progress)';

CREATE FUNCTION idempotency.complete_operations(
    job_type text,
    operation_keys text[],
    attempts integer[],
    results jsonb[] DEFAULT NULL)
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
AS 'MODULE_PATHNAME', 'complete_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) IS
'Complete many operations of one job type in one call (at most 1000): one row per key, in the order given: done (now, or already by this attempt), or the SQLSTATE and message of the refusal (ID003 superseded, ID004 no record, ID005 wrong state), which fails only that key';

CREATE FUNCTION idempotency.release_operations(
    job_type text,
    operation_keys text[],
    attempts integer[])
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
AS 'MODULE_PATHNAME', 'release_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.release_operations(text, text[], integer[]) IS
'Release many operations of one job type in one call (at most 1000): one row per key, in the order given: done, or the SQLSTATE and message of the refusal, which fails only that key';

REVOKE ALL ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operations(text, text[], integer[]) FROM PUBLIC;
