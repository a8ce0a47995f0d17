# Store benchmarks beside LangGraph.js's InMemoryStore and PostgresStore
# (bench/peer/store, installed with npm on first use; never committed):
# put / get / batched get / search per second from 64 tasks.
BENCH_DEPS += bench-store

.PHONY: bench-store
bench-store: all
	@if command -v npm >/dev/null 2>&1; then \
	  [ -f bench/peer/store/node_modules/@langchain/langgraph-checkpoint-postgres/package.json ] || \
	  (cd bench/peer/store && npm install --no-audit --no-fund --loglevel=error) || \
	  echo "bench-store: npm install failed; LangGraph.js figures skipped"; \
	else echo "bench-store: node/npm not found; LangGraph.js figures skipped"; fi
	./$(BIN) run bench/store.lua
