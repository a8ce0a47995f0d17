--[[
moongraph.api.langgraph_request — the body of a LangGraph Agent API run
request, checked and made ready for either backend.

  local lgrequest = require "moongraph.api.langgraph_request"
  local r, status, msg = lgrequest.run(body)
  -- r: strategy (default reject), names (stream modes as asked), modes (set
  -- of engine modes), engine_modes (list), subgraphs, input (a table, a
  -- mg.Command, or nil: continue), command (the API's {resume, update,
  -- goto} when given), durability, config, metadata, checkpoint_id,
  -- recursion_limit, configurable, context
  lgrequest.object(v, what) -> v (nil/null: {}) | nil, 422, msg
]]

local json = require "moongraph.json"
local lgrun = require "moongraph.langgraph_run"

local type, ipairs, tostring, tonumber, next = type, ipairs, tostring, tonumber, next
local null, array = json.null, json.array

local _M = {}

_M.STRATEGIES = { reject = true, enqueue = true, interrupt = true, rollback = true }

local function isnull(v) return v == nil or v == null end

-- a JSON object from a request (nil/null: empty) | nil, 422, msg
function _M.object(v, what)
  if isnull(v) then return {} end
  if type(v) ~= "table" or json.is_array(v) or (next(v) ~= nil and v[1] ~= nil) then
    return nil, 422, what .. " must be an object"
  end
  return v
end
local object = _M.object

local function list_of(v)
  if isnull(v) then return nil end
  if type(v) == "string" then return { v } end
  if type(v) == "table" then return v end
  return false
end

function _M.run(body)
  if type(body) ~= "table" then return nil, 422, "the request body must be a JSON object" end
  local strategy = isnull(body.multitask_strategy) and "reject" or body.multitask_strategy
  if not _M.STRATEGIES[strategy] then
    return nil, 422, "multitask_strategy must be reject, enqueue, interrupt or rollback"
  end
  for _, k in ipairs { "interrupt_before", "interrupt_after" } do
    if not isnull(body[k]) then
      return nil, 422, k .. " per run is not supported: compile the graph with " .. k
    end
  end
  if not isnull(body.webhook) then return nil, 422, "webhooks are not supported" end
  local modes_in = list_of(body.stream_mode)
  if modes_in == false then return nil, 422, "stream_mode must be a mode or a list of modes" end
  modes_in = modes_in or { "values" }
  local modes, engine_modes, names = {}, {}, array()
  for _, m in ipairs(modes_in) do
    local em = lgrun.STREAM_MODES[m]
    if not em then
      return nil, 422, "stream_mode '" .. tostring(m) .. "' is not supported (values, updates, " ..
        "messages-tuple, custom, debug, tasks, checkpoints)"
    end
    if not modes[em] then
      modes[em] = true
      engine_modes[#engine_modes + 1] = em
    end
    names[#names + 1] = m
  end
  local input, command
  if not isnull(body.command) then
    local cmd, cerr = lgrun.command(body.command)
    if not cmd then return nil, 422, cerr end
    input, command = cmd, body.command
  elseif not isnull(body.input) then
    if type(body.input) ~= "table" or json.is_array(body.input) or body.input[1] ~= nil then
      return nil, 422, "input must be an object of state values (or null to continue the thread)"
    end
    input = body.input
  end
  local durability = not isnull(body.durability) and body.durability or nil
  if durability and durability ~= "sync" and durability ~= "async" and durability ~= "exit" then
    return nil, 422, "durability must be sync, async or exit"
  end
  local config, st, msg = object(body.config, "config")
  if not config then return nil, st, msg end
  local metadata
  metadata, st, msg = object(body.metadata, "metadata")
  if not metadata then return nil, st, msg end
  local cp_id = body.checkpoint_id
  if isnull(cp_id) and type(body.checkpoint) == "table" then cp_id = body.checkpoint.checkpoint_id end
  if isnull(cp_id) then cp_id = nil end
  return { strategy = strategy, names = names, modes = modes, engine_modes = engine_modes,
    subgraphs = body.stream_subgraphs == true, input = input, command = command,
    durability = durability, config = config, metadata = metadata, checkpoint_id = cp_id,
    recursion_limit = tonumber(config.recursion_limit),
    configurable = type(config.configurable) == "table" and config.configurable or nil,
    context = type(body.context) == "table" and body.context or nil }
end

return _M
