# The Eco² chat pipeline end to end with three upstream nodes on the test
# server (bench/pipeline.lua): latency percentiles and concurrent throughput.
BENCH_DEPS += bench-pipeline

.PHONY: bench-pipeline
bench-pipeline: all build/testserver
	./$(BIN) run bench/pipeline.lua
