-- moongraph demo: a small parallel fan-out on the scheduler — three
-- branches that each wait on their own timer run side by side, and the
-- total time is that of the slowest branch, not the sum.
local mg = require "moongraph"

local _M = {}

function _M.main()
  local branches = { retrieval = 0.12, weather = 0.08, places = 0.10 }
  local names = {}
  for name in pairs(branches) do names[#names + 1] = name end
  table.sort(names)
  local t0 = mg.now()
  local fns = {}
  for i, name in ipairs(names) do
    fns[i] = function()
      mg.sleep(branches[name])
      return string.format("%-10s done after %3.0f ms", name, (mg.now() - t0) * 1000)
    end
  end
  for _, r in ipairs(mg.gather(fns)) do print(r.value) end
  print(string.format("all branches done in %.0f ms (sequential would take %.0f ms)",
    (mg.now() - t0) * 1000, (0.12 + 0.08 + 0.10) * 1000))
  return 0
end

return _M
