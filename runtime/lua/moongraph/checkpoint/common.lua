--[[
moongraph.checkpoint.common — argument checks and encoding shared by the savers.
]]

local type, error, tostring = type, error, tostring
local table_concat = table.concat

local errors = require "moongraph.errors"
local json = require "moongraph.json"

local _M = {}

--[[ encode_writes(task_id, writes [, indent]) -> JSON array text | nil, err
Each {channel, value} pair is encoded on its own so that an error names the
channel and the task ("write to 'f' by task 3:a is a function, ..."). ]]
function _M.encode_writes(task_id, writes, indent)
  if type(writes) ~= "table" then
    error("bad argument #3 to 'put_writes': list of {channel, value} expected, got " .. type(writes), 3)
  end
  local parts = {}
  for i = 1, #writes do
    local pair = writes[i]
    if type(pair) ~= "table" or type(pair[1]) ~= "string" then
      error("bad argument #3 to 'put_writes': write " .. i .. " is not a {channel, value} pair", 3)
    end
    local v, err = json.encode(pair[2], { name = "write to '" .. pair[1] .. "' by task " .. task_id })
    if not v then return nil, err end
    parts[i] = "[" .. json.encode(pair[1]) .. "," .. v .. "]"
  end
  local sep = indent and ",\n  " or ","
  return "[" .. (indent and "\n  " or "") .. table_concat(parts, sep) .. (indent and "\n]" or "]")
end

