local mg = require "moongraph"

describe("coroutine reuse", function()
  it("a task cancelled inside xpcall leaves no stale error handler behind", function()
    local errs = mg.run(function()
      -- cancel many tasks while they wait inside xpcall with a handler
      for _ = 1, 50 do
        local t = mg.spawn(function()
          xpcall(function() mg.sleep(60) end, debug.traceback)
        end)
        mg.sleep(0)
        t:cancel()
      end
      -- later tasks that raise must report their own error
      local out = {}
      for i = 1, 50 do
        local ok, err = mg.spawn(function() error("failure " .. i) end):join()
        out[i] = (not ok) and err:match("failure %d+") or "ok?"
      end
      return out
    end)
    for i = 1, 50 do assert.equal("failure " .. i, errs[i]) end
  end)

  it("a task that failed inside xpcall's handler leaves no stale handler either", function()
    local errs = mg.run(function()
      for _ = 1, 20 do
        mg.spawn(function()
          xpcall(function() error("first") end, function() error("handler fails") end)
          error("after")
        end):join()
      end
      local out = {}
      for i = 1, 20 do
        local _, err = mg.spawn(function() error({ n = i }) end):join()
        out[i] = err
      end
      return out
    end)
    for i = 1, 20 do assert.same({ n = i }, errs[i]) end
  end)
end)
