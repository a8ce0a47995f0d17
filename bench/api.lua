-- The Chat API under load (`make bench-api`): CLIENTS concurrent clients,
-- each POST /chat/messages and then reading the job's SSE stream to `done`,
-- against `moongraph serve` (embedded backend, offline Eco² pipeline, a data
-- directory of its own); beside the same jobs submitted to the same backend
-- in this process without HTTP (moongraph.api.chat_embedded: the durable
-- accept, the run with its file checkpoints, the event log), read from its
-- event logs. The ratio is the gateway's overhead (goal <= 1.2x). Rounds
-- alternate (gateway, in-process, gateway, ...); figures are medians of the
-- rounds, with the load average beside.
--
--   ./moongraph run bench/api.lua [CLIENTS] [ROUNDS]
--
-- Per round: p50 and p99 of the time to the first event and to `done`,
-- measured from just before the POST (the submit), and jobs per second.
package.path = "bench/?.lua;" .. package.path
local mg = require "moongraph"
local http = require "moongraph.http"
local process = require "moongraph.process"
local json = require "moongraph.json"
local embedded = require "moongraph.api.chat_embedded"

local CLIENTS = tonumber(arg and arg[1]) or 200
local ROUNDS = tonumber(arg and arg[2]) or 3
local MESSAGE = "종이 어떻게 버려? 그리고 수거함도 알려줘"
local LOCATION = "서울특별시 강남구"

local function tmpdir(tag)
  local d = os.tmpname()
  os.remove(d)
  d = d .. "-" .. tag
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

local function percentile(sorted, p)
  return sorted[math.max(1, math.ceil(p / 100 * #sorted))]
end

local function median(xs)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

-- CLIENTS jobs at once through one(i) -> first, done (seconds after its
-- start): {first_p50, first_p99, done_p50, done_p99 (ms), rate (jobs/s)}
local function round(one)
  local firsts, dones = {}, {}
  local t0 = mg.now()
  local ws = {}
  for i = 1, CLIENTS do
    ws[i] = mg.spawn(function()
      local first, done = one(i)
      firsts[#firsts + 1], dones[#dones + 1] = first * 1000, done * 1000
    end)
  end
  for i = 1, CLIENTS do
    local ok, err = ws[i]:join()
    if not ok then error("a client failed: " .. tostring(err), 0) end
  end
  local wall = mg.now() - t0
  table.sort(firsts)
  table.sort(dones)
  return { first_p50 = percentile(firsts, 50), first_p99 = percentile(firsts, 99),
           done_p50 = percentile(dones, 50), done_p99 = percentile(dones, 99), rate = CLIENTS / wall }
end

-- the gateway: a moongraph serve process
local serve_dir = tmpdir("serve")
local srv = assert(process.spawn({ "./moongraph", "serve", "--port", "0", "--rate-limit", "0",
  "--concurrency", tostring(CLIENTS), "--data", serve_dir .. "/data" }, { stderr = "inherit" }))
local base
for line in srv.stdout:lines() do
  base = line:match("^listening on (%S+)")
  if base then break end
end
assert(base, "moongraph serve did not start")

local body = json.encode { message = MESSAGE, user_location = LOCATION }
local function via_http()
  local t0 = mg.now()
  local res = assert(http.request { method = "POST", url = base .. "/chat/messages", body = body,
    headers = { ["Content-Type"] = "application/json" }, timeout = 120 })
  if res.status ~= 202 then error("POST answered " .. res.status .. ": " .. res.body, 0) end
  local job = assert(res:json())
  local first, done, tail = nil, nil, ""
  local sres, err = http.request { url = base .. job.stream_url, timeout = 120,
    headers = { Accept = "text/event-stream" },
    on_data = function(chunk)
      if not first and chunk:find("id:", 1, true) then first = mg.now() - t0 end
      local seen = tail .. chunk
      tail = seen:sub(-16)   -- a marker cut between two chunks
      if seen:find("event: done", 1, true) then
        done = mg.now() - t0
        return false
      end
    end }
  if not sres and not done then error("stream: " .. tostring(err), 0) end
  if not done then error("the stream ended before done", 0) end
  return first, done
end

-- the same jobs in this process, on a backend of its own
local local_dir = tmpdir("inproc")
local backend = assert(embedded.new { data = local_dir .. "/data", concurrency = CLIENTS,
  scripts = { { name = "chat", path = "scripts/eco/chat.lua" } } })
local function in_process()
  local t0 = mg.now()
  local job, status, msg = backend:submit("bench", { message = MESSAGE, user_location = LOCATION })
  if not job then error("submit: " .. tostring(status) .. " " .. tostring(msg), 0) end
  local log = assert(backend:events("bench", job.job_id))
  local first, seen = nil, 0
  while true do
    local evs = log:after(seen)
    for _, e in ipairs(evs) do
      seen = e.id
      if not first then first = mg.now() - t0 end
      if e.type == "done" then return first, mg.now() - t0 end
    end
    log:wait(seen, 60)
  end
end

do
  round(via_http)      -- warm-up: connections, compiled scripts, the model
  round(in_process)
  local rows = { http = {}, inproc = {} }
  print(string.format("%d clients at once, one message each, %d interleaved rounds:", CLIENTS, ROUNDS))
  for r = 1, ROUNDS do
    rows.http[r] = round(via_http)
    rows.inproc[r] = round(in_process)
    for _, k in ipairs { "http", "inproc" } do
      local x = rows[k][r]
      print(string.format("  round %d %-10s first event p50 %7.1f p99 %7.1f ms; done p50 %7.1f p99 %7.1f ms; %6.0f jobs/s",
        r, k == "http" and "HTTP+SSE" or "in-process", x.first_p50, x.first_p99, x.done_p50, x.done_p99, x.rate))
    end
  end
  local function med(k, field)
    local xs = {}
    for r = 1, ROUNDS do xs[r] = rows[k][r][field] end
    return median(xs)
  end
  print(string.format("median HTTP+SSE:   first event p50 %.1f ms p99 %.1f ms; done p50 %.1f ms p99 %.1f ms; %.0f jobs/s",
    med("http", "first_p50"), med("http", "first_p99"), med("http", "done_p50"), med("http", "done_p99"), med("http", "rate")))
  print(string.format("median in-process: first event p50 %.1f ms p99 %.1f ms; done p50 %.1f ms p99 %.1f ms; %.0f jobs/s",
    med("inproc", "first_p50"), med("inproc", "first_p99"), med("inproc", "done_p50"), med("inproc", "done_p99"), med("inproc", "rate")))
  print(string.format("gateway overhead: done p50 %.2fx, throughput %.2fx (goal <= 1.2x)",
    med("http", "done_p50") / med("inproc", "done_p50"), med("inproc", "rate") / med("http", "rate")))
  local load = io.open("/proc/loadavg")
  if load then print("load average: " .. load:read("l")); load:close() end
  srv:close()
end
os.execute("rm -rf '" .. serve_dir .. "' '" .. local_dir .. "'")
