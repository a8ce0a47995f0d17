-- Jobs of one conversation (thread) on `moongraph worker`, against real
-- Redis and PostgreSQL: one at a time across workers, by the job's
-- multitask_strategy (enqueue by default, reject, interrupt, rollback).
local mg = require "moongraph"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local results = require "moongraph.worker.results"

local CHAT = "chat=scripts/eco/chat.lua"
local STEPS = "steps=spec/support/worker_scripts/steps.lua"

local env

local function events_of(c, job_id, limit)
  local list = {}
  local last, done = c:follow(job_id, { idle_timeout = limit or 30, block = 0.5,
    on_event = function(ev) list[#list + 1] = ev end })
  assert(last, "no done event for " .. job_id .. ": " .. tostring(done))
  return list, done
end

local function wait_node_start(c, job_id, node)
  local seen = false
  c:follow(job_id, { idle_timeout = 20, block = 0.5, on_event = function(ev)
    if ev.type == "node_start" and ev.data.node == node then seen = true return false end
  end })
  assert(seen, job_id .. " never started " .. node)
end

describe("jobs of one thread", function()
  setup(function() env = wenv.new() end)
  teardown(function() if env then env:destroy() end end)
  after_each(function()
    env:stop_all()
    mg.run(function()
      local r = env:conns()
      assert(r:call("FLUSHALL"))
    end)
  end)

  it("two turns of one conversation submitted at once to two workers both run, as turn 1 and turn 2", function()
    local a = env:worker { "--script", CHAT, "--concurrency", "4" }
    local b = env:worker { "--script", CHAT, "--concurrency", "4" }
    local threads = 6
    mg.run(function()
      a:wait_started()
      b:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local jobs = {}
      for t = 1, threads do
        for turn = 1, 2 do
          jobs[#jobs + 1] = assert(c:submit { thread_id = "pair-" .. t, user_id = "u-" .. t,
            input = { message = turn == 1 and "종이 어떻게 버려?" or "페트병은?" } })
        end
      end
      for _, id in ipairs(jobs) do
        local _, done = events_of(c, id)
        assert.equal("done", done.data.status)
      end
      for t = 1, threads do
        local rows = assert(db:query(
          "SELECT (state->>'turn')::int AS turn FROM job_results WHERE thread_id = $1 ORDER BY 1", { "pair-" .. t }))
        assert.equal(2, #rows)
        assert.same({ 1, 2 }, { rows[1].turn, rows[2].turn })
        local msgs = assert(db:query("SELECT count(*)::int AS n, count(DISTINCT turn)::int AS turns FROM messages WHERE thread_id = $1",
          { "pair-" .. t }))[1]
        assert.equal(4, msgs.n)
        assert.equal(2, msgs.turns)
        assert.equal(4, r:call("LLEN", "moongraph:memory:pair-" .. t .. ":recent"))
      end
    end)
    for _, w in ipairs { a, b } do
      w:signal("TERM")
      mg.run(function() assert.equal(0, w:wait()) end)
    end
  end)

  it("reject: a job for a busy thread is refused, naming the job that holds it", function()
    local w = env:worker { "--script", STEPS, "--concurrency", "4" }
    mg.run(function()
      w:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local first = assert(c:submit { thread_id = "busy-1", input = { message = "sleep=1 first" } })
      wait_node_start(c, first, "slow")
      local second = assert(c:submit { thread_id = "busy-1", multitask_strategy = "reject",
                                       input = { message = "second" } })
      local ev, done = events_of(c, second)
      assert.equal("rejected", done.data.status)
      assert.equal("the thread 'busy-1' is busy with job " .. first .. " (multitask_strategy reject)", ev[1].data.error)
      local _, done1 = events_of(c, first)
      assert.equal("done", done1.data.status)
      assert.equal("rejected", assert(results.get(db, second)).status)
      -- the thread is free again
      local third = assert(c:submit { thread_id = "busy-1", multitask_strategy = "reject", input = { message = "third" } })
      local _, done3 = events_of(c, third)
      assert.equal("done", done3.data.status)
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
  end)

  for _, case in ipairs {
    { "interrupt", "interrupted", "interrupted by job %s of the same thread (multitask_strategy interrupt)" },
    { "rollback", "rolled_back", "rolled back: job %s of the same thread asked for multitask_strategy rollback" },
  } do
    local strategy, status, reason = case[1], case[2], case[3]
    it(strategy .. ": the running job of the thread stops at once (stored as " .. status .. ") and the new one runs", function()
      -- two workers: the new job waits on one while the old one runs on the
      -- other; leases are renewed every 10 s (claim-idle 30), and the old
      -- job hears of the new one's request without waiting for that
      local a = env:worker { "--script", STEPS, "--concurrency", "1" }
      local b = env:worker { "--script", STEPS, "--concurrency", "1" }
      mg.run(function()
        a:wait_started()
        b:wait_started()
        local r, db = env:conns()
        local c = assert(client.connect { redis = r })
        local old = assert(c:submit { thread_id = "pre-" .. strategy, input = { message = "sleep=60 old" } })
        wait_node_start(c, old, "slow")
        local new = assert(c:submit { thread_id = "pre-" .. strategy, multitask_strategy = strategy,
                                      input = { message = "new" } })
        local asked = mg.now()
        local ev_old, done_old = events_of(c, old)
        assert.equal(status, done_old.data.status)
        local took = mg.now() - asked
        assert.is_true(took < 3, ("the old job took %.1f s to stop"):format(took))
        local err_ev
        for _, e in ipairs(ev_old) do if e.type == "error" then err_ev = e end end
        assert.equal(reason:format(new), assert(err_ev).data.error)
        local _, done_new = events_of(c, new)
        assert.equal("done", done_new.data.status)
        local row = assert(results.get(db, old))
        assert.equal(status, row.status)
        assert.equal("done", assert(results.get(db, new)).status)
        -- (acknowledged right after the done event)
        wenv.eventually("both jobs acknowledged", 10, function()
          return r:call("XPENDING", "moongraph:jobs", "moongraph")[1] == 0
        end)
      end)
      local stopped = #a:logged("job asked to stop by a later job") + #b:logged("job asked to stop by a later job")
      assert.equal(1, stopped)
      for _, w in ipairs { a, b } do
        w:signal("TERM")
        mg.run(function() assert.equal(0, w:wait()) end)
      end
    end)
  end

  it("a commit with the lease token of a stalled earlier holder is refused", function()
    mg.run(function()
      local _, db = env:conns()
      local w = env:worker { "--script", STEPS }     -- (its migrations make the tables)
      w:wait_started()
      w:signal("TERM")
      assert.equal(0, w:wait())
      assert.is_true(results.claim(db, "fenced", "200"))
      local ok, err = results.commit(db, { job_id = "late", thread_id = "fenced", status = "done", answer = "x" },
        nil, { thread_id = "fenced", token = "100" })
      assert.is_nil(ok)
      assert.matches(results.STALE, err, 1, true)
      assert.is_nil((results.get(db, "late")))
      assert.is_true((results.commit(db, { job_id = "on-time", thread_id = "fenced", status = "done", answer = "y" },
        nil, { thread_id = "fenced", token = "200" })))
      assert.is_false(results.claim(db, "fenced", "150"))
      -- a first delivery's claim reads the job's stored row in the same statement
      local claimed, stored = results.claim(db, "fenced", "300", "on-time")
      assert.is_true(claimed)
      assert.equal("y", stored.answer)
      assert.equal("done", stored.status)
      claimed, stored = results.claim(db, "fenced", "400", "not-stored")
      assert.is_true(claimed)
      assert.is_nil(stored)
      claimed, stored = results.claim(db, "fenced", "350", "on-time")
      assert.is_false(claimed)
      assert.equal("y", stored.answer)
      -- a cleanup's writes are committed whether or not the row went in;
      -- a record's (also) only with the row
      assert(db:exec("CREATE TABLE spec_marks (what text)"))
      local function mark(what)
        return function(tx) return tx:query("INSERT INTO spec_marks VALUES ($1)", { what }) end
      end
      assert.is_true((results.commit(db, { job_id = "c1", thread_id = "fenced", status = "done", answer = "z" },
        mark("record 1"), { thread_id = "fenced", token = "400" }, mark("cleanup 1"))))
      local inserted, kept = results.commit(db, { job_id = "c1", thread_id = "fenced", status = "done", answer = "w" },
        mark("record 2"), { thread_id = "fenced", token = "400" }, mark("cleanup 2"))
      assert.is_false(inserted)
      assert.equal("z", kept.answer)
      local marks = {}
      for _, m in ipairs(assert(db:query("SELECT what FROM spec_marks ORDER BY what"))) do marks[#marks + 1] = m.what end
      assert.same({ "cleanup 1", "cleanup 2", "record 1" }, marks)
      local ok2, err2 = results.commit(db, { job_id = "c2", thread_id = "fenced", status = "done" },
        nil, nil, function() return nil, "cannot" end)
      assert.is_nil(ok2)
      assert.matches("cleanup: cannot", err2, 1, true)
      assert.is_nil((results.get(db, "c2")))
    end)
  end)

  it("moongraph submit sends the job's multitask_strategy, and refuses an unknown one", function()
    local bad = env:spawn { "submit", "--redis", env.redis_url, "--thread", "t", "--multitask-strategy", "merge", "hi" }
    local good = env:spawn { "submit", "--redis", env.redis_url, "--thread", "t", "--multitask-strategy", "reject", "hi" }
    mg.run(function()
      assert.equal(2, bad:wait(20))
      assert.equal(0, good:wait(20))
      local r = env:conns()
      local entries = r:call("XRANGE", "moongraph:jobs", "-", "+")
      assert.equal(1, #entries)
      local j = require("moongraph.worker.job").decode(entries[1][2])
      assert.equal("reject", j.multitask_strategy)
    end)
    assert.matches("%-%-multitask%-strategy: enqueue, reject, interrupt or rollback expected", bad:log())
  end)
end)
