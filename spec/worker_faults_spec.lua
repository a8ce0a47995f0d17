-- Faults a new user runs into with `moongraph worker`, against real Redis
-- and PostgreSQL: a job's lease renewal racing its acknowledgement, dead
-- consumers left in the group, poison input, a Postgres blip.
local mg = require "moongraph"
local cjson = require "cjson"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local config = require "moongraph.worker.config"
local worker = require "moongraph.worker"
local tmp = require "tmp"

local PLAIN = "plain=spec/support/worker_scripts/plain.lua"
local STEPS = "steps=spec/support/worker_scripts/steps.lua"

local env

local function no_env() return nil end

local function lines_of(path)
  local out = {}
  for line in (wenv.read_file(path) or ""):gmatch("[^\n]+") do
    out[#out + 1] = assert(cjson.decode(line))
  end
  return out
end

local function with_msg(lines, msg)
  local out = {}
  for _, l in ipairs(lines) do
    if type(l.msg) == "string" and l.msg:find(msg, 1, true) then out[#out + 1] = l end
  end
  return out
end

local function events_of(c, job_id, limit)
  local list = {}
  local last, done = c:follow(job_id, { idle_timeout = limit or 20, block = 0.5,
    on_event = function(ev) list[#list + 1] = ev end })
  assert(last, "no done event for " .. job_id .. ": " .. tostring(done))
  return list, done
end

local function consumers(r)
  local rows = r:call("XINFO", "CONSUMERS", "moongraph:jobs", "moongraph")
  assert(type(rows) == "table", "XINFO CONSUMERS: " .. tostring(rows))
  local names = {}
  for _, row in ipairs(rows) do
    for i = 1, #row - 1, 2 do
      if row[i] == "name" then names[#names + 1] = row[i + 1] end
    end
  end
  table.sort(names)
  return names
end

describe("worker faults", function()
  setup(function() env = wenv.new() end)
  teardown(function() if env then env:destroy() end end)
  after_each(function()
    env:stop_all()
    mg.run(function()
      local r, db = env:conns()
      assert(r:call("FLUSHALL"))
      if assert(db:query("SELECT to_regclass('job_results') IS NOT NULL AS e"))[1].e then
        assert(db:exec("TRUNCATE job_results"))
      end
    end)
  end)

  it("a lease renewal that sees a job after its own XACK does not stop it, and the counters are exact", function()
    local logfile = tmp.path("worker.log", "race")
    local log_out = assert(io.open(logfile, "w"))
    local cfg = assert(config.parse({ "--script", PLAIN, "--redis", env.redis_url, "--pg", env.pg_url,
      "--checkpoint", "memory", "--consumer", "inproc", "--concurrency", "1", "--grace", "5" }, no_env))
    local w = worker.new(cfg, { log_out = log_out })
    local counters
    mg.run(function()
      assert(w:start())
      -- the interleaving of the race: a renewal pass runs between the
      -- job's XACK and the rest of its clean-up
      local q = w.queue
      local ack = q.ack
      local injected = 0
      q.ack = function(self, id)
        local ok, err = ack(self, id)
        injected = injected + 1
        mg.spawn(function() w:renew_once() end):join()
        return ok, err
      end
      local t = mg.spawn(w.run, w)
      local r = env:conns()
      local c = assert(client.connect { redis = r })
      for i = 1, 3 do
        local id = assert(c:submit { thread_id = "race-" .. i, input = { text = "job " .. i } })
        local _, done = events_of(c, id)
        assert.equal("done", done.data.status)
      end
      wenv.eventually("the jobs acknowledged", 10, function()
        return r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0 and w.inflight == 0
      end)
      assert.equal(3, injected)
      counters = w.metrics:snapshot().counters
      w:stop()
      local ok, code = t:join(20)
      assert.is_true(ok)
      assert.equal(0, code)
    end)
    log_out:close()
    local lines = lines_of(logfile)
    assert.same({}, with_msg(lines, "claimed by another worker"))
    assert.equal(3, #with_msg(lines, "job done"))
    assert.equal(3, counters.jobs_done)
    assert.equal(0, counters.jobs_released)
  end)

  it("a worker that stops cleanly leaves the consumer group", function()
    local w = env:worker { "--script", PLAIN }
    mg.run(function()
      w:wait_started()
      local r = env:conns()
      local c = assert(client.connect { redis = r })
      local id = assert(c:submit { thread_id = "leave-1", input = { text = "hi" } })
      events_of(c, id)
      assert.same({ "w" .. env.n }, consumers(r))    -- (a consumer exists once it got a job)
      w:signal("TERM")
      assert.equal(0, w:wait())
      assert.same({}, consumers(r))
    end)
  end)

  it("the consumers of killed workers are removed once nothing is pending on them", function()
    -- one job each, held (running) by each worker when the victims die
    local args = { "--script", STEPS, "--claim-idle", "1", "--claim-interval", "0.25", "--concurrency", "1" }
    local live = env:worker(args)
    local live_name = "w" .. env.n
    local victims = {}
    mg.run(function()
      live:wait_started()
      for i = 1, 4 do
        victims[i] = env:worker(args)
        victims[i]:wait_started()
      end
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local ids = {}
      for i = 1, 5 do
        ids[i] = assert(c:submit { thread_id = "reap-" .. i, input = { message = "sleep=1 job " .. i } })
      end
      wenv.eventually("five consumers, each with its job", 10, function() return #consumers(r) == 5 end)
      for _, v in ipairs(victims) do v:kill() end
      wenv.eventually("the jobs answered", 60, function()
        return assert(db:query("SELECT count(*)::int AS n FROM job_results"))[1].n == 5
      end)
      wenv.eventually("only the live consumer left", 30, function()
        return #consumers(r) == 1
      end)
      assert.same({ live_name }, consumers(r))
      assert.equal(0, r:call("XPENDING", "moongraph:jobs", "moongraph")[1])
    end)
    assert.is_true(#live:logged("removed the consumers of dead workers") > 0)
  end)

  it("refuses poison input at the door: NUL or invalid UTF-8 is dead-lettered at once, with the true reason", function()
    local w = env:worker { "--script", PLAIN, "--max-deliveries", "5" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local poison = {
        nul = { [[{"job_id":"p-nul","thread_id":"t","input":{"text":"a\u0000b"}}]],
                "field input.text contains a NUL character (\\u0000) at byte 2; text must be UTF-8 without NUL" },
        utf8 = { '{"job_id":"p-utf8","thread_id":"t","input":{"text":"caf\xe9"}}',
                 "field input.text is not valid UTF-8 (at byte 4); text must be UTF-8 without NUL" },
        key = { [[{"job_id":"p-key","thread_id":"t","input":{"list":[{"\ud800":1}]}}]],
                "field input.list[1] has a key that is not valid UTF-8 (at byte 1); text must be UTF-8 without NUL" },
      }
      for _, p in pairs(poison) do assert(r:call("XADD", "moongraph:jobs", "*", "job", p[1])) end
      -- a good job after them is answered
      local good = assert(c:submit { thread_id = "t", input = { text = "fine" } })
      local _, done = events_of(c, good)
      assert.equal("done", done.data.status)
      for name, p in pairs(poison) do
        local job_id = "p-" .. name
        local ev, pdone = events_of(c, job_id)
        assert.equal("dead", pdone.data.status)
        assert.equal("error", ev[1].type)
        assert.equal("bad job: " .. p[2], ev[1].data.error)
      end
      local dead = r:call("XRANGE", "moongraph:jobs:dead", "-", "+")
      assert.equal(3, #dead)
      for _, e in ipairs(dead) do
        local f = {}
        for i = 1, #e[2] - 1, 2 do f[e[2][i]] = e[2][i + 1] end
        assert.equal("1", f.deliveries)                 -- refused at its first delivery
        assert.matches("^bad job: field input", f.reason)
      end
      assert.equal(1, assert(db:query("SELECT count(*)::int AS n FROM job_results"))[1].n)
      -- the client refuses such a job before it is queued
      local ok, err = pcall(c.submit, c, { thread_id = "t", input = { text = "x\0y" } })
      assert.is_false(ok)
      assert.matches("NUL character", err)
      ok, err = pcall(c.submit, c, { thread_id = "t", input = { text = "\xff" } })
      assert.is_false(ok)
      assert.matches("not valid UTF%-8", err)
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
  end)

  it("moongraph submit refuses a message that is not UTF-8 text, with exit 2 and the reason", function()
    local p = env:spawn { "submit", "--redis", env.redis_url, "--thread", "t", "caf\xe9" }
    local q = env:spawn { "submit", "--redis", env.redis_url, "--thread", "t", "--input", '{"text":"a\\u0000"}' }
    mg.run(function()
      assert.equal(2, p:wait(20))
      assert.equal(2, q:wait(20))
      local r = env:conns()
      assert.equal(0, r:call("XLEN", "moongraph:jobs"))
    end)
    assert.matches("input.message is not valid UTF%-8", p:log())
    assert.matches("input.text contains a NUL character", q:log())
  end)

  it("a Postgres restart under running jobs: they retry in place and finish at their first delivery", function()
    -- claim_idle stays at its default (30 s): a job given up by its worker
    -- would wait that long, past the limit below, and be delivered twice
    local w = env:worker { "--script", STEPS, "--concurrency", "8" }
    local N = 40
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      for i = 1, N do
        assert(c:submit { thread_id = "blip-" .. i, job_id = ("blip-%02d"):format(i),
                          input = { message = "sleep=0.5 tokens=3 job " .. i } })
      end
      wenv.eventually("the first results", 20, function()
        return assert(db:query("SELECT count(*)::int AS n FROM job_results"))[1].n >= 4
      end)
      db:close()
      -- down until the worker has run into it, then up again
      local restarted <close> = setmetatable({}, { __close = function()
        if not env.pg:running() then env.pg:start() end
      end })
      env.pg:stop("fast")
      wenv.eventually("the worker to run into the outage", 20, function()
        return w:log():find("cannot connect", 1, true)
      end)
      env.pg:start()
      db = assert(require("moongraph.pg").connect(env.pg_url))
      wenv.eventually("every result", 25, function()
        local n = db:query("SELECT count(*)::int AS n FROM job_results")
        return n and n[1].n == N
      end)
      local rows = assert(db:query("SELECT job_id, status, deliveries, error FROM job_results"))
      assert.equal(N, #rows)
      for _, row in ipairs(rows) do
        assert.equal("done", row.status, row.job_id .. ": " .. tostring(row.error))
        assert.equal(1, row.deliveries, row.job_id)
      end
      wenv.eventually("every job acknowledged", 10, function()
        return r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
      end)
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
    assert.same({}, w:logged("left pending for a later attempt"))
    assert.is_true(#w:logged("retrying") > 0, "no job noticed the restart")
  end)

  it("stops at once on a wrong Redis password instead of retrying it for a minute", function()
    local servers = require "servers"
    local locked = servers.redis { password = "s3cret" }
    local wrong = locked.url:gsub("s3cret", "wrong")
    local w = env:spawn({ "worker", "--redis", wrong, "--pg", env.pg_url, "--script", PLAIN })
    local t0 = mg.now()
    local code = mg.run(function() return w:wait(20) end)
    local took = mg.now() - t0
    locked:destroy()
    assert.is_true(code ~= 0)
    assert.is_true(took < 10, "took " .. took .. " s")
    assert.matches("WRONGPASS", w:output() .. w:log())
    assert.same({}, w:logged("retrying"))
  end)
end)
