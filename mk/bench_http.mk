# HTTP fan-out benchmark: moongraph vs a bare libcurl-multi client.
BENCH_DEPS += bench-http

build/curl_fanout: bench/curl_fanout.c
	@mkdir -p $(@D)
	$(CC) -O2 -g -Wall -Wextra $< -o $@ $(shell pkg-config --cflags --libs libcurl)

.PHONY: bench-http
bench-http: all build/testserver build/curl_fanout
	./$(BIN) run bench/http_fanout.lua
