-- moongraph.multitask: one run at a time per thread, in one process
-- (memory), across processes sharing a Redis (real redis-server), and
-- across processes sharing a directory (file locks).
local mg = require "moongraph"
local multitask = require "moongraph.multitask"
local servers = require "servers"
local redis = require "moongraph.redis"
local tmp = require "tmp"

-- A conversation: each run appends its message in `first`, then waits
-- (gate: a queue the spec opens, or a sleep) in `second`, and counts a turn.
local function conversation(saver)
  local g = mg.graph { log = mg.reducers.append, turn = mg.reducers.add }
  g:add_node("first", function(state)
    return { log = { state.msg .. ":1" } }
  end)
  g:add_node("second", function(state)
    if state.hold then mg.sleep(state.hold) end
    return { log = { state.msg .. ":2" }, turn = 1 }
  end)
  g:add_edge(mg.START, "first")
  g:add_edge("first", "second")
  g:add_edge("second", mg.END)
  return g:compile { checkpointer = saver or mg.checkpoint.memory() }
end

local function wait_until(what, fn)
  for _ = 1, 400 do
    if fn() then return end
    mg.sleep(0.01)
  end
  error("gave up waiting for " .. what, 2)
end

local function state_of(app, thread)
  local snap = assert(app:get_state { thread_id = thread })
  return snap.values
end

local function backends(r_url)
  return {
    memory = function() local c = multitask.memory() return c, c end,
    redis = function()
      local a = multitask.redis(assert(redis.connect(r_url)), { prefix = "mt" .. math.random(1e9), ttl = 0.6, poll = 0.02 })
      -- a second coordinator on its own connection: another process
      local b = multitask.redis(assert(redis.connect(r_url)), { prefix = a.prefix, ttl = 0.6, poll = 0.02 })
      return a, b
    end,
  }
end