--[[ copy_writes(task_id, writes) -> list of {channel, value} copies | nil, err
What decoding encode_writes' text gives (a nil value comes back as null),
made without the text; an error names the channel and the task as
encode_writes' does. ]]
local copy, null = json.copy, json.null
function _M.copy_writes(task_id, writes)
  if type(writes) ~= "table" then
    error("bad argument #3 to 'put_writes': list of {channel, value} expected, got " .. type(writes), 3)
  end
  local out = {}
  for i = 1, #writes do
    local pair = writes[i]
    if type(pair) ~= "table" or type(pair[1]) ~= "string" then
      error("bad argument #3 to 'put_writes': write " .. i .. " is not a {channel, value} pair", 3)
    end
    local v, err = pair[2], nil
    if v == nil then
      v = null
    else
      v, err = copy(v)
      if v == nil then
        local _, eerr = _M.encode_writes(task_id, writes)
        return nil, eerr or err
      end
    end
    out[i] = { pair[1], v }
  end
  return out
end

-- (a check per saver call: type() is a call of its own, so each field is
-- read once and the usual "" namespace needs none)
--[[ pack_writes(task_id, writes) -> the task id and its writes packed
together (moongraph.json pack) | nil, err. Raises, as encode_writes does,
when writes is not a list of {channel, value} pairs; an error names the
channel and the task. ]]
local ok_core, core = pcall(require, "moongraph.core")
local pack_pairs = ok_core and type(core) == "table" and core.pack and core.pack.pack_pairs
local array_mt = getmetatable(json.array())
function _M.pack_writes(task_id, writes)
  if type(writes) ~= "table" then
    error("bad argument #3 to 'put_writes': list of {channel, value} expected, got " .. type(writes), 3)
  end
  local packed, bad = nil, 0
  if pack_pairs then
    packed, bad = pack_pairs(null, array_mt, task_id, writes)
    if packed then return packed end
  else
    for i = 1, #writes do
      local pair = writes[i]
      if type(pair) ~= "table" or type(pair[1]) ~= "string" then bad = i break end
    end
  end
  if bad > 0 then
    error("bad argument #3 to 'put_writes': write " .. bad .. " is not a {channel, value} pair", 3)
  end
  -- the codec's copy of each pair, or the error naming the write
  local list, err = _M.copy_writes(task_id, writes)
  if not list then return nil, err end
  return json.pack(task_id, list)
end

function _M.check_cfg(cfg, fname)
  if type(cfg) ~= "table" then
    error("bad argument #1 to '" .. fname .. "': config table expected, got " .. type(cfg), 3)
  end
  local thread_id = cfg.thread_id
  if type(thread_id) ~= "string" then
    if thread_id == nil then
      error("bad argument #1 to '" .. fname .. "': config.thread_id is required", 3)
    end
    cfg.thread_id = tostring(thread_id)
  end
  local ns = cfg.checkpoint_ns
  if ns ~= nil and ns ~= "" and type(ns) ~= "string" then
    error("bad argument #1 to '" .. fname .. "': config.checkpoint_ns must be a string", 3)
  end
  local id = cfg.checkpoint_id
  if id ~= nil and type(id) ~= "string" then
    error("bad argument #1 to '" .. fname .. "': config.checkpoint_id must be a string", 3)
  end
end

-- The arguments of put(cfg, checkpoint, metadata).
function _M.check_put(cfg, checkpoint)
  _M.check_cfg(cfg, "put")
  if type(checkpoint) ~= "table" or type(checkpoint.id) ~= "string" then
    error("bad argument #2 to 'put': checkpoint with a string id expected", 3)
  end
end

-- The arguments of put_writes(cfg, task_id, writes) other than the writes.
function _M.check_put_writes(cfg, task_id)
  _M.check_cfg(cfg, "put_writes")
  if cfg.checkpoint_id == nil then
    error("bad argument #1 to 'put_writes': config.checkpoint_id expected", 3)
  end
  if type(task_id) ~= "string" then
    error("bad argument #2 to 'put_writes': task id (string) expected, got " .. type(task_id), 3)
  end
end

--[[ encode_checkpoint(checkpoint, metadata [, indent]) -> cp, md | nil, err
The checkpoint and its metadata as JSON text; an error names which failed. ]]
function _M.encode_checkpoint(checkpoint, metadata, indent)
  local cp, err = json.encode(checkpoint, { indent = indent, name = "checkpoint" })
  if not cp then return nil, err end
  local md
  md, err = json.encode(metadata or {}, { indent = indent, name = "metadata" })
  if not md then return nil, err end
  return cp, md
end

--[[ Optimistic concurrency. A put names the checkpoint it extends
(cfg.checkpoint_id; nil: the namespace has none yet). The namespace's
latest checkpoint must be that one — or cfg.head_id when given (a fork from
an older checkpoint names the latest it saw), or the checkpoint being put
(a retried put) — else the put fails with conflict_error(...) and nothing
of it is saved. ]]
_M.CONFLICT = "checkpoint conflict"

-- expected(cfg) -> the id the namespace's latest checkpoint must have
-- (false: none)
function _M.expected(cfg)
  local e = cfg.head_id
  if e == nil then e = cfg.checkpoint_id end
  return e or false
end

-- The error of a put that lost the race: code "conflict", not retryable
-- as such (the run must read the thread again first).
function _M.conflict_error(thread_id, ns, expected, latest)
  return errors.new("conflict", string.format(
    "%s: thread '%s'%s is at checkpoint %s, not %s: another run wrote to it meanwhile",
    _M.CONFLICT, thread_id, ns ~= "" and (" (namespace '" .. ns .. "')") or "",
    latest and tostring(latest) or "(none)", expected and tostring(expected) or "(none: a new thread)"),
    { details = { thread_id = thread_id, checkpoint_ns = ns, expected = expected or nil,
      latest = latest } })
end

function _M.is_conflict(err)
  return errors.find(err, "conflict") ~= nil   -- also under a checkpointer failure
end

-- list options -> limit, before (a checkpoint id)
function _M.list_opts(opts)
  if opts == nil then return nil, nil end
  if type(opts) ~= "table" then
    error("bad argument #2 to 'list': options table expected, got " .. type(opts), 3)
  end
  local limit, before = opts.limit, opts.before
  if limit ~= nil and (type(limit) ~= "number" or limit < 1) then
    error("bad argument #2 to 'list': limit must be a positive number", 3)
  end
  if type(before) == "table" then before = before.checkpoint_id end
  if before ~= nil and type(before) ~= "string" then
    error("bad argument #2 to 'list': before must be a checkpoint id or a config", 3)
  end
  return limit, before
end

return _M
