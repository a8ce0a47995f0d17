-- bench/worker.lua — throughput and memory of `moongraph worker`.
--
--   ./moongraph run bench/worker.lua [JOBS_PER_WORKER] [CHECKPOINT] [DURABILITY]
--   make bench-worker
--
-- Runs the Eco² chat pipeline (scripts/eco/chat.lua) with its LLM served by
-- the local test server (build/testserver), which streams every reply as 50
-- tokens 5 ms apart. The reply is one JSON object that satisfies both the
-- intent classifier's and the feedback judge's schemas, so each job makes
-- three LLM calls (intent, answer, feedback) on the LLM path. Redis and
-- PostgreSQL are throwaway servers (spec/support/servers.sh).
--
-- For 1, 2 and 3 workers at concurrency 64 each: jobs per second (from the
-- first submit to the last stored result) and, per worker, the peak RSS
-- above its idle RSS divided by its peak number of jobs in flight, and the
-- workers' CPU time per job (a figure other load on the machine does not
-- change much, unlike jobs per second). The
-- checkpointer is CHECKPOINT (default: cached when this build has it, else
-- file:<tmp>) with DURABILITY (default: the worker's default);
-- BENCH_MAX_WORKERS=1 stops after the one-worker figure. Per job it also
-- prints the Redis commands and round trips (INFO stats
-- total_reads_processed: one per request batch a client sends) of the
-- workers, the bench's own submits, polls and INFO calls taken out, and the
-- token events the job's stream holds (each one piece or more of streamed
-- text: pieces that wait for the write before them go as one event).
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path

local mg = require "moongraph"
local servers = require "servers"
local testserver = require "testserver"
local wenv = require "worker_env"
local redis_counters = require("redis_stats").counters
local client = require "moongraph.worker.client"
local cjson = require "cjson"
local wconfig = require "moongraph.worker.config"

-- The main chunk of `moongraph run` is already a task.
local function inline(fn) return fn() end

local PER_WORKER = tonumber(arg and arg[1]) or 320
local CONCURRENCY = 64
local DURABILITY = (arg and arg[3] ~= nil and arg[3] ~= "") and arg[3] or wconfig.defaults.durability

local QUESTIONS = {
  "종이 어떻게 버려?", "페트병은 어떻게 분리배출해?", "스티로폼 버리는 법",
  "유리병 분리수거 방법", "캔은 어떻게 버려?", "우유팩은 어디에 버려?",
}

