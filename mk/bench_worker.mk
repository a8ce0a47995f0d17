# Worker throughput and memory: 1, 2 and 3 `moongraph worker` processes at
# concurrency 64 on the Eco² pipeline, LLM served by build/testserver.
BENCH_DEPS += bench-worker

.PHONY: bench-worker
bench-worker: all build/testserver
	./$(BIN) run bench/worker.lua
