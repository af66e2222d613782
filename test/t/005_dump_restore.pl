# pg_dump / restore: the extension's configuration, records and the
# resolutions audit are user data (pg_extension_config_dump), so a dump
# keeps them, in the custom format through pg_restore and in the plain
# format through psql; the grants given to a worker and an operator role
# survive, nothing is granted to PUBLIC, and the protocol goes on in the
# restored database (completed keys stay completed, held claims stay held,
# fencing holds, the audit's identity continues).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
$node->append_conf('postgresql.conf', "log_statement = none\n");
$node->start;

$node->safe_psql('postgres', q{
    CREATE ROLE worker;
    CREATE ROLE operator;
    CREATE DATABASE src;
});
$node->safe_psql('src', q{
    CREATE EXTENSION idempotency;
    GRANT USAGE ON SCHEMA idempotency TO worker, operator;
    GRANT EXECUTE ON FUNCTION
        idempotency.claim_operation(text, text, text, text, text, boolean),
        idempotency.complete_operation(text, text, integer, jsonb),
        idempotency.release_operation(text, text, integer),
        idempotency.extend_lease(text, text, integer) TO worker;
    GRANT EXECUTE ON FUNCTION
        idempotency.stale_claims(text),
        idempotency.resolve_operation(text, text, text, text),
        idempotency.purge_operations(integer) TO operator;
    GRANT SELECT ON idempotency.job_type_stats TO operator;
    GRANT SELECT, INSERT, UPDATE ON idempotency.job_types TO operator;

    INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention) VALUES
        ('send_email', '10 minutes', 'hold', NULL, '30 days'),
        ('charge_card', '2 minutes', 'lookup', 3, NULL),
        ('post_slack', '30 seconds', 'skip', NULL, '1 day'),
        ('sync_crm', '1 hour', 'retry', 5, NULL);
    -- 0.2: a job type that only role worker may work (regrole: dumped by name)
    UPDATE idempotency.job_types SET worker_role = 'worker' WHERE job_type = 'sync_crm';
    -- completed (with a result), claimed, released, and claims that will be stale
    SELECT idempotency.claim_operation('send_email', 'ORD-' || k, 'fp-' || k, 'w1')
    FROM generate_series(1, 50) k;
    SELECT idempotency.complete_operation('send_email', 'ORD-' || k, 1,
                                          jsonb_build_object('message_id', 'm-' || k, 'n', k))
    FROM generate_series(1, 40) k;
    SELECT idempotency.claim_operation(jt, 'K-' || k, NULL, 'w2')
    FROM unnest(ARRAY['charge_card', 'post_slack', 'sync_crm']) jt, generate_series(1, 10) k;
    SELECT idempotency.release_operation('sync_crm', 'K-' || k, 1) FROM generate_series(1, 3) k;
    UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 day',
        heartbeat_at = heartbeat_at - interval '1 day'
    WHERE status = 'claimed' AND operation_key IN ('ORD-41', 'ORD-42', 'K-9', 'K-10');
    -- skipped by a redelivery, then two decisions by a person
    SELECT idempotency.claim_operation('post_slack', 'K-9');
    SELECT idempotency.resolve_operation('send_email', 'ORD-41', 'completed', 'provider shows it sent');
    SELECT idempotency.resolve_operation('post_slack', 'K-9', 'retry', 'never posted');
});

# a fingerprint of each table, row by row in a fixed order
sub fingerprint
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
        SELECT (SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.job_type), '')) FROM idempotency.job_types t)
            || ' ' || (SELECT md5(coalesce(string_agg(o::text, '|' ORDER BY o.job_type, o.operation_key), ''))
                       FROM idempotency.operations o)
            || ' ' || (SELECT md5(coalesce(string_agg(r::text, '|' ORDER BY r.id), '')) FROM idempotency.resolutions r)
            || ' ' || (SELECT count(*) FROM idempotency.operations)
            || ' ' || (SELECT count(*) FROM idempotency.resolutions)});
}
my $before = fingerprint('src');
like($before, qr/ 80 2$/, 'the source has 80 records and 2 resolutions');

my $tmp = PostgreSQL::Test::Utils::tempdir();
my $connstr = $node->connstr('src');
my ($out, $err);

# custom format, pg_restore into a new database
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $connstr ],
	'pg_dump -Fc of a database with the extension');
$node->safe_psql('postgres', 'CREATE DATABASE restored_custom');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored_custom'), "$tmp/src.dump" ],
	'pg_restore into a new database');

