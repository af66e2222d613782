# Memory: one backend makes a million claims (and the completions, releases,
# takeovers, heartbeats, stale_claims() calls and refused calls that come
# with them); its memory, as pg_backend_memory_contexts counts it, must stay
# flat after a warm-up: no more than 1 MB of growth over the million.
# This asserts a behaviour (no leak per call), not a timing.
# IDEMPOTENCY_LONG=1 makes it five million.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $rounds = $ENV{IDEMPOTENCY_LONG} ? 50 : 10;    # of 100000 claims each
my $node = PostgreSQL::Test::Cluster->new('memory');
$node->init;
$node->append_conf('postgresql.conf', "log_statement = none\n");
$node->start;

$node->safe_psql('postgres', q{
    CREATE EXTENSION idempotency;
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
        ('mem', '10 minutes', 'hold'),
        ('churn', '1 microsecond', 'retry');
    -- n claims: 20000 keys of a hold job (new, completed, in progress) and,
    -- every tenth, 100 keys of a retry job whose lease runs out at once
    -- (each claim a takeover), released or extended now and then; a
    -- refused call (fingerprint mismatch, caught) every 5000; a commit
    -- every 1000
    CREATE PROCEDURE churn(n integer, base bigint) LANGUAGE plpgsql AS $$
    DECLARE
        c record;
        k text;
        j bigint;
    BEGIN
        FOR i IN 1 .. n LOOP
            j := base + i;
            IF j % 10 = 0 THEN
                k := 'C' || (j % 100);
                SELECT * INTO c FROM idempotency.claim_operation('churn', k, NULL, 'w');
                IF c.verdict = 'run' THEN
                    IF j % 3 = 0 THEN
                        PERFORM idempotency.release_operation('churn', k, c.attempt);
                    ELSIF j % 7 = 0 THEN
                        PERFORM idempotency.extend_lease('churn', k, c.attempt);
                    END IF;
                END IF;
            ELSE
                k := 'K' || (j % 20000);
                SELECT * INTO c FROM idempotency.claim_operation('mem', k, 'fp', 'w');
                IF c.verdict = 'run' AND j % 2 = 0 THEN
                    PERFORM idempotency.complete_operation('mem', k, c.attempt, '{"ok": true}');
                END IF;
            END IF;
            IF j % 5000 = 0 THEN
                BEGIN
                    PERFORM idempotency.claim_operation('mem', 'K2', 'other-fp');
                EXCEPTION WHEN SQLSTATE 'ID002' THEN
                    NULL;
                END;
                PERFORM count(*) FROM idempotency.stale_claims();
            END IF;
            IF i % 1000 = 0 THEN
                COMMIT;
            END IF;
        END LOOP;
    END
    $$;
});

# one session: a warm-up (plans prepared, caches filled), then the rounds,
# the backend's memory after each
my $script = "SET client_min_messages = warning;\nCALL churn(50000, 0);\n"
  . "SELECT 'mem ' || sum(total_bytes) FROM pg_backend_memory_contexts;\n";
for my $r (1 .. $rounds)
{
	$script .= "CALL churn(100000, " . (50000 + ($r - 1) * 100000) . ");\n"
	  . "SELECT 'mem ' || sum(total_bytes) FROM pg_backend_memory_contexts;\n";
}
my $t0 = time();
my $out = $node->safe_psql('postgres', $script, timeout => 1800);
my $secs = time() - $t0;
my @mem = map { /^mem (\d+)$/ ? $1 : () } split /\n/, $out;
is(scalar(@mem), $rounds + 1, 'memory measured after the warm-up and after every round');
my $growth = $mem[-1] - $mem[0];
my $claims = $rounds * 100000;
note("backend memory (bytes) after 50000 warm-up claims and after each 100000: @mem");
cmp_ok($growth, '<=', 1024 * 1024,
	"backend memory flat over $claims claims in ${secs}s: $mem[0] -> $mem[-1] bytes ($growth)");
my $max = (sort { $b <=> $a } @mem)[0];
cmp_ok($max - $mem[0], '<=', 1024 * 1024, 'and never more than 1 MB above the warm-up in between');

is($node->safe_psql('postgres', q{
    SELECT count(*) FROM idempotency.operations WHERE job_type = 'mem' AND status NOT IN ('claimed', 'completed')}),
	'0', 'the hold records are claimed or completed');
cmp_ok($node->safe_psql('postgres',
		q{SELECT min(attempt) FROM idempotency.operations WHERE job_type = 'churn'}),
	'>', 100, 'the retry records were taken over again and again');

$node->stop;
done_testing();
