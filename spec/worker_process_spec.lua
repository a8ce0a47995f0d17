-- `moongraph worker` processes against real Redis and PostgreSQL: answers,
-- the Eco² pipeline's conversation memory (its hooks), bad jobs, duplicates, failures, SIGTERM drain,
-- resuming another worker's job from its checkpoints, SIGHUP reload,
-- heartbeat and metrics.
local mg = require "moongraph"
local cjson = require "cjson"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local results = require "moongraph.worker.results"

local env
local STEPS = "steps=spec/support/worker_scripts/steps.lua"
local CHAT = "chat=scripts/eco/chat.lua"

-- Every event of a job, up to done (or a timeout error).
local function events_of(c, job_id, limit)
  local list = {}
  local last, done = c:follow(job_id, { idle_timeout = limit or 20, block = 0.5,
    on_event = function(ev) list[#list + 1] = ev end })
  assert(last, "no done event for " .. job_id .. ": " .. tostring(done))
  return list, done
end

local function types(list)
  local out = {}
  for i, ev in ipairs(list) do out[i] = ev.type end
  return out
end

local function count(list, t)
  local n = 0
  for _, ev in ipairs(list) do if ev.type == t then n = n + 1 end end
  return n
end

-- Wait until a node_start of `node` shows in the job's events.
local function wait_node_start(c, job_id, node)
  c:follow(job_id, { idle_timeout = 20, block = 0.5, on_event = function(ev)
    if ev.type == "node_start" and ev.data.node == node then return false end
  end })
end

local function runs(r, job_id, node)
  return tonumber(r:call("GET", "spec:runs:" .. job_id .. ":" .. node)) or 0
end

describe("moongraph worker", function()
  setup(function() env = wenv.new() end)
  teardown(function() if env then env:destroy() end end)
  after_each(function() env:stop_all() end)

  it("answers jobs with the Eco² pipeline and carries the conversation over", function()
    local w = env:worker { "--script", CHAT, "--concurrency", "4" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local j1 = assert(c:submit { thread_id = "conv-1", user_id = "u-1", script = "chat",
                                   input = { message = "종이 어떻게 버려?", user_location = "서울특별시 강남구" } })
      local ev1, done1 = events_of(c, j1)
      local j2 = assert(c:submit { thread_id = "conv-1", user_id = "u-1", input = { message = "그럼 플라스틱은?" } })
      local ev2 = events_of(c, j2)

      -- the event stream: nodes, tokens, one answer, one done, last
      assert.equal("node_start", ev1[1].type)
      assert.equal("intent", ev1[1].data.node)
      assert.is_true(count(ev1, "token") > 0)
      assert.equal(1, count(ev1, "answer"))
      assert.equal(1, count(ev1, "done"))
      assert.equal("done", ev1[#ev1].type)
      assert.equal("done", done1.data.status)
      local streamed = {}
      for _, ev in ipairs(ev1) do if ev.type == "token" then streamed[#streamed + 1] = ev.data.text end end
      local answer_ev = ev1[#ev1 - 1]
      assert.equal("answer", answer_ev.type)
      assert.equal(table.concat(streamed), answer_ev.data.answer)
      assert.equal("waste", answer_ev.data.intent)           -- from the script's result hook
      assert.is_true(r:call("TTL", "moongraph:events:" .. j1) > 0)

      -- results and memory
      local r1, r2 = assert(results.get(db, j1)), assert(results.get(db, j2))
      assert.equal("done", r1.status)
      assert.equal(answer_ev.data.answer, r1.answer)
      assert.equal("waste", r1.state.intent)
      assert.equal(1, r1.state.turn)
      assert.equal(2, r2.state.turn)
      assert.equal("waste", r2.state.prev_intent)          -- the previous turn's intent, from memory
      assert.equal("서울특별시 강남구", r2.state.user_location) -- remembered location
      local msgs = assert(db:query("SELECT role, turn FROM messages WHERE thread_id = 'conv-1' ORDER BY id"))
      assert.equal(4, #msgs)
      assert.equal(1, count(ev2, "done"))
      -- a new conversation of the same user starts from the user's profile
      local j3 = assert(c:submit { thread_id = "conv-2", user_id = "u-1", input = { message = "근처 수거함 어디 있어?" } })
      events_of(c, j3)
      local r3 = assert(results.get(db, j3))
      assert.equal(1, r3.state.turn)
      assert.equal("서울특별시 강남구", r3.state.user_location)
      local prof = assert(require("scripts.eco.profile").get(mg.store.postgres(db), "u-1"))
      assert.equal(3, prof.turns)
      assert.equal("서울특별시 강남구", prof.last_location)
      assert.equal(0, assert(db:query("SELECT count(*)::int AS n FROM user_profiles"))[1].n)  -- the old table, unwritten
      -- the stored state leaves the memory keys to the memory
      assert.is_nil(r1.state.messages)
      -- L1: the conversation's recent messages under the worker's prefix
      assert.equal(4, r:call("LLEN", "moongraph:memory:conv-1:recent"))
      -- a job the pipeline cannot answer is refused by its input hook
      local bad = assert(c:submit { thread_id = "conv-3", user_id = "u-1", input = { text = "no message" } })
      local evb, doneb = events_of(c, bad)
      assert.equal("dead", doneb.data.status)
      assert.equal("the script refused the job: input.message is missing (the user's message)", evb[1].data.error)
      local anon = assert(c:submit { thread_id = "conv-3", input = { message = "hi" } })
      local eva = events_of(c, anon)
      assert.matches("user_id is required", eva[1].data.error)
      -- acknowledged and deleted (after the done event): nothing left in the stream or pending
      wenv.eventually("the jobs acknowledged", 10, function()
        return r:call("XLEN", "moongraph:jobs") == 0 and r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
      end)
      r:call("DEL", "moongraph:jobs:dead")
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
  end)

  it("dead-letters bad jobs with the reason, tells their listeners, and keeps working", function()
    local w = env:worker { "--script", STEPS }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      assert(r:call("XADD", "moongraph:jobs", "*", "job", "{not json"))
      assert(r:call("XADD", "moongraph:jobs", "*", "other", "x"))
      assert(r:call("XADD", "moongraph:jobs", "*", "job", cjson.encode {
        job_id = "bad-1", thread_id = "t", user_id = "u" }))
      assert(r:call("XADD", "moongraph:jobs", "*", "job", cjson.encode {
        job_id = "bad-2", thread_id = "t", user_id = "u", message = "hi", script = "nope" }))
      local good = assert(c:submit { thread_id = "t-good", user_id = "u", input = { message = "hello" } })
      local _, done = events_of(c, good)
      assert.equal("done", done.data.status)
      local ev = events_of(c, "bad-1")
      assert.same({ "error", "done" }, types(ev))
      assert.matches("'input' is missing", ev[1].data.error)
      assert.equal("dead", ev[2].data.status)
      ev = events_of(c, "bad-2")
      assert.matches("unknown script 'nope'", ev[1].data.error)
      -- (listeners hear first; the entry is dead-lettered and acknowledged next)
      wenv.eventually("four dead letters", 10, function()
        return r:call("XLEN", "moongraph:jobs:dead") == 4 and r:call("XLEN", "moongraph:jobs") == 0
      end)
      local dead = r:call("XRANGE", "moongraph:jobs:dead", "-", "+")
      local reasons = {}
      for _, e in ipairs(dead) do
        for i = 1, #e[2], 2 do if e[2][i] == "reason" then reasons[#reasons + 1] = e[2][i + 1] end end
      end
      assert.matches("invalid JSON", reasons[1])
      assert.matches("no 'job' field", reasons[2])
      assert.matches("'input' is missing", reasons[3])
      assert.matches("unknown script", reasons[4])
      assert.equal(0, r:call("XLEN", "moongraph:jobs"))
      assert.equal(0, r:call("XPENDING", "moongraph:jobs", "moongraph")[1])
      assert.same({}, { results.get(db, "bad-1") })   -- no row, and no error reading it
      r:call("DEL", "moongraph:jobs:dead")
    end)
    assert.is_true(w:running())
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
  end)

  it("answers a job delivered twice once", function()
    local w = env:worker { "--script", STEPS, "--concurrency", "1" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local text = cjson.encode { job_id = "twice", thread_id = "t-twice", user_id = "u", input = { message = "tokens=5" } }
      assert(r:call("XADD", "moongraph:jobs", "*", "job", text))
      assert(r:call("XADD", "moongraph:jobs", "*", "job", text))
      wenv.eventually("both deliveries handled", 20, function()
        return r:call("XLEN", "moongraph:jobs") == 0 and r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
      end)
      local ev = events_of(c, "twice")
      assert.equal(1, count(ev, "answer"))
      assert.equal(1, count(ev, "done"))
      local streamed = {}
      for _, e in ipairs(ev) do
        if e.type == "token" then streamed[#streamed + 1] = e.data.text end
      end
      assert.equal("t1 t2 t3 t4 t5 ", table.concat(streamed))   -- streamed once
      local counts = wenv.result_counts(db)
      assert.equal(1, counts.twice)
      assert.equal(1, runs(r, "twice", "answer"))
    end)
    w:signal("TERM")
    mg.run(function() w:wait() end)
    assert.equal(1, #w:logged("job already has a result"))
  end)

  -- One job of the steps script on a worker of its own: its events, its
  -- done event, its stored row and how often its `answer` node ran.
  local function one_job(thread_id, message)
    local w = env:worker { "--script", STEPS }
    local got = mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local id = assert(c:submit { thread_id = thread_id, user_id = "u", input = { message = message } })
      local ev, done = events_of(c, id)
      return { ev = ev, done = done, row = assert(results.get(db, id)), answer_runs = runs(r, id, "answer") }
    end)
    w:signal("TERM")
    mg.run(function() w:wait() end)
    return got
  end

  it("stores a failed pipeline as the job's result and reports it", function()
    local got = one_job("t-fail", "please fail")
    local ev = got.ev
    assert.equal("failed", got.done.data.status)
    assert.equal("error", ev[#ev - 1].type)
    -- the client hears which node failed, the row (the operator's) why
    assert.matches("^node 'slow' failed %(job j%-", ev[#ev - 1].data.error)
    assert.is_nil(ev[#ev - 1].data.error:find("asked to fail", 1, true))
    assert.equal("failed", got.row.status)
    assert.matches("asked to fail", got.row.error)
  end)

  it("stores a run that pauses at ctx.interrupt as interrupted", function()
    local got = one_job("t-ask", "please ask")
    local ev, row = got.ev, got.row
    assert.equal("interrupted", got.done.data.status)
    assert.same({ "node_start", "node_end", "node_start", "node_end", "done" }, types(ev))
    assert.equal("interrupt", ev[#ev - 1].data.status)
    assert.equal("interrupted", row.status)
    assert.same({ "prepare" }, row.state.trail)   -- slow paused before its update
    assert.same({ question = "which bin?" }, row.state.__interrupt__[1].value)
    assert.equal(0, got.answer_runs)
  end)

  it("drains on SIGTERM: the running job finishes, no new job is taken, exit 0", function()
    local w = env:worker { "--script", STEPS, "--grace", "20" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local running = assert(c:submit { thread_id = "t-drain", user_id = "u", input = { message = "sleep=1" } })
      wait_node_start(c, running, "slow")
      w:signal("TERM")
      wenv.eventually("the drain to begin", 10, function() return w:logged("SIGTERM: draining")[1] end)
      local later = assert(c:submit { thread_id = "t-drain", user_id = "u", input = { message = "later" } })
      assert.equal(0, w:wait(20))
      local row = assert(results.get(db, running))
      assert.equal("done", row.status)
      assert.same({}, { results.get(db, later) })   -- no row, and no error reading it
      assert.equal(1, r:call("XLEN", "moongraph:jobs"))                  -- still queued
      -- and nobody's: a read already blocked when the drain began may have
      -- had it delivered; then the drain released it (idle past claim_idle,
      -- 30 s) for the next worker's first claim pass
      for _, p in ipairs(r:call("XPENDING", "moongraph:jobs", "moongraph", "-", "+", 10)) do
        assert.is_true(p[3] >= 30000, "a pending job not released: " .. table.concat(p, " "))
      end
      assert.equal(0, r:call("EXISTS", "moongraph:workers:" .. "w" .. env.n))
      -- the next worker takes it
      local w2 = env:worker { "--script", STEPS }
      local _, done = events_of(c, later)
      assert.equal("done", done.data.status)
      w2:signal("TERM")
      w2:wait()
    end)
  end)

  for _, how in ipairs { "TERM with a short grace", "a second SIGINT", "kill -9" } do
    it("after " .. how .. ", another worker resumes the job from its checkpoint", function()
      local grace = how == "a second SIGINT" and "60" or "0.2"
      -- durability sync: each step's checkpoint is saved before the next
      -- one starts, so what finished before the stop is never run again
      -- (under async, the default, the last batch may be lost and re-run)
      local a = env:worker { "--script", STEPS, "--grace", grace, "--claim-idle", "1", "--durability", "sync" }
      mg.run(function()
        a:wait_started()
        local r, db = env:conns()
        local c = assert(client.connect { redis = r })
        local id = assert(c:submit { thread_id = "t-resume", user_id = "u", input = { message = "sleep=2 tokens=4" } })
        wait_node_start(c, id, "slow")
        if how == "kill -9" then
          assert.equal(137, a:kill())     -- killed mid-job, not exited by itself
        elseif how == "a second SIGINT" then
          a:signal("INT")
          wenv.eventually("the drain to begin", 10, function() return a:logged("SIGINT: draining")[1] end)
          a:signal("INT")
          assert.equal(0, a:wait(10))
        else
          a:signal("TERM")
          assert.equal(0, a:wait(10))     -- docs/worker.md: the grace ends, the jobs are left, status 0
        end
        local b = env:worker { "--script", STEPS, "--claim-idle", "1", "--claim-interval", "0.2",
                               "--durability", "sync" }
        local ev, done = events_of(c, id, 30)
        assert.equal("done", done.data.status)
        assert.equal(1, runs(r, id, "prepare"))     -- finished before the stop: not run again
        assert.equal(2, runs(r, id, "slow"))        -- interrupted: run again
        assert.equal(1, runs(r, id, "answer"))
        assert.equal(1, count(ev, "done"))
        assert.equal(1, count(ev, "answer"))
        local row = assert(results.get(db, id))
        assert.equal("v1: t1 t2 t3 t4 ", row.answer)
        assert.equal(2, row.deliveries)
        b:signal("TERM")
        b:wait()
        -- (a loaded machine may let b's claim pass see the entry again while
        -- it is acknowledged: that delivery finds the result and ends there)
        assert.is_true(#b:logged("job claimed from a stalled or dead worker") >= 1)
        assert.equal(1, #b:logged("job resumed from its checkpoint"))
      end)
    end)
  end

  it("reloads its scripts on SIGHUP without dropping the running job", function()
    local dir = wenv.tmpdir("reload")
    local src = assert(wenv.read_file("spec/support/worker_scripts/steps.lua"))
    local path = dir .. "/reloaded.lua"
    local function write(text) local f = assert(io.open(path, "w")) f:write(text) f:close() end
    write(src)
    local w = env:worker { "--script", "steps=" .. path }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local old = assert(c:submit { thread_id = "t-reload", user_id = "u", input = { message = "sleep=1 tokens=1" } })
      wait_node_start(c, old, "slow")
      write((src:gsub('VERSION = "v1"', 'VERSION = "v2"')))
      w:signal("HUP")
      wenv.eventually("the reload", 10, function() return w:logged("scripts reloaded")[1] end)
      local new = assert(c:submit { thread_id = "t-reload", user_id = "u", input = { message = "tokens=1" } })
      events_of(c, old)
      events_of(c, new)
      assert.equal("v1: t1 ", assert(results.get(db, old)).answer)
      assert.equal("v2: t1 ", assert(results.get(db, new)).answer)
      -- a script that no longer loads: the worker keeps the last good one
      write("return {")
      w:signal("HUP")
      wenv.eventually("the failed reload", 10, function() return w:logged("reloading the scripts failed")[1] end)
      local after = assert(c:submit { thread_id = "t-reload", user_id = "u", input = { message = "tokens=1" } })
      events_of(c, after)
      assert.equal("v2: t1 ", assert(results.get(db, after)).answer)
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
  end)

  it("keeps a heartbeat key, writes metrics and logs JSON with job_id, node and duration", function()
    local mfile = env.dir .. "/metrics.prom"
    local w = env:worker { "--script", STEPS, "--metrics", mfile, "--consumer", "beat-1" }
    mg.run(function()
      w:wait_started()
      local r = env:conns()
      local c = assert(client.connect { redis = r })
      local id = assert(c:submit { thread_id = "t-m", user_id = "u", input = { message = "tokens=2" } })
      events_of(c, id)
      local hb = wenv.eventually("a heartbeat counting the job", 10, function()
        local v = r:call("GET", "moongraph:workers:beat-1")
        local t = type(v) == "string" and cjson.decode(v)
        return t and t.counters.jobs_done == 1 and t
      end)
      assert.equal("beat-1", hb.consumer)
      assert.is_true(r:call("TTL", "moongraph:workers:beat-1") > 0)
      wenv.eventually("the metrics file", 10, function()
        local text = wenv.read_file(mfile)
        return text and text:find('moongraph_worker_jobs_done_total{worker="beat-1"} 1', 1, true)
      end)
      local text = wenv.read_file(mfile)
      assert.matches('moongraph_worker_node_duration_seconds_count{worker="beat-1",node="slow"} 1', text, 1, true)
    end)
    w:signal("TERM")
    mg.run(function() w:wait() end)
    local nodes = w:logged("node finished")
    assert.equal(3, #nodes)
    for _, l in ipairs(nodes) do
      assert.is_string(l.job_id)
      assert.is_string(l.node)
      assert.is_number(l.duration_ms)
      assert.equal("beat-1", l.worker)
    end
  end)
end)
