# moongraph — build, test, bench, deps, demo.
#
#   make           the `moongraph` binary and lib/moongraph/core.so
#   make test      installs missing Debian packages, builds, runs every spec
#   make asan      the same specs against an ASan+UBSan build
#   make bench     benchmarks (figures on stdout)
#   make deps      Debian packages (idempotent; sudo when not root)
#   make demo      deps + build + the main job
#   make install-app  the binary and the applications under PREFIX (/usr/local)
#
# `test` and `demo` install the packages first and then build in a second make,
# so that the pkg-config flags below are read after the libraries exist (a
# fresh machine has neither pkg-config nor the -dev packages).

PKGS     := lua5.4 libuv libcurl hiredis libpq openssl
CC       ?= cc
OPT      ?= -O2 -g
CFLAGS   += $(OPT) -std=gnu11 -Wall -Wextra -fPIC $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# libcurl and libpq are opened on first use (runtime/lazylib.h), not linked;
# http-parser ships no pkg-config file
LINKED   := $(filter-out libcurl libpq,$(PKGS))
LDLIBS   := $(shell pkg-config --libs $(LINKED) 2>/dev/null) -lhttp_parser -lm -ldl
EDIT_CFLAGS := $(shell pkg-config --cflags libedit 2>/dev/null)
EDIT_LIBS   := $(shell pkg-config --libs libedit 2>/dev/null)
DEPS_OK  := $(shell pkg-config --exists $(PKGS) libedit 2>/dev/null && test -f /usr/include/http_parser.h && echo yes)

BUILD    ?= build
OUTLIB   ?= lib
BIN      ?= moongraph

APP_SRC  := runtime/main.c runtime/repl.c runtime/alloc.c
CORE_SRC := $(filter-out $(APP_SRC),$(wildcard runtime/*.c))
CORE_OBJ := $(CORE_SRC:runtime/%.c=$(BUILD)/%.o)
APP_OBJ  := $(APP_SRC:runtime/%.c=$(BUILD)/%.o) $(BUILD)/embedded.o
LUA_SRC  := $(shell find runtime/lua -name '*.lua' | sort)
HDRS     := $(wildcard runtime/*.h)

.PHONY: all test asan bench bench-core deps demo install install-app clean check-deps
all: $(BIN) $(OUTLIB)/moongraph/core.so

# A build on a machine without the packages stops with the command to run,
# instead of failing at the link step.
check-deps:
ifneq ($(DEPS_OK),yes)
	@echo "moongraph: build dependencies are missing (pkg-config $(PKGS) libedit, http_parser.h); run 'make deps' first" >&2; exit 1
endif

$(BUILD)/%.o: runtime/%.c $(HDRS) | $(BUILD) check-deps
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/repl.o: runtime/repl.c $(HDRS) | $(BUILD) check-deps
	$(CC) $(CFLAGS) $(EDIT_CFLAGS) -c $< -o $@

$(BUILD)/embedded.c: tools/embed.lua $(LUA_SRC) | $(BUILD)
	lua5.4 tools/embed.lua $@ runtime/lua $(LUA_SRC)

$(BUILD)/embedded.o: $(BUILD)/embedded.c
	$(CC) $(CFLAGS) -w -c $< -o $@

$(BIN): $(CORE_OBJ) $(APP_OBJ)
	$(CC) $(CFLAGS) -rdynamic -o $@ $^ $(LDLIBS) $(EDIT_LIBS) $(LDFLAGS)

$(OUTLIB)/moongraph/core.so: $(CORE_OBJ)
	@mkdir -p $(OUTLIB)/moongraph
	$(CC) $(CFLAGS) -shared -o $@ $^ $(filter-out -llua5.4,$(LDLIBS)) $(LDFLAGS)

$(BUILD):
	@mkdir -p $(BUILD)

# Per-feature rules (test servers, fuzzers, benchmarks) live in mk/*.mk.
-include $(wildcard mk/*.mk)

test:
	@tools/install-deps
	@$(MAKE) --no-print-directory all $(TEST_DEPS)
	@lua5.4 tools/check-deps
	@tools/run-specs

asan:
	@tools/install-deps
	$(MAKE) BUILD=build-asan OUTLIB=build-asan/lib BIN=moongraph-asan \
	  OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" all $(TEST_DEPS)
	MOONGRAPH_BIN=./moongraph-asan MOONGRAPH_LIBDIR=build-asan/lib \
	  LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  tools/run-specs

bench: all bench-core $(BENCH_DEPS)

bench-core: all
	./$(BIN) run bench/loop_spawn.lua
	./$(BIN) run bench/loop_sleep.lua

deps:
	@tools/install-deps

# The main job: the Eco² chat pipeline on its embedded defaults (no LLM key,
# no Redis, no Postgres).
DEMO_MESSAGE ?= 종이 어떻게 버려? 그리고 수거함도 알려줘
demo:
	@tools/install-deps
	@$(MAKE) --no-print-directory all
	./$(BIN) chat --location "서울특별시 강남구" "$(DEMO_MESSAGE)"

# `luarocks make` calls this with LUADIR and LIBDIR of the rocks tree.
LUADIR ?= /usr/local/share/lua/5.4
LIBDIR ?= /usr/local/lib/lua/5.4
install: $(OUTLIB)/moongraph/core.so
	mkdir -p $(DESTDIR)$(LUADIR) $(DESTDIR)$(LIBDIR)/moongraph
	cp -R runtime/lua/moongraph $(DESTDIR)$(LUADIR)/
	cp $(OUTLIB)/moongraph/core.so $(DESTDIR)$(LIBDIR)/moongraph/core.so

# The executable and the applications it runs (scripts/, nodes/, prompts/,
# data/) with the chat page `moongraph serve` answers at / (web/), found from
# any directory: the binary looks in ../share/moongraph.
PREFIX ?= /usr/local
install-app: $(BIN)
	mkdir -p $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/moongraph
	cp $(BIN) $(DESTDIR)$(PREFIX)/bin/moongraph
	cp -R scripts nodes prompts data web $(DESTDIR)$(PREFIX)/share/moongraph/

# Build outputs only (never LIBDIR or LUADIR: those are install targets).
clean:
	rm -rf $(BUILD) build-asan $(OUTLIB) $(BIN) moongraph-asan
