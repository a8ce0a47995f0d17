-- `moongraph worker` with scripts that are not Eco²: a script with no hooks
-- (the job's input goes in, state.answer is stored), a script with every
-- hook (each called once per job, also across a duplicate delivery and a
-- crash), jobs in the earlier format, and no script at all.
local mg = require "moongraph"
local cjson = require "cjson"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local results = require "moongraph.worker.results"
local redis = require "moongraph.redis"

local env
local PLAIN = "plain=spec/support/worker_scripts/plain.lua"
local HOOKS = "hooks=spec/support/worker_scripts/hooks.lua"

local function events_of(c, job_id, limit)
  local list = {}
  local last, done = c:follow(job_id, { idle_timeout = limit or 20, block = 0.5,
    on_event = function(ev) list[#list + 1] = ev end })
  assert(last, "no done event for " .. job_id .. ": " .. tostring(done))
  return list, done
end

local function of_type(list, t)
  local out = {}
  for _, ev in ipairs(list) do if ev.type == t then out[#out + 1] = ev end end
  return out
end

-- How often a hook of hooks.lua ran for a job (0: never); raises when
-- Redis cannot say.
local function calls(r, job_id, hook)
  local v, err = r:call("GET", "moongraph:hookspec:" .. job_id .. ":" .. hook)
  if v == redis.null then return 0 end
  return assert(tonumber(v), "the count of " .. hook .. " for " .. job_id .. ": " .. tostring(v or err))
end

local function drained(r)
  return r:call("XLEN", "moongraph:jobs") == 0 and r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
end

local function stop(w)
  w:signal("TERM")
  mg.run(function() assert.equal(0, w:wait()) end)
end

describe("moongraph worker with a script of its own", function()
  setup(function() env = wenv.new() end)
  teardown(function() if env then env:destroy() end end)
  after_each(function() env:stop_all() end)

  it("runs a script without hooks: the job's input goes in, state.answer and the state are stored", function()
    local w = env:worker({}, { MOONGRAPH_WORKER_SCRIPT = PLAIN })    -- the script from the environment
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local id = assert(c:submit { thread_id = "p-1", input = { text = "hi", n = 2, nested = { a = true } } })
      local ev, done = events_of(c, id)
      assert.equal("done", done.data.status)
      local answer = of_type(ev, "answer")
      assert.equal(1, #answer)
      assert.same({ answer = "echo: hi", thread_id = "p-1" }, answer[1].data)
      local row = assert(results.get(db, id))
      assert.equal("done", row.status)
      assert.equal("echo: hi", row.answer)
      assert.is_nil(row.user_id)                                    -- none given, none made up
      assert.same({ text = "hi", n = 2, nested = { a = true }, answer = "echo: hi", echoed = true }, row.state)
      -- an answer that is not a string is not an answer; the state keeps it
      local id2 = assert(c:submit { thread_id = "p-2", input = { number_answer = true } })
      events_of(c, id2)
      local row2 = assert(results.get(db, id2))
      assert.equal("done", row2.status)
      assert.is_nil(row2.answer)
      assert.equal(42, row2.state.answer)
      -- no application tables: only the worker's own schema
      local t = assert(db:query("SELECT count(*)::int AS n FROM pg_tables WHERE tablename IN ('conversations', 'messages', 'user_profiles')"))
      assert.equal(0, t[1].n)
      wenv.eventually("the jobs acknowledged", 10, function() return drained(r) end)
    end)
    stop(w)
  end)

  it("deletes a job's checkpoints with its result; a run that saved none leaves none", function()
    local w = env:worker({ "--script", PLAIN })
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local function rows(id)
        local q = assert(db:query("SELECT count(*)::int AS n FROM moongraph_checkpoints WHERE thread_id = $1",
          { "job:" .. id }))
        return q[1].n
      end
      -- the run waits in its node: its first checkpoints are saved meanwhile
      local id = assert(c:submit { thread_id = "cp-1", input = { text = "slow", wait = 1 } })
      -- (the saver makes its tables with its first write)
      wenv.eventually("a checkpoint of the running job", 10, function()
        local ok, n = pcall(rows, id)
        return ok and n > 0
      end)
      local _, done = events_of(c, id)
      assert.equal("done", done.data.status)
      assert.equal(0, rows(id))
      -- a run that never waits: its writes are dropped, nothing is left
      local id2 = assert(c:submit { thread_id = "cp-2", input = { text = "quick" } })
      local _, done2 = events_of(c, id2)
      assert.equal("done", done2.data.status)
      assert.equal(0, rows(id2))
      assert.equal("echo: slow", assert(results.get(db, id)).answer)
    end)
    stop(w)
  end)

  it("runs a job in the earlier format (message and user_location at the top level)", function()
    local w = env:worker { "--script", PLAIN }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      assert(r:call("XADD", "moongraph:jobs", "*", "job", cjson.encode {
        job_id = "old-format", thread_id = "t-old", user_id = "u-old",
        message = "종이 어떻게 버려?", user_location = "서울특별시 강남구" }))
      local _, done = events_of(c, "old-format")
      assert.equal("done", done.data.status)
      local row = assert(results.get(db, "old-format"))
      assert.equal("echo: 종이 어떻게 버려?", row.answer)
      assert.equal("u-old", row.user_id)
      assert.equal("종이 어떻게 버려?", row.state.message)
      assert.equal("서울특별시 강남구", row.state.user_location)
      -- the client takes the earlier fields too
      local id = assert(c:submit { thread_id = "t-old", message = "again" })
      events_of(c, id)
      assert.equal("echo: again", assert(results.get(db, id)).answer)
    end)
    stop(w)
  end)

  it("calls each hook once per job, also when the job is delivered twice", function()
    local w = env:worker { "--script", HOOKS, "--concurrency", "1" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local text = cjson.encode { job_id = "hooked", thread_id = "t-h", user_id = "u-h", input = { text = "hello" } }
      assert(r:call("XADD", "moongraph:jobs", "*", "job", text))
      assert(r:call("XADD", "moongraph:jobs", "*", "job", text))
      wenv.eventually("both deliveries handled", 20, function() return drained(r) end)
      local ev = events_of(c, "hooked")
      local answer = of_type(ev, "answer")
      assert.equal(1, #answer)
      assert.equal(1, #of_type(ev, "done"))
      assert.same({ answer = "SAID HELLO", thread_id = "t-h", extra = "from the result hook" }, answer[1].data)
      -- result: what the result hook made of the state
      local row = assert(results.get(db, "hooked"))
      assert.equal("SAID HELLO", row.answer)
      assert.same({ text = "hello", user = "u-h", job = "hooked" }, row.state)
      -- the hooks: input, record and committed once (the first delivery),
      -- forget once (the second)
      assert.equal(1, calls(r, "hooked", "input"))
      -- (prefetch: at each delivery that claims the thread)
      assert.equal(2, calls(r, "hooked", "prefetch"))
      assert.equal(1, calls(r, "hooked", "record"))
      assert.equal(1, calls(r, "hooked", "committed"))
      assert.equal(1, calls(r, "hooked", "forget"))
      assert.equal("done/scratch ok", r:call("GET", "moongraph:hookspec:hooked:committed_status"))
      local rec = assert(db:query("SELECT job_id, answer, status FROM hookspec_records"))
      assert.same({ { job_id = "hooked", answer = "SAID HELLO", status = "done" } }, rec)
      -- the script's schema went in under its own scope
      local m = assert(db:query("SELECT scope, version FROM moongraph_schema WHERE scope = 'hookspec'"))
      assert.same({ { scope = "hookspec", version = 1 } }, m)
    end)
    stop(w)
    assert.equal(1, #w:logged("job already has a result"))
  end)

  it("sends the prefetch hook's reads with the claim of the thread, and reads without them when it fails", function()
    local w = env:worker { "--script", HOOKS, "--concurrency", "4" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local ids = {
        ok = assert(c:submit { script = "hooks", thread_id = "t-pf", user_id = "u", input = { text = "a" } }),
        sql = assert(c:submit { script = "hooks", thread_id = "t-pf-sql", user_id = "u",
          input = { text = "b", bad_prefetch = "sql" } }),
        raise = assert(c:submit { script = "hooks", thread_id = "t-pf-raise", user_id = "u",
          input = { text = "c", bad_prefetch = "raise" } }),
        -- (an error of the hook's own that reads like a database away is
        -- not retried as one)
        transient = assert(c:submit { script = "hooks", thread_id = "t-pf-transient", user_id = "u",
          input = { text = "d", bad_prefetch = "transient" } }),
      }
      for what, id in pairs(ids) do
        local _, done = events_of(c, id)
        assert.equal("done", done.data.status, what)
        assert.equal(1, calls(r, id, "input"), what)
      end
      -- the read ran after the claim: it saw the fence token the job's lease wrote
      local fence = assert(db:query("SELECT token::text AS token FROM thread_fences WHERE thread_id = 't-pf'"))[1]
      assert.equal(fence.token, r:call("GET", "moongraph:hookspec:" .. ids.ok .. ":prefetched"))
      -- a failing prefetch: the claim went again without it, the input hook found nothing
      for _, what in ipairs { "sql", "raise", "transient" } do
        assert.equal("nil", r:call("GET", "moongraph:hookspec:" .. ids[what] .. ":prefetched"), what)
        assert.equal(1, calls(r, ids[what], "prefetch"), what)
      end
    end)
    stop(w)
    local warned = w:logged("the prefetch hook failed")
    assert.equal(3, #warned)
    local reasons = {}
    for _, l in ipairs(warned) do reasons[#reasons + 1] = l.error end
    table.sort(reasons)
    assert.matches("division by zero", reasons[1])
    assert.matches("prefetch refuses", reasons[2])
    assert.matches("redis: timeout after", reasons[3])
    assert.equal(0, #w:logged("claiming the thread failed; retrying"))
  end)

  it("after kill -9, the worker that resumes the job records it once and does not build its input again", function()
    -- durability sync: the run's first checkpoint is saved before its node
    -- starts (under async, the default, a kill may lose it and the input
    -- is built again)
    local a = env:worker { "--script", HOOKS, "--claim-idle", "1", "--durability", "sync" }
    mg.run(function()
      a:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local id = assert(c:submit { thread_id = "t-k", user_id = "u", input = { text = "slow", sleep = 2 } })
      -- kill it while the job's node runs: follow stopped there, not at the end
      local at, done_early = c:follow(id, { idle_timeout = 20, block = 0.5, on_event = function(ev)
        if ev.type == "node_start" and ev.data.node == "work" then return false end
      end })
      assert(at, "the work node never started: " .. tostring(done_early))
      assert.is_nil(done_early)
      assert.equal(137, a:kill())
      local b = env:worker { "--script", HOOKS, "--claim-idle", "1", "--claim-interval", "0.2",
                             "--durability", "sync" }
      local _, done = events_of(c, id, 30)
      assert.equal("done", done.data.status)
      assert.equal("SAID SLOW", assert(results.get(db, id)).answer)
      assert.equal(1, calls(r, id, "input"))
      assert.equal(1, calls(r, id, "record"))
      assert.equal(1, calls(r, id, "committed"))
      assert.equal(0, calls(r, id, "forget"))
      -- the resumed delivery had no scratch from the input hook
      assert.equal("done/nil", r:call("GET", "moongraph:hookspec:" .. id .. ":committed_status"))
      b:signal("TERM")
      assert.equal(0, b:wait())
    end)
  end)

  it("dead-letters a job its input hook refuses, and retries one the hook cannot take yet", function()
    local w = env:worker { "--script", HOOKS, "--claim-idle", "1", "--claim-interval", "0.2" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local refused = assert(c:submit { thread_id = "t-r", input = { refuse = true } })
      local ev, done = events_of(c, refused)
      assert.equal("dead", done.data.status)
      assert.equal("the script refused the job: this job asks to be refused", ev[1].data.error)
      local stored, gerr = results.get(db, refused)
      assert.is_nil(gerr)
      assert.is_nil(stored)
      local busy = assert(c:submit { thread_id = "t-b", input = { text = "later", busy = 1 } })
      local _, bdone = events_of(c, busy, 30)
      assert.equal("done", bdone.data.status)
      local row = assert(results.get(db, busy))
      assert.equal("SAID LATER", row.answer)
      assert.equal(2, row.deliveries)           -- left pending once, then claimed
      assert.equal(2, calls(r, busy, "input"))
      wenv.eventually("the dead letter", 10, function() return r:call("XLEN", "moongraph:jobs:dead") == 1 end)
      r:call("DEL", "moongraph:jobs:dead")
    end)
    stop(w)
    assert.equal(1, #w:logged("job left pending for a later attempt"))
  end)

  it("stores a job as failed when its record hook keeps failing, and carries on", function()
    local w = env:worker { "--script", HOOKS }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      -- the hook returns nil, err; or a statement it sent fails at the commit
      for _, case in ipairs {
        { thread = "t-f", input = { text = "x", bad_record = true }, err = "^the record hook failed: record refuses$" },
        { thread = "t-s", input = { text = "x", bad_sent = true }, err = "^the record hook failed: .*division by zero" },
      } do
        local id = assert(c:submit { thread_id = case.thread, input = case.input })
        local ev, done = events_of(c, id)
        assert.equal("failed", done.data.status)
        -- the client hears that it failed, under the job's id; the row keeps why
        assert.equal("the run failed (job " .. id .. ")", of_type(ev, "error")[1].data.error)
        local row = assert(results.get(db, id))
        assert.equal("failed", row.status)
        assert.matches(case.err, row.error)
        assert.equal(3, calls(r, id, "record"))
        assert.equal("failed/scratch ok", r:call("GET", "moongraph:hookspec:" .. id .. ":committed_status"))
        assert.same({}, assert(db:query("SELECT * FROM hookspec_records WHERE job_id = $1", { id })))
      end
      local ok_id = assert(c:submit { thread_id = "t-f", input = { text = "fine" } })
      local _, okdone = events_of(c, ok_id)
      assert.equal("done", okdone.data.status)
    end)
    stop(w)
  end)

  it("applies a reloaded script's new migrations on SIGHUP, and keeps the old script when they fail", function()
    local dir = wenv.tmpdir("hupmig")
    local path = dir .. "/grows.lua"
    local function write(migs)
      local f = assert(io.open(path, "w"))
      f:write("local plain = dofile('spec/support/worker_scripts/plain.lua')\n",
        "return { build = plain.build, worker = { scope = 'grows', migrations = {", migs, "} } }\n")
      f:close()
    end
    local v1 = "{ version = 1, name = 'one', sql = 'CREATE TABLE grows_a (x int)' },"
    write(v1)
    local w = env:worker { "--script", "grows=" .. path }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local function versions()
        local rows = assert(db:query("SELECT version FROM moongraph_schema WHERE scope = 'grows' ORDER BY version"))
        local out = {}
        for i, row in ipairs(rows) do out[i] = row.version end
        return out
      end
      assert.same({ 1 }, versions())
      write(v1 .. "{ version = 2, name = 'two', sql = 'CREATE TABLE grows_b (y int)' },")
      w:signal("HUP")
      wenv.eventually("the reload", 10, function() return w:logged("scripts reloaded")[1] end)
      assert.same({ 1, 2 }, versions())
      assert(db:query("INSERT INTO grows_b (y) VALUES (1)"))
      write(v1 .. "{ version = 2, name = 'two', sql = 'CREATE TABLE grows_b (y int)' },"
        .. "{ version = 3, name = 'broken', sql = 'CREATE TABLE (' },")
      w:signal("HUP")
      wenv.eventually("the failed reload", 10, function() return w:logged("reloading the scripts failed")[1] end)
      assert.matches("migration 3 (broken) of scope 'grows' failed", w:logged("reloading the scripts failed")[1].error, 1, true)
      assert.same({ 1, 2 }, versions())
      local id = assert(c:submit { thread_id = "t-g", input = { text = "still here" } })
      local _, done = events_of(c, id)
      assert.equal("done", done.data.status)
      assert.equal("echo: still here", assert(results.get(db, id)).answer)
    end)
    stop(w)
  end)

  it("exits 2 with a clear message when no script is given", function()
    local w = env:worker {}
    local code = mg.run(function() return w:wait(20) end)
    assert.equal(2, code)
    assert.matches("moongraph worker: no script to run: give %-%-script %[NAME=%]PATH %(repeatable%) or set MOONGRAPH_WORKER_SCRIPT",
      w:log())
  end)

  it("stops at once when a script's migration is broken SQL, naming it", function()
    local dir = wenv.tmpdir("badsql")
    local path = dir .. "/badsql.lua"
    local f = assert(io.open(path, "w"))
    f:write([[
local steps = dofile("spec/support/worker_scripts/plain.lua")
return { build = steps.build, worker = { scope = "badsql",
  migrations = { { version = 1, name = "typo", sql = "CREAT TABLE x ()" } } } }]])
    f:close()
    local w = env:worker { "--script", "badsql=" .. path }
    local code = mg.run(function() return w:wait(20) end)   -- not after the 60 s of retries
    assert.equal(1, code)
    local line = w:logged("worker could not start")[1]
    assert.is_table(line)
    assert.matches("migration 1 (typo) of scope 'badsql' failed", line.error, 1, true)
    assert.same({}, w:logged("migrating Postgres failed; retrying"))
  end)

  it("refuses to start with a script whose hooks are wrong, naming the script", function()
    local dir = wenv.tmpdir("badhooks")
    local path = dir .. "/bad.lua"
    local f = assert(io.open(path, "w"))
    f:write([[return { build = function() end, worker = { inptu = function() end } }]])
    f:close()
    local w = env:worker { "--script", "bad=" .. path }
    local code = mg.run(function() return w:wait(20) end)
    assert.equal(1, code)
    local line = w:logged("worker could not start")[1]
    assert.is_table(line)
    assert.matches("script 'bad' %(.-bad%.lua%): worker%.inptu: not a hook", line.error)
  end)
end)
