-- The Chat API under load (`make bench-api`): CLIENTS concurrent clients,
-- each POST /chat/messages and then reading the job's SSE stream to `done`,
-- offline Eco² pipeline, in both backends, each beside the same jobs
-- without the gateway:
--
--   embedded     `moongraph serve` (a data directory of its own) beside the
--                same jobs submitted to the same backend in this process
--                without HTTP (moongraph.api.chat_embedded: the durable
--                accept, the run with its file checkpoints, the event log)
--   distributed  `moongraph serve --redis --pg` in front of one `moongraph
--                worker` (--concurrency CLIENTS) beside the same jobs sent
--                as `moongraph submit` does (worker client: XADD, then the
--                job's event stream followed to done); throwaway Redis and
--                PostgreSQL (spec/support/worker_env.lua)
--
-- The ratio is the gateway's overhead (goal <= 1.2x). Rounds alternate
-- (gateway, without, gateway, ...); figures are medians of the rounds,
-- with the load average beside.
--
--   ./moongraph run bench/api.lua [CLIENTS] [ROUNDS] [embedded|distributed|both]
--
-- Per round: p50 and p99 of the time to the first event and to `done`,
-- measured from just before the POST (the submit), and jobs per second.
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local http = require "moongraph.http"
local process = require "moongraph.process"
local json = require "moongraph.json"
local embedded = require "moongraph.api.chat_embedded"
local stats = require "stats"

local CLIENTS = tonumber(arg and arg[1]) or 200
local ROUNDS = tonumber(arg and arg[2]) or 3
local WHICH = arg and arg[3] or "both"
local MESSAGE = "종이 어떻게 버려? 그리고 수거함도 알려줘"
local LOCATION = "서울특별시 강남구"

local function tmpdir(tag)
  local d = os.tmpname()
  os.remove(d)
  d = d .. "-" .. tag
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

local percentile, median = stats.percentile, stats.median

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

-- The gateway's client: POST then the SSE stream to done -> first, done
local body = json.encode { message = MESSAGE, user_location = LOCATION }
local function via_http(base, headers)
  local t0 = mg.now()
  local h = { ["Content-Type"] = "application/json" }
  for k, v in pairs(headers or {}) do h[k] = v end
  local res = assert(http.request { method = "POST", url = base .. "/chat/messages", body = body,
    headers = h, timeout = 120 })
  if res.status ~= 202 then error("POST answered " .. res.status .. ": " .. res.body, 0) end
  local job = assert(res:json())
  local first, done, tail = nil, nil, ""
  local sh = { Accept = "text/event-stream" }
  for k, v in pairs(headers or {}) do sh[k] = v end
  local sres, err = http.request { url = base .. job.stream_url, timeout = 120, headers = sh,
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

-- `moongraph serve ARGS...` started; its base URL and the process
local function start_serve(args, env)
  local full = { "./moongraph", "serve", "--port", "0", "--rate-limit", "0" }
  for _, a in ipairs(args) do full[#full + 1] = a end
  local srv = assert(process.spawn(full, { stderr = "inherit", env = env }))
  for line in srv.stdout:lines() do
    local base = line:match("^listening on (%S+)")
    if base then return base, srv end
  end
  error("moongraph serve did not start", 0)
end

local function compare(title, gateway, without, labels)
  round(gateway)      -- warm-up: connections, compiled scripts, the model
  round(without)
  local rows = { a = {}, b = {} }
  print(string.format("%s: %d clients at once, one message each, %d interleaved rounds:", title, CLIENTS, ROUNDS))
  for r = 1, ROUNDS do
    rows.a[r] = round(gateway)
    rows.b[r] = round(without)
    for _, k in ipairs { "a", "b" } do
      local x = rows[k][r]
      print(string.format("  round %d %-12s first event p50 %7.1f p99 %7.1f ms; done p50 %7.1f p99 %7.1f ms; %6.0f jobs/s",
        r, labels[k], x.first_p50, x.first_p99, x.done_p50, x.done_p99, x.rate))
    end
  end
  local function med(k, field)
    local xs = {}
    for r = 1, ROUNDS do xs[r] = rows[k][r][field] end
    return median(xs)
  end
  for _, k in ipairs { "a", "b" } do
    print(string.format("  median %-12s first event p50 %.1f ms p99 %.1f ms; done p50 %.1f ms p99 %.1f ms; %.0f jobs/s",
      labels[k], med(k, "first_p50"), med(k, "first_p99"), med(k, "done_p50"), med(k, "done_p99"), med(k, "rate")))
  end
  print(string.format("  gateway overhead: done p50 %.2fx, throughput %.2fx (goal <= 1.2x)",
    med("a", "done_p50") / med("b", "done_p50"), med("b", "rate") / med("a", "rate")))
  local load = io.open("/proc/loadavg")
  if load then print("  load average: " .. load:read("l")); load:close() end
end

if WHICH == "embedded" or WHICH == "both" then
  local serve_dir = tmpdir("serve")
  local base, srv = start_serve { "--concurrency", tostring(CLIENTS), "--data", serve_dir .. "/data" }
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
      for _, e in ipairs(log:after(seen)) do
        seen = e.id
        if not first then first = mg.now() - t0 end
        if e.type == "done" then return first, mg.now() - t0 end
      end
      log:wait(seen, 60)
    end
  end
  compare("embedded backend", function() return via_http(base) end, in_process,
    { a = "HTTP+SSE", b = "in-process" })
  srv:close()
  os.execute("rm -rf '" .. serve_dir .. "' '" .. local_dir .. "'")
end

if WHICH == "distributed" or WHICH == "both" then
  local wenv = require "worker_env"
  local client = require "moongraph.worker.client"
  local env = wenv.new { persist = true }
  local ok, err = pcall(function()
    local worker = env:worker { "--script", "chat=scripts/eco/chat.lua", "--concurrency", tostring(CLIENTS) }
    worker:wait_started()
    local base, srv = start_serve { "--script", "chat=scripts/eco/chat.lua", "--redis", env.redis_url,
                                    "--pg", env.pg_url }
    local c = assert(client.connect(env.redis_url))
    local n = 0
    local function submitted()
      local t0 = mg.now()
      n = n + 1
      local job_id = assert(c:submit { thread_id = "bench-" .. n, user_id = "bench", script = "chat",
                                       input = { message = MESSAGE, user_location = LOCATION } })
      local first
      local last, done = c:follow(job_id, { block = 1, idle_timeout = 120, on_event = function()
        if not first then first = mg.now() - t0 end
      end })
      if not last then error("follow: " .. tostring(done), 0) end
      return first, mg.now() - t0
    end
    compare("distributed backend (one worker)", function() return via_http(base) end, submitted,
      { a = "HTTP+SSE", b = "submit" })
    c:close()
    srv:close()
  end)
  env:destroy()
  if not ok then error(err, 0) end
end
