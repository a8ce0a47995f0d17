# Redis and PostgreSQL benchmarks against throwaway servers
# (spec/support/servers.sh): Redis SET/GET from 64 tasks beside
# redis-benchmark, SELECT 1 through a pool of 8 beside pgbench, and
# checkpoints per second of each saver.
BENCH_DEPS += bench-db

.PHONY: bench-db
bench-db: all
	./$(BIN) run bench/db_redis.lua
	./$(BIN) run bench/db_pg.lua
	./$(BIN) run bench/db_checkpoints.lua