describe("multitask", function()
  local rs
  setup(function() rs = servers.redis() end)
  teardown(function() if rs then rs:destroy() end end)

  it("refuses an unknown strategy, naming the known ones", function()
    local c = multitask.memory()
    local ok, err = pcall(c.acquire, c, "t", { strategy = "merge" })
    assert.is_false(ok)
    assert.matches("multitask_strategy must be enqueue, reject, interrupt or rollback, got 'merge'", err)
  end)

  for name, make in pairs(backends(nil)) do
    describe("(" .. name .. ")", function()
      local function coords()
        if name == "redis" then return backends(rs.url).redis() end
        return make()
      end

      it("enqueue: two turns of one thread at once both run, one after the other", function()
        mg.run(function()
          local c1, c2 = coords()
          local app = conversation()
          local a = mg.spawn(multitask.invoke, c1, app, { msg = "a", hold = 0.2 }, { thread_id = "t1" })
          wait_until("a to hold the thread", function() return #(state_of(app, "t1").log or {}) > 0 end)
          local b = mg.spawn(multitask.invoke, c2, app, { msg = "b" }, { thread_id = "t1" })
          local _, sa = a:join()
          local _, sb = b:join()
          assert.equal(1, sa.turn)
          assert.equal(2, sb.turn)
          assert.same({ "a:1", "a:2", "b:1", "b:2" }, state_of(app, "t1").log)
        end)
      end)

      it("reject: a run on a busy thread is refused with the holder's id", function()
        mg.run(function()
          local c1, c2 = coords()
          local l1 = assert(c1:acquire("t2", { run_id = "first" }))
          local l2, err, info = c2:acquire("t2", { run_id = "second", strategy = "reject" })
          assert.is_nil(l2)
          assert.equal("busy", err)
          assert.equal("first", info.holder)
          assert.is_true(l1:release())
          assert(c2:acquire("t2", { run_id = "third", strategy = "reject" })):release()
        end)
      end)

      it("interrupt: the running turn stops, its progress stays, the new one runs", function()
        mg.run(function()
          local c1, c2 = coords()
          local app = conversation()
          local a = mg.spawn(multitask.invoke, c1, app, { msg = "a", hold = 30 }, { thread_id = "t3" })
          wait_until("a to hold the thread", function() return #(state_of(app, "t3").log or {}) > 0 end)
          local sb = assert(multitask.invoke(c2, app, { msg = "b", hold = 0 }, { thread_id = "t3", multitask_strategy = "interrupt" }))
          local _, sa, aerr = a:join()
          assert.is_nil(sa)
          assert.matches("^interrupted by ", aerr)
          assert.same({ "a:1", "b:1", "b:2" }, sb.log)
          assert.equal(1, sb.turn)
        end)
      end)

      it("rollback: the running turn stops and is undone, the new one runs from before it", function()
        mg.run(function()
          local c1, c2 = coords()
          local app = conversation()
          assert(multitask.invoke(c1, app, { msg = "z" }, { thread_id = "t4" }))
          local a = mg.spawn(multitask.invoke, c1, app, { msg = "a", hold = 30 }, { thread_id = "t4" })
          wait_until("a to hold the thread", function() return #(state_of(app, "t4").log or {}) > 2 end)
          local sb = assert(multitask.invoke(c2, app, { msg = "b" }, { thread_id = "t4", multitask_strategy = "rollback" }))
          local _, sa, aerr = a:join()
          assert.is_nil(sa)
          assert.matches("^rolled back by ", aerr)
          assert.same({ "z:1", "z:2", "b:1", "b:2" }, sb.log)
          assert.equal(2, sb.turn)
          assert.same(sb.log, state_of(app, "t4").log)
        end)
      end)

      it("a waiter cancelled while it waits leaves the queue: the thread goes to the next one", function()
        mg.run(function()
          local c1, c2 = coords()
          local first = assert(c1:acquire("t6", { run_id = "first" }))
          local queued = mg.queue()
          local function mark() queued:put(true) end
          local waiting = mg.spawn(function() return c2:acquire("t6", { run_id = "cancelled", on_wait = mark }) end)
          assert.is_true(queued:get(5))
          local behind = mg.spawn(function() return c1:acquire("t6", { run_id = "behind", on_wait = mark }) end)
          assert.is_true(queued:get(5))
          waiting:cancel()
          assert.is_true(first:release())
          local ok, lease = behind:join(5)
          assert.is_true(ok)
          assert.equal("behind", lease.run_id)
          assert.is_true(lease:release())
          assert(c2:acquire("t6", { run_id = "after", strategy = "reject" })):release()
        end)
      end)

      it("gives a larger fencing token to each later holder", function()
        mg.run(function()
          local c1, c2 = coords()
          local l1 = assert(c1:acquire("t5"))
          local t1 = tonumber(l1.token)
          l1:release()
          local l2 = assert(c2:acquire("t5"))
          assert.is_true(tonumber(l2.token) > t1)
          assert.is_true(l2:check())
          l2:release()
        end)
      end)
    end)
  end

  it("(redis) a holder that stopped renewing loses the thread; its lease says so and cannot release the next one's", function()
    mg.run(function()
      local conn = assert(redis.connect(rs.url))
      local c = multitask.redis(conn, { prefix = "mtlost", ttl = 0.2, poll = 0.02 })
      local stalled = assert(c:acquire("t", { run_id = "stalled" }))
      local waited = false
      local next_one = assert(c:acquire("t", { run_id = "next", on_wait = function() waited = true end }))
      assert.is_true(waited)
      assert.is_true(tonumber(next_one.token) > tonumber(stalled.token))
      local ok, why = stalled:check()
      assert.is_nil(ok)
      assert.equal("lost", why)
      assert.is_false(stalled:release())
      assert.is_true(next_one:check())
      assert.is_true(next_one:release())
    end)
  end)

  -- (redis, on_preempt) two coordinators on url's server, as two processes;
  -- ttl 30: no check() is due for 10 s
  local function coordinators(url, prefix)
    local function one() return multitask.redis(assert(redis.connect(url)), { prefix = prefix, ttl = 30, poll = 0.02 }) end
    return one(), one
  end
  -- the holder of thread "t", its notices put on `heard`
  local function holder_of(c, heard, from)
    return assert(c:acquire("t", { run_id = "holder", from = from, on_preempt = function(info) heard:put(info) end }))
  end
  -- run "asker" asks the holder to stop; the holder hears within a second
  -- -> info it heard; then the thread passes to the asker
  local function ask_and_hear(holder, c, strategy, heard)
    local asked = mg.now()
    local asker = mg.spawn(function()
      return c:acquire("t", { run_id = "asker", strategy = strategy, timeout = 10 })
    end)
    local info = heard:get(5)
    assert.is_table(info)
    assert.is_true(mg.now() - asked < 1)
    assert.is_true(holder:release())
    local ok, lease = asker:join(5)
    assert.is_true(ok)
    assert.equal("asker", lease.run_id)
    assert.is_true(lease:release())
    return info
  end

  it("(redis) a holder given on_preempt hears at once that a later run asks it to stop, without a check", function()
    mg.run(function()
      local c1, another = coordinators(rs.url, "mtnote")
      local heard = mg.queue()
      local holder = holder_of(c1, heard, "cp-1")
      mg.sleep(0.2)   -- (its coordinator is listening by now)
      local info = ask_and_hear(holder, another(), "rollback", heard)
      assert.same({ by = "asker", strategy = "rollback", from = "cp-1" }, info)
      -- told once; and the subscription ends once no lease needs it
      assert.is_nil(heard:get(0.2))
      wait_until("the listener to end", function() return not c1.listening end)
    end)
  end)

  it("(redis) a holder given on_preempt still hears of a later run's request after its subscription dropped", function()
    local prs = servers.redis { persist = true }
    local ok, err = pcall(mg.run, function()
      local c1, another = coordinators(prs.url, "mtcut")
      local heard = mg.queue()
      local holder = holder_of(c1, heard)
      mg.sleep(0.2)
      prs:restart()
      mg.sleep(1.5)   -- (the listener subscribes again)
      local info = ask_and_hear(holder, another(), "interrupt", heard)
      assert.equal("asker", info.by)
    end)
    prs:destroy()
    if not ok then error(err, 0) end
  end)

  it("(redis) a waiter that stopped polling leaves the queue", function()
    mg.run(function()
      local conn = assert(redis.connect(rs.url))
      local c = multitask.redis(conn, { prefix = "mtgone", ttl = 0.3, poll = 0.02 })
      local h = assert(c:acquire("t", { run_id = "holder" }))
      local l, err = c:acquire("t", { run_id = "gone", timeout = 0.05 })   -- queued, then gives up
      assert.is_nil(l)
      assert.equal("timeout", err)
      h:release()
      -- a third run is not held up by the one that left
      local t = assert(c:acquire("t", { run_id = "third", timeout = 5 }))
      t:release()
    end)
  end)

  it("(file) a second process's run waits for the lock, or is refused with reject", function()
    local dir = tmp.dir("locks")
    mg.run(function()
      local c1, c2 = multitask.file(dir, { poll = 0.02 }), multitask.file(dir, { poll = 0.02 })
      local l1 = assert(c1:acquire("chat-1"))
      local l2, err = c2:acquire("chat-1", { strategy = "reject" })
      assert.is_nil(l2)
      assert.equal("busy", err)
      local got, waiting = nil, mg.queue()
      local waiter = mg.spawn(function()
        got = assert(c2:acquire("chat-1", { timeout = 10, on_wait = function() waiting:put(true) end }))
      end)
      assert.is_true(waiting:get(10))
      assert.is_nil(got)
      l1:release()
      waiter:join()
      assert.is_truthy(got)
      got:release()
      local _, ierr = c1:acquire("chat-1", { strategy = "interrupt" })
      assert.matches("a file lock supports enqueue and reject", ierr)
    end)
  end)
end)
