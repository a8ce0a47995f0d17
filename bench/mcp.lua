-- One MCP tool call over stdio, moongraph's client next to the official
-- TypeScript SDK's client, both against the same server (`moongraph mcp
-- serve bench/mcp_tools.lua`, one echo tool). `make bench-mcp` runs it.
--
-- Each round starts a fresh server for each client, warms up, then times
--   latency     SEQ sequential calls: median round trip
--   seq/s       the same calls per second
--   conc/s      CONC calls with INFLIGHT in flight at once (parallel tasks
--               on one connection; Promise.all on the SDK side)
-- Rounds alternate the two clients; the summary gives medians over rounds
-- and ratios (SDK figure / moongraph figure for time, the inverse for
-- rates), with the machine's load average.
package.path = "bench/?.lua;" .. package.path
local stats = require "stats"
local mg = require "moongraph"
local mcp = require "moongraph.mcp"
local process = require "moongraph.process"

local ROUNDS = tonumber(os.getenv("ROUNDS") or "") or 5
local SEQ, CONC, INFLIGHT = 2000, 5000, 32
local bin = os.getenv("MOONGRAPH_BIN") or "./moongraph"
local server = { bin, "mcp", "serve", "bench/mcp_tools.lua" }

local median = stats.median

local function loadavg()
  local f = io.open("/proc/loadavg")
  local s = f and f:read("l") or "?"
  if f then f:close() end
  return s:match("^(%S+ %S+ %S+)") or s
end

local function ours()
  local c <close> = assert(mcp.connect { command = server, kill_grace = 1 })
  local function call(i) assert(c:call_tool("echo", { text = "x" .. i })) end
  for i = 1, 200 do call(i) end
  local lat = {}
  local t0 = mg.now()
  for i = 1, SEQ do
    local a = mg.now()
    call(i)
    lat[i] = (mg.now() - a) * 1e6
  end
  local seq_s = mg.now() - t0
  local next_i = 0
  local fns = {}
  for k = 1, INFLIGHT do
    fns[k] = function()
      while next_i < CONC do
        next_i = next_i + 1
        call(next_i)
      end
    end
  end
  t0 = mg.now()
  for _, r in ipairs(mg.gather(fns)) do assert(r.ok, r.err) end
  local conc_s = mg.now() - t0
  return { latency = median(lat), seq = SEQ / seq_s, conc = CONC / conc_s }
end

local function sdk()
  local args = { "node", "bench/mcp_sdk.mjs", tostring(SEQ), tostring(CONC), tostring(INFLIGHT) }
  for _, a in ipairs(server) do args[#args + 1] = a end
  local r = assert(process.run(args, { timeout = 300 }))
  local lat, seq, conc = r.stdout:match("latency_us ([%d%.]+) seq_per_s (%d+) conc_per_s (%d+)")
  if not lat then error("the SDK client failed: " .. r.stdout .. r.stderr) end
  return { latency = tonumber(lat), seq = tonumber(seq), conc = tonumber(conc) }
end

local have = io.open("spec/support/node/node_modules/@modelcontextprotocol/sdk/package.json")
if not have then error("the SDK is not installed: make bench-mcp runs npm ci in spec/support/node first") end
have:close()

print(string.format("mcp tool call over stdio: %d rounds, %d sequential calls, %d calls with %d in flight; load %s",
  ROUNDS, SEQ, CONC, INFLIGHT, loadavg()))
local A, B = { latency = {}, seq = {}, conc = {} }, { latency = {}, seq = {}, conc = {} }
for round = 1, ROUNDS do
  local first, second = ours, sdk
  if round % 2 == 0 then first, second = sdk, ours end
  for _, fn in ipairs { first, second } do
    local r = fn()
    local into = fn == ours and A or B
    for k, v in pairs(r) do into[k][#into[k] + 1] = v end
    print(string.format("round %d %-9s latency %8.1f us  seq %7.0f calls/s  %d in flight %7.0f calls/s",
      round, fn == ours and "moongraph" or "ts-sdk", r.latency, r.seq, INFLIGHT, r.conc))
  end
end
local a = { latency = median(A.latency), seq = median(A.seq), conc = median(A.conc) }
local b = { latency = median(B.latency), seq = median(B.seq), conc = median(B.conc) }
print(string.format("\nsummary (medians over %d rounds; load %s)", ROUNDS, loadavg()))
print(string.format("%-34s %10s %10s %8s", "", "moongraph", "ts-sdk", "ratio"))
print(string.format("%-34s %10.1f %10.1f %7.2fx", "round trip, one call (us)", a.latency, b.latency, b.latency / a.latency))
print(string.format("%-34s %10.0f %10.0f %7.2fx", "sequential calls/s", a.seq, b.seq, a.seq / b.seq))
print(string.format("%-34s %10.0f %10.0f %7.2fx", INFLIGHT .. " in flight, calls/s", a.conc, b.conc, a.conc / b.conc))
print("ratio > 1: moongraph faster (client side; both talk to the same moongraph server)")
