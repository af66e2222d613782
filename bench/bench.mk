# bench/bench.mk: the benchmark suite; included by the top Makefile.
#
#   make bench         the whole suite on a throwaway cluster (about 16
#                      minutes on 2 cores); rewrites bench/README.md,
#                      bench/throughput.png, bench/batch.png and the data
#                      behind them
#   make bench-smoke   every benchmark script with tiny sizes on a throwaway
#                      cluster, about 30 s; its report is thrown away
#   make bench-citus   the run and duplicate paths through Citus against one
#                      node (bench/citus/run.sh, about 13 minutes; needs
#                      Citus installed); rewrites bench/citus/summary.md and
#                      the data behind it (bench/citus/README.md is the report)
#   make bench-citus-cure  what the cure of issue 18 costs on Citus: the
#                      library of 0a5e4e5 against HEAD's, interleaved
#                      (bench/citus/cure.sh, about 9 minutes; needs Citus,
#                      and installs HEAD's build: root); rewrites
#                      bench/citus/cure.md and cure.tsv
#
# Settings: see `bench/run.sh --help` (environment variables BENCH_*).

.PHONY: bench bench-smoke bench-citus bench-citus-cure

bench:
	bench/run.sh

bench-smoke:
	bench/run.sh --smoke

bench-citus:
	bench/citus/run.sh

bench-citus-cure:
	bench/citus/cure.sh
