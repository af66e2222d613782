# Kill storm: worker processes deliver a queue of keys, each several times,
# while backends are terminated (pg_terminate_backend) and workers are
# SIGKILLed at random points. Three job types share the queue:
#
#   tx_invoice  transactional mode: claim, invoice row and completion in one
#               transaction. Every key's invoice exactly once.
#   ext_hold    two-commit "external effect" mode: claim (commit), send an
#               email (a row committed in its own transaction), complete
#               (commit). Policy hold, lease 1 s: at most one email per key,
#               and every key ends completed or listed by stale_claims().
#   ext_retry   the same with policy retry, max_attempts 3: never more than
#               3 runs (emails) per key, never two runs of one attempt.
#
# Short by default (1000 keys per job type, 3 deliveries each, 100 kills);
# IDEMPOTENCY_LONG=1 runs 5000 keys, 4 deliveries each and 1000 kills.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes ();

my $long = $ENV{IDEMPOTENCY_LONG} ? 1 : 0;
my $nkeys = $long ? 5000 : 1000;     # per job type
my $copies = $long ? 4 : 3;          # deliveries of each key during the storm
my $nkills = $long ? 1000 : 100;      # half pg_terminate_backend, half SIGKILL
my $nworkers = 8;                    # worker processes at any time
my $per_worker = 40;                 # deliveries per worker process

my $node = PostgreSQL::Test::Cluster->new('storm');
$node->init;
$node->append_conf('postgresql.conf', qq{
max_connections = 40
log_statement = none
log_min_messages = warning
log_error_verbosity = verbose
});
$node->start;

$node->safe_psql('postgres', qq{
    CREATE EXTENSION idempotency;
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts) VALUES
        ('tx_invoice', '10 minutes', 'hold', NULL),
        ('ext_hold', '1 second', 'hold', NULL),
        ('ext_retry', '1 second', 'retry', 3);

    CREATE TABLE invoices (operation_key text NOT NULL);
    CREATE TABLE emails (job_type text NOT NULL, operation_key text NOT NULL, attempt integer NOT NULL);
    CREATE TABLE fenced (job_type text NOT NULL, operation_key text NOT NULL, attempt integer NOT NULL);

    -- the queue: every delivery of every key, duplicates close together
    -- so that redeliveries race each other
    CREATE TABLE queue (id bigint PRIMARY KEY, job_type text NOT NULL, operation_key text NOT NULL);
    CREATE SEQUENCE queue_seq;
    INSERT INTO queue
    SELECT row_number() OVER (ORDER BY k + random() * 20), jt, 'K' || k
    FROM generate_series(1, $nkeys) k,
         unnest(ARRAY['tx_invoice', 'ext_hold', 'ext_retry']) jt,
         generate_series(1, $copies) c;

    -- step 1 of a delivery: take the next message and claim its key. In the
    -- transactional mode the invoice and the completion go in the same
    -- transaction. Returns the attempt the caller must run (0: nothing).
    CREATE FUNCTION take(OUT id bigint, OUT attempt integer) LANGUAGE plpgsql AS \$\$
    DECLARE
        q queue;
        c record;
    BEGIN
        id := nextval('queue_seq');
        attempt := 0;
        SELECT * INTO q FROM queue WHERE queue.id = take.id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        SELECT * INTO c FROM idempotency.claim_operation(q.job_type, q.operation_key, NULL,
                                                         'w' || pg_backend_pid());
        IF c.verdict NOT IN ('run', 'verify') THEN
            RETURN;
        END IF;
        IF q.job_type = 'tx_invoice' THEN
            INSERT INTO invoices VALUES (q.operation_key);
            PERFORM idempotency.complete_operation(q.job_type, q.operation_key, c.attempt);
            RETURN;
        END IF;
        attempt := c.attempt;
    END
    \$\$;
    -- step 2, its own transaction: the external effect
    CREATE FUNCTION send_email(id bigint, attempt integer) RETURNS void LANGUAGE sql AS \$\$
        INSERT INTO emails SELECT q.job_type, q.operation_key, send_email.attempt
        FROM queue q WHERE q.id = send_email.id AND send_email.attempt > 0
    \$\$;
    -- step 3, its own transaction: the completion (a zombie is fenced off)
    CREATE FUNCTION finish(id bigint, attempt integer) RETURNS void LANGUAGE plpgsql AS \$\$
    DECLARE
        q queue;
    BEGIN
        SELECT * INTO q FROM queue WHERE queue.id = finish.id;
        IF finish.attempt = 0 OR NOT FOUND THEN
            RETURN;
        END IF;
        PERFORM idempotency.complete_operation(q.job_type, q.operation_key, finish.attempt);
    EXCEPTION WHEN SQLSTATE 'ID003' THEN
        INSERT INTO fenced VALUES (q.job_type, q.operation_key, finish.attempt);
    END
    \$\$;
});
my $storm_size = $node->safe_psql('postgres', 'SELECT count(*) FROM queue');

