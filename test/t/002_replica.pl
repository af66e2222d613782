# Replication: a hot standby refuses claims with a clear read-only error
# (SQLSTATE 25006) but serves stale_claims() and job_type_stats; with
# synchronous replication, after an immediate stop of the primary and the
# promotion of the standby, every claim and completion a client saw
# acknowledged is there, and the protocol goes on: a stale claim is taken
# over per policy and fencing still refuses the old attempt.
#
# The C extension by default; test/t/007_portable_replica.pl runs this file
# again with IDEMPOTENCY_TAP_EDITION=portable: the same checks on the
# portable edition, installed as the plain script (portable/build.sh) by
# psql -f, as a managed service's user installs it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
max_connections = 20
log_statement = none
});
$primary->start;

my $edition = $ENV{IDEMPOTENCY_TAP_EDITION} // 'c';
if ($edition eq 'portable')
{
	my $dir = PostgreSQL::Test::Utils::tempdir;
	system('sh', 'portable/build.sh', $dir) == 0
	  or die 'portable/build.sh failed';
	$primary->command_ok(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			'-d', $primary->connstr('postgres'),
			'-f', "$dir/idempotency-portable.sql"
		],
		'the portable edition installed as the plain script');
}
else
{
	$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
}
is($primary->safe_psql('postgres', 'SELECT edition FROM idempotency.edition()'),
	$edition, "the $edition edition answers");

$primary->safe_psql('postgres', q{
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
        ('send_email', '1 second', 'hold'),
        ('retry_email', '1 second', 'retry'),
        ('book_invoice', '10 minutes', 'hold');
    -- a claim whose worker died: stale after a second
    SELECT verdict FROM idempotency.claim_operation('send_email', 'ORD-STALE', NULL, 'w-dead');
});

$primary->backup('b1');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b1', has_streaming => 1);
$standby->append_conf('postgresql.conf', "max_connections = 20\nlog_statement = none\n");
$standby->start;
$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));

# 1. The hot standby: writes refused with 25006 and a message naming the
# function; reads work.
sub psql_error
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 0);
	return $err;
}

like(psql_error($standby,
		q{SELECT * FROM idempotency.claim_operation('send_email', 'ORD-1')}),
	qr/ERROR:  25006: cannot execute claim_operation\(\) during recovery/,
	'standby: claim_operation fails with 25006 and says why');
like(psql_error($standby,
		q{SELECT idempotency.complete_operation('send_email', 'ORD-STALE', 1)}),
	qr/ERROR:  25006: cannot execute complete_operation\(\) during recovery/,
	'standby: complete_operation fails with 25006 and says why');
like(psql_error($standby,
		q{SELECT idempotency.release_operation('send_email', 'ORD-STALE', 1)}),
	qr/ERROR:  25006: /, 'standby: release_operation fails with 25006');
like(psql_error($standby,
		q{SELECT idempotency.extend_lease('send_email', 'ORD-STALE', 1)}),
	qr/ERROR:  25006: /, 'standby: extend_lease fails with 25006');
like(psql_error($standby,
		q{SELECT idempotency.resolve_operation('send_email', 'ORD-STALE', 'retry')}),
	qr/ERROR:  25006: /, 'standby: resolve_operation fails with 25006');
like(psql_error($standby, q{SELECT idempotency.purge_operations()}),
	qr/ERROR:  25006: /, 'standby: purge_operations fails with 25006');

$standby->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM idempotency.stale_claims()})
  or die 'the claim never went stale on the standby';
is($standby->safe_psql('postgres', q{
    SELECT operation_key || '/' || attempt || '/' || claimed_by || '/' || stale_policy
    FROM idempotency.stale_claims('send_email')}),
	'ORD-STALE/1/w-dead/hold', 'standby: stale_claims() lists the stale claim');
is($standby->safe_psql('postgres', q{
    SELECT claimed || '/' || stale || '/' || (oldest_stale_claimed_at IS NOT NULL)
    FROM idempotency.job_type_stats WHERE job_type = 'send_email'}),
	'1/1/true', 'standby: job_type_stats works');
is(psql_error($standby, q{SELECT count(*) FROM idempotency.stale_claims('send_email')}),
	'', 'standby: stale_claims() raises nothing');

