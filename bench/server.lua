-- `make bench-server`: moongraph.server side by side with node's http
-- module and a bare H2O C handler (bench/server_h2o.c), then 10,000
-- concurrent SSE clients.
--
--   ./moongraph run bench/server.lua [ROUNDS] [SECONDS] [SSE_CLIENTS] [SSE_SECONDS]
--
-- 1. Hello-world JSON, keep-alive, 64 connections: `wrk -t1 -c64 -dSECONDS
--    --latency` against each server, ROUNDS rounds (default 5) whose order
--    rotates, so every server sees the same machine load. Medians of
--    requests/s, p99 and each server's CPU time per request (from
--    /proc/PID/stat: what it spends, whatever wrk's share of the cores),
--    the ratios, and the 1-minute load average read after each round. Goals: >= 1.5x node's requests/s, >= 0.75x the bare
--    C handler's.
-- 2. SSE_CLIENTS (default 10,000) streams of one event per second for
--    SSE_SECONDS (default 30), from build/sse_client (C on libuv) against a
--    fresh moongraph process: its RSS per connection (goal <= 8 KiB) and
--    the event delivery delay (p50, p99, max).
--
-- Every server runs in its own process; this script only drives them. node
-- is optional (skipped with a note when not installed).
package.path = "bench/?.lua;" .. package.path
local stats = require "stats"
local ROUNDS = tonumber(arg and arg[1]) or 5
local SECONDS = tonumber(arg and arg[2]) or 5
local SSE_N = tonumber(arg and arg[3]) or 10000
local SSE_SECONDS = tonumber(arg and arg[4]) or 30

local BIN = os.getenv("MOONGRAPH_BIN") or "./moongraph"

local function sh_ok(cmd)
  return os.execute(cmd .. " >/dev/null 2>&1") == true
end

local function need(cmd, what)
  if not sh_ok("command -v " .. cmd) then
    io.stderr:write("bench-server: ", cmd, " not found (", what, ")\n")
    os.exit(1)
  end
end
need("wrk", "apt-get install wrk")
for _, f in ipairs{ "build/server_h2o", "build/sse_client" } do
  if not io.open(f) then
    io.stderr:write("bench-server: ", f, " missing (run make bench-server)\n")
    os.exit(1)
  end
end

local function status_field(pid, name)
  local f = io.open("/proc/" .. pid .. "/status")
  if not f then return nil end
  for line in f:lines() do
    local v = line:match("^" .. name .. ":%s+(%d+) kB")
    if v then f:close(); return tonumber(v) end
  end
  f:close()
end

local function loadavg()
  local f = assert(io.open("/proc/loadavg"))
  local one = f:read("n")
  f:close()
  return one
end

-- Start a server command; returns {name, url, pid, fh}.
local function start(name, cmd)
  local fh = assert(io.popen("exec " .. cmd .. " 2>&1", "r"))
  local line = fh:read("l")
  local url, pid = (line or ""):match("listening on (%S+) pid (%d+)")
  if not url then
    fh:close()
    error(name .. " did not start: " .. tostring(line))
  end
  return { name = name, url = url, pid = tonumber(pid), fh = fh }
end

local function stop(s)
  os.execute("kill " .. s.pid .. " 2>/dev/null")
  s.fh:close()
end

local function ms(v, unit)
  v = tonumber(v)
  if unit == "us" then return v / 1000 elseif unit == "s" then return v * 1000 end
  return v
end