-- CPU seconds (user + system) the process has used.
local function cpu_seconds(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return 0 end
  local line = f:read("l")
  f:close()
  local rest = line:match("%) (.*)$")
  local fields = {}
  for w in rest:gmatch("%S+") do fields[#fields + 1] = w end
  -- after the command: state is field 3, utime 14, stime 15 (1-based in stat)
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100
end

local function status_kb(pid, name)
  local f = io.open("/proc/" .. pid .. "/status")
  if not f then return nil end
  for line in f:lines() do
    local v = line:match("^" .. name .. ":%s+(%d+) kB")
    if v then f:close() return tonumber(v) end
  end
  f:close()
end

-- 50 pieces of one JSON object both schemas accept.
local function reply_chunks()
  local text = cjson.encode {
    intent = "waste", confidence = 0.9, additional_intents = {},
    faithfulness = 0.9, groundedness = 0.85, context_relevance = 0.9, answer_relevance = 0.95,
    comment = "종이류는 물기 없이 펴서 끈으로 묶어 배출하세요. 비닐 코팅이나 테이프는 떼어냅니다.",
  }
  local chunks, n = {}, 50
  local size = math.ceil(#text / n)
  local i = 1
  while #chunks < n do
    -- cut on UTF-8 boundaries
    local j = math.min(#text, i + size - 1)
    while j < #text and (text:byte(j + 1) or 0) & 0xC0 == 0x80 do j = j + 1 end
    chunks[#chunks + 1] = text:sub(i, j)
    i = j + 1
    if i > #text then break end
  end
  while #chunks < n do chunks[#chunks + 1] = " " end
  return chunks
end

-- Token events in the event streams of the first `sample` jobs.
local function token_events(r, ids, sample)
  local n, jobs = 0, 0
  for i = 1, math.min(sample, #ids) do
    local entries = r:call("XRANGE", "moongraph:events:" .. ids[i], "-", "+")
    if type(entries) == "table" and #entries > 0 then
      jobs = jobs + 1
      for _, e in ipairs(entries) do
        if e[2][1] == "type" and e[2][2] == "token" then n = n + 1 end
      end
    end
  end
  return jobs > 0 and n / jobs or 0
end

local function run_config(env, srv, nworkers)
  local workers = {}
  local llm_env = { MOONGRAPH_LLM_BASE_URL = srv.url .. "/v1", MOONGRAPH_LLM_MODEL = "bench" }
  for i = 1, nworkers do
    workers[i] = env:worker({ "--script", "chat=scripts/eco/chat.lua", "--concurrency", tostring(CONCURRENCY),
      "--log-level", "warn", "--durability", DURABILITY,
      "--consumer", "bench-" .. nworkers .. "-" .. i, "--heartbeat", "0.1" }, llm_env)
  end
  local n = PER_WORKER * nworkers
  local out = inline(function()
    local r, db = env:conns()
    for i, w in ipairs(workers) do
      wenv.eventually("worker " .. i .. " to start (log: " .. w.dir .. "/log)", 60, function()
        assert(w:running(), "worker exited: " .. w:log())
        return r:call("EXISTS", "moongraph:workers:bench-" .. nworkers .. "-" .. i) == 1
      end)
    end
    -- warm-up: one job per worker (first use loads data, opens connections)
    local c = assert(client.connect { redis = r })
    for i = 1, nworkers * 2 do
      assert(c:submit { thread_id = "warm-" .. i, user_id = "w", input = { message = QUESTIONS[1] } })
    end
    wenv.eventually("warm-up", 60, function()
      return db:query("SELECT count(*)::int AS n FROM job_results")[1].n >= nworkers * 2
    end)
    local idle, cpu0 = {}, {}
    for i, w in ipairs(workers) do
      idle[i] = status_kb(w.pid, "VmRSS")
      cpu0[i] = cpu_seconds(w.pid)
    end
    assert(db:exec("TRUNCATE job_results"))
    local load = (io.open("/proc/loadavg"):read("l") or ""):match("^(%S+)")
    local rc0 = redis_counters(r)
    local t0 = mg.now()
    local peak_inflight = {}
    local ids = {}
    for i = 1, n do
      ids[i] = assert(c:submit { thread_id = "conv-" .. i, user_id = "u" .. (i % 50),
                                 input = { message = QUESTIONS[i % #QUESTIONS + 1] } })
    end
    local done, polls = 0, 0
    while done < n do
      mg.sleep(0.05)
      polls = polls + 1
      done = db:query("SELECT count(*)::int AS n FROM job_results")[1].n
      for i, w in ipairs(workers) do
        local hb = r:call("GET", "moongraph:workers:bench-" .. nworkers .. "-" .. i)
        local t = type(hb) == "string" and cjson.decode(hb)
        if t and t.inflight > (peak_inflight[i] or 0) then peak_inflight[i] = t.inflight end
      end
    end
    local elapsed = mg.now() - t0
    -- the workers' last acknowledgements follow the last stored result
    mg.sleep(0.5)
    local rc1 = redis_counters(r)
    -- the bench's own: rc0's INFO reply came before the count started,
    -- rc1's INFO is counted; one XADD per submit, one GET per worker per poll
    local own = 1 + n + polls * nworkers
    local redis = { cmds = (rc1.cmds - rc0.cmds - own) / n, reads = (rc1.reads - rc0.reads - own) / n,
                    tokens = token_events(r, ids, 20) }
    local failed = db:query("SELECT count(*)::int AS n FROM job_results WHERE status <> 'done'")[1].n
    local per = {}
    for i, w in ipairs(workers) do
      local peak = status_kb(w.pid, "VmHWM")
      per[i] = { idle = idle[i], peak = peak, inflight = peak_inflight[i] or 0,
                 cpu = cpu_seconds(w.pid) - cpu0[i] }
    end
    assert(db:exec("TRUNCATE job_results, messages, conversations, user_profiles"))
    r:call("FLUSHALL")
    assert(r:call("XGROUP", "CREATE", "moongraph:jobs", "moongraph", "0", "MKSTREAM"))
    return { n = n, elapsed = elapsed, failed = failed, per = per, load = load, redis = redis }
  end)
  for _, w in ipairs(workers) do
    w:signal("TERM")
  end
  inline(function() for _, w in ipairs(workers) do w:wait(60) end end)
  return out
end

local env = wenv.new { checkpoint = (arg and arg[2] ~= "" and arg[2]) or nil }
local srv = testserver.start()
local ok, err = pcall(function()
  inline(function()
    srv:record { path = "/v1/chat/completions", chunks = reply_chunks(), fault = "drip", drip_ms = 5, times = 0 }
  end)
  print(string.format("moongraph worker: Eco² chat pipeline, LLM = test server streaming 50 tokens 5 ms apart"))
  print(string.format("  3 LLM calls per job (intent, answer, feedback); concurrency %d per worker; checkpoint %s (%s); %d core(s)",
    CONCURRENCY, env.checkpoint, DURABILITY, tonumber(io.popen("nproc"):read("l")) or 0))
  for nworkers = 1, tonumber(os.getenv("BENCH_MAX_WORKERS") or 3) do
    local res = run_config(env, srv, nworkers)
    local rss = {}
    local cpu = 0
    for i, p in ipairs(res.per) do
      local per_job = p.inflight > 0 and (p.peak - p.idle) / p.inflight or 0
      rss[i] = string.format("w%d idle %.1f MiB, peak %.1f MiB, peak in flight %d, %.0f KiB/job",
        i, p.idle / 1024, p.peak / 1024, p.inflight, per_job)
      cpu = cpu + p.cpu
    end
    rss[#rss + 1] = string.format("worker CPU %.1f ms per job; load average before the run %s",
      cpu * 1000 / res.n, res.load)
    print(string.format("%d worker%s: %d jobs in %.2f s = %.1f jobs/s%s", nworkers, nworkers > 1 and "s" or " ",
      res.n, res.elapsed, res.n / res.elapsed, res.failed > 0 and (" (" .. res.failed .. " not answered)") or ""))
    for _, l in ipairs(rss) do print("    " .. l) end
    print(string.format("    per job: %.1f Redis commands in %.1f round trips; %.1f token events (LLM replies: 3 x 50 tokens)",
      res.redis.cmds, res.redis.reads, res.redis.tokens))
  end
end)
srv:stop()
env:destroy()
if not ok then error(err, 0) end
