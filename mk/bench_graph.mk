# Graph engine benchmarks compared with @langchain/langgraph (bench/peer,
# installed with npm on first use; never committed).
BENCH_DEPS += bench-graph

.PHONY: bench-graph
bench-graph: all
	@if command -v npm >/dev/null 2>&1; then \
	  [ -f bench/peer/node_modules/@langchain/langgraph/package.json ] || \
	  (cd bench/peer && npm install --no-audit --no-fund --loglevel=error) || \
	  echo "bench-graph: npm install failed; LangGraph figures skipped"; \
	else echo "bench-graph: node/npm not found; LangGraph figures skipped"; fi
	./$(BIN) run bench/graph_compare.lua
