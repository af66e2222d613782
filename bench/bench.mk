# bench/bench.mk: the benchmark suite; included by the top Makefile.
#
#   make bench         the whole suite on a throwaway cluster (about 16
#                      minutes on 2 cores); rewrites bench/README.md,
#                      bench/throughput.png, bench/batch.png and the data
#                      behind them (results.tsv, kv.tsv, machine.txt)
#   make bench-smoke   every benchmark script with tiny sizes on a throwaway
#                      cluster, about 50 s; its report is thrown away
#   make bench-citus   the run and duplicate paths through Citus against one
#                      node (bench/citus/run.sh, about 13 minutes; needs
#                      Citus installed); rewrites bench/citus/summary.md and
#                      the data behind it (bench/citus/README.md is the report)
#
# Settings: see `bench/run.sh --help` (environment variables BENCH_*).

.PHONY: bench bench-smoke bench-citus

bench:
	bench/run.sh

bench-smoke:
	bench/run.sh --smoke

bench-citus:
	bench/citus/run.sh
