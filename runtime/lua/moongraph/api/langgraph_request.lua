--[[
moongraph.api.langgraph_request — every body and query of the LangGraph
Agent API checked (moongraph.api.fields: numbers in range and whole,
strings of the kind asked) and made ready for either backend. Each
function returns the request's fields or nil, 422, a message naming the
field.

  local lgrequest = require "moongraph.api.langgraph_request"
  local r, status, msg = lgrequest.run(body)
  -- r: strategy (default reject), names (stream modes as asked), modes (set
  -- of engine modes), engine_modes (list), subgraphs, input (a table, a
  -- mg.Command, or nil: continue), command (the API's {resume, update,
  -- goto} when given), durability, config, metadata, checkpoint_id,
  -- recursion_limit, configurable, context, on_completion, on_disconnect,
  -- if_not_exists
  lgrequest.assistant_search(body) -> {graph_id, name, metadata, limit, offset}
  lgrequest.thread_create(body)    -> {thread_id (nil: make one), metadata, if_exists, supersteps}
  lgrequest.thread_patch(body)     -> {metadata}
  lgrequest.thread_search(body)    -> {metadata, values, ids, status, sort_by, sort_order, select, limit, offset}
  lgrequest.history(body)          -> {limit, before, checkpoint_id, metadata}
  lgrequest.state_update(body)     -> {values, as_node, checkpoint_id}
  lgrequest.checkpoint_id(body)    -> string | nil (body.checkpoint_id or body.checkpoint.checkpoint_id)
  lgrequest.run_list(query)        -> {limit, offset, status}
  lgrequest.cancel(query)          -> {action, wait}
  lgrequest.object(v, what) -> v (nil/null: {}) | nil, 422, msg
]]

local json = require "moongraph.json"
local fields = require "moongraph.api.fields"
local lgrun = require "moongraph.langgraph_run"

local type, ipairs, tostring = type, ipairs, tostring
local null, array = json.null, json.array

local _M = {}

_M.STRATEGIES = { reject = true, enqueue = true, interrupt = true, rollback = true }
_M.MAX_PAGE = 1000
_M.MAX_RECURSION = 10000

local THREAD_STATUS = { "idle", "busy", "interrupted", "error" }
local RUN_STATUS = { "pending", "running", "error", "success", "timeout", "interrupted" }

local function isnull(v) return v == nil or v == null end
local function bad(msg) return nil, 422, msg end

-- a JSON object from a request (nil/null: {}) | nil, 422, msg
function _M.object(v, what)
  local t, err = fields.object(v, what)
  if not t then return bad(err) end
  return t
end
local object = _M.object

-- an object or nothing (nil/null: nil) | false, msg
local function maybe_object(v, what)
  if isnull(v) then return nil end
  local t, err = fields.object(v, what)
  if not t then return false, err end
  return t
end

local function page(src)
  local p, err = fields.page(src, { limit = 10, max_limit = _M.MAX_PAGE })
  if not p then return nil, err end
  return p
end

-- checkpoint_id(body) -> id | nil | false, msg
local function checkpoint_of(body, name)
  local id = body.checkpoint_id
  local where = "checkpoint_id"
  if isnull(id) and not isnull(body.checkpoint) then
    if type(body.checkpoint) ~= "table" then return false, (name or "checkpoint") .. " must be an object" end
    id, where = body.checkpoint.checkpoint_id, (name or "checkpoint") .. ".checkpoint_id"
  end
  if isnull(id) then return nil end
  local s, err = fields.string(id, where, { max = 200 })
  if not s then return false, err end
  return s
end

function _M.checkpoint_id(body)
  local id, err = checkpoint_of(body or {})
  if id == false then return bad(err) end
  return id
end

local function list_of(v)
  if isnull(v) then return nil end
  if type(v) == "string" then return { v } end
  if type(v) == "table" then return v end
  return false
end