my $script = "$PostgreSQL::Test::Utils::tmp_check/003_worker.sql";
PostgreSQL::Test::Utils::append_to_file($script, q{
SELECT id, attempt FROM take() \gset
SELECT send_email(:id, :attempt);
SELECT finish(:id, :attempt);
});

my $monitor = $node->background_psql('postgres');
# a worker chosen for pg_terminate_backend() may exit first; the WARNING
# that pid is no backend would fail query_safe (the count stays exact)
$monitor->query_safe('SET client_min_messages = error');

# Run worker processes until the queue is empty, killing $kills of them
# along the way, spread over the queue: at random points of its progress
# either a random worker's backend is terminated or a random worker process
# is SIGKILLed. Returns (terminated backends, SIGKILLed workers, processes).
sub run_workers
{
	my ($queue_end, $kills) = @_;
	my (@workers, $started, $terminated, $sigkilled, $failed);
	$started = $terminated = $sigkilled = $failed = 0;
	my $first = $monitor->query_safe('SELECT last_value FROM queue_seq');
	my $span = $queue_end - $first;
	my @kill_at = sort { $a <=> $b } map { $first + int(rand($span * 0.95)) } 1 .. $kills;
	my $exhausted = 0;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default * 3;

	while (1)
	{
		die 'the storm did not end in time' if time() > $deadline;
		# reap the workers that ended (done, or aborted by a kill)
		@workers = grep {
			$_->pump_nb if $_->pumpable;
			if ($_->pumpable) { 1 }
			else { $failed++ unless $_->finish; 0 }
		} @workers;
		my $progress = $monitor->query_safe(
			'SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM queue_seq');
		$exhausted = 1 if $progress >= $queue_end;
		last if $exhausted && !@workers;
		while (!$exhausted && @workers < $nworkers)
		{
			my ($out, $err) = ('', '');
			push @workers, IPC::Run::start(
				[
					'pgbench', '--no-vacuum', '--client=1',
					"--transactions=$per_worker", "--file=$script",
					$node->connstr('postgres') . ' application_name=storm_worker'
				],
				'>', \$out, '2>', \$err);
			$started++;
		}
		while (@kill_at && $progress >= $kill_at[0])
		{
			shift @kill_at;
			if (($terminated + $sigkilled) % 2 == 0)
			{
				$terminated += $monitor->query_safe(q{
                    SELECT count(*) FROM (
                        SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity
                        WHERE application_name = 'storm_worker' ORDER BY random() LIMIT 1) k
                    WHERE t});
			}
			elsif (@workers)
			{
				$workers[ int(rand(@workers)) ]->signal('KILL');
				$sigkilled++;
			}
		}
		# poll interval of this loop (like poll_query_until's)
		Time::HiRes::sleep(0.02);
	}
	# A SIGKILLed worker's backend may still be running the statement it was
	# sent (a claim, say), and commit it after the worker is gone: wait until
	# every worker backend has noticed and left, so that what follows sees
	# the storm's last claim.
	$node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'storm_worker'})
	  or die 'worker backends stayed after their workers were gone';
	return ($terminated, $sigkilled, $started, $failed);
}

my $t0 = time();
my ($terminated, $sigkilled, $processes) = run_workers($storm_size, $nkills);
my $storm_secs = time() - $t0;
cmp_ok($terminated + $sigkilled, '>=', $nkills * 0.6,
	"storm: $storm_size deliveries of " . 3 * $nkeys . " keys by $processes worker processes in ${storm_secs}s; "
	  . "$terminated backends terminated, $sigkilled workers SIGKILLed");

# Every claim left behind by a dead worker runs out of its lease...
$node->poll_query_until('postgres', q{
    SELECT count(*) = 0 FROM idempotency.operations o JOIN idempotency.job_types jt USING (job_type)
    WHERE o.status = 'claimed' AND o.heartbeat_at + jt.lease > clock_timestamp()})
  or die 'claims stayed inside their lease';
my $stale_after_storm = $node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.stale_claims()});

# ... and the queue redelivers every key once more, with no kills: the
# policies decide what happens to the stale claims. The storm's workers went
# on drawing ids after the queue ran dry (a worker runs a fixed number of
# transactions), so the redeliveries are queued after the sequence's current
# value, not after the storm's last message: otherwise the first of them
# would never be delivered.
my $base = $node->safe_psql('postgres', 'SELECT last_value FROM queue_seq');
$node->safe_psql('postgres', qq{
    INSERT INTO queue
    SELECT $base + row_number() OVER (ORDER BY random()), jt, 'K' || k
    FROM generate_series(1, $nkeys) k, unnest(ARRAY['tx_invoice', 'ext_hold', 'ext_retry']) jt});
