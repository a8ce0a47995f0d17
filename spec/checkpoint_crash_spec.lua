-- A run killed with SIGKILL in the middle of a superstep resumes in a new
-- process and re-runs only the tasks whose writes were not saved.
local child = require "graph_child"

describe("crash recovery with the file saver", function()
  for _, durability in ipairs { "async", "sync" } do
    it("a run killed with kill -9 mid-step re-runs only unfinished tasks (durability " .. durability .. ")", function()
      local dir = child.tmpdir()
      local r = child.crash_and_resume("file", dir, durability)
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
