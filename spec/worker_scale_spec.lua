-- Acceptance: many workers side by side against real Redis and
-- PostgreSQL. 200 jobs through 3 worker processes are answered exactly
-- once: as they are, while workers are killed with kill -9 and restarted,
-- and while Redis restarts under them.
local mg = require "moongraph"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"

local N = 200

local QUESTIONS = {
  "종이 어떻게 버려?", "페트병은 어떻게 분리배출해?", "냉장고 버리려면 어떻게 해?",
  "안녕", "고철 시세 알려줘", "건전지 수거함 어디 있어?", "스티로폼 버리는 법",
  "유리병 분리수거 방법", "캔은 어떻게 버려?", "헌 옷 수거함 위치",
}

-- Submit n jobs, each on its own conversation; returns the job ids.
local function submit_all(c, n, message_of)
  local ids = {}
  for i = 1, n do
    ids[i] = assert(c:submit { thread_id = "conv-" .. i, user_id = "user-" .. (i % 17),
                                input = { message = message_of(i) }, job_id = string.format("job-%04d", i) })
  end
  return ids
end

local function done_count(db)
  return assert(db:query("SELECT count(*)::int AS n FROM job_results"))[1].n
end

-- What each script records per answered job (in the transaction of its
-- result): the Eco² pipeline a turn of two messages, steps_recorded.lua one row.
local RECORDS = {
  chat = { sql = "SELECT count(*)::int AS n, count(DISTINCT job_id)::int AS jobs FROM messages", per_job = 2 },
  steps = { sql = "SELECT count(*)::int AS n, count(DISTINCT job_id)::int AS jobs FROM stepspec_turns", per_job = 1 },
}
local STEPS = "steps=spec/support/worker_scripts/steps_recorded.lua"

