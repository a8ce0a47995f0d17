# Worker throughput and memory: 1, 2 and 3 `moongraph worker` processes at
# concurrency 64 on the Eco² pipeline, LLM served by build/testserver.
# OFFLINE=1: one worker on the offline pipeline beside the same pipeline
# invoked in-process (same saver and durability), Postgres with fsync on:
# jobs/s of each, the ratio, CPU per job of every process, Redis commands
# and round trips and Postgres transactions per job (bench/worker_offline.lua).
BENCH_DEPS += bench-worker

.PHONY: bench-worker
ifeq ($(OFFLINE),1)
bench-worker: all
	./$(BIN) run bench/worker_offline.lua
else
bench-worker: all build/testserver
	./$(BIN) run bench/worker.lua
endif