-- CPU time a process (all its threads) has used, in seconds.
local CLK_TCK = tonumber(io.popen("getconf CLK_TCK"):read("l")) or 100
local function cpu_seconds(pid)
  local f = assert(io.open("/proc/" .. pid .. "/stat"))
  local text = f:read("a")
  f:close()
  -- fields after the command name: state is field 3, utime 14, stime 15
  local rest = text:match("^%d+ %b() (.*)$")
  local fields = {}
  for v in rest:gmatch("%S+") do fields[#fields + 1] = v end
  return (tonumber(fields[12]) + tonumber(fields[13])) / CLK_TCK
end

-- One wrk run: requests/s, p99 ms, the server's CPU microseconds per request.
-- On a shared machine wrk and the server compete for the same cores, so
-- requests/s can be capped by the load generator; CPU per request is what
-- each server itself spends.
local function wrk(url, secs, pid)
  local cpu0 = pid and cpu_seconds(pid)
  local p = assert(io.popen(string.format("wrk -t1 -c64 -d%ds --latency %s/ 2>&1", secs, url)))
  local out = p:read("a")
  p:close()
  local cpu = pid and cpu_seconds(pid) - cpu0
  local rps = tonumber(out:match("Requests/sec:%s+([%d%.]+)"))
  local total = tonumber(out:match("(%d+) requests in"))
  local v, unit = out:match("\n%s+99%%%s+([%d%.]+)(%a+)")
  if not rps or not v or not total then error("wrk output not understood:\n" .. out) end
  if out:match("Non%-2xx") or out:match("Socket errors") then
    error("wrk saw errors against " .. url .. ":\n" .. out)
  end
  return rps, ms(v, unit), cpu and cpu * 1e6 / total
end

local median = stats.median

-- ------------------------------------------------------------- requests

local servers = {
  start("moongraph", BIN .. " run bench/server_app.lua 0"),
  start("bare-h2o", "build/server_h2o 0"),
}
local node_version
if sh_ok("command -v node") then
  local p = io.popen("node --version")
  node_version = p:read("l")
  p:close()
  servers[#servers + 1] = start("node", "node bench/server_node.js 0")
else
  print("node not found: the node comparison is skipped")
end

print(string.format("hello-world JSON, keep-alive, wrk -t1 -c64, %d rounds of %d s, order rotating%s",
  ROUNDS, SECONDS, node_version and (", node " .. node_version) or ""))
for _, s in ipairs(servers) do wrk(s.url, 1) end   -- warm-up
local rps, p99, cpu, loads = {}, {}, {}, {}
for _, s in ipairs(servers) do rps[s.name], p99[s.name], cpu[s.name] = {}, {}, {} end
for round = 1, ROUNDS do
  local line = { string.format("round %d:", round) }
  for k = 0, #servers - 1 do
    local s = servers[(round + k - 1) % #servers + 1]
    local r, p, c = wrk(s.url, SECONDS, s.pid)
    table.insert(rps[s.name], r)
    table.insert(p99[s.name], p)
    table.insert(cpu[s.name], c)
    line[#line + 1] = string.format("%s %.0f/s p99 %.2f ms %.1f us", s.name, r, p, c)
  end
  local l = loadavg()
  loads[#loads + 1] = l
  line[#line + 1] = string.format("load %.2f", l)
  print(table.concat(line, "  "))
end
local mg_rss = status_field(servers[1].pid, "VmHWM")
for _, s in ipairs(servers) do stop(s) end

print(string.format("%-10s %12s %10s %18s", "server", "median req/s", "p99 ms", "CPU us/request"))
for _, s in ipairs(servers) do
  print(string.format("%-10s %12.0f %10.2f %18.1f", s.name, median(rps[s.name]), median(p99[s.name]),
    median(cpu[s.name])))
end
local m, h = median(rps.moongraph), median(rps["bare-h2o"])
local mc, hc = median(cpu.moongraph), median(cpu["bare-h2o"])
print(string.format("requests/s      moongraph / bare-h2o = %.2f (goal >= 0.75): %s", m / h,
  m / h >= 0.75 and "met" or "NOT met"))
if rps.node then
  local n, nc = median(rps.node), median(cpu.node)
  print(string.format("requests/s      moongraph / node     = %.2f (goal >= 1.5): %s", m / n,
    m / n >= 1.5 and "met" or "NOT met"))
  print(string.format("requests/s      bare-h2o / node      = %.2f", h / n))
  print(string.format("requests/CPU-s  moongraph / node     = %.2f, bare-h2o / node = %.2f, moongraph / bare-h2o = %.2f",
    nc / mc, nc / hc, hc / mc))
else
  print(string.format("requests/CPU-s  moongraph / bare-h2o = %.2f", hc / mc))
end
table.sort(loads)
print(string.format("load average (1 min) after the rounds: min %.2f median %.2f max %.2f on %d CPUs",
  loads[1], median(loads), loads[#loads], tonumber(io.popen("nproc"):read("l")) or 0))
print(string.format("moongraph peak RSS during the rounds: %.1f MiB", (mg_rss or 0) / 1024))

-- ------------------------------------------------------------------ SSE

print(string.format("\n%d SSE clients, one event per second each, %d s (client: build/sse_client, C on libuv)",
  SSE_N, SSE_SECONDS))
local app = start("moongraph", BIN .. " run bench/server_app.lua 0")
local port = app.url:match(":(%d+)$")
local rss0 = status_field(app.pid, "VmRSS")
local load0 = loadavg()
local cl = assert(io.popen(string.format("build/sse_client 127.0.0.1 %s /sse %d %d 2>&1",
  port, SSE_N, SSE_SECONDS)))
local rss_connected, connected_in, result = nil, nil, {}
for line in cl:lines() do
  local n, secs = line:match("^connected (%d+) ([%d%.]+)")
  if n then
    rss_connected = status_field(app.pid, "VmRSS")
    connected_in = tonumber(secs)
    result.connected = tonumber(n)
  end
  local got, want = line:match("^events (%d+) (%d+)")
  if got then result.events, result.expected = tonumber(got), tonumber(want) end
  local p50, p99v, max = line:match("^delay_ms (%S+) (%S+) (%S+)")
  if p50 then result.p50, result.p99, result.max = tonumber(p50), tonumber(p99v), tonumber(max) end
  local errs = line:match("^errors (%d+)")
  if errs then result.errors = tonumber(errs) end
  if not (n or got or p50 or errs) then print("  sse_client: " .. line) end
end
cl:close()
local rss_end = status_field(app.pid, "VmRSS")
local hwm = status_field(app.pid, "VmHWM")
local load1 = loadavg()
stop(app)
if not rss_connected or not result.p99 then
  error("the SSE run did not complete (connected: " .. tostring(result.connected) .. ")")
end
local per = (rss_connected - rss0) / SSE_N
local per_end = (rss_end - rss0) / SSE_N
print(string.format("connected %d streams in %.2f s; errors %d", result.connected, connected_in, result.errors or -1))
print(string.format("events received %d of %d expected", result.events, result.expected))
print(string.format("delivery delay: p50 %.2f ms  p99 %.2f ms  max %.2f ms", result.p50, result.p99, result.max))
print(string.format("server RSS: %.1f MiB idle, %.1f MiB with %d streams, %.1f MiB at the end (peak %.1f MiB)",
  rss0 / 1024, rss_connected / 1024, SSE_N, rss_end / 1024, hwm / 1024))
print(string.format("RSS per connection: %.2f KiB when connected, %.2f KiB at the end (goal <= 8 KiB): %s",
  per, per_end, math.max(per, per_end) <= 8 and "met" or "NOT met"))
print(string.format("load average (1 min): %.2f before, %.2f after the SSE run", load0, load1))
