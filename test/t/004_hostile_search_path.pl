# Security: the extension's functions run their statements with the rights
# of the owner of its tables (a superuser here), so a caller must not be
# able to make them call the caller's own code. A plain worker role plants,
# in a schema of its own put ahead of pg_catalog on its search_path,
# look-alikes of every operator and function the extension's statements
# use (=, <=, +, - on text, integer, timestamptz, interval, the status enum
# and tid; bigint and interval arithmetic; count, now, clock_timestamp,
# pg_sleep, pg_relation_size, current_setting, date_part, coalesce-like
# helpers), tables named like the extension's, and temporary tables too. Each look-alike
# returns the right answer (so a capture would go unnoticed by the caller)
# but counts its call in a sequence, and records the user it ran as. Then
# the worker calls every function of the extension, on every path
# (verdicts, takeovers, refusals), and CALLs the paced purge
# idempotency.purge(), a PL/pgSQL procedure that runs with the caller's
# rights and search_path (it cannot have a SET clause); the count must stay
# 0. The plant is shown to work: the worker's own unqualified `=` is
# captured.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('hostile');
$node->init;
$node->append_conf('postgresql.conf', "log_statement = none\n");
$node->start;

$node->safe_psql('postgres', q{
    CREATE EXTENSION idempotency;
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention) VALUES
        ('hold', '10 minutes', 'hold', NULL, '1 hour'),
        ('retry', '10 minutes', 'retry', 5, NULL),
        ('skip', '10 minutes', 'skip', NULL, '1 hour'),
        ('lookup', '10 minutes', 'lookup', NULL, NULL);
    CREATE ROLE mallory LOGIN;
    GRANT USAGE ON SCHEMA idempotency TO mallory;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO mallory;
    GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA idempotency TO mallory;
    GRANT SELECT ON idempotency.job_type_stats TO mallory;
    GRANT CREATE ON DATABASE postgres TO mallory;
    -- expired records over several pages, for the paced purge's batches
    -- and pauses
    INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                                        claimed_at, heartbeat_at, completed_at)
    SELECT 'hold', 'filler-' || g, 'completed', 1,
           now() - interval '3 hours', now() - interval '3 hours', now() - interval '3 hours'
    FROM generate_series(1, 300) g;
});

