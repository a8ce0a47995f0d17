# The local HTTP/HTTPS server used by specs and benchmarks (spec/support/).
all: build/testserver

TESTSERVER_CFLAGS = -std=gnu11 -O2 -g -Wall -Wextra $(shell pkg-config --cflags libuv openssl)
TESTSERVER_LIBS = $(shell pkg-config --libs libuv openssl)

build/testserver: spec/support/testserver.c
	@mkdir -p $(@D)
	$(CC) $(TESTSERVER_CFLAGS) $< -o $@ $(TESTSERVER_LIBS)

TEST_DEPS += build/testserver
