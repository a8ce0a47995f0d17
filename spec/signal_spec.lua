local mg = require "moongraph"
local signal = require("moongraph.core").signal

local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")

describe("core.signal", function()
  it("wakes a waiting task when the process receives the signal", function()
    local got = mg.run(function()
      local waiter = mg.spawn(signal.wait, "USR1")
      mg.sleep(0)   -- the watcher is installed once the waiter has run
      io.popen("kill -USR1 " .. pid):close()
      return select(2, waiter:join())
    end)
    assert.equal("USR1", got)
  end)

  it("accepts SIG-prefixed names and rejects unknown ones", function()
    local ok, err = pcall(mg.run, function() signal.wait("NOPE") end)
    assert.is_false(ok)
    assert.matches("unknown signal", err)
    local got = mg.run(function()
      local waiter = mg.spawn(signal.wait, "SIGUSR2")
      mg.sleep(0)
      io.popen("kill -USR2 " .. pid):close()
      return select(2, waiter:join())
    end)
    assert.equal("USR2", got)
  end)

  it("a cancelled wait removes its watcher", function()
    local r = mg.run(function()
      local waiter = mg.spawn(signal.wait, "HUP")
      mg.sleep(0)
      return { waiter:cancel(), waiter:status() }
    end)
    assert.same({ true, "cancelled" }, r)
  end)
end)
