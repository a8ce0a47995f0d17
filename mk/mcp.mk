# The official peers the specs and bench/mcp.lua talk to
# (spec/support/node: the TypeScript SDK's client and the reference server
# @modelcontextprotocol/server-everything; the LangGraph SDK client
# @langchain/langgraph-sdk for moongraph serve), installed with `npm ci` from the
# committed lockfile, again only when the lockfile changes.
MCP_PEERS := spec/support/node/node_modules/.package-lock.json
TEST_DEPS += $(MCP_PEERS)
BENCH_DEPS += bench-mcp

$(MCP_PEERS): spec/support/node/package-lock.json spec/support/node/package.json
	@command -v npm >/dev/null || { echo "the MCP specs need node and npm (make deps installs nodejs and npm)"; exit 1; }
	cd spec/support/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# One MCP tool call over stdio, round trip and calls/s: moongraph's client
# and the TypeScript SDK's client against the same moongraph server.
.PHONY: bench-mcp
bench-mcp: all $(MCP_PEERS)
	./$(BIN) run bench/mcp.lua
