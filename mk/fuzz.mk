# Fuzz harnesses (libFuzzer + ASan/UBSan). Needs clang and libclang-rt-14-dev.
#   make fuzz                 run every harness for FUZZ_RUNS executions
#   make fuzz FUZZ_RUNS=N     choose the count
FUZZ_CC ?= clang
FUZZ_RUNS ?= 1000000
# SSE framing state is reached with short inputs; longer ones only slow it down
FUZZ_ARGS ?= -max_len=1024
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-Iruntime $(shell pkg-config --cflags lua5.4 libuv)
FUZZ_LIBS = $(shell pkg-config --libs lua5.4)

build/fuzz/sse_fuzz: fuzz/sse_fuzz.c runtime/sse.c runtime/sse.h runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/sse_fuzz.c runtime/sse.c -o $@ $(FUZZ_LIBS)

.PHONY: fuzz fuzz-sse
fuzz: fuzz-sse

# New interesting inputs go to build/fuzz/corpus-sse; fuzz/corpus/sse holds
# the checked-in seeds.
fuzz-sse: build/fuzz/sse_fuzz
	@mkdir -p build/fuzz/corpus-sse
	build/fuzz/sse_fuzz -runs=$(FUZZ_RUNS) -dict=fuzz/sse.dict $(FUZZ_ARGS) \
		-print_final_stats=1 build/fuzz/corpus-sse fuzz/corpus/sse

# The C JSON encoder against the Lua one (fuzz/json_fuzz.c), from the
# repository root so that the harness finds runtime/lua.
build/fuzz/json_fuzz: fuzz/json_fuzz.c fuzz/json_harness.h runtime/json.c runtime/walk.h runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/json_fuzz.c runtime/json.c -o $@ $(FUZZ_LIBS) -lm

.PHONY: fuzz-json
fuzz: fuzz-json

fuzz-json: build/fuzz/json_fuzz
	@mkdir -p build/fuzz/corpus-json
	build/fuzz/json_fuzz -runs=$(FUZZ_RUNS) -max_len=512 -print_final_stats=1 build/fuzz/corpus-json fuzz/corpus/json

# The C JSON decoder against the Lua one (fuzz/json_decode_fuzz.c), on
# arbitrary bytes seeded with the encoder's corpus.
build/fuzz/json_decode_fuzz: fuzz/json_decode_fuzz.c fuzz/json_harness.h runtime/json.c runtime/walk.h runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/json_decode_fuzz.c runtime/json.c -o $@ $(FUZZ_LIBS) -lm

.PHONY: fuzz-json-decode
fuzz: fuzz-json-decode

fuzz-json-decode: build/fuzz/json_decode_fuzz
	@mkdir -p build/fuzz/corpus-json-decode
	build/fuzz/json_decode_fuzz -runs=$(FUZZ_RUNS) -max_len=512 -print_final_stats=1 build/fuzz/corpus-json-decode fuzz/corpus/json-decode

# The HTTP server's own parsing: the request reader over http-parser
# (fuzz/http1_fuzz.c), routes and percent-decoding (fuzz/route_fuzz.c) and
# static path resolution (fuzz/static_fuzz.c).
SERVER_FUZZ_SRC = runtime/http1.c runtime/route.c runtime/static.c
SERVER_FUZZ_HDR = runtime/http1.h runtime/server.h

build/fuzz/%_fuzz: fuzz/%_fuzz.c $(SERVER_FUZZ_SRC) $(SERVER_FUZZ_HDR)
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $< $(SERVER_FUZZ_SRC) -o $@ -lhttp_parser

.PHONY: fuzz-http1 fuzz-route fuzz-static
fuzz: fuzz-http1 fuzz-route fuzz-static

fuzz-http1 fuzz-route fuzz-static: fuzz-%: build/fuzz/%_fuzz
	@mkdir -p build/fuzz/corpus-$*
	build/fuzz/$*_fuzz -runs=$(FUZZ_RUNS) -dict=fuzz/http.dict -max_len=2048 \
		-print_final_stats=1 build/fuzz/corpus-$* fuzz/corpus/$*

# The code-point scans of the Eco² nodes (fuzz/codepoints_fuzz.c): each
# scan's promises checked on arbitrary bytes.
build/fuzz/codepoints_fuzz: fuzz/codepoints_fuzz.c fuzz/check_harness.h runtime/codepoints.c runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/codepoints_fuzz.c runtime/codepoints.c -o $@ $(FUZZ_LIBS)

.PHONY: fuzz-codepoints
fuzz: fuzz-codepoints

fuzz-codepoints: build/fuzz/codepoints_fuzz
	@mkdir -p build/fuzz/corpus-codepoints
	build/fuzz/codepoints_fuzz -runs=$(FUZZ_RUNS) -max_len=256 -print_final_stats=1 \
		build/fuzz/corpus-codepoints fuzz/corpus/codepoints

# core.pack's reader (fuzz/pack_fuzz.c): damaged input is refused, and
# what it reads packs and reads back the same.
build/fuzz/pack_fuzz: fuzz/pack_fuzz.c fuzz/check_harness.h runtime/pack.c runtime/buf.h runtime/walk.h runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/pack_fuzz.c runtime/pack.c -o $@ $(FUZZ_LIBS) -lm

.PHONY: fuzz-pack
fuzz: fuzz-pack

fuzz-pack: build/fuzz/pack_fuzz
	@mkdir -p build/fuzz/corpus-pack
	build/fuzz/pack_fuzz -runs=$(FUZZ_RUNS) -max_len=512 -print_final_stats=1 build/fuzz/corpus-pack fuzz/corpus/pack

# core.sentences.split (fuzz/sentences_fuzz.c) against the Lua patterns it
# replaces, from the repository root (the harness loads
# spec/support/sentences_reference.lua).
build/fuzz/sentences_fuzz: fuzz/sentences_fuzz.c fuzz/check_harness.h runtime/sentences.c runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/sentences_fuzz.c runtime/sentences.c -o $@ $(FUZZ_LIBS)

.PHONY: fuzz-sentences
fuzz: fuzz-sentences

fuzz-sentences: build/fuzz/sentences_fuzz
	@mkdir -p build/fuzz/corpus-sentences
	build/fuzz/sentences_fuzz -runs=$(FUZZ_RUNS) -max_len=256 -print_final_stats=1 \
		build/fuzz/corpus-sentences fuzz/corpus/sentences

# The checks every request field goes through (fuzz/fields_fuzz.c): request
# bodies decoded by the C decoder, each value put through every check of
# runtime/lua/moongraph/api/fields.lua, from the repository root.
build/fuzz/fields_fuzz: fuzz/fields_fuzz.c fuzz/json_harness.h runtime/json.c runtime/walk.h runtime/mg.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) fuzz/fields_fuzz.c runtime/json.c -o $@ $(FUZZ_LIBS) -lm

.PHONY: fuzz-fields
fuzz: fuzz-fields

fuzz-fields: build/fuzz/fields_fuzz
	@mkdir -p build/fuzz/corpus-fields
	build/fuzz/fields_fuzz -runs=$(FUZZ_RUNS) -max_len=512 -print_final_stats=1 build/fuzz/corpus-fields fuzz/corpus/fields
