# bench/bench.mk: the benchmark suite; included by the top Makefile.
#
#   make bench         the whole suite on a throwaway cluster (about 16
#                      minutes on 2 cores); rewrites bench/README.md,
#                      bench/throughput.png, bench/batch.png and the data
#                      behind them
#   make bench-smoke   every benchmark script with tiny sizes on a throwaway
#                      cluster, about 30 s; its report is thrown away
#
# Settings: see `bench/run.sh --help` (environment variables BENCH_*).

.PHONY: bench bench-smoke

bench:
	bench/run.sh

bench-smoke:
	bench/run.sh --smoke
