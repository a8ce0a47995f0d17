-- Jobs of one conversation (thread) on `moongraph worker`, against real
-- Redis and PostgreSQL: one at a time across workers, by the job's
-- multitask_strategy (enqueue by default, reject, interrupt, rollback).
local mg = require "moongraph"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local results = require "moongraph.worker.results"

local CHAT = "chat=scripts/eco/chat.lua"
local STEPS = "steps=spec/support/worker_scripts/steps.lua"
local TURNS = "turns=spec/support/worker_scripts/turns.lua"

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

-- A turn of `thread` (turns.lua) whose node waits until the spec lets it
-- go (deletes spec:hold:<job_id>), submitted and running -> its job id.
local function held_turn(c, r, thread)
  local id = assert(c:submit { thread_id = thread, input = { hold = true } })
  assert(r:call("SET", "spec:hold:" .. id, "1"))
  wait_node_start(c, id, "work")
  return id
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
      -- the thread's results are counted: the claims see on-time and c1,
      -- not c1's refused second commit nor the stale one
      local c3, stored3, commits = results.claim(db, "fenced", "500")
      assert.is_true(c3)
      assert.is_nil(stored3)
      assert.equal(2, commits)
      local _, _, commits_j = results.claim(db, "fenced", "500", "c1")
      assert.equal(2, commits_j)
      assert.equal(0, select(3, results.claim(db, "new-thread", "1", "x")))
      local ok2, err2 = results.commit(db, { job_id = "c2", thread_id = "fenced", status = "done" },
        nil, nil, function() return nil, "cannot" end)
      assert.is_nil(ok2)
      assert.matches("cleanup: cannot", err2, 1, true)
      assert.is_nil((results.get(db, "c2")))
    end)
  end)

  -- A job of `thread` killed mid-run (its first checkpoint saved:
  -- durability sync), then the thread's next job answered by another
  -- worker before that worker claims the killed one. `before_b(db)` runs
  -- between the kill and the second worker's start. -> the worker, the
  -- killed job's row, the second job's row, the turns recorded.
  local function thread_moved_on(thread, args, before_b)
    local a = env:worker(args)
    return mg.run(function()
      a:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local first = held_turn(c, r, thread)
      assert.equal(137, a:kill())
      assert(r:call("DEL", "spec:hold:" .. first))
      if before_b then before_b(db) end
      -- b reads the next turn at once and takes the thread when a's lease
      -- expires; it claims the killed job only seconds later
      local b_args = { "--claim-interval", "4" }
      for _, v in ipairs(args) do b_args[#b_args + 1] = v end
      local b = env:worker(b_args)
      b:wait_started()
      local second = assert(c:submit { thread_id = thread, input = {} })
      local _, done2 = events_of(c, second, 30)
      assert.equal("done", done2.data.status)
      local _, done1 = events_of(c, first, 30)
      assert.equal("done", done1.data.status)
      local turns = assert(db:query(
        "SELECT turn, job_id FROM turnspec_turns WHERE thread_id = $1 ORDER BY turn, job_id", { thread }))
      local rows = { assert(results.get(db, first)), assert(results.get(db, second)) }
      b:signal("TERM")
      assert.equal(0, b:wait())
      return b, rows[1], rows[2], turns
    end)
  end

  it("a job killed mid-run after its thread's next turn was answered starts over, as the turn after it", function()
    local b, first, second, turns = thread_moved_on("moved",
      { "--script", TURNS, "--claim-idle", "1", "--durability", "sync" })
    assert.equal("turn 1", second.answer)
    assert.equal("turn 2", first.answer)
    assert.equal(2, first.deliveries)
    assert.same({ { turn = 1, job_id = second.job_id }, { turn = 2, job_id = first.job_id } }, turns)
    assert.equal(1, #b:logged("the thread moved on since the job's checkpoint: starting the job over"))
    assert.equal(0, #b:logged("job resumed from its checkpoint"))
  end)

  it("a checkpoint saved by an earlier version (no count of the thread's results) is resumed as it was", function()
    local b, first, second = thread_moved_on("moved-old",
      { "--script", TURNS, "--claim-idle", "1", "--durability", "sync", "--checkpoint", "postgres" }, function(db)
      local n = assert(db:query([[
UPDATE moongraph_checkpoints SET metadata = (metadata::jsonb - 'thread_commits')::json
WHERE metadata::jsonb ? 'thread_commits' RETURNING 1]]))
      assert.is_true(#n >= 1)
    end)
    -- it read its memory before the second job's turn, as before
    assert.equal("turn 1", second.answer)
    assert.equal("turn 1", first.answer)
    assert.equal(1, #b:logged("job resumed from its checkpoint"))
    assert.equal(0, #b:logged("the thread moved on"))
  end)

  it("a job killed mid-run resumes from its checkpoint when its thread has not moved on", function()
    local a = env:worker { "--script", TURNS, "--claim-idle", "1", "--durability", "sync" }
    mg.run(function()
      a:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local before = assert(c:submit { thread_id = "still", input = {} })
      events_of(c, before)
      local id = held_turn(c, r, "still")
      assert.equal(137, a:kill())
      assert(r:call("DEL", "spec:hold:" .. id))
      local b = env:worker { "--script", TURNS, "--claim-idle", "1", "--claim-interval", "0.3",
                             "--durability", "sync" }
      local _, done = events_of(c, id, 30)
      assert.equal("done", done.data.status)
      assert.equal("turn 2", assert(results.get(db, id)).answer)
      assert.equal(1, #b:logged("job resumed from its checkpoint"))
      assert.equal(0, #b:logged("the thread moved on"))
      b:signal("TERM")
      assert.equal(0, b:wait())
    end)
  end)

  it("a delivery whose thread a later lease claimed stops at its run's checkpoint conflict", function()
    local a = env:worker { "--script", TURNS, "--claim-idle", "30", "--durability", "sync",
                           "--checkpoint", "postgres" }
    mg.run(function()
      a:wait_started()
      local r, db = env:conns()
      local c = assert(client.connect { redis = r })
      local id = held_turn(c, r, "overtaken")
      -- a later holder claims the thread, and (as its delivery of the job
      -- would) starts the job's checkpoints over: the run's next put conflicts
      assert.is_true((results.claim(db, "overtaken", "1" .. string.rep("0", 30))))
      assert(mg.checkpoint.postgres(env.pg_url):delete_thread("job:" .. id))
      assert(r:call("DEL", "spec:hold:" .. id))
      local left
      wenv.eventually("the job left pending", 20, function()
        left = a:logged("job left pending for a later attempt")[1]
        return left ~= nil
      end)
      assert.equal("the thread's lease passed to a later job while this one ran (stalled worker)", left.reason)
      assert.equal(1, #a:logged("the run's checkpointer failed"))
      assert.equal(1, #a:logged("job started"))
      assert.is_nil((results.get(db, id)))
      assert.equal(0, assert(db:query("SELECT count(*)::int AS n FROM moongraph_checkpoints WHERE thread_id = $1",
        { "job:" .. id }))[1].n)
    end)
    a:signal("TERM")
    mg.run(function() assert.equal(0, a:wait()) end)
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