-- Everything "exactly once" means, checked from the outside.
local function check_exactly_once(r, db, ids, script)
  local rows = assert(db:query("SELECT job_id, status, answer, error FROM job_results"))
  assert.equal(#ids, #rows)
  local by = {}
  for _, row in ipairs(rows) do by[row.job_id] = row end
  for _, id in ipairs(ids) do
    local row = by[id]
    assert(row, "no result for " .. id)
    assert.equal("done", row.status, id .. ": " .. tostring(row.error))
    -- the job's event stream: one answer (the stored one), one done, last
    local entries = r:call("XRANGE", "moongraph:events:" .. id, "-", "+")
    local answers, dones, answer = 0, 0, nil
    for _, e in ipairs(entries) do
      local t, d = e[2][2], e[2][4]
      if t == "answer" then answers = answers + 1; answer = require("cjson").decode(d).answer end
      if t == "done" then dones = dones + 1 end
    end
    assert.equal(1, answers, id .. " answers")
    assert.equal(1, dones, id .. " done events")
    assert.equal("done", entries[#entries][2][2])
    assert.equal(row.answer, answer)
  end
  -- what the script records: once per job
  local rec = RECORDS[script]
  local got = assert(db:query(rec.sql))[1]
  assert.equal(rec.per_job * #ids, got.n)
  assert.equal(#ids, got.jobs)
  if script == "chat" then
    -- every answered turn counted once in its user's profile, 17 users
    -- updated by three workers at once
    local profiles = assert(mg.store.postgres(db):search({ "eco", "users" }, { limit = 100 }))
    local turns = 0
    for _, it in ipairs(profiles) do turns = turns + it.value.turns end
    assert.equal(17, #profiles)
    assert.equal(#ids, turns)
  end
  assert.equal(0, r:call("XLEN", "moongraph:jobs"))
  assert.equal(0, r:call("XPENDING", "moongraph:jobs", "moongraph")[1])
  assert.equal(0, r:call("XLEN", "moongraph:jobs:dead"))
end

local function reset(r, db)
  local tables = { "job_results" }
  for _, t in ipairs { "messages", "conversations", "user_profiles", "stepspec_turns", "moongraph_store" } do
    if assert(db:query("SELECT to_regclass($1)::text AS t", { t }))[1].t == t then tables[#tables + 1] = t end
  end
  assert(db:exec("TRUNCATE " .. table.concat(tables, ", ")))
  assert(r:call("FLUSHALL"))
end

describe("many workers side by side", function()
  local env
  setup(function() env = wenv.new { persist = true } end)
  teardown(function() if env then env:destroy() end end)
  after_each(function()
    env:stop_all()
    mg.run(function() local r, db = env:conns() reset(r, db) end)
  end)

  it("200 jobs through 3 workers: every job answered exactly once", function()
    local workers = {}
    for i = 1, 3 do workers[i] = env:worker { "--script", "chat=scripts/eco/chat.lua", "--concurrency", "16" } end
    mg.run(function()
      for _, w in ipairs(workers) do w:wait_started(30) end
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local ids = submit_all(c, N, function(i) return QUESTIONS[i % #QUESTIONS + 1] end)
      wenv.eventually("200 results", 90, function() return done_count(db) == N end)
      wenv.eventually("every job acknowledged", 20, function()
        return r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
      end)
      check_exactly_once(r, db, ids, "chat")
    end)
    local ran = 0
    for _, w in ipairs(workers) do
      w:signal("TERM")
      mg.run(function() assert.equal(0, w:wait(30)) end)
      local n = #w:logged("job done")
      assert.is_true(n > 0, "a worker answered nothing")
      ran = ran + n
    end
    assert.equal(N, ran)                    -- no job ran to the end twice
  end)

  it("200 jobs while a worker is killed with kill -9 every 1.2 s and restarted: none lost, none doubled", function()
    local args = { "--script", STEPS, "--concurrency", "6",
                   "--claim-idle", "1", "--claim-interval", "0.25", "--max-deliveries", "50" }
    local workers = {}
    for i = 1, 3 do workers[i] = env:worker(args) end
    local kills = 0
    mg.run(function()
      for _, w in ipairs(workers) do w:wait_started(30) end
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local ids = submit_all(c, N, function(i) return "sleep=0.4 tokens=5 gap=0.02 job " .. i end)
      local deadline = mg.now() + 120
      local victim = 0
      while done_count(db) < N do
        assert(mg.now() < deadline, "the jobs did not finish within 120 s")
        mg.sleep(1.2)
        if kills < 8 and done_count(db) < N then
          victim = victim % 3 + 1
          assert.equal(137, workers[victim]:kill())
          kills = kills + 1
          workers[victim] = env:worker(args)
        end
      end
      wenv.eventually("every job acknowledged", 30, function()
        return r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
      end)
      check_exactly_once(r, db, ids, "steps")
    end)
    assert.is_true(kills >= 3, "too few kills happened: " .. kills)
    local reclaimed, resumed = 0, 0
    for _, p in ipairs(env.procs) do
      reclaimed = reclaimed + #p:logged("job claimed from a stalled or dead worker")
      resumed = resumed + #p:logged("job resumed from its checkpoint")
    end
    assert.is_true(reclaimed > 0, "no job was claimed from a killed worker")
    assert.is_true(resumed > 0, "no job resumed from a checkpoint")
  end)

  it("Redis restarted during the run: the workers reconnect and finish every job once", function()
    local workers = {}
    for i = 1, 3 do
      workers[i] = env:worker { "--script", STEPS, "--concurrency", "8" }
    end
    mg.run(function()
      for _, w in ipairs(workers) do w:wait_started(30) end
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local ids = submit_all(c, N, function(i) return "sleep=0.1 tokens=5 gap=0.01 job " .. i end)
      wenv.eventually("a third of the results", 60, function() return done_count(db) >= N / 3 end)
      assert.is_true(done_count(db) < N, "the run ended before the restart")
      env.redis:restart("term")
      wenv.eventually("200 results", 90, function() return done_count(db) == N end)
      wenv.eventually("every job acknowledged", 30, function()
        local p = r:call("XPENDING", "moongraph:jobs", "moongraph")
        return type(p) == "table" and p[1] == 0
      end)
      check_exactly_once(r, db, ids, "steps")
    end)
    local warned = 0
    for _, w in ipairs(workers) do
      assert.is_true(w:running(), "a worker died with Redis")
      warned = warned + #w:logged("failed")
      w:signal("TERM")
      mg.run(function() assert.equal(0, w:wait(30)) end)
    end
    assert.is_true(warned > 0, "no worker noticed the restart")
  end)
end)
