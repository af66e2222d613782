# Crash, restart and load: what a committed claim or completion promises
# survives an immediate shutdown, and concurrent deliveries of the same keys
# run each key's effect exactly once in the transactional mode.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('main');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 40\nrestart_after_crash = on\n");
$node->start;

$node->safe_psql('postgres', q{
    CREATE EXTENSION idempotency;
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
        ('book_invoice', '10 minutes', 'hold'),
        ('send_email', '1 second', 'retry');
    -- the side effect of the transactional job: a row in the same database
    CREATE TABLE invoices (order_ref text NOT NULL, booked_at timestamptz DEFAULT clock_timestamp());
    -- one delivery of the transactional job: claim, book, complete, one commit
    CREATE FUNCTION deliver_invoice(k text) RETURNS text LANGUAGE plpgsql AS $$
    DECLARE
        c record;
    BEGIN
        SELECT * INTO c FROM idempotency.claim_operation('book_invoice', k);
        IF c.verdict = 'run' THEN
            INSERT INTO invoices (order_ref) VALUES (k);
            PERFORM idempotency.complete_operation('book_invoice', k, c.attempt);
        END IF;
        RETURN c.verdict;
    END
    $$;
});

# The invariants of the transactional mode, checked after load and after
# each crash: every booked invoice exists once, has a completed record, and
# every record is a completed one with a booked invoice.
sub check_exactly_once
{
	my ($label) = @_;
	my $dups = $node->safe_psql('postgres',
		q{SELECT count(*) FROM (SELECT order_ref FROM invoices GROUP BY 1 HAVING count(*) > 1) d});
	is($dups, '0', "$label: no invoice booked twice");
	my $orphans = $node->safe_psql('postgres', q{
        SELECT count(*) FROM invoices i
        WHERE NOT EXISTS (SELECT 1 FROM idempotency.operations o
                          WHERE o.job_type = 'book_invoice' AND o.operation_key = i.order_ref
                            AND o.status = 'completed' AND o.attempt = 1)});
	is($orphans, '0', "$label: every invoice has its completed record");
	my $unbooked = $node->safe_psql('postgres', q{
        SELECT count(*) FROM idempotency.operations o
        WHERE o.job_type = 'book_invoice'
          AND (o.status <> 'completed'
               OR NOT EXISTS (SELECT 1 FROM invoices i WHERE i.order_ref = o.operation_key))});
	is($unbooked, '0', "$label: no record without its invoice, none left claimed");
}

# 1. wait => false under load: 8 clients claim new keys at once in the
# empty table, so the table and its index grow under them and the inserts wait for one
# another's extension locks (a millisecond or two, more under load). No
# other claim of those keys exists, so every call must answer run: a
# claim that will not wait for another claim still waits out these
# (before 0.4, with lock_timeout at 1 ms, most clients got 55P03 in the
# first second).
$node->safe_psql('postgres',
	q{INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES ('nowait', '1 minute', 'hold')});
$node->pgbench(
	'--no-vacuum --client=8 --jobs=2 --transactions=1000',
	0,
	[qr{processed: 8000/8000}],
	[qr{^$}],
	'8 clients claim 8000 new keys with wait => false: no call fails',
	{
		'004_nowait' => q{
SELECT verdict FROM idempotency.claim_operation('nowait', 'N-' || :client_id || '-' || random(), wait => false);
}
	});
is($node->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE status = 'claimed' AND attempt = 1) || '/' || count(*)
      FROM idempotency.operations WHERE job_type = 'nowait'}),
	'8000/8000', 'each of the 8000 new keys claimed once, attempt 1');

# 2. Load: 8 clients deliver 50 keys over and over (each key ~32 times).
$node->pgbench(
	'--no-vacuum --client=8 --jobs=2 --transactions=200',
	0,
	[qr{processed: 1600/1600}],
	[qr{^$}],
	'8 concurrent clients deliver 50 keys 1600 times',
	{
		'001_deliver' => q{
\set k random(1, 50)
SELECT deliver_invoice('ORD-' || :k);
}
	});
