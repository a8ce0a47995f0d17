-- bench/worker_offline.lua — one `moongraph worker` beside the same pipeline
-- invoked in-process, on the offline Eco² chat pipeline (no LLM: offline
-- classifier, extractive answer, heuristic feedback).
--
--   ./moongraph run bench/worker_offline.lua [JOBS] [ROUNDS] [CHECKPOINT] [DURABILITY] [LOG_LEVEL]
--   make bench-worker OFFLINE=1
--
-- The worker logs at LOG_LEVEL (default warn: the in-process side writes
-- no log; `info`, the worker's default, adds its job and node lines).
--
-- Throwaway servers started durable: PostgreSQL with fsync on, Redis with
-- appendonly + appendfsync everysec. Both sides use the same saver
-- (CHECKPOINT, default cached: Postgres behind a Redis cache) and the same
-- durability (default: the worker's default), 64 runs in flight:
--
--   in-process  chat.build{checkpointer = saver}:invoke(input, {thread_id,
--               durability}) from 64 tasks of this process
--   worker      one worker process (--concurrency 64); JOBS jobs submitted
--               to its queue, timed from the first submit to the last stored
--               result. A job is the pipeline plus what the worker adds:
--               the job's memory (Redis + Postgres), its event stream, its
--               result row, the checkpoints' clean-up.
--
-- The two alternate for ROUNDS rounds (interleaved, so a noisy neighbour
-- hits both); medians are printed with the ratio, and for each side the CPU
-- per job of every process (this bench process for the in-process side, the
-- worker, redis-server, every PostgreSQL process), Redis commands, Redis
-- reads (INFO stats total_reads_processed: one per request batch a client
-- sends, the round trips) and Postgres transactions (pg_stat_database
-- xact_commit + xact_rollback) per job. The bench's own queries (submits,
-- the polling for results, the statistics) are counted and taken out.
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path

local mg = require "moongraph"
local wenv = require "worker_env"
local redis_counters = require("redis_stats").counters
local client = require "moongraph.worker.client"
local checkpointer = require "moongraph.worker.checkpointer"
local wconfig = require "moongraph.worker.config"
local chat = require "scripts.eco.chat"

local JOBS = tonumber(arg and arg[1]) or 400
local ROUNDS = tonumber(arg and arg[2]) or 3
local CHECKPOINT = (arg and arg[3] ~= nil and arg[3] ~= "") and arg[3] or "cached"
local DURABILITY = (arg and arg[4] ~= nil and arg[4] ~= "") and arg[4] or wconfig.defaults.durability
local LOG_LEVEL = (arg and arg[5] ~= nil and arg[5] ~= "") and arg[5] or "warn"
local CONCURRENCY = 64

local QUESTIONS = {
  "종이 어떻게 버려?", "페트병은 어떻게 분리배출해?", "스티로폼 버리는 법",
  "유리병 분리수거 방법", "캔은 어떻게 버려?", "우유팩은 어디에 버려?",
}

---------------------------------------------------------------- /proc

local TICK = 100   -- USER_HZ on Linux

local function stat_fields(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local line = f:read("l")
  f:close()
  local rest = line and line:match("%) (.*)$")
  if not rest then return nil end
  local t = {}
  for w in rest:gmatch("%S+") do t[#t + 1] = w end
  return t   -- t[1] = state (field 3), t[2] = ppid, t[12..15] = utime stime cutime cstime
end

-- CPU seconds of a process (with reap = true: plus its reaped children).
local function cpu_of(pid, reap)
  local t = stat_fields(pid)
  if not t then return 0 end
  local v = tonumber(t[12]) + tonumber(t[13])
  if reap then v = v + tonumber(t[14]) + tonumber(t[15]) end
  return v / TICK
end

-- CPU seconds of a process tree: the root with its reaped children, and its
-- live children (PostgreSQL: the postmaster and its backends).
local function tree_cpu(root)
  local total = cpu_of(root, true)
  local p = io.popen("ls /proc")
  for name in p:lines() do
    local pid = tonumber(name)
    if pid and pid ~= root then
      local t = stat_fields(pid)
      if t and tonumber(t[2]) == root then total = total + cpu_of(pid, false) end
    end
  end
  p:close()
  return total
end

local function self_pid()
  local f = io.open("/proc/self/stat")
  local pid = f:read("l"):match("^%d+")
  f:close()
  -- /proc/self of io.open is this process (no shell in between)
  return tonumber(pid)
end

---------------------------------------------------------------- counters

local env = wenv.new { checkpoint = CHECKPOINT, durable = true, appendfsync = "everysec" }
local bench_pid = self_pid()
-- BENCH_STATEMENTS=1: also list the worker's Postgres statements per job
-- (pg_stat_statements, loaded by a restart of the throwaway server)
local STATEMENTS = os.getenv("BENCH_STATEMENTS") == "1"
if STATEMENTS then
  env.pg:psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
  env.pg:restart()
  env.pg:psql("CREATE EXTENSION pg_stat_statements")
end
local pg_pid = env.pg.pid


-- Committed + rolled-back transactions of every database, once the
-- backends have reported them: at most once a second while busy, and a
-- backend that went idle with counts pending reports them 10 s later
-- (PostgreSQL's PGSTAT_IDLE_INTERVAL), so the first read waits that long.
local function pg_xacts(db)
  mg.sleep(10)
  local function read()
    mg.sleep(1.1)
    local rows = assert(db:query("SELECT (sum(xact_commit) + sum(xact_rollback))::bigint AS n FROM pg_stat_database"))
    return tonumber(rows[1].n)
  end
  local a = read()
  while true do
    local b = read()
    -- each read() is itself one transaction
    if b - a <= 1 then return b end
    a = b
  end
end

---------------------------------------------------------------- the two sides

-- A round's counters: at its start once the transactions of the round
-- before have been reported; at its end the CPU and Redis counters half a
-- second after the last result (the worker's last acknowledgements), before
-- the wait for the transactions (idle time, not the round's).
local function snapshot(r, db, worker, at_end)
  local xacts = not at_end and pg_xacts(db) or nil
  if at_end then mg.sleep(0.5) end
  local s = {
    redis = redis_counters(r),
    cpu = { bench = cpu_of(bench_pid), worker = worker and cpu_of(worker.pid) or 0,
            redis = cpu_of(env.redis.pid), pg = tree_cpu(pg_pid) },
    t = mg.now(),
  }
  s.xacts = xacts or pg_xacts(db)
  return s
end

-- The difference of two snapshots, per job, less the bench's own queries.
local function per_job(a, b, n, elapsed, own)
  local d = { rate = n / elapsed, cpu = {} }
  for k, v in pairs(b.cpu) do d.cpu[k] = (v - a.cpu[k]) * 1000 / n end
  -- the INFO calls and the stats reads of the snapshot between are the bench's
  d.redis_cmds = (b.redis.cmds - a.redis.cmds - own.redis_cmds) / n
  d.redis_reads = (b.redis.reads - a.redis.reads - own.redis_reads) / n
  d.xacts = (b.xacts - a.xacts - own.xacts) / n
  d.by = {}
  for name, calls in pairs(b.redis.by) do
    local c = calls - (a.redis.by[name] or 0)
    if c > 0 then d.by[name] = c end
  end
  return d
end

local round_no = 0

local r, db   -- the bench's own connections

local function inprocess(saver, app)
  round_no = round_no + 1
  local a = snapshot(r, db)
  local t0 = mg.now()
  local next_i, failures = 0, 0
  local function runner()
    while next_i < JOBS do
      next_i = next_i + 1
      local i = next_i
      local out, err = app:invoke(chat.input(QUESTIONS[i % #QUESTIONS + 1]),
        { thread_id = "inproc-" .. round_no .. "-" .. i, durability = DURABILITY })
      if not out then
        failures = failures + 1
        if failures == 1 then io.stderr:write("in-process run failed: " .. tostring(err) .. "\n") end
      end
    end
  end
  local fns = {}
  for k = 1, CONCURRENCY do fns[k] = runner end
  mg.gather(fns)
  local elapsed = mg.now() - t0
  local b = snapshot(r, db, nil, true)
  -- own: snapshot a's INFO + stats reads happened before t0; b's INFO comes after
  -- the counters were read, so only the first snapshot's trailing reads count
  local d = per_job(a, b, JOBS, elapsed, { redis_cmds = 1, redis_reads = 1, xacts = 0 })
  d.failures = failures
  return d
end

local function worker_round(w, c)
  round_no = round_no + 1
  assert(db:exec("TRUNCATE job_results"))
  if STATEMENTS then assert(db:query("SELECT pg_stat_statements_reset()")) end
  local a = snapshot(r, db, w)
  local t0 = mg.now()
  for i = 1, JOBS do
    assert(c:submit { thread_id = "conv-" .. round_no .. "-" .. i, user_id = "u" .. (i % 50),
                      input = { message = QUESTIONS[i % #QUESTIONS + 1] } })
  end
  local polls, done = 0, 0
  while done < JOBS do
    mg.sleep(0.1)
    polls = polls + 1
    done = db:query("SELECT count(*)::int AS n FROM job_results")[1].n
  end
  local elapsed = mg.now() - t0
  local failed = db:query("SELECT count(*)::int AS n FROM job_results WHERE status <> 'done'")[1].n
  local b = snapshot(r, db, w, true)
  local d = per_job(a, b, JOBS, elapsed,
    { redis_cmds = 1 + JOBS, redis_reads = 1 + JOBS, xacts = polls + 1 })
  d.failures = failed
  if STATEMENTS then
    d.statements = assert(db:query([[SELECT calls, total_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS q
      FROM pg_stat_statements ORDER BY calls DESC LIMIT 15]]))
  end
  return d
end

local function median(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  return s[(#s + 1) // 2]
end

local ok, err = pcall(function()
  local w = env:worker { "--script", "chat=scripts/eco/chat.lua", "--concurrency", tostring(CONCURRENCY),
    "--log-level", LOG_LEVEL, "--durability", DURABILITY, "--consumer", "bench", "--heartbeat", "1" }
  local saver = assert(checkpointer.open(CHECKPOINT,
    { redis_url = env.redis_url, pg_url = env.pg_url, concurrency = CONCURRENCY }))
  local app = chat.build { checkpointer = saver }
  local rows = { inproc = {}, worker = {} }
  do   -- the main chunk of `moongraph run` is a task already
    r, db = env:conns()
    wenv.eventually("the worker to start (log: " .. w.dir .. "/log)", 60, function()
      assert(w:running(), "worker exited: " .. w:log())
      return r:call("EXISTS", "moongraph:workers:bench") == 1
    end)
    local c = assert(client.connect { redis = r })
    -- warm-up of both sides: connections, migrations, data files
    local save_jobs = JOBS
    JOBS = 64
    inprocess(saver, app)
    worker_round(w, c)
    JOBS = save_jobs
    local load = io.open("/proc/loadavg"):read("l"):match("^(%S+ %S+ %S+)")
    print(string.format("worker vs in-process: offline Eco² pipeline, %d runs in flight, %d jobs per round, %d rounds",
      CONCURRENCY, JOBS, ROUNDS))
    print(string.format("  saver %s, durability %s, worker log level %s; Postgres fsync on, Redis appendfsync everysec;"
      .. " %s core(s); load %s", CHECKPOINT, DURABILITY, LOG_LEVEL, io.popen("nproc"):read("l"), load))
    for round = 1, ROUNDS do
      local ip = inprocess(saver, app)
      local wk = worker_round(w, c)
      rows.inproc[round], rows.worker[round] = ip, wk
      print(string.format("  round %d: in-process %.1f runs/s, worker %.1f jobs/s, ratio %.2fx%s",
        round, ip.rate, wk.rate, wk.rate / ip.rate,
        (ip.failures + wk.failures > 0) and string.format(" (%d in-process runs and %d jobs failed)",
          ip.failures, wk.failures) or ""))
    end
  end
  local function med(side, f)
    local l = {}
    for i, d in ipairs(rows[side]) do l[i] = f(d) end
    return median(l)
  end
  local ratios = {}
  for i = 1, ROUNDS do ratios[i] = rows.worker[i].rate / rows.inproc[i].rate end
  print(string.format("median: in-process %.1f runs/s, worker %.1f jobs/s, ratio %.2fx (floor 0.35x, goal 0.5x)",
    med("inproc", function(d) return d.rate end), med("worker", function(d) return d.rate end), median(ratios)))
  for _, side in ipairs { "inproc", "worker" } do
    local own = side == "inproc" and "bench" or "worker"
    local total = med(side, function(d) return d.cpu[own] + d.cpu.redis + d.cpu.pg end)
    print(string.format("  %-10s CPU per job %.2f ms (%s %.2f, redis %.2f, postgres %.2f; LLM test server: none, offline)%s",
      side == "inproc" and "in-process" or "worker", total, own,
      med(side, function(d) return d.cpu[own] end), med(side, function(d) return d.cpu.redis end),
      med(side, function(d) return d.cpu.pg end), side == "worker" and " (floor 3 ms)" or ""))
    print(string.format("             per job: %.1f Redis commands in %.1f round trips, %.1f Postgres transactions",
      med(side, function(d) return d.redis_cmds end), med(side, function(d) return d.redis_reads end),
      med(side, function(d) return d.xacts end)))
    local last = rows[side][ROUNDS]
    local names = {}
    for name in pairs(last.by) do names[#names + 1] = name end
    table.sort(names, function(x, y) return last.by[x] > last.by[y] end)
    local parts = {}
    for i = 1, math.min(10, #names) do
      parts[i] = string.format("%s %.1f", names[i], last.by[names[i]] / JOBS)
    end
    print("             Redis commands per job (last round): " .. table.concat(parts, ", "))
    if last.statements then
      for _, st in ipairs(last.statements) do
        print(string.format("             %6.2f/job %7.3f ms  %s", st.calls / JOBS, st.total_exec_time / st.calls, st.q))
      end
    end
  end
  w:signal("TERM")
  w:wait(60)
end)
env:destroy()
if not ok then error(err, 0) end