# mallory's plant: every look-alike counts its call and answers correctly
my $plant = q{
    CREATE SCHEMA evil;
    CREATE SEQUENCE evil.calls;
    CREATE TABLE evil.callers (who name, what text);
    GRANT USAGE ON SCHEMA evil TO PUBLIC;
    GRANT USAGE, UPDATE ON SEQUENCE evil.calls TO PUBLIC;
    GRANT INSERT ON evil.callers TO PUBLIC;
    CREATE FUNCTION evil.caught(what text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_catalog.nextval('evil.calls');
        INSERT INTO evil.callers VALUES (current_user, what);
    END $$;
};
my @ops = (
	[ '=', 'text', 'text', 'boolean', 'pg_catalog.texteq' ],
	[ '=', 'integer', 'integer', 'boolean', 'pg_catalog.int4eq' ],
	[ '=', 'timestamptz', 'timestamptz', 'boolean', 'pg_catalog.timestamptz_eq' ],
	[ '<=', 'timestamptz', 'timestamptz', 'boolean', 'pg_catalog.timestamptz_le' ],
	[ '<', 'timestamptz', 'timestamptz', 'boolean', 'pg_catalog.timestamptz_lt' ],
	[ '>=', 'timestamptz', 'timestamptz', 'boolean', 'pg_catalog.timestamptz_ge' ],
	[ '+', 'timestamptz', 'interval', 'timestamptz', 'pg_catalog.timestamptz_pl_interval' ],
	[ '-', 'timestamptz', 'interval', 'timestamptz', 'pg_catalog.timestamptz_mi_interval' ],
	[ '-', 'timestamptz', 'timestamptz', 'interval', 'pg_catalog.timestamptz_mi' ],
	[ '+', 'integer', 'integer', 'integer', 'pg_catalog.int4pl' ],
	[ '<', 'integer', 'integer', 'boolean', 'pg_catalog.int4lt' ],
	[ '=', 'tid', 'tid', 'boolean', 'pg_catalog.tideq' ],
	[ '||', 'text', 'text', 'text', 'pg_catalog.textcat' ],
	[ '>', 'interval', 'interval', 'boolean', 'pg_catalog.interval_gt' ],
	[ '=', 'idempotency.operation_status', 'idempotency.operation_status', 'boolean', 'pg_catalog.enum_eq' ],
	[ '=', 'idempotency.stale_policy', 'idempotency.stale_policy', 'boolean', 'pg_catalog.enum_eq' ],
	[ '=', 'jsonb', 'jsonb', 'boolean', 'pg_catalog.jsonb_eq' ],
	# the paced purge's arithmetic
	[ '<', 'bigint', 'bigint', 'boolean', 'pg_catalog.int8lt' ],
	[ '>', 'bigint', 'integer', 'boolean', 'pg_catalog.int84gt' ],
	[ '+', 'bigint', 'bigint', 'bigint', 'pg_catalog.int8pl' ],
	[ '+', 'bigint', 'integer', 'bigint', 'pg_catalog.int84pl' ],
	[ '/', 'bigint', 'bigint', 'bigint', 'pg_catalog.int8div' ],
	[ '<', 'interval', 'interval', 'boolean', 'pg_catalog.interval_lt' ],
	[ '>', 'double precision', 'double precision', 'boolean', 'pg_catalog.float8gt' ],
);
my $n = 0;
for my $op (@ops)
{
	my ($name, $l, $r, $ret, $impl) = @$op;
	$n++;
	$plant .= qq{
    CREATE FUNCTION evil.op$n(a $l, b $r) RETURNS $ret LANGUAGE plpgsql AS \$\$
    BEGIN
        PERFORM evil.caught('$l $name $r');
        RETURN $impl(a, b);
    END \$\$;
    CREATE OPERATOR evil.$name (LEFTARG = $l, RIGHTARG = $r, FUNCTION = evil.op$n);
};
}
# functions by the names of built-ins, and tables by the extension's names
$plant .= q{
    CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('now()'); RETURN pg_catalog.now(); END $$;
    CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('clock_timestamp()'); RETURN pg_catalog.clock_timestamp(); END $$;
    CREATE FUNCTION evil.text(idempotency.operation_status) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('text(status)'); RETURN $1::pg_catalog.text; END $$;
    CREATE FUNCTION evil.text(idempotency.stale_policy) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('text(policy)'); RETURN $1::pg_catalog.text; END $$;
    CREATE FUNCTION evil.name(text) RETURNS name LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('name(text)'); RETURN $1::pg_catalog.name; END $$;
    CREATE FUNCTION evil.octet_length(text) RETURNS integer LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('octet_length'); RETURN pg_catalog.octet_length($1); END $$;
    CREATE FUNCTION evil.escape_json(text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('escape_json'); RETURN $1; END $$;
    CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('pg_notify'); END $$;
    CREATE FUNCTION evil.pg_relation_size(regclass) RETURNS bigint LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('pg_relation_size'); RETURN pg_catalog.pg_relation_size($1); END $$;
    CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('current_setting'); RETURN pg_catalog.current_setting($1); END $$;
    CREATE FUNCTION evil.date_part(text, interval) RETURNS double precision LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('date_part'); RETURN pg_catalog.date_part($1, $2); END $$;
    CREATE FUNCTION evil.pg_sleep(double precision) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('pg_sleep'); PERFORM pg_catalog.pg_sleep($1); END $$;
    CREATE FUNCTION evil.pg_sleep_for(interval) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN PERFORM evil.caught('pg_sleep_for'); PERFORM pg_catalog.pg_sleep_for($1); END $$;
    CREATE TABLE evil.operations (job_type text, operation_key text, status text, attempt integer,
        claimed_at timestamptz, heartbeat_at timestamptz, completed_at timestamptz,
        claimed_by text, fingerprint text, result jsonb);
    CREATE TABLE evil.job_types (job_type text, lease interval, stale_policy text,
        max_attempts integer, retention interval);
    CREATE TABLE evil.resolutions (LIKE evil.operations);
    -- a job type the real table does not have; a claim that read this
    -- table would answer differently
    INSERT INTO evil.job_types VALUES ('evil', '1 second', 'retry', NULL, NULL);
    CREATE TRIGGER evil_ops BEFORE INSERT OR UPDATE OR DELETE ON evil.operations
        FOR EACH STATEMENT EXECUTE FUNCTION evil.trap();
};
# the trigger function must exist before the trigger
$plant =~ s/(    CREATE TABLE evil\.operations)/    CREATE FUNCTION evil.trap() RETURNS trigger LANGUAGE plpgsql AS \$\$
    BEGIN PERFORM evil.caught('evil.operations written'); RETURN NULL; END \$\$;
$1/;

my ($out, $err) = ('', '');
my $mallory = $node->connstr('postgres') . ' user=mallory';
my $rc = $node->psql('postgres', $plant, connstr => $mallory, stdout => \$out, stderr => \$err);
is($rc, 0, 'mallory planted ' . scalar(@ops) . ' operators, 13 functions and 3 tables in schema evil')
  or diag($err);

sub calls
{
	return $node->safe_psql('postgres',
		q{SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM evil.calls});
}

# the plant works: mallory's own unqualified = is captured
$node->psql('postgres', q{SET search_path = evil, pg_catalog; SELECT 'a'::text = 'a'::text;},
	connstr => $mallory);
is(calls(), '1', "the plant works: the caller's own unqualified = text is evil's");
$node->safe_psql('postgres', q{ALTER SEQUENCE evil.calls RESTART; TRUNCATE evil.callers});

# Every function, every path, in a new session of mallory's whose
# search_path puts evil (and pg_temp) first; the plans are prepared in this
# session, under this search_path. Errors are expected on the refused
# paths; psql goes on.
my $session = q{
SET search_path = pg_temp, evil, pg_catalog;
CREATE TEMP TABLE operations (LIKE evil.operations);
CREATE TEMP TABLE job_types (LIKE evil.job_types);
INSERT INTO job_types VALUES ('evil', '1 second', 'retry', NULL, NULL);
-- verdicts: run, completed, in_progress, verify, skipped, held, run after release
SELECT * FROM idempotency.claim_operation('hold', 'A', 'fp', 'mallory');
SELECT idempotency.complete_operation('hold', 'A', 1, '{"ok": true}');
SELECT idempotency.complete_operation('hold', 'A', 1, '{"ok": true}');
SELECT * FROM idempotency.claim_operation('hold', 'A', 'fp', 'mallory');
SELECT * FROM idempotency.claim_operation('hold', 'B');
SELECT * FROM idempotency.claim_operation('hold', 'B');
SELECT idempotency.extend_lease('hold', 'B', 1);
SELECT idempotency.release_operation('hold', 'B', 1);
SELECT idempotency.release_operation('hold', 'B', 1);
SELECT * FROM idempotency.claim_operation('hold', 'B');
SELECT * FROM idempotency.claim_operation('retry', 'R');
SELECT * FROM idempotency.claim_operation('lookup', 'L');
SELECT * FROM idempotency.claim_operation('skip', 'S');
SELECT * FROM idempotency.claim_operation('hold', 'H');
SELECT * FROM idempotency.claim_operation('evil', 'E');
SELECT * FROM idempotency.claim_operation('hold', 'A', 'other-fp');
SELECT * FROM idempotency.claim_operation('hold', repeat('k', 2000));
SELECT idempotency.complete_operation('hold', 'nobody', 1);
SELECT idempotency.complete_operation('hold', 'B', 1);
SELECT idempotency.complete_operation('hold', 'B', NULL);
SELECT idempotency.resolve_operation('hold', 'H', 'maybe');
SELECT count(*) FROM idempotency.stale_claims();
SELECT count(*) FROM idempotency.stale_claims('hold');
SELECT count(*) FROM idempotency.job_type_stats;
\echo paced purge:
CALL idempotency.purge(1, '1 millisecond');
SELECT idempotency.purge_operations(2);
};
$node->psql('postgres', $session, connstr => $mallory, on_error_stop => 0,
	stdout => \$out, stderr => \$err);

# the leases run out (the owner ages the records), and the stale paths run
# in another session of mallory's
$node->safe_psql('postgres', q{
    UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour',
        heartbeat_at = heartbeat_at - interval '1 hour',
        completed_at = completed_at - interval '2 hours'});
my $stale = q{
SET search_path = evil, pg_catalog;
SELECT count(*) FROM idempotency.stale_claims();
SELECT * FROM idempotency.claim_operation('retry', 'R');
SELECT * FROM idempotency.claim_operation('lookup', 'L');
SELECT * FROM idempotency.claim_operation('skip', 'S');
SELECT * FROM idempotency.claim_operation('hold', 'H');
SELECT idempotency.complete_operation('retry', 'R', 1);
SELECT idempotency.complete_operation('retry', 'R', 2, '[1, 2]');
SELECT idempotency.resolve_operation('hold', 'H', 'completed', 'checked the mailbox');
SELECT idempotency.resolve_operation('skip', 'S', 'retry');
SELECT * FROM idempotency.claim_operation('skip', 'S');
\echo paced purge:
CALL idempotency.purge(1, '1 millisecond');
SELECT idempotency.purge_operations();
SELECT * FROM idempotency.job_type_stats;
};
my ($out2, $err2) = ('', '');
$node->psql('postgres', $stale, connstr => $mallory, on_error_stop => 0,
	stdout => \$out2, stderr => \$err2);

# the trigger that guards job types, fired by the owner under the same path
my ($out3, $err3) = ('', '');
$node->psql('postgres', q{
SET search_path = evil, pg_catalog;
INSERT INTO idempotency.job_types (job_type) VALUES ('unused');
DELETE FROM idempotency.job_types WHERE job_type OPERATOR(pg_catalog.=) 'unused';
DELETE FROM idempotency.job_types WHERE job_type OPERATOR(pg_catalog.=) 'hold';
}, on_error_stop => 0, stdout => \$out3, stderr => \$err3);
like($err3, qr/job type "hold" still has operations/, 'the job type guard ran under the hostile search_path');

is(calls(), '0', 'not one look-alike was called by the extension')
  or diag($node->safe_psql('postgres', 'SELECT who, what FROM evil.callers'));
is($node->safe_psql('postgres', 'SELECT count(*) FROM evil.operations'), '0',
	"nothing was written to mallory's tables");
unlike($err . $err2, qr/evil\.|XX000|internal error/i, 'no error mentions the plant');

# and the calls did what they should: the records are the extension's
is($node->safe_psql('postgres', q{
    SELECT string_agg(job_type || '/' || operation_key || '/' || status || '/' || attempt, ' '
                      ORDER BY job_type, operation_key)
    FROM idempotency.operations}),
	'hold/B/claimed/2 hold/H/completed/1 lookup/L/claimed/2 retry/R/completed/2 skip/S/claimed/2',
	'the records are what the protocol says (A purged after its retention)');
like($out2, qr/^verify\|2\|$/m, 'lookup took over its stale claim with verify');
like($out, qr/^paced purge:\n300\n0$/m,
	'the paced purge deleted the 300 expired records over several pages, pausing between batches');
like($out2, qr/^paced purge:\n1\n0$/m, 'the paced purge deleted A after its retention');
like($err, qr/job type "evil" is not registered/, "mallory's own job_types table was not read");
like($err, qr/was claimed with a different fingerprint.*operation_key is too long/s,
	'the refusals ran (fingerprint, key length, ...)');
like($err2, qr/attempt 1 of operation "R" of job type "retry" was superseded/,
	'fencing ran under the hostile search_path');
is($node->safe_psql('postgres',
		q{SELECT resolved_by || '/' || resolution || '/' || coalesce(note, '') FROM idempotency.resolutions ORDER BY id}),
	"mallory/completed/checked the mailbox\nmallory/retry/",
	'resolutions are audited with the caller, not the owner');

$node->stop;
done_testing();