is($node->safe_psql('postgres', 'SELECT count(*) FROM invoices'),
	'50', 'after 1600 deliveries of 50 keys, 50 invoices');
check_exactly_once('load');

# 3. Crash under load: immediate shutdown while clients deliver new keys.
my ($out, $err) = ('', '');
my $script = "$PostgreSQL::Test::Utils::tmp_check/deliver_new.sql";
PostgreSQL::Test::Utils::append_to_file($script,
	"\\set k random(1, 5000)\nSELECT deliver_invoice('NEW-' || :k);\n");
my $bench = IPC::Run::start(
	[
		'pgbench', '--no-vacuum', '--client=8', '--jobs=2',
		'--transactions=100000', "--file=$script", $node->connstr('postgres')
	],
	'>', \$out, '2>', \$err);
$node->poll_query_until('postgres',
	q{SELECT count(*) >= 300 FROM invoices WHERE order_ref LIKE 'NEW-%'})
  or die "the load never got going: $err";
$node->stop('immediate');
$bench->finish;
isnt($?, 0, 'pgbench saw the crash');
$node->start;
my $booked = $node->safe_psql('postgres',
	q{SELECT count(*) FROM invoices WHERE order_ref LIKE 'NEW-%'});
cmp_ok($booked, '>=', 300, "the invoices committed before the crash are there ($booked)");
check_exactly_once('immediate shutdown under load');

# ... and the keys keep their promise after recovery: redelivering every
# key once more books only the ones that had not committed
$node->safe_psql('postgres',
	q{SELECT deliver_invoice('NEW-' || k) FROM generate_series(1, 5000) k});
is($node->safe_psql('postgres', q{SELECT count(*) FROM invoices WHERE order_ref LIKE 'NEW-%'}),
	'5000', 'after a redelivery of all 5000 keys, 5000 invoices');
check_exactly_once('redelivery after recovery');

# 4. A committed claim survives kill -9 of a backend (the server restarts
# every backend and recovers), and its lease runs on the database clock
# across the restart.
my $claim = $node->safe_psql('postgres',
	q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('send_email', 'ORD-1005')});
is($claim, 'run/1', 'claimed before the crash');
my $sleeper = IPC::Run::start(
	[ 'psql', '-X', '-c', 'SELECT pg_sleep(600)', $node->connstr('postgres') ],
	'>', \$out, '2>', \$err);
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)'})
  or die 'the victim never started';
my $victim = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)'});
ok(kill('KILL', $victim), "kill -9 of backend $victim");
$sleeper->finish;
$node->poll_query_until('postgres', 'SELECT true')
  or die 'the server did not come back';
ok($node->log_contains('terminated by signal 9'), 'the server went through crash recovery');
is($node->safe_psql('postgres',
	q{SELECT status || '/' || attempt FROM idempotency.operations WHERE operation_key = 'ORD-1005'}),
	'claimed/1', 'the claim survived the crash');
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM idempotency.stale_claims('send_email')})
  or die 'the claim never went stale';
is($node->safe_psql('postgres',
	q{SELECT verdict || '/' || attempt FROM idempotency.claim_operation('send_email', 'ORD-1005')}),
	'run/2', 'after its lease the retry policy takes it over with attempt 2');
my $fenced = $node->psql('postgres',
	q{SELECT idempotency.complete_operation('send_email', 'ORD-1005', 1)},
	stderr => \$err);
like($err, qr/was superseded/, 'the dead attempt cannot complete after the restart');

# nothing in an impossible state
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM idempotency.operations
    WHERE attempt < 1
       OR (status = 'completed' AND completed_at IS NULL)
       OR (status IN ('claimed', 'released') AND completed_at IS NOT NULL)
       OR heartbeat_at < claimed_at}),
	'0', 'no record in an impossible state');

$node->stop;
done_testing();
