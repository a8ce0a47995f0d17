# HTTP server benchmark (bench/server.lua): moongraph.server beside node's
# http module and a bare H2O C handler under wrk, then 10,000 concurrent SSE
# clients (bench/sse_client.c). Needs wrk and libh2o-dev (listed in
# tools/debian-packages.txt); node is optional.
BENCH_DEPS += bench-server

build/server_h2o: bench/server_h2o.c
	@mkdir -p $(@D)
	$(CC) -O2 -g -Wall -Wextra $< -o $@ $(shell pkg-config --cflags --libs libh2o libuv openssl)

build/sse_client: bench/sse_client.c
	@mkdir -p $(@D)
	$(CC) -O2 -g -Wall -Wextra $< -o $@ $(shell pkg-config --cflags --libs libuv)

.PHONY: bench-server
bench-server: all build/server_h2o build/sse_client
	./$(BIN) run bench/server.lua $(BENCH_SERVER_ARGS)
