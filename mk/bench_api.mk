# The Chat API under load (bench/api.lua): 200 clients at once, each POST
# /chat/messages then its SSE stream to done, against moongraph serve,
# beside the same jobs submitted in-process (the gateway's overhead).
BENCH_DEPS += bench-api

.PHONY: bench-api
bench-api: all
	./$(BIN) run bench/api.lua $(BENCH_API_ARGS)
