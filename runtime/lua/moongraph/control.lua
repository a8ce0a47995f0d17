--[[
moongraph.control — the control-flow values of the graph engine.

START and END name the virtual entry and exit of every graph. A router or a
node's Command sends work onward with plain node names or Send packets; a
node pauses the run with ctx.interrupt(), which raises an Interrupt value the
engine catches. These values are plain tables tagged by metatable, so they
cost one table each and survive being passed through user code.
]]

local setmetatable, getmetatable, type, error, rawget = setmetatable, getmetatable, type, error, rawget
local tostring = tostring

local _M = {}

_M.START = "__start__"
_M.END = "__end__"

local send_mt = { __name = "moongraph.Send" }
send_mt.__tostring = function(s) return "Send(" .. tostring(s.node) .. ")" end

local command_mt = { __name = "moongraph.Command" }
command_mt.__tostring = function() return "Command" end

local interrupt_mt = { __name = "moongraph.Interrupt" }
interrupt_mt.__tostring = function(i)
  return "graph interrupted (" .. tostring(i[1] and i[1].id) .. ")"
end

--[[ Send(node, arg): a packet that runs `node` once in the next superstep
with `arg` as its input instead of the graph state. ]]
function _M.Send(node, arg)
  if type(node) ~= "string" then
    error("bad argument #1 to 'Send': node name expected, got " .. type(node), 2)
  end
  return setmetatable({ node = node, arg = arg }, send_mt)
end

--[[ Command{update=, to=, resume=}: returned by a node (update state and
choose where to go) or passed by the caller to invoke() (resume an interrupted
run, update its state, or pick the next nodes). `to` is a node name, a Send,
or a list of them. graph = PARENT, from a node of a subgraph, ends the
subgraph and applies the update and `to` in the parent graph instead. ]]
_M.PARENT = "__parent__"

function _M.Command(t)
  if type(t) ~= "table" then
    error("bad argument #1 to 'Command': table expected, got " .. type(t), 2)
  end
  for k in pairs(t) do
    if k ~= "update" and k ~= "to" and k ~= "resume" and k ~= "goto" and k ~= "graph" then
      error("bad argument #1 to 'Command': unknown field '" .. tostring(k) ..
        "' (expected update, to, resume, graph)", 2)
    end
  end
  if t.update ~= nil and type(t.update) ~= "table" then
    error("bad argument #1 to 'Command': update must be a table, got " .. type(t.update), 2)
  end
  if t.graph ~= nil and t.graph ~= _M.PARENT then
    error("bad argument #1 to 'Command': graph must be mg.PARENT (or absent: this graph)", 2)
  end
  return setmetatable({ update = t.update, to = t.to or t["goto"], resume = t.resume, graph = t.graph },
    command_mt)
end

-- Raised out of a subgraph by a node's Command{graph = PARENT}: the command
-- for the task of the parent that ran the subgraph.
local parent_command_mt = { __name = "moongraph.ParentCommand" }
parent_command_mt.__tostring = function()
  return "Command{graph = PARENT} outside a subgraph"
end

function _M.parent_command(cmd)
  return setmetatable({ command = cmd }, parent_command_mt)
end

function _M.is_parent_command(v) return getmetatable(v) == parent_command_mt end

--[[ Overwrite(value): a write that bypasses the key's reducer and replaces
its value (LangGraph's Overwrite). It is the plain table
{__overwrite__ = value}, so it keeps its meaning through JSON (pending
writes, an API request). Two Overwrites of one key in a step are an error. ]]
local overwrite_mt = { __name = "moongraph.Overwrite" }
overwrite_mt.__tostring = function() return "Overwrite" end

function _M.Overwrite(value)
  if value == nil then
    error("bad argument #1 to 'Overwrite': a value expected (nil cannot be stored)", 2)
  end
  return setmetatable({ __overwrite__ = value }, overwrite_mt)
end

-- is_overwrite(v) -> true, the value | false
function _M.is_overwrite(v)
  if type(v) == "table" then
    local x = rawget(v, "__overwrite__")
    if x ~= nil then return true, x end
  end
  return false
end

function _M.is_send(v) return getmetatable(v) == send_mt end
function _M.is_command(v) return getmetatable(v) == command_mt end
function _M.is_interrupt(v) return getmetatable(v) == interrupt_mt end

-- Raised by ctx.interrupt(): a list of {id=, value=} records (subgraphs
-- bubble up their own list unchanged).
function _M.interrupt_error(list)
  return setmetatable(list, interrupt_mt)
end

return _M