function _M.run(body)
  if type(body) ~= "table" then return bad("the request body must be a JSON object") end
  local strategy = isnull(body.multitask_strategy) and "reject" or body.multitask_strategy
  if not _M.STRATEGIES[strategy] then
    return bad("multitask_strategy must be reject, enqueue, interrupt or rollback")
  end
  for _, k in ipairs { "interrupt_before", "interrupt_after" } do
    if not isnull(body[k]) then
      return bad(k .. " per run is not supported: compile the graph with " .. k)
    end
  end
  if not isnull(body.webhook) then return bad("webhooks are not supported") end
  local _, err = fields.string(body.assistant_id, "assistant_id", { max = 200 })
  if err then return bad(err) end
  local modes_in = list_of(body.stream_mode)
  if modes_in == false then return bad("stream_mode must be a mode or a list of modes") end
  modes_in = modes_in or { "values" }
  local modes, engine_modes, names = {}, {}, array()
  for _, m in ipairs(modes_in) do
    local em = type(m) == "string" and lgrun.STREAM_MODES[m]
    if not em then
      return bad("stream_mode '" .. tostring(m) .. "' is not supported (values, updates, " ..
        "messages-tuple, custom, debug, tasks, checkpoints)")
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
    if not cmd then return bad(cerr) end
    input, command = cmd, body.command
  elseif not isnull(body.input) then
    if type(body.input) ~= "table" or json.is_array(body.input) or body.input[1] ~= nil then
      return bad("input must be an object of state values (or null to continue the thread)")
    end
    input = body.input
  end
  local durability
  durability, err = fields.string(body.durability, "durability", { one_of = { "sync", "async", "exit" } })
  if err then return bad(err) end
  local config, st, msg = object(body.config, "config")
  if not config then return nil, st, msg end
  local metadata
  metadata, st, msg = object(body.metadata, "metadata")
  if not metadata then return nil, st, msg end
  local cp_id
  cp_id, err = checkpoint_of(body)
  if cp_id == false then return bad(err) end
  local recursion_limit
  recursion_limit, err = fields.integer(config.recursion_limit, "config.recursion_limit",
    { min = 1, max = _M.MAX_RECURSION })
  if err then return bad(err) end
  local configurable
  configurable, err = maybe_object(config.configurable, "config.configurable")
  if configurable == false then return bad(err) end
  local context
  context, err = maybe_object(body.context, "context")
  if context == false then return bad(err) end
  local checks = {
    { "on_completion", { "delete", "keep" } }, { "on_disconnect", { "cancel", "continue" } },
    { "if_not_exists", { "create", "reject" } },
  }
  local words = {}
  for _, c in ipairs(checks) do
    words[c[1]], err = fields.string(body[c[1]], c[1], { one_of = c[2] })
    if err then return bad(err) end
  end
  local subgraphs
  subgraphs, err = fields.boolean(body.stream_subgraphs, "stream_subgraphs", { default = false })
  if err then return bad(err) end
  _, err = fields.number(body.after_seconds, "after_seconds", { min = 0, max = 31536000 })
  if err then return bad(err) end
  return { strategy = strategy, names = names, modes = modes, engine_modes = engine_modes,
    subgraphs = subgraphs, input = input, command = command,
    durability = durability, config = config, metadata = metadata, checkpoint_id = cp_id,
    recursion_limit = recursion_limit, configurable = configurable, context = context,
    on_completion = words.on_completion, on_disconnect = words.on_disconnect,
    if_not_exists = words.if_not_exists }
end

function _M.assistant_search(body)
  local p, err = page(body)
  if not p then return bad(err) end
  local out = { limit = p.limit, offset = p.offset }
  for _, k in ipairs { "graph_id", "name" } do
    out[k], err = fields.string(body[k], k, { max = 200 })
    if err then return bad(err) end
  end
  local metadata
  metadata, err = maybe_object(body.metadata, "metadata")
  if metadata == false then return bad(err) end
  out.metadata = metadata
  return out