# plain format, through psql
$node->command_ok([ 'pg_dump', '-Fp', '-f', "$tmp/src.sql", '-d', $connstr ],
	'pg_dump -Fp of a database with the extension');
$node->safe_psql('postgres', 'CREATE DATABASE restored_plain');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', "$tmp/src.sql", '-d', $node->connstr('restored_plain') ],
	'the plain dump replays through psql');

my $dump_text = PostgreSQL::Test::Utils::slurp_file("$tmp/src.sql");
unlike($dump_text, qr/CREATE (TABLE|FUNCTION) idempotency\./,
	"the dump creates the extension's objects through CREATE EXTENSION only");
like($dump_text, qr/CREATE EXTENSION IF NOT EXISTS idempotency/, 'the dump creates the extension');

for my $db (qw(restored_custom restored_plain))
{
	is(fingerprint($db), $before, "$db: job_types, operations and resolutions identical, row for row");
	is($node->safe_psql($db, q{
        SELECT string_agg(c.relname, ',' ORDER BY c.relname) FROM pg_depend d
        JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass
        JOIN pg_extension e ON e.oid = d.refobjid
        WHERE e.extname = 'idempotency' AND d.deptype = 'e' AND c.relkind IN ('r', 'S')}),
		'job_types,operations,resolutions,resolutions_id_seq',
		"$db: the tables still belong to the extension");

	# grants
	is($node->safe_psql($db, q{
        SELECT string_agg(f || ':' || has_function_privilege('worker', f, 'EXECUTE')
                          || '/' || has_function_privilege('operator', f, 'EXECUTE'), ' ' ORDER BY f)
        FROM unnest(ARRAY['idempotency.claim_operation(text,text,text,text,text,boolean)',
                          'idempotency.complete_operation(text,text,integer,jsonb)',
                          'idempotency.resolve_operation(text,text,text,text)',
                          'idempotency.stale_claims(text)']) f}),
		'idempotency.claim_operation(text,text,text,text,text,boolean):true/false '
		  . 'idempotency.complete_operation(text,text,integer,jsonb):true/false '
		  . 'idempotency.resolve_operation(text,text,text,text):false/true '
		  . 'idempotency.stale_claims(text):false/true',
		"$db: the worker's and the operator's grants survived");
	is($node->safe_psql($db, q{
        SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.pronamespace = 'idempotency'::regnamespace AND a.grantee = 0}),
		'0', "$db: nothing granted to PUBLIC");
	ok($node->safe_psql($db, q{SELECT has_table_privilege('operator', 'idempotency.job_type_stats', 'SELECT')
                                  AND NOT has_table_privilege('worker', 'idempotency.operations', 'UPDATE')}) eq 't',
		"$db: table grants survived");

	is($node->safe_psql($db, q{
        SELECT string_agg(job_type || ':' || coalesce(worker_role::text, '-'), ' ' ORDER BY job_type)
        FROM idempotency.job_types}),
		'charge_card:- post_slack:- send_email:- sync_crm:worker',
		"$db: the job types' worker roles survived");

	# the protocol goes on
	is($node->safe_psql($db, q{
        SELECT verdict || '/' || attempt || '/' || (result ->> 'message_id')
        FROM idempotency.claim_operation('send_email', 'ORD-7', 'fp-7')}),
		'completed/1/m-7', "$db: a completed key is completed, with its result");
	is($node->safe_psql($db, q{SELECT verdict FROM idempotency.claim_operation('send_email', 'ORD-42')}),
		'held', "$db: a stale claim under hold is held");
	is($node->safe_psql($db, q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('charge_card', 'K-10')}),
		'verify/2', "$db: a stale claim under lookup is taken over");
	my ($rc, $o, $e) = $node->psql($db, q{SELECT idempotency.complete_operation('charge_card', 'K-10', 1)});
	like($e, qr/was superseded/, "$db: the old attempt is fenced off");
	($rc, $o, $e) = $node->psql($db, q{SELECT idempotency.claim_operation('send_email', 'ORD-45', 'other')});
	like($e, qr/different fingerprint/, "$db: fingerprints survived");
	is($node->safe_psql($db, q{
        SELECT idempotency.resolve_operation('send_email', 'ORD-42', 'retry', 'after restore') \\g /dev/null
        SELECT string_agg(id || ':' || operation_key, ',' ORDER BY id) FROM idempotency.resolutions}),
		'1:ORD-41,2:K-9,3:ORD-42', "$db: the audit's identity continues after the restore");
	is($node->safe_psql($db, q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('sync_crm', 'K-1')}),
		'run/2', "$db: a released record runs with the next attempt");
}

$node->stop;
done_testing();
