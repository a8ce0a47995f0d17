local mg = require "moongraph"

describe("scheduler", function()
  it("runs spawned tasks in spawn order once the spawner yields", function()
    local order = mg.run(function()
      local order = {}
      for i = 1, 5 do mg.spawn(function() order[#order + 1] = i end) end
      order[#order + 1] = "spawner"
      mg.sleep(0)
      return order
    end)
    assert.same({ "spawner", 1, 2, 3, 4, 5 }, order)
  end)

  it("mg.sleep(0) lets every other ready task run first", function()
    local order = mg.run(function()
      local order = {}
      local a = mg.spawn(function() order[#order + 1] = "a1"; mg.sleep(0); order[#order + 1] = "a2" end)
      local b = mg.spawn(function() order[#order + 1] = "b1"; mg.sleep(0); order[#order + 1] = "b2" end)
      a:join(); b:join()
      return order
    end)
    assert.same({ "a1", "b1", "a2", "b2" }, order)
  end)

  it("join returns every result of a finished task", function()
    local ok, a, b, c = mg.run(function()
      return mg.spawn(function(x) return x, nil, "z" end, 1):join()
    end)
    assert.is_true(ok)
    assert.equal(1, a)
    assert.is_nil(b)
    assert.equal("z", c)
  end)

  it("join returns false and the error with a traceback", function()
    local ok, err = mg.run(function()
      return mg.spawn(function() error("broken node") end):join()
    end)
    assert.is_false(ok)
    assert.matches("broken node", err)
    assert.matches("stack traceback", err)
  end)

  it("keeps non-string error objects as they are", function()
    local ok, err = mg.run(function()
      return mg.spawn(function() error({ code = 7 }) end):join()
    end)
    assert.is_false(ok)
    assert.same({ code = 7 }, err)
  end)

  it("many joiners all get the results", function()
    local got = mg.run(function()
      local t = mg.spawn(function() mg.sleep(0.01); return "v" end)
      local js = {}
      for i = 1, 3 do js[i] = mg.spawn(function() return select(2, t:join()) end) end
      local out = {}
      for i = 1, 3 do out[i] = select(2, js[i]:join()) end
      return out
    end)
    assert.same({ "v", "v", "v" }, got)
  end)

  it("join with a timeout returns false, 'timeout' and leaves the task running", function()
    local r = mg.run(function()
      local t = mg.spawn(function() mg.sleep(0.05); return "late" end)
      local ok, err = t:join(0.001)
      local later = table.pack(t:join())
      return { ok, err, later[1], later[2] }
    end)
    assert.same({ false, "timeout", true, "late" }, r)
  end)

  it("cancel runs the pending operation's cleanup and to-be-closed variables", function()
    local r = mg.run(function()
      local closed = false
      local t = mg.spawn(function()
        local guard <close> = setmetatable({}, { __close = function() closed = true end })
        mg.sleep(60)
      end)
      mg.sleep(0)
      assert.equal("waiting", t:status())
      local first = t:cancel()
      local again = t:cancel()
      local ok, err = t:join()
      return { first, again, ok, err, closed, t:status() }
    end)
    assert.same({ true, false, false, "cancelled", true, "cancelled" }, r)
  end)

  it("cancel wakes a task's joiners with false, 'cancelled'", function()
    local r = mg.run(function()
      local t = mg.spawn(function() mg.sleep(60) end)
      local j = mg.spawn(function() return t:join() end)
      mg.sleep(0)
      t:cancel()
      return table.pack(j:join())
    end)
    assert.same({ true, false, "cancelled", n = 3 }, r)
  end)

  it("cancelling a task that never started means it never runs", function()
    local ran = mg.run(function()
      local ran = false
      local t = mg.spawn(function() ran = true end)
      t:cancel()
      mg.sleep(0)
      return ran
    end)
    assert.is_false(ran)
  end)

  it("cancels a task whose timer fired but which has not resumed yet", function()
    local r = mg.run(function()
      local target
      -- both timers expire in the same loop turn; the canceller's was
      -- started first, so it runs while the target is woken but not resumed
      local canceller = mg.spawn(function()
        mg.sleep(0.005)
        return target:status(), target:cancel()
      end)
      target = mg.spawn(function() mg.sleep(0.005); return "ran" end)
      local _, status_before, cancelled = canceller:join()
      return { status_before, cancelled, target:join() }
    end)
    assert.same({ "ready", true, false, "cancelled" }, r)
  end)

  it("a task cannot cancel or join itself", function()
    local ok1, e1, ok2, e2 = mg.run(function()
      local me = mg.current()
      local a, b = pcall(me.cancel, me)
      local c, d = pcall(me.join, me)
      return a, b, c, d
    end)
    assert.is_false(ok1); assert.matches("cannot cancel itself", e1)
    assert.is_false(ok2); assert.matches("cannot join itself", e2)
  end)

  it("gather returns results in input order whatever the finish order", function()
    local r = mg.run(function()
      return mg.gather({
        function() mg.sleep(0.03); return "slow" end,
        function() return "fast" end,
        function() error("bad") end,
        function() mg.sleep(0.01); return "mid" end,
      })
    end)
    assert.equal(4, #r)
    assert.same({ true, "slow" }, { r[1].ok, r[1].value })
    assert.same({ true, "fast" }, { r[2][1], r[2][2] })
    assert.is_false(r[3].ok)
    assert.matches("bad", r[3].err)
    assert.equal("mid", r[4].value)
  end)

  it("mg.timeout cancels a function that takes too long", function()
    local r = mg.run(function()
      local cleaned = false
      local ok, err = mg.timeout(0.01, function()
        local g <close> = setmetatable({}, { __close = function() cleaned = true end })
        mg.sleep(60)
      end)
      return { ok, err, cleaned }
    end)
    assert.same({ false, "timeout", true }, r)
  end)

  it("mg.timeout returns the function's results or its error", function()
    local r = mg.run(function()
      local a = table.pack(mg.timeout(1, function(x) return x * 2, "y" end, 21))
      local b = table.pack(mg.timeout(1, function() error("inner") end))
      return { a, b }
    end)
    assert.same({ true, 42, "y", n = 3 }, r[1])
    assert.is_false(r[2][1])
    assert.matches("inner", r[2][2])
  end)

  it("a task woken by a timer runs in that loop turn, not at the next deadline", function()
    -- the parent's join deadline is the next timer after the child's sleep;
    -- the child must finish long before it
    local ok, elapsed = mg.run(function()
      local t0 = mg.now()
      local child = mg.spawn(function() mg.sleep(0.001); return "done" end)
      local ok = child:join(20)
      return ok, mg.now() - t0
    end)
    assert.is_true(ok)
    assert.is_true(elapsed < 10, "child finished only at the join deadline")
  end)

  it("mg.sleep waits at least the asked time on the monotonic clock", function()
    local elapsed = mg.run(function()
      local t0 = mg.now()
      mg.sleep(0.02)
      return mg.now() - t0
    end)
    assert.is_true(elapsed >= 0.019)
  end)

  it("mg.sleep rejects negative and non-number durations", function()
    -- (mg.run raises the task's error with its traceback after the message)
    local ok, err = pcall(mg.run, function() mg.sleep(-1) end)
    assert.is_false(ok)
    assert.matches(":%d+: bad argument #1 to 'sleep' %(must be a non%-negative number%)\n", err)
    ok, err = pcall(mg.run, function() mg.sleep("x") end)
    assert.is_false(ok)
    assert.matches(":%d+: bad argument #1 to 'sleep' %(number expected, got string%)\n", err)
  end)

  it("10,000 coroutines sleep at once on one loop", function()
    local n, woke = 10000, 0
    local r = mg.run(function()
      local ts = {}
      for i = 1, n do
        ts[i] = mg.spawn(function() mg.sleep(0.05); woke = woke + 1; return i end)
      end
      local sum = 0
      for i = 1, n do sum = sum + select(2, ts[i]:join()) end
      return sum
    end)
    assert.equal(n, woke)
    assert.equal(n * (n + 1) // 2, r)
  end)

  it("tasks still alive when mg.run returns are cancelled and cleaned up", function()
    local closed = false
    mg.run(function()
      mg.spawn(function()
        local g <close> = setmetatable({}, { __close = function() closed = true end })
        mg.sleep(60)
      end)
      mg.sleep(0)
    end)
    assert.is_true(closed)
  end)

  it("mg.run raises the main function's error", function()
    local ok, err = pcall(mg.run, function() error("top") end)
    assert.is_false(ok)
    assert.matches("^spec/loop_spec%.lua:%d+: top\nstack traceback:", err)
  end)

  it("mg.run reports a main task that can never be woken instead of hanging", function()
    local ok, err = pcall(mg.run, function() mg.queue():get() end)
    assert.is_false(ok)
    assert.matches("can never happen", err)
  end)

  it("mg.run cannot be nested inside a task", function()
    local ok, err = mg.run(function() return pcall(mg.run, function() end) end)
    assert.is_false(ok)
    assert.matches("already running", err)
  end)
end)

describe("yielding where Lua cannot yield", function()
  it("raises a clear error inside a table.sort comparator", function()
    local ok, err = mg.run(function()
      return pcall(table.sort, { 3, 1, 2 }, function(a, b) mg.sleep(0); return a < b end)
    end)
    assert.is_false(ok)
    assert.matches("cannot wait here", err)
  end)

  it("raises a clear error at the top level of a required chunk", function()
    local ok, err = mg.run(function()
      package.preload["spec_yield_in_require"] = function() mg.sleep(0) end
      local a, b = pcall(require, "spec_yield_in_require")
      package.preload["spec_yield_in_require"] = nil
      return a, b
    end)
    assert.is_false(ok)
    assert.matches("top level of a required chunk", err)
  end)

  it("raises a clear error inside __gc", function()
    local err = mg.run(function()
      local msg
      setmetatable({}, { __gc = function() msg = select(2, pcall(mg.sleep, 0)) end })
      collectgarbage(); collectgarbage()
      return msg
    end)
    assert.matches("cannot wait here", err)
  end)

  it("raises a clear error outside any task", function()
    local ok, err = pcall(mg.sleep, 0)
    assert.is_false(ok)
    assert.matches("not inside a moongraph task", err)
  end)

  it("raises a clear error inside a plain coroutine of a task", function()
    local ok, err = mg.run(function()
      local co = coroutine.wrap(function() mg.sleep(0) end)
      return pcall(co)
    end)
    assert.is_false(ok)
    assert.matches("not inside a moongraph task", err)
  end)
end)

describe("queue", function()
  it("delivers items in order to a waiting consumer", function()
    local got = mg.run(function()
      local q = mg.queue()
      mg.spawn(function()
        for i = 1, 3 do q:put(i); mg.sleep(0) end
        q:close()
      end)
      local got = {}
      while true do
        local v, err = q:get()
        if v == nil then got[#got + 1] = err; break end
        got[#got + 1] = v
      end
      return got
    end)
    assert.same({ 1, 2, 3, "closed" }, got)
  end)

  it("get times out", function()
    local r = mg.run(function() return table.pack(mg.queue():get(0.001)) end)
    assert.same({ nil, "timeout", n = 2 }, r)
  end)

  it("each item goes to exactly one of several consumers", function()
    local total = mg.run(function()
      local q = mg.queue()
      local sums = {}
      local ts = {}
      for c = 1, 4 do
        ts[c] = mg.spawn(function()
          local s = 0
          while true do
            local v = q:get()
            if not v then break end
            s = s + v
          end
          return s
        end)
      end
      for i = 1, 100 do q:put(i) end
      mg.sleep(0)
      q:close()
      local total = 0
      for c = 1, 4 do total = total + select(2, ts[c]:join()) end
      return total
    end)
    assert.equal(5050, total)
  end)

  it("a cancelled consumer does not swallow an item", function()
    local r = mg.run(function()
      local q = mg.queue()
      local a = mg.spawn(function() return q:get() end)
      local b = mg.spawn(function() return q:get() end)
      mg.sleep(0)
      a:cancel()
      q:put("x")
      return table.pack(b:join())
    end)
    assert.same({ true, "x", n = 2 }, r)
  end)

  it("a run that starts after time spent outside the loop counts its timeouts from its start", function()
    local process = require "moongraph.process"
    mg.run(function() mg.sleep(0) end)
    os.execute("sleep 1.5")   -- the process busy elsewhere, no run going
    local code, signal = mg.run(function()
      local p = assert(process.spawn({ "sleep", "0.2" }, { timeout = 1 }))
      return p:wait()
    end)
    assert.same({ 0, nil }, { code, signal })
  end)
end)
