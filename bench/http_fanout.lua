-- HTTP fan-out: K = 1, 10, 100, 1000 concurrent GETs to /delay?ms=50, one
-- task each, against the local C test server; the bare libcurl-multi client
-- (bench/curl_fanout.c) runs against the same server in the same run, its
-- rounds interleaved with ours so both see the same machine load.
-- Goals: within 1.15x of the bare client at K=1000, peak RSS under 64 MiB,
-- both against the 50 ms physical limit. Also the CPU cost per request on a
-- loopback keep-alive connection.
--
--   ./moongraph run bench/http_fanout.lua [BLOCKS] [ROUNDS_PER_BLOCK] [KEEPALIVE_N]
-- (the main chunk runs as a task, so it calls the clients directly)
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local http = require "moongraph.http"
local testserver = require "testserver"
local rss = require "rss"

local BLOCKS = tonumber(arg and arg[1]) or 3
local PER_BLOCK = tonumber(arg and arg[2]) or 3
local KEEPALIVE_N = tonumber(arg and arg[3]) or 3000
local KS = { 1, 10, 100, 1000 }
local CURL = "build/curl_fanout"

local srv = testserver.start()
local curl_rss = 0

-- Run the baseline; returns its lines split into fields.
local function curl(...)
  local cmd = table.concat({ CURL, srv.url, ... }, " ")
  local p = assert(io.popen(cmd))
  local out = {}
  for line in p:lines() do
    local f = {}
    for w in line:gmatch("%S+") do f[#f + 1] = w end
    if f[1] == "rss" then curl_rss = math.max(curl_rss, tonumber(f[2]))
    else out[#out + 1] = f end
  end
  p:close()
  return out
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[#s // 2 + 1], s[1]
end

local function fanout(url, k)
  local tasks = {}
  for i = 1, k do tasks[i] = mg.spawn(http.get, url) end
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

-- per-request CPU on one keep-alive connection, measured first, while the
-- connection cache holds only that connection (as in the baseline process)
local url0 = srv.url .. "/delay?ms=0"
for _ = 1, 100 do http.get(url0) end
local ccpu, mcpu, mwall, cwall = {}, {}, {}, {}
local opened, failed = 0, 0
for _ = 1, BLOCKS do
  local f = curl("keepalive", KEEPALIVE_N)[1]
  ccpu[#ccpu + 1] = tonumber(f[2]); cwall[#cwall + 1] = tonumber(f[3])
  local before = srv:stats().connections_total
  local c0, w0 = os.clock(), mg.now()
  for _ = 1, KEEPALIVE_N do
    local res = http.get(url0)
    if not res or res.status ~= 200 then failed = failed + 1 end
  end
  mcpu[#mcpu + 1] = (os.clock() - c0) / KEEPALIVE_N * 1e6
  mwall[#mwall + 1] = (mg.now() - w0) / KEEPALIVE_N * 1e6
  opened = opened + srv:stats().connections_total - before
end
print(string.format("keep-alive, %d sequential GETs:", KEEPALIVE_N))
print(string.format("  curl_multi  %6.1f us CPU/request  %6.1f us wall/request (new easy handle each)",
  (median(ccpu)), (median(cwall))))
print(string.format("  moongraph   %6.1f us CPU/request  %6.1f us wall/request  %d new connections%s",
  (median(mcpu)), (median(mwall)), opened, failed > 0 and "  FAILURES" or ""))

local ratio_1000
local url = srv.url .. "/delay?ms=50"
print(string.format("%-11s %-7s %10s %10s %14s", "client", "K", "median ms", "best ms", "CPU us/req"))
for _, k in ipairs(KS) do
  local cw, cc, mw, mc = {}, {}, {}, {}
  local cfail, mfail = 0, fanout(url, k)   -- warm-up: opens the connections
  for _ = 1, BLOCKS do
    for _, f in ipairs(curl("fanout", k, PER_BLOCK)) do
      cw[#cw + 1] = tonumber(f[2]); cc[#cc + 1] = tonumber(f[3])
      cfail = cfail + tonumber(f[4])
    end
    for _ = 1, PER_BLOCK do
      local c0, t0 = os.clock(), mg.now()
      mfail = mfail + fanout(url, k)
      mw[#mw + 1] = (mg.now() - t0) * 1000
      mc[#mc + 1] = (os.clock() - c0) / k * 1e6
    end
    collectgarbage()
  end
  local cmed, cbest = median(cw)
  local mmed, mbest = median(mw)
  print(string.format("%-11s K=%-5d %10.1f %10.1f %14.1f%s", "curl_multi", k, cmed, cbest,
    (median(cc)), cfail > 0 and "  FAILURES" or ""))
  print(string.format("%-11s K=%-5d %10.1f %10.1f %14.1f   %.2fx curl_multi%s", "moongraph", k,
    mmed, mbest, (median(mc)), mmed / cmed, mfail > 0 and "  FAILURES" or ""))
  if k == 1000 then ratio_1000 = mmed / cmed end
end
print("(the physical limit is 50 ms: the server answers each request after 50 ms)")

srv:stop()

local peak = rss.peak() / 1024
print(string.format("peak RSS: moongraph %.1f MiB (goal < 64), curl_multi %.1f MiB", peak, curl_rss / 1024))
print(string.format("K=1000: moongraph / curl_multi = %.2f (goal <= 1.15): %s; peak RSS %s",
  ratio_1000, ratio_1000 <= 1.15 and "met" or "NOT met", peak < 64 and "met" or "NOT met"))
