--[[
moongraph.engine.branch — where a task sends the run next: conditional
edges (routers) and Command.to targets.

A router returns a node name (or a path_map label), a list of them, mg.Send
packets or mg.END. Resolved targets go to the task's result record: plain
nodes into `res.route`, Send packets into `res.sends`. Every function returns
nil or an error message naming the router and what it returned.
]]

local type, tostring, xpcall = type, tostring, xpcall
local table_concat = table.concat
local traceback = debug.traceback

local control = require "moongraph.control"

local is_send = control.is_send
local END = control.END

local _M = {}

-- The message handler of node and router calls: string errors get the
-- traceback of where they were raised.
function _M.handler(e)
  if type(e) == "string" then return traceback(e, 2) end
  return e
end
local handler = _M.handler

-- Resolve one router/Command output into res.route / res.sends.
local function add_target(run, res, out, branch, who)
  if is_send(out) then
    if not run.nodes[out.node] then
      return who .. " sent to '" .. tostring(out.node) .. "', which is not a node"
    end
    local sends = res.sends
    if not sends then sends = {}; res.sends = sends end
    sends[#sends + 1] = out
    return nil
  end
  if type(out) ~= "string" then
    return who .. " returned a " .. type(out) ..
      "; expected a node name, a list of them, mg.Send packets or mg.END"
  end
  local target = out
  if branch and branch.map then
    target = branch.map[out]
    if target == nil then
      return who .. " returned '" .. out .. "', which is not in its path_map (" ..
        table_concat(branch.labels, ", ") .. ")"
    end
  end
  if target == END then return nil end
  if not run.nodes[target] then
    return who .. " returned '" .. target .. "', which is not a node"
  end
  local route = res.route
  if not route then route = {}; res.route = route end
  route[#route + 1] = target
  return nil
end

-- add_targets(run, res, out, branch, who) -> nil | error message
function _M.add_targets(run, res, out, branch, who)
  if out == nil then
    return who .. " returned nil; expected a node name, a list of them, mg.Send packets or mg.END"
  end
  if type(out) == "table" and not is_send(out) then
    for i = 1, #out do
      local err = add_target(run, res, out[i], branch, who)
      if err then return err end
    end
    return nil
  end
  return add_target(run, res, out, branch, who)
end

--[[ route(run, spec, state, res, ctx) -> nil | error message
Evaluate the routers of `spec` (a node or the START pseudo-node) on `state`,
adding their targets to res. ]]
function _M.route(run, spec, state, res, ctx)
  local branches = spec.branches
  for i = 1, #branches do
    local b = branches[i]
    local ok, out = xpcall(b.router, handler, state, ctx)
    local who = "router on '" .. spec.name .. "'"
    if not ok then return who .. " failed: " .. tostring(out) end
    local err = _M.add_targets(run, res, out, b, who)
    if err then return err end
  end
  return nil
end

return _M
