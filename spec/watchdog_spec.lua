-- The watchdog (runtime/watchdog.c): a task that runs too long without
-- yielding is stopped, a server goes on answering, and SIGTERM still stops
-- a process whose loop such a task holds.
local mg = require "moongraph"
local sp = require "serverproc"
local socket = require "socket"

describe("mg.watchdog", function()
  it("gives a task that runs past its limit without yielding an error its caller handles", function()
    local ok, err = mg.run(function()
      local t = mg.spawn(function() local n = 0 while true do n = n + 1 end end)
      mg.watchdog(0.2, t)
      return t:join()
    end)
    assert.is_false(ok)
    assert.matches("^watchdog: the task ran [%d.]+ s without yielding %(limit 0.2 s%)", err)
  end)

  it("stops for good a task that catches that error and keeps running, closing what it holds", function()
    local closed = false
    local ok, err = mg.run(function()
      local t = mg.spawn(function()
        local guard <close> = setmetatable({}, { __close = function() closed = true end })
        while true do pcall(function() while true do end end) end
      end)
      mg.watchdog(0.1, t)
      return t:join()
    end)
    assert.is_false(ok)
    assert.matches("watchdog: the task was stopped: it kept running", err)
    assert.is_true(closed)
  end)

  it("lets a watched task that yields run as long as it likes", function()
    local n = mg.run(function()
      local t = mg.spawn(function()
        local n = 0
        for _ = 1, 6 do
          local s = mg.now()
          while mg.now() - s < 0.05 do n = n + 1 end   -- 50 ms of work, then a yield
          mg.sleep(0)
        end
        return n
      end)
      mg.watchdog(0.2, t)
      return select(2, t:join())
    end)
    assert.is_true(n > 0)
  end)

  it("passes a task's limit to the tasks it spawns, and the process default to tasks without one", function()
    local inner_err, default_err = mg.run(function()
      local parent = mg.spawn(function()
        return mg.spawn(function() while true do end end):join()
      end)
      mg.watchdog(0.1, parent)
      local _, _, e1 = parent:join()
      local before = mg.watchdog(0.1)
      local ok, e2 = mg.spawn(function() while true do end end):join()
      mg.watchdog(before)
      assert.is_false(ok)
      return e1, e2
    end)
    assert.matches("^watchdog: ", inner_err)
    assert.matches("^watchdog: ", default_err)
  end)

  it("leaves alone a task whose limit is false, whatever the default", function()
    local ok, sum = mg.run(function()
      local before = mg.watchdog(0.05)
      local t = mg.spawn(function()
        local s, t0 = 0, mg.now()
        while mg.now() - t0 < 0.2 do s = s + 1 end
        return s
      end)
      mg.watchdog(false, t)
      local r = { t:join() }
      mg.watchdog(before)
      return table.unpack(r)
    end)
    assert.is_true(ok)
    assert.is_true(sum > 0)
  end)

  it("refuses a limit that is not a number of seconds", function()
    assert.has_error(function() mg.watchdog(-1) end)
    assert.has_error(function() mg.watchdog("5") end)
  end)
end)

describe("the watchdog in a server", function()
  -- CPU ticks the process has used (/proc/PID/stat: utime + stime)
  local function ticks(pid)
    local f = assert(io.open("/proc/" .. pid .. "/stat"))
    local st = f:read("a")
    f:close()
    local fields = {}
    for w in st:gsub("^.-%) ", ""):gmatch("%S+") do fields[#fields + 1] = w end
    return tonumber(fields[12]) + tonumber(fields[13])
  end

  -- send a request whose handler holds the loop, and see that it does
  local function hold(s, path)
    local c = s:connect()
    local before = ticks(s.pid)
    assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"))
    sp.wait_until(function() return ticks(s.pid) - before >= 20 end, 10, "the handler to spin")
    return c
  end

  local function timed(s, path)
    local t0 = socket.gettime()
    local r = s:curl({ path }, { timeout = 20 })
    return r, socket.gettime() - t0
  end

  it("answers a handler that spins 500 with the request id, and goes on serving", function()
    local s = sp.start { watchdog = 0.3 }
    local ok, err = pcall(function()
      local r, took = timed(s, "/spin")
      assert.equal(500, r.status)
      assert.is_true(took < 2, "the spinning request took " .. took .. " s")
      local body = require("cjson").decode(r.body)
      assert.equal("internal server error", body.error)
      assert.equal(r.headers["x-request-id"], body.request_id)
      assert.equal(200, s:curl({ "/hello" }).status)
      -- the detail is on stderr under the request id
      assert.matches("%[" .. body.request_id:gsub("%-", "%%-") .. "%] GET /spin: watchdog: the task ran", s:stderr())
      -- a handler that swallows the error is stopped a second later: its
      -- connection is cut, the server goes on
      local r2, took2 = timed(s, "/spin-swallow")
      assert.is_nil(r2.status)
      assert.is_true(took2 < 5, "the swallowing request took " .. took2 .. " s")
      assert.equal(200, s:curl({ "/hello" }).status)
    end)
    s:stop()
    assert(ok, err)
  end)

  -- SIGTERM to a server (no watchdog) whose loop a request to `path`
  -- holds -> exit code, seconds it took, stderr
  local function term_while_held(path)
    local s = sp.start { watchdog = false }
    local c = hold(s, path)
    local t0 = socket.gettime()
    s:signal("TERM")
    local code = s:wait_exit()
    local took = socket.gettime() - t0
    c:close()
    local err = s:stderr()
    s:stop()
    return code, took, err
  end

  it("drains on SIGTERM while a handler without a watchdog spins", function()
    local code, took, err = term_while_held("/spin")
    assert.equal(0, code)
    assert.is_true(took < 5, "exit took " .. took .. " s")
    assert.matches("watchdog: the task was stopped at SIGTERM", err)
  end)

  it("ends by SIGTERM a process held by one long C call that no hook can stop", function()
    local code, took, err = term_while_held("/spin-c")
    assert.equal(-15, code)   -- killed by the signal's default action
    assert.is_true(took < 8, "exit took " .. took .. " s")
    assert.matches("SIGTERM: a task has held the loop [%d.]+ s and cannot be stopped", err)
  end)
end)
