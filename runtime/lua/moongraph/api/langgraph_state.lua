--[[
moongraph.api.langgraph_state — a thread's state as the LangGraph Agent API
reads and writes it, over the graph compiled with the thread's saver: the
same for every backend (the embedded one reads its local checkpoints, the
distributed one the checkpoints the workers wrote).

  local lgstate = require "moongraph.api.langgraph_state"
  lgstate.get(app, thread_id [, checkpoint_id])  -> ThreadState | nil, status, msg
  lgstate.update(app, graph_id, thread_id, q)    -> {checkpoint} | nil, status, msg
  lgstate.history(app, thread_id, q)             -> [ThreadState] | nil, status, msg
  (q: the request as moongraph.api.langgraph_request.state_update / history
  checked it)
  lgstate.state_json(snap)   lgstate.empty_state(thread_id)   lgstate.checkpoint_json(cfg)
  lgstate.contains(have, want)   -- JSON containment, one level deep

app nil: a thread no graph ran on yet (an empty state, an empty history;
updating it answers 400).
]]

local errors = require "moongraph.errors"
local mg = require "moongraph"
local json = require "moongraph.json"
local lgrun = require "moongraph.langgraph_run"

local type, pairs, ipairs, tostring, pcall = type, pairs, ipairs, tostring, pcall
local null, array = json.null, json.array
local interrupts_json = lgrun.interrupts_json

local _M = {}


-- does `have` contain every key/value of `want` (tables compared by their
-- encoding)?
function _M.contains(have, want)
  for k, v in pairs(want) do
    local h = have and have[k]
    if type(v) == "table" and type(h) == "table" then
      if json.encode(v) ~= json.encode(h) then return false end
    elseif h ~= v then
      return false
    end
  end
  return true
end

function _M.checkpoint_json(cfg)
  if type(cfg) ~= "table" or not cfg.checkpoint_id then return null end
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "",
    checkpoint_id = cfg.checkpoint_id, checkpoint_map = null }
end
local checkpoint_json = _M.checkpoint_json

-- a state snapshot as LangGraph's ThreadState
function _M.state_json(snap)
  local tasks = array()
  for i, t in ipairs(snap.tasks or {}) do
    tasks[i] = { id = t.id, name = t.name, path = array { "__pregel_pull", t.name },
      error = t.error and tostring(t.error) or null, interrupts = interrupts_json(t.interrupts),
      checkpoint = null, state = null, result = t.result == nil and null or t.result }
  end
  local next_ = array()
  for i, n in ipairs(snap.next or {}) do next_[i] = n end
  return { values = snap.values or {}, next = next_, tasks = tasks,
    interrupts = interrupts_json(snap.interrupts),
    metadata = snap.metadata or {}, created_at = snap.created_at or null,
    checkpoint = checkpoint_json(snap.config), parent_checkpoint = checkpoint_json(snap.parent_config) }
end
local state_json = _M.state_json

function _M.empty_state(thread_id)
  return { values = {}, next = array(), tasks = array(), interrupts = array(), metadata = {},
    created_at = null, checkpoint = null, parent_checkpoint = null, thread_id = thread_id }
end

function _M.get(app, id, checkpoint_id)
  if not app then
    if checkpoint_id then return nil, 404, "checkpoint '" .. tostring(checkpoint_id) .. "' not found" end
    return _M.empty_state(nil)
  end
  local snap, err = app:get_state { thread_id = id, checkpoint_id = checkpoint_id }
  if not snap then return nil, 503, err end
  if checkpoint_id and (not snap.config or snap.config.checkpoint_id ~= checkpoint_id) then
    return nil, 404, "checkpoint '" .. tostring(checkpoint_id) .. "' not found"
  end
  return state_json(snap)
end

function _M.update(app, gid, id, q)
  if not app then
    return nil, 400, "thread '" .. id .. "' has no graph yet (run an assistant on it first, or create " ..
      "it with metadata.graph_id)"
  end
  local as_node = q.as_node
  if as_node ~= nil and as_node ~= mg.START and as_node ~= mg.END and not app.nodes[as_node] then
    return nil, 422, "as_node: graph '" .. tostring(gid) .. "' has no node '" .. tostring(as_node) .. "'"
  end
  local ok, cfg, err = pcall(app.update_state, app, { thread_id = id, checkpoint_id = q.checkpoint_id },
    q.values, as_node)
  -- (update_state raises on values the graph refuses: its message, without
  -- the place in the code it came from)
  if not ok then return nil, 422, (tostring(cfg):gsub("^[^:\n]+%.lua:%d+: ", "")) end
  if not cfg then
    if errors.has(err, "not_found") then return nil, 404, err end
    return nil, 503, err
  end
  return { checkpoint = checkpoint_json(cfg) }
end

function _M.history(app, id, q)
  if not app then return array() end
  local limit = q.limit or 10
  local cfg = { thread_id = id, checkpoint_id = q.checkpoint_id }
  local filter = q.metadata
  local list, err = app:get_state_history(cfg, { limit = filter and nil or limit, before = q.before })
  if not list then return nil, 503, err end
  local out = array()
  for _, snap in ipairs(list) do
    if #out >= limit then break end
    if not filter or _M.contains(snap.metadata or {}, filter) then out[#out + 1] = state_json(snap) end
  end
  return out
end

return _M
