--[[
moongraph.control — the control-flow values of the graph engine.

START and END name the virtual entry and exit of every graph. A router or a
node's Command sends work onward with plain node names or Send packets; a
node pauses the run with ctx.interrupt(), which raises an Interrupt value the
engine catches. These values are plain tables tagged by metatable, so they
cost one table each and survive being passed through user code.
]]

local setmetatable, getmetatable, type, error = setmetatable, getmetatable, type, error
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
or a list of them. ]]
function _M.Command(t)
  if type(t) ~= "table" then
    error("bad argument #1 to 'Command': table expected, got " .. type(t), 2)
  end
  for k in pairs(t) do
    if k ~= "update" and k ~= "to" and k ~= "resume" and k ~= "goto" then
      error("bad argument #1 to 'Command': unknown field '" .. tostring(k) ..
        "' (expected update, to, resume)", 2)
    end
  end
  if t.update ~= nil and type(t.update) ~= "table" then
    error("bad argument #1 to 'Command': update must be a table, got " .. type(t.update), 2)
  end
  return setmetatable({ update = t.update, to = t.to or t["goto"], resume = t.resume }, command_mt)
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