end

function _M.thread_create(body)
  local metadata, st, msg = object(body.metadata, "metadata")
  if not metadata then return nil, st, msg end
  local id, err = fields.string(body.thread_id, "thread_id", { max = 200 })
  if err then return bad(err) end
  local if_exists
  if_exists, err = fields.string(body.if_exists, "if_exists", { one_of = { "raise", "do_nothing" } })
  if err then return bad(err) end
  return { thread_id = id, metadata = metadata, if_exists = if_exists, supersteps = body.supersteps }
end

function _M.thread_patch(body)
  local metadata, st, msg = object(body.metadata, "metadata")
  if not metadata then return nil, st, msg end
  return { metadata = metadata }
end

function _M.thread_search(body)
  local p, err = page(body)
  if not p then return bad(err) end
  local metadata, st, msg = object(body.metadata, "metadata")
  if not metadata then return nil, st, msg end
  local values
  values, st, msg = object(body.values, "values")
  if not values then return nil, st, msg end
  local ids
  ids, err = fields.strings(body.ids, "ids", { max = _M.MAX_PAGE })
  if err then return bad(err) end
  local status
  status, err = fields.string(body.status, "status", { one_of = THREAD_STATUS })
  if err then return bad(err) end
  local sort_by
  sort_by, err = fields.string(body.sort_by, "sort_by",
    { default = "created_at", one_of = { "thread_id", "status", "created_at", "updated_at" } })
  if err then return bad(err) end
  local sort_order
  sort_order, err = fields.string(body.sort_order, "sort_order", { default = "desc", one_of = { "asc", "desc" } })
  if err then return bad(err) end
  local select
  select, err = fields.strings(body.select, "select", { max = 100 })
  if err then return bad(err) end
  return { metadata = metadata, values = values, ids = ids, status = status, sort_by = sort_by,
    sort_order = sort_order, select = select, limit = p.limit, offset = p.offset }
end

function _M.history(body)
  local limit, err = fields.integer(body.limit, "limit", { default = 10, min = 1, max = _M.MAX_PAGE })
  if not limit then return bad(err) end
  local before = body.before
  local where = "before"
  if type(before) == "table" and not json.is_array(before) then
    before, where = before.checkpoint_id, "before.checkpoint_id"
  end
  before, err = fields.string(before, where, { max = 200 })
  if err then return bad(err) end
  local cp_id
  cp_id, err = checkpoint_of({ checkpoint = body.checkpoint })
  if cp_id == false then return bad(err) end
  local metadata
  metadata, err = maybe_object(body.metadata, "metadata")
  if metadata == false then return bad(err) end
  return { limit = limit, before = before, checkpoint_id = cp_id, metadata = metadata }
end

function _M.state_update(body)
  local values = body.values
  if isnull(values) then values = nil
  elseif type(values) ~= "table" then return bad("values must be an object")
  elseif json.is_array(values) or values[1] ~= nil then
    return bad("values must be an object (a list of updates is not supported)")
  end
  local as_node, err = fields.string(body.as_node, "as_node", { max = 200 })
  if err then return bad(err) end
  local cp_id
  cp_id, err = checkpoint_of(body)
  if cp_id == false then return bad(err) end
  return { values = values, as_node = as_node, checkpoint_id = cp_id }
end

function _M.run_list(q)
  local p, err = page(q)
  if not p then return bad(err) end
  local status
  status, err = fields.string(q.status, "status", { one_of = RUN_STATUS })
  if err then return bad(err) end
  return { limit = p.limit, offset = p.offset, status = status }
end

function _M.cancel(q)
  local action, err = fields.string(q.action, "action", { default = "interrupt", one_of = { "interrupt", "rollback" } })
  if err then return bad(err) end
  local wait
  wait, err = fields.boolean(q.wait, "wait", { default = false })
  if err then return bad(err) end
  return { action = action, wait = wait }
end

return _M
