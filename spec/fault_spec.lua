-- Fault tolerance with the durable savers: database restarts in the middle
-- of a run, and a process killed with SIGKILL in the middle of a superstep.
local mg = require "moongraph"
local rsaver = require "moongraph.checkpoint.redis"
local postgres = require "moongraph.checkpoint.postgres"
local cached = require "moongraph.checkpoint.cached"
local servers = require "servers"
local child = require "graph_child"

-- A 10-node linear graph; node `bounce_at` calls bounce() once, in the
-- middle of the run. Returns the app and the execution counts.
local function linear(saver, durability, bounce_at, bounce)
  local runs = {}
  local g = mg.graph { log = mg.reducers.append }
  for i = 1, 10 do
    local name = "n" .. i
    g:add_node(name, function()
      runs[name] = (runs[name] or 0) + 1
      if i == bounce_at and runs[name] == 1 then bounce() end
      return { log = name }
    end)
    g:add_edge(i == 1 and mg.START or ("n" .. (i - 1)), name)
  end
  return g:compile { checkpointer = saver, durability = durability }, runs
end

local EXPECTED = "n1,n2,n3,n4,n5,n6,n7,n8,n9,n10"

-- Every checkpoint of the thread decodes, the finished run's last one (step
-- 10) is there, and those saved before the fault are all still there.
local function check_history(saver, thread, before)
  local list = assert(saver:list { thread_id = thread })
  local have, last = {}, -1
  for _, tup in ipairs(list) do
    have[tup.checkpoint.id] = true
    assert.equal(tup.checkpoint.step, #tup.checkpoint.values.log)
    last = math.max(last, tup.checkpoint.step)
  end
  assert.equal(10, last)
  for _, id in ipairs(before) do assert.is_true(have[id], "checkpoint " .. id .. " was lost") end
  return list
end

-- ids of the thread's stored checkpoints, and the greatest step among them
local function ids_of(saver, thread)
  local out, step = {}, -1
  for _, tup in ipairs(assert(saver:list { thread_id = thread })) do
    out[#out + 1] = tup.checkpoint.id
    if tup.checkpoint.step > step then step = tup.checkpoint.step end
  end
  return out, step
end

-- Nodes finished under a checkpoint stored before the fault ran once; the
-- others ran at most twice (once more when their results were not saved:
-- with durability "async" that may be a few steps' worth).
local function check_runs(runs, saved_step, durability)
  if durability == "sync" then assert.is_true(saved_step >= 4) end
  for i = 1, 10 do
    local n = runs["n" .. i]
    if i <= saved_step then assert.equal(1, n, "n" .. i) else assert.is_true(n == 1 or n == 2, "n" .. i) end
  end
end

-- Run until done: the first invoke may fail (clearly) because of the fault;
-- resuming from the last checkpoint must then finish the run.
local function run_through(app, thread, errpattern)
  local out, err = app:invoke({ log = {} }, { thread_id = thread })
  if not out then
    assert.matches(errpattern, err)
    out, err = app:invoke(nil, { thread_id = thread })
  end
  assert(out, err)
  return out
end

describe("fault tolerance", function()
  describe("Redis restarting during a run (redis saver)", function()
    local srv
    setup(function() srv = servers.redis { persist = true } end)
    teardown(function() if srv then srv:destroy() end end)

    for _, durability in ipairs { "sync", "async" } do
      it("completes, or fails clearly and resumes, losing no checkpoint (" .. durability .. ")", function()
        mg.run(function()
          local thread = "redis-restart-" .. durability
          local saver = rsaver.new(srv.url)
          local before, saved_step
          local app, runs = linear(saver, durability, 5, function()
            before, saved_step = ids_of(saver, thread)
            srv:restart()
          end)
          local out = run_through(app, thread, "checkpointer .* failed: redis: ")
          assert.equal(EXPECTED, table.concat(out.log, ","))
          check_runs(runs, saved_step, durability)
          check_history(saver, thread, before)
        end)
      end)
    end

    it("a kill -9 of Redis (appendfsync always) loses no acknowledged checkpoint", function()
      mg.run(function()
        local thread = "redis-kill"
        local saver = rsaver.new(srv.url)
        local before
        local app = linear(saver, "sync", 7, function()
          before = ids_of(saver, thread)
          srv:restart("kill")
        end)
        local out = run_through(app, thread, "checkpointer .* failed: redis: ")
        assert.equal(EXPECTED, table.concat(out.log, ","))
        assert.is_true(#before >= 6, "checkpoints acknowledged before the kill: " .. #before)
        check_history(saver, thread, before)
      end)
    end)
  end)

  describe("Postgres restarting during a run (postgres saver)", function()
    local srv, url
    setup(function()
      srv = servers.postgres()
      url = srv:create_database("fault_pg")
    end)
    teardown(function() if srv then srv:destroy() end end)

    for _, mode in ipairs { "fast", "immediate" } do
      for _, durability in ipairs { "sync", "async" } do
        it("completes, or fails clearly and resumes (" .. mode .. " restart, " .. durability .. ")", function()
          mg.run(function()
            local thread = "pg-" .. mode .. "-" .. durability
            local saver = postgres.new(url)
            local before, saved_step
            local app, runs = linear(saver, durability, 5, function()
              before, saved_step = ids_of(saver, thread)
              srv:restart(mode)
            end)
            local out = run_through(app, thread, "checkpointer .* failed: pg: ")
            assert.equal(EXPECTED, table.concat(out.log, ","))
            check_runs(runs, saved_step, durability)
            check_history(saver, thread, before)
          end)
        end)
      end
    end
  end)

  describe("Redis restarting under the cached saver", function()
    local rsrv, psrv
    setup(function()
      rsrv = servers.redis()
      psrv = servers.postgres()
    end)
    teardown(function()
      if rsrv then rsrv:destroy() end
      if psrv then psrv:destroy() end
    end)

    it("the run completes: the cache never fails a write", function()
      mg.run(function()
        local durable = postgres.new(psrv:create_database("fault_cached"))
        local saver = cached.new(rsaver.new(rsrv.url, { ttl = 60 }), durable, { retry_after = 0 })
        local app, runs = linear(saver, "sync", 5, function() rsrv:restart() end)
        local out = assert(app:invoke({ log = {} }, { thread_id = "cached" }))
        assert.equal(EXPECTED, table.concat(out.log, ","))
        for i = 1, 10 do assert.equal(1, runs["n" .. i]) end
        local tup = assert(saver:get { thread_id = "cached" })
        assert.equal(10, #tup.checkpoint.values.log)
        assert.equal(11, #check_history(durable, "cached", {}))
      end)
    end)
  end)

  describe("kill -9 in the middle of a superstep (postgres saver)", function()
    local srv
    setup(function() srv = servers.postgres() end)
    teardown(function() if srv then srv:destroy() end end)

    for _, durability in ipairs { "sync", "async" } do
      it("a new process re-runs only the unfinished tasks (durability " .. durability .. ")", function()
        local url = srv:create_database("kill_" .. durability)
        local r = child.crash_and_resume("postgres", url, durability)
        assert.equal("signal", r.crash[2], r.crash[1])
        assert.equal(9, r.crash[3])
        assert.same({ "a", "b", "fan", "killer" }, r.crashed_nodes)
        assert.equal("exit", r.resume[2], r.resume[1])
        assert.equal(0, r.resume[3])
        assert.equal("RESULT a,b,killer\n", r.resume[1])
        assert.same({ fan = 1, a = 1, b = 1, killer = 2, final = 1 }, r.runs)
      end)
    end
  end)
end)
