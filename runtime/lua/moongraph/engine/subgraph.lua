--[[
moongraph.engine.subgraph — what a compiled graph run inside a task hands
back to its parent, and which pending interrupts it holds.

A subgraph runs in namespace parent_ns|name:task_id[@checkpoint] with the
parent's checkpointer, stream and trace (engine/loop.lua run_subgraph).
]]

local type, pairs, ipairs, rawequal = type, pairs, ipairs, rawequal
local string_sub = string.sub

local reducers = require "moongraph.reducers"
local algo = require "moongraph.engine.algo"

local deep_equal = algo.deep_equal

local _M = {}

--[[ write_back(run, input, values) -> update | nil
What a subgraph changed in the keys the parent declares (every key when the
parent has no schema), as an update for the parent's reducers: an append
list that grew by a suffix gives the suffix, a number under `add` gives the
difference. A key that holds the very table the parent gave (which the
subgraph may have changed in place and returned) is no update, but counts
as written for the parent's async writer (run.written), which then copies
it again. ]]
function _M.write_back(run, input, values)
  local declared = run.app.declared
  local reds = run.reducers
  local written = run.written
  local up = nil
  for k, v in pairs(values) do
    if declared == nil or declared[k] then
      local iv = input[k]
      if written and type(v) == "table" and rawequal(v, iv) then written[k] = true end
      if not deep_equal(v, iv) then
        local red = reds[k]
        if red == reducers.append and reducers.is_list(iv) and reducers.is_list(v) and #v >= #iv then
          local prefix = true
          for i = 1, #iv do
            if not deep_equal(iv[i], v[i]) then prefix = false break end
          end
          if prefix then
            local d = {}
            for i = #iv + 1, #v do d[#d + 1] = v[i] end
            v = d
          end
        elseif red == reducers.add and type(iv) == "number" and type(v) == "number" then
          v = v - iv
        end
        up = up or {}
        up[k] = v
      end
    end
  end
  return up
end

--[[ holds(namespaces, ns) -> whether the subgraph of namespace ns holds one
of the pending interrupts. namespaces: theirs (nil: records without one,
from a subgraph node, whose one subgraph holds them). ]]
function _M.holds(namespaces, ns)
  if namespaces == nil then return true end
  local n = #ns
  for _, x in ipairs(namespaces) do
    if x == ns or (string_sub(x, 1, n) == ns and string_sub(x, n + 1, n + 1) == "|") then
      return true
    end
  end
  return false
end

return _M