# 2. Synchronous replication: a commit is acknowledged only once the
# standby has it.
$primary->append_conf('postgresql.conf', "synchronous_standby_names = '*'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'})
  or die 'the standby never became synchronous';

# acknowledged before the load: one claim per policy left open, the worker "dies"
is($primary->safe_psql('postgres', q{
    SELECT string_agg(verdict || '/' || attempt, ',') FROM (
        SELECT (idempotency.claim_operation('retry_email', 'ORD-R', NULL, 'w-old')).*
        UNION ALL
        SELECT (idempotency.claim_operation('send_email', 'ORD-H', NULL, 'w-old')).*) c}),
	'run/1,run/1', 'claims acknowledged before the failover');

# The load: one client claims, then completes, key after key, each in its
# own transaction (autocommit); after each acknowledged statement it prints
# a line. psql runs with ON_ERROR_STOP, so a line is printed only when the
# statement before it returned (its commit acknowledged by the standby).
my $nkeys = 5000;
my $script = '';
for my $i (1 .. $nkeys)
{
	$script .= "SELECT verdict FROM idempotency.claim_operation('book_invoice', 'INV-$i') \\g /dev/null\n"
	  . "\\echo claimed INV-$i\n"
	  . "SELECT idempotency.complete_operation('book_invoice', 'INV-$i', 1, '{\"n\": $i}') \\g /dev/null\n"
	  . "\\echo completed INV-$i\n";
}
my $script_file = "$PostgreSQL::Test::Utils::tmp_check/002_load.sql";
PostgreSQL::Test::Utils::append_to_file($script_file, $script);
my ($out, $err) = ('', '');
my $load = IPC::Run::start(
	[
		'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-f', $script_file,
		'-d', $primary->connstr('postgres')
	],
	'>', \$out, '2>', \$err);
$standby->poll_query_until('postgres', q{
    SELECT count(*) >= 300 FROM idempotency.operations
    WHERE job_type = 'book_invoice' AND status = 'completed'})
  or die "the load never got going: $err";
$primary->stop('immediate');
$load->finish;
isnt($?, 0, 'the client lost its server');

my %acked;
for my $line (split /\n/, $out)
{
	$acked{$2} = $1 if $line =~ /^(claimed|completed) (INV-\d+)$/;
}
my $ncompleted = grep { $_ eq 'completed' } values %acked;
my $nclaimed = grep { $_ eq 'claimed' } values %acked;
cmp_ok($ncompleted, '>=', 300, "acknowledged: $ncompleted completions, $nclaimed claim(s) not yet completed");
note("the client's last words: $err");

$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby was never promoted';
my $new = $standby;

# every acknowledged claim and completion is on the new primary
my %found = map { split /\|/ } split /\n/, $new->safe_psql('postgres', q{
    SELECT operation_key || '|' || status || '/' || attempt
    FROM idempotency.operations WHERE job_type = 'book_invoice'});
my @missing = grep {
	!defined $found{$_}
	  || ($acked{$_} eq 'completed' && $found{$_} ne 'completed/1')
	  || ($acked{$_} eq 'claimed' && $found{$_} !~ m{^(claimed|completed)/1$})
} sort keys %acked;
is(scalar(@missing), 0, 'every acknowledged claim and completion survived the failover')
  or diag('missing or wrong: ' . join(', ', map { "$_ acked $acked{$_}, found " . ($found{$_} // 'nothing') } @missing[0 .. ($#missing < 9 ? $#missing : 9)]));
# nothing unacknowledged can be more than one statement ahead of the client
my @ahead = grep { !defined $acked{$_} } sort keys %found;
cmp_ok(scalar(@ahead), '<=', 1, 'at most the one statement in flight is beyond what was acknowledged')
  or diag('unacknowledged: ' . join(', ', @ahead));
is($new->safe_psql('postgres', q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'book_invoice' AND status = 'completed'
      AND result OPERATOR(pg_catalog.->>) 'n' <> substr(operation_key, 5)}),
	'0', 'every completion kept its result');

# 3. The protocol goes on on the new primary: the stale claims of the dead
# workers are taken over per policy, fencing still refuses the old attempt.
$new->poll_query_until('postgres',
	q{SELECT count(*) = 2 FROM idempotency.stale_claims() WHERE operation_key IN ('ORD-R', 'ORD-H')})
  or die 'the claims never went stale on the new primary';
is($new->safe_psql('postgres',
		q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('retry_email', 'ORD-R', NULL, 'w-new')}),
	'run/2', 'retry: the stale claim is taken over with attempt 2');
is($new->safe_psql('postgres',
		q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('send_email', 'ORD-H', NULL, 'w-new')}),
	'held/1', 'hold: the stale claim is held');
like(psql_error($new, q{SELECT idempotency.complete_operation('retry_email', 'ORD-R', 1)}),
	qr/ERROR:  ID003: attempt 1 of operation "ORD-R" of job type "retry_email" was superseded/,
	'the old attempt is fenced off on the new primary');
$new->safe_psql('postgres', q{SELECT idempotency.complete_operation('retry_email', 'ORD-R', 2, '{"sent": true}')});
is($new->safe_psql('postgres',
		q{SELECT verdict || '/' || attempt || '/' || result FROM idempotency.claim_operation('retry_email', 'ORD-R')}),
	'completed/2/{"sent": true}', 'the new attempt completes');
is($new->safe_psql('postgres',
		q{SELECT verdict FROM idempotency.claim_operation('book_invoice', 'INV-NEW')}),
	'run', 'new keys are claimed on the new primary');

$new->stop;
done_testing();
