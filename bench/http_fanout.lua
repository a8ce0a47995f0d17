-- HTTP fan-out: K = 1, 10, 100, 1000 concurrent GETs to /delay?ms=50, one
-- task each, against the local C test server; the bare libcurl-multi client
-- (bench/curl_fanout.c) runs against the same server in the same run.
-- Goals: within 1.15x of the bare client at K=1000, peak RSS under 64 MiB,
-- both against the 50 ms physical limit. Then the CPU cost per request on a
-- loopback keep-alive connection.
--
--   ./moongraph run bench/http_fanout.lua [ROUNDS] [KEEPALIVE_N]
-- (the main chunk runs as a task, so it calls the clients directly)
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local http = require "moongraph.http"
local testserver = require "testserver"
local rss = require "rss"

local ROUNDS = tonumber(arg and arg[1]) or 5
local KEEPALIVE_N = tonumber(arg and arg[2]) or 5000
local KS = { 1, 10, 100, 1000 }

local srv = testserver.start()

-- the baseline first, in its own process, on the same server
local baseline = {}
local p = assert(io.popen(string.format("build/curl_fanout %s %d %d", srv.url, ROUNDS, KEEPALIVE_N)))
for line in p:lines() do
  print(line)
  local k, median = line:match("K=(%d+)%s+median%s+([%d.]+) ms")
  if k then baseline[tonumber(k)] = tonumber(median) end
end
p:close()

local function fanout(url, k)
  local tasks = {}
  for i = 1, k do
    tasks[i] = mg.spawn(http.get, url)
  end
  local failed = 0
  for i = 1, k do
    local ok, res, err = tasks[i]:join()
    if not ok or not res or res.status ~= 200 then
      failed = failed + 1
      if failed == 1 then io.stderr:write("request failed: ", tostring(err or res), "\n") end
    end
  end
  return failed
end

local ratio_1000
do
  local url = srv.url .. "/delay?ms=50"
  for _, k in ipairs(KS) do
    local failed = fanout(url, k)   -- warm-up: opens the connections
    local t = {}
    local c0 = os.clock()
    for r = 1, ROUNDS do
      local t0 = mg.now()
      failed = failed + fanout(url, k)
      t[r] = (mg.now() - t0) * 1000
    end
    local cpu = (os.clock() - c0) / (ROUNDS * k) * 1e6
    table.sort(t)
    local median = t[ROUNDS // 2 + 1]
    local vs = baseline[k] and string.format("  %.2fx curl_multi", median / baseline[k]) or ""
    if k == 1000 and baseline[k] then ratio_1000 = median / baseline[k] end
    print(string.format("moongraph   K=%-5d median %7.1f ms  best %7.1f ms  (limit 50 ms)  "
      .. "%6.1f us CPU/request%s%s", k, median, t[1], cpu, vs, failed > 0 and "  FAILURES" or ""))
  end

  -- per-request CPU on one keep-alive connection
  local url0 = srv.url .. "/delay?ms=0"
  for _ = 1, 100 do http.get(url0) end
  local before = srv:stats().connections_total
  local c0, w0 = os.clock(), mg.now()
  local failed = 0
  for _ = 1, KEEPALIVE_N do
    local res = http.get(url0)
    if not res or res.status ~= 200 then failed = failed + 1 end
  end
  local cpu, wall = os.clock() - c0, mg.now() - w0
  local opened = srv:stats().connections_total - before
  print(string.format("moongraph   keep-alive %d sequential GETs: %.1f us CPU/request, "
    .. "%.1f us wall/request, %d new connections%s", KEEPALIVE_N, cpu / KEEPALIVE_N * 1e6,
    wall / KEEPALIVE_N * 1e6, opened, failed > 0 and "  FAILURES" or ""))
end
srv:stop()

local peak = rss.peak() / 1024
print(string.format("moongraph   peak RSS %.1f MiB (goal < 64)", peak))
if ratio_1000 then
  print(string.format("K=1000: moongraph / curl_multi = %.2f (goal <= 1.15): %s; peak RSS %s",
    ratio_1000, ratio_1000 <= 1.15 and "met" or "NOT met", peak < 64 and "met" or "NOT met"))
end
