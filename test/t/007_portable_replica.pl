# The portable edition on a hot standby and through a failover: every check
# of 002_replica.pl (25006 on the standby for each writing function, naming
# it; stale_claims() and job_type_stats served there; every acknowledged
# claim and completion kept through an immediate stop and a promotion; the
# protocol going on on the new primary), with the edition installed as the
# plain script by psql -f instead of CREATE EXTENSION.
use strict;
use warnings;

# loaded at compile time, as in any TAP test: the Cluster module's INIT
# block (its port and temp dirs) does not run for a module first loaded by
# the do below
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

$ENV{IDEMPOTENCY_TAP_EDITION} = 'portable';
my $file = 'test/t/002_replica.pl';
my $ok = do "./$file";
die "$file: $@" if $@;
die "$file: $!" unless defined $ok;