my ($t2, $k2, $p2, $failed2) = run_workers($base + 3 * $nkeys, 0);
note("the storm queue had $storm_size messages; its workers drew ids up to $base");
is($failed2, 0, "redelivery: all $p2 worker processes ended without an error");
$node->poll_query_until('postgres', q{
    SELECT count(*) = 0 FROM idempotency.operations o JOIN idempotency.job_types jt USING (job_type)
    WHERE o.status = 'claimed' AND o.heartbeat_at + jt.lease > clock_timestamp()})
  or die 'claims stayed inside their lease';

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# transactional mode: every effect exactly once
is(q1(q{SELECT count(*) FROM (SELECT operation_key FROM invoices GROUP BY 1 HAVING count(*) > 1) d}),
	'0', 'tx_invoice: no invoice twice');
is(q1(q{SELECT count(DISTINCT operation_key) FROM invoices}),
	$nkeys, "tx_invoice: every one of the $nkeys keys has its invoice");
is(q1(q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'tx_invoice'
      AND (status <> 'completed' OR attempt <> 1
           OR NOT EXISTS (SELECT 1 FROM invoices i WHERE i.operation_key = o.operation_key))}),
	'0', 'tx_invoice: every record is completed at attempt 1 with its invoice');

# hold: at most one email per key; every key completed or listed as stale
is(q1(q{SELECT count(*) FROM (SELECT operation_key FROM emails WHERE job_type = 'ext_hold'
                               GROUP BY 1 HAVING count(*) > 1) d}),
	'0', 'ext_hold: no key emailed twice');
is(q1(q{SELECT count(*) FROM idempotency.operations WHERE job_type = 'ext_hold'}),
	$nkeys, 'ext_hold: every key has a record');
is(q1(q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'ext_hold' AND status <> 'completed'
      AND NOT EXISTS (SELECT 1 FROM idempotency.stale_claims('ext_hold') s
                      WHERE s.operation_key = o.operation_key)}),
	'0', 'ext_hold: every key ends completed or listed by stale_claims()');
is(q1(q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'ext_hold' AND status = 'completed'
      AND (SELECT count(*) FROM emails e WHERE e.job_type = 'ext_hold'
           AND e.operation_key = o.operation_key) <> 1}),
	'0', 'ext_hold: every completed key was emailed exactly once');

# retry: never more than max_attempts runs, never two runs of one attempt
is(q1(q{SELECT count(*) FROM (SELECT operation_key FROM emails WHERE job_type = 'ext_retry'
                               GROUP BY 1 HAVING count(*) > 3) d}),
	'0', 'ext_retry: no key emailed more than max_attempts (3) times');
is(q1(q{SELECT count(*) FROM (SELECT operation_key, attempt FROM emails WHERE job_type = 'ext_retry'
                               GROUP BY 1, 2 HAVING count(*) > 1) d}),
	'0', 'ext_retry: no attempt ran twice');
is(q1(q{
    SELECT count(*) FROM emails e JOIN idempotency.operations o USING (job_type, operation_key)
    WHERE e.job_type = 'ext_retry' AND e.attempt > o.attempt}),
	'0', 'ext_retry: no email from an attempt the record does not know');
is(q1(q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'ext_retry' AND status <> 'completed'
      AND NOT EXISTS (SELECT 1 FROM idempotency.stale_claims('ext_retry') s
                      WHERE s.operation_key = o.operation_key)}),
	'0', 'ext_retry: every key ends completed or listed by stale_claims()');
is(q1(q{
    SELECT count(*) FROM idempotency.operations o
    WHERE job_type = 'ext_retry' AND status = 'claimed' AND attempt < 3}),
	'0', 'ext_retry: a key is left for a person only after 3 attempts');
is(q1(q{SELECT count(*) FROM idempotency.operations WHERE job_type = 'ext_retry'}),
	$nkeys, 'ext_retry: every key has a record');

# nothing in an impossible state
is(q1(q{
    SELECT count(*) FROM idempotency.operations
    WHERE attempt < 1
       OR (status = 'completed' AND completed_at IS NULL)
       OR (status IN ('claimed', 'released') AND completed_at IS NOT NULL)
       OR heartbeat_at < claimed_at}),
	'0', 'no record in an impossible state');
ok(!$node->log_contains('(PANIC|TRAP:|terminated by signal|XX000)'),
	'no crash and no internal error in the server log');

my $figures = q1(q{
    SELECT string_agg(format('%s: %s completed, %s held (stale), %s emails, %s fenced',
                             job_type, completed, stale, emails, fenced), '; ' ORDER BY job_type)
    FROM (SELECT s.job_type, s.completed, s.stale,
                 (SELECT count(*) FROM emails e WHERE e.job_type = s.job_type) AS emails,
                 (SELECT count(*) FROM fenced f WHERE f.job_type = s.job_type) AS fenced
          FROM idempotency.job_type_stats s) x});
note("kill storm: $storm_size deliveries + " . 3 * $nkeys . " redeliveries, "
	  . "$terminated terminated, $sigkilled SIGKILLed, $stale_after_storm stale claims after the storm; $figures");

$monitor->quit;
$node->stop;
done_testing();
